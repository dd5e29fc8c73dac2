"""How far the plugin's decode-only saving is from the decode steps' own saving (issue 21 item 2).

For each case the plugin's own pair measurer (:class:`PairMeasurer`, the reference server, the
modeled meter pricing the tiny models as the real shapes they declare: ``modeled (h200, priced as
Qwen3-8B)``, as the quickstart runs) measures the baseline and the speculative arm. Next to the
saving the plugin reports (full window minus prefill-only twin, per token), the script prices only
the full window's decode, verify and draft steps - the modeled meter's
``details["joules_by_phase"]``, prefill steps excluded - over the same tokens, and prints:

* **plugin** / **steps only**: the two savings, and **bias** = plugin - steps only, in points;
* **residue**: per arm, (plugin decode joules - decode-step joules) / plugin decode joules - the
  prefill energy the twin failed to subtract (negative: it subtracted too much);
* **coverage**: per arm, the window's decode tokens over the pool's (every prompt's whole output,
  its first token excluded: prefill makes it);
* **conc**: per arm, the mean requests per decode step the engine recorded in the window.

Usage (CPU, the built-in tiny models; the default matrix takes about 10 minutes on 2 cores)::

    PYTHONPATH=. .venv/bin/python benchmarks/window_bias.py [--quick] [--cap-at-batch] [--drafters ngram block]
        [--batches 1 4 8 16] [--corpora code news] [--pool 32] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.measure.pairs import PairMeasurer
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult

#: The drafters by the name ``--drafters`` takes.
DRAFTERS = {
    "ngram": Drafter("ngram", num_draft_tokens=4, id="ngram-k4"),
    "draft_model": Drafter(
        "draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft-k4"
    ),
    "block": Drafter(
        "block", draft_model="tiny:dense-draft", block_size=16, accept_p=0.8, id="block16"
    ),
}
#: Phases of the modeled meter that are decode work (everything but prefill).
DECODE_PHASES = ("decode", "verify", "draft")


@dataclass(frozen=True)
class ArmBias:
    """One arm's decode energy as the plugin measured it and as its decode steps alone cost."""

    plugin_joules: float
    steps_joules: float
    tokens: float
    coverage: float | None
    concurrency: float | None

    @property
    def residue(self) -> float:
        """Share of the plugin's decode energy that is no decode step (prefill left in)."""
        return (self.plugin_joules - self.steps_joules) / self.plugin_joules


@dataclass(frozen=True)
class BiasRow:
    """One case: both arms and the two savings."""

    case: str
    baseline: ArmBias
    speculative: ArmBias
    plugin_saving: float
    failed: tuple[str, ...]
    seconds: float

    @property
    def steps_saving(self) -> float:
        """The saving from the decode, verify and draft steps alone, per token."""
        spec = self.speculative.steps_joules / self.speculative.tokens
        base = self.baseline.steps_joules / self.baseline.tokens
        return 1.0 - spec / base

    @property
    def bias(self) -> float:
        """Plugin saving minus steps-only saving, in percentage points."""
        return 100.0 * (self.plugin_saving - self.steps_saving)


def arm_bias(run: RunResult) -> ArmBias:
    """Sum over the arm's repeats (per loop, as the plugin's own figures are)."""
    plugin = steps = tokens = 0.0
    for sample in run.samples:
        full = sample.window.full
        by_phase = full.details["joules_by_phase"]
        plugin += sample.decode_joules
        steps += sum(by_phase.get(p, 0.0) for p in DECODE_PHASES) / full.loops
        tokens += sample.decode_tokens
    return ArmBias(plugin, steps, tokens, run.coverage, run.concurrency.mean_running)


def bias_row(pair: PairResult, seconds: float = 0.0) -> BiasRow:
    """The row of one measured pair."""
    return BiasRow(
        pair.case.id,
        arm_bias(pair.baseline),
        arm_bias(pair.speculative),
        pair.energy_saving,
        tuple(c.name for c in pair.failed_checks),
        seconds,
    )


