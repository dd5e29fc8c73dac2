"""The terminal summary: one row per case, every energy figure labelled with its source."""

from __future__ import annotations

from typing import Iterable

from tabulate import tabulate

from pytest_specenergy.results import PairResult

HEADERS = ("case", "source", "base J/tok", "spec J/tok", "saving", "accept len", "accept rate",
           "verified/step", "base tbt ms", "spec tbt ms", "speedup", "equivalence",
           "logprob gap", "flags")


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def pair_row(pair: PairResult) -> tuple[str, ...]:
    """One table row."""
    eq = pair.equivalence
    exact = sum(r.exact for r in eq.requests)
    equivalence = f"{exact}/{len(eq.requests)} exact"
    if exact < len(eq.requests):
        equivalence += f", min prefix {eq.min_common_prefix}"
    return (
        pair.case_id,
        pair.source,
        _num(pair.baseline.energy_per_token, ".4g"),
        _num(pair.speculative.energy_per_token, ".4g"),
        _num(pair.energy_saving, "+.1%"),
        _num(pair.accept_length, ".2f"),
        _num(pair.acceptance_rate, ".2f"),
        str(pair.verified_per_step),
        _num(pair.baseline.tbt_ms, ".3f"),
        _num(pair.speculative.tbt_ms, ".3f"),
        _num(pair.speedup, ".2f") + "x" if pair.speedup is not None else "n/a",
        equivalence,
        _num(pair.coherence.mean_gap if pair.coherence else None, ".3f"),
        ", ".join(pair_flags(pair)) or "-",
    )


def pair_flags(pair: PairResult) -> list[str]:
    """The names of the validity checks that tripped (``!`` marks fail-closed ones)."""
    return [("!" if c.severity == "fail" else "") + c.name for c in pair.checks]


def render_table(pairs: Iterable[PairResult]) -> str:
    """The summary table (plain grid, fits a CI log)."""
    rows = [pair_row(p) for p in pairs]
    return tabulate(rows, headers=HEADERS, tablefmt="simple", disable_numparse=True)