def make_cases(
    drafters: Sequence[str],
    batches: Sequence[int],
    corpora: Sequence[str],
    pool: int,
    max_new_tokens: int,
    cap_at_batch: bool = False,
) -> list[Case]:
    """The matrix: every corpus x batch x drafter, one pool per corpus (as the plugin shares it).
    ``cap_at_batch`` starts each batch point's engines admitting exactly the batch
    (``max_running_requests=B``) instead of the reference server's cap set at run time."""
    generation = Generation(max_new_tokens=max_new_tokens, prompts=pool, ignore_eos=True)
    return [
        Case.of(
            engine="reference",
            model="tiny:dense",
            drafter=DRAFTERS[d],
            batch=b,
            corpus=load_corpus(c),
            generation=generation,
            max_running_requests=b if cap_at_batch else None,
        )
        for c in corpora
        for b in batches
        for d in drafters
    ]


def measure_rows(
    cases: Sequence[Case],
    meter: str = "modeled:h200",
    log_dir: Path | None = None,
    progress: Any = None,
) -> list[BiasRow]:
    """Each case through the plugin's pair measurer (one repeat, no warm-up: the modeled meter
    needs none), as a :class:`BiasRow`."""
    pool = EnginePool(
        log_dir or Path(tempfile.mkdtemp(prefix="specenergy-bias-")), startup_timeout_s=300
    )
    measurer = PairMeasurer(
        log_dir=pool.log_dir, startup_timeout=300, meter=meter, repeats=1, warmup=0, pool=pool
    )
    # The plugin prices a modeled window's prefill from its own steps; this script checks the
    # twin that a board meter needs against those steps, so the twin runs.
    measurer.run_twin = True
    measurer.plan(list(cases))
    rows = []
    try:
        for case in cases:
            began = time.monotonic()
            pair = measurer.measure(case)
            rows.append(bias_row(pair, time.monotonic() - began))
            if progress is not None:
                progress(rows[-1])
    finally:
        measurer.close()
    return rows


def _pct(value: float | None, spec: str = ".1%") -> str:
    return "n/a" if value is None else format(value, spec)


def format_rows(rows: Sequence[BiasRow]) -> str:
    """A plain table: one line per case."""
    head = (
        f"{'case':<24} {'plugin':>7} {'steps':>7} {'bias':>6} {'res b':>6} {'res s':>6} "
        f"{'cov b':>6} {'cov s':>6} {'conc b':>6} {'conc s':>6} {'wall':>5}  failed"
    )
    lines = [head]
    for r in rows:
        b, s = r.baseline, r.speculative
        lines.append(
            f"{r.case:<24} {_pct(r.plugin_saving):>7} {_pct(r.steps_saving):>7} {r.bias:>+6.2f} "
            f"{_pct(b.residue, '.2%'):>6} {_pct(s.residue, '.2%'):>6} {_pct(b.coverage):>6} "
            f"{_pct(s.coverage):>6} {_pct(b.concurrency, '.2f'):>6} "
            f"{_pct(s.concurrency, '.2f'):>6} {r.seconds:>4.0f}s  {','.join(r.failed) or '-'}"
        )
    worst = max((abs(r.bias) for r in rows), default=0.0)
    residue = max((max(r.baseline.residue, r.speculative.residue) for r in rows), default=0.0)
    lines.append(f"max |bias| {worst:.2f} points; max residue {residue:.2%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--meter", default="modeled:h200", help="modeled:<gpu>[:shape] (default modeled:h200)"
    )
    parser.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=list(DRAFTERS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--corpora", nargs="+", default=["code", "news"])
    parser.add_argument("--pool", type=int, default=32, help="prompts per pool (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--cap-at-batch",
        action="store_true",
        help="declare max_running_requests=B in each case (one engine per batch point); "
        "without it the reference server's cap is set to the batch at run time",
    )
    parser.add_argument(
        "--quick", action="store_true", help="three rows: ngram b1 and b8, block b4, on code"
    )
    args = parser.parse_args(argv)
    if args.quick:
        cases = make_cases(
            ["ngram"], [1, 8], ["code"], args.pool, args.max_new_tokens, args.cap_at_batch
        ) + make_cases(["block"], [4], ["code"], args.pool, args.max_new_tokens, args.cap_at_batch)
    else:
        cases = make_cases(
            args.drafters,
            args.batches,
            args.corpora,
            args.pool,
            args.max_new_tokens,
            args.cap_at_batch,
        )
    started = time.monotonic()
    rows = measure_rows(
        cases, args.meter, progress=lambda r: print(f"{r.case}: {r.seconds:.0f} s", file=sys.stderr)
    )
    print(format_rows(rows))
    print(f"total wall time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
