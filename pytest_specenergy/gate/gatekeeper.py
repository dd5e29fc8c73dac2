"""The gate inside a test run: each measured case against its baseline, verdict on the test.

Where the baseline comes from: ``--specenergy-compare=last|NAME|NNNN|PATH`` (a stored run of
this machine key) or ``--specenergy-golden=MODE`` (committed golden files, one per test).
Limits come from ``--specenergy-compare-fail`` / ``specenergy_compare_fail`` and, per test,
the ``tolerance(...)`` marker (marker > command line > ini). The regressed test itself fails,
with the numbers, the p-value and the baseline file in its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Mapping

import pytest

from pytest_specenergy.gate import storage
from pytest_specenergy.options import SpecEnergyConfig
from pytest_specenergy.gate.limits import FailExprError
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.compare import Verdict
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.compare import needs_more_repeats
from pytest_specenergy.gate.compare import resolve_inconclusive

#: Limits when neither the command line, the ini file nor a marker names any.
DEFAULT_LIMITS = ("energy_per_token:5%", "accept_length:5%", "equivalence:0")


@dataclass
class Judgement:
    """What the gate decided for one test: its verdict, and what the test must do."""

    comparison: CaseComparison | None
    baseline_path: Path | None = None
    fail: list[str] = field(default_factory=list)
    warn: list[str] = field(default_factory=list)
    skip: str | None = None
    xfail: str | None = None

    @property
    def verdict(self) -> str | None:
        """The verdict's name, or None when nothing was compared."""
        return self.comparison.verdict.value if self.comparison else None


def _apply(policy: str, message: str, judgement: Judgement) -> Judgement:
    """A ``fail`` / ``skip`` / ``warn`` policy applied to ``message``."""
    if policy == "fail":
        judgement.fail.append(message)
    elif policy == "skip":
        judgement.skip = message
    else:
        judgement.warn.append(message)
    return judgement


def tolerance_limits(test: str, mark: Any) -> list[FailLimit]:
    """Limits of a ``tolerance(...)`` marker: ``tolerance(energy_per_token="5%")`` or
    ``tolerance("energy:median:5%")``."""
    if mark is None:
        return []
    texts = [str(a) for a in mark.args] + [f"{k}:{v}" for k, v in mark.kwargs.items()]
    limits = []
    for text in texts:
        try:
            limits.append(parse_fail_expr(text))
        except FailExprError as exc:
            raise pytest.UsageError(f"{test}: marker tolerance value {text!r}: {exc}") from None
    return limits


def merge_limits(*layers: list[FailLimit]) -> list[FailLimit]:
    """Later layers override earlier ones metric by metric (ini < CLI < marker)."""
    merged: dict[str, FailLimit] = {}
    for layer in layers:
        overridden = {limit.metric for limit in layer}
        merged = {k: v for k, v in merged.items() if v.metric not in overridden}
        for limit in layer:
            merged[f"{limit.metric}:{limit.stat}"] = limit
    return list(merged.values())


class Gatekeeper:
    """Finds each case's baseline, compares, and turns the verdict into a test outcome."""

    def __init__(self, config: SpecEnergyConfig) -> None:
        self.config = config
        self.active = bool(config.compare or config.golden)
        self._run: tuple[dict[str, Any], Path] | None = None
        self._run_error: str | None = None
        self.used_goldens: set[str] = set()

    def limits_for(self, item: pytest.Item) -> list[FailLimit]:
        """The limits of one test: marker > command line/ini > the defaults."""
        configured = list(self.config.compare_fail) or [parse_fail_expr(t) for t in DEFAULT_LIMITS]
        return merge_limits(configured, tolerance_limits(item.nodeid, item.get_closest_marker("tolerance")))

    def _stored_baseline(self, machine_key: str, nodeid: str) -> tuple[Mapping[str, Any] | None, Path | None, str | None]:
        if self._run is None and self._run_error is None:
            try:
                path = self._find(machine_key)
                self._run = (storage.load_run(path), path)
            except storage.StorageError as exc:
                self._run_error = str(exc)
        if self._run is None:
            return None, None, self._run_error
        document, path = self._run
        by_node = {r.get("nodeid"): r for r in document.get("results", [])}
        return by_node.get(nodeid), path, None

    def _find(self, machine_key: str) -> Path:
        """The compare run: this machine key's, else the same reference stored under another
        key - which the comparison then reports as INCOMPARABLE instead of silently missing."""
        ref = str(self.config.compare)
        try:
            return storage.find_run(self.config.storage, machine_key, ref)
        except storage.RunNotFound:
            for other in storage.machine_keys(self.config.storage):
                if other == machine_key:
                    continue
                try:
                    return storage.find_run(self.config.storage, other, ref)
                except storage.RunNotFound:
                    continue
            raise

    def judge(self, item: pytest.Item, record: dict[str, Any], machine_key: str,
              repeat: Any = None) -> Judgement:
        """Compare ``record`` with its baseline; ``repeat(extra)`` re-measures with more
        repeats and returns the new record (for INCONCLUSIVE cases)."""
        limits = self.limits_for(item)
        if self.config.golden:
            return self._judge_golden(item, record, machine_key, limits)
        baseline, path, error = self._stored_baseline(machine_key, item.nodeid)
        info = {"machine_key": machine_key}
        if baseline is None:
            comparison = compare_case(None, record, limits, self.config.alpha)
            return self._missing(comparison, path, error)
        baseline_info = {"machine_key": self._run[0].get("machine_key")} if self._run else {}
        comparison = compare_case(baseline, record, limits, self.config.alpha,
                                  baseline_info=baseline_info, current_info=info)
        while needs_more_repeats(comparison) and repeat is not None and \
                len(record["speculative"]["samples"]) < self.config.max_repeats:
            extra = min(self.config.repeats, self.config.max_repeats - len(record["speculative"]["samples"]))
            record = repeat(extra)
            comparison = compare_case(baseline, record, limits, self.config.alpha,
                                      baseline_info=baseline_info, current_info=info)
        return self._outcome(comparison, path)

    def _missing(self, comparison: CaseComparison, path: Path | None, error: str | None) -> Judgement:
        why = error or f"no result for this test in {path}"
        message = f"specenergy: no baseline for {comparison.case_id}: {why}"
        return _apply(self.config.missing_baseline, message, Judgement(comparison, path))

    def _outcome(self, comparison: CaseComparison, path: Path | None) -> Judgement:
        judgement = Judgement(comparison, path)
        verdict = comparison.verdict
        if verdict is Verdict.REGRESSED:
            judgement.fail.append(comparison.failure_message(path))
        elif verdict is Verdict.INCONCLUSIVE:
            resolution = resolve_inconclusive(self.config.inconclusive, comparison, path)
            if resolution.action == "fail":
                judgement.fail.append(resolution.message)
            elif resolution.action == "xfail":
                judgement.xfail = resolution.message
            else:
                judgement.warn.append(resolution.message)
        elif verdict is Verdict.INCOMPARABLE:
            _apply(self.config.incomparable, comparison.failure_message(path), judgement)
        return judgement

    def _judge_golden(self, item: pytest.Item, record: dict[str, Any], machine_key: str,
                      limits: list[FailLimit]) -> Judgement:
        folder = self.config.baselines / machine_key
        self.used_goldens.add(item.nodeid)
        golden = storage.load_golden(folder, item.nodeid)
        info = {"machine_key": machine_key}
        comparison = None
        if golden is not None:
            comparison = compare_case(golden.record, record, limits, self.config.alpha,
                                      baseline_info={"machine_key": machine_key}, current_info=info)
        mismatched = comparison is not None and comparison.verdict in (Verdict.REGRESSED, Verdict.IMPROVED)
        update = storage.update_golden(folder, item.nodeid, record, mode=str(self.config.golden),
                                       mismatched=mismatched, run_info=info)
        if comparison is None:
            judgement = Judgement(compare_case(None, record, limits, self.config.alpha), update.path)
        else:
            judgement = self._outcome(comparison, update.path)
        if update.written:
            # A rewritten golden decides the outcome: snapshot tools fail "created"/"updated".
            if update.fails:
                judgement.fail = [update.message]
            else:
                judgement.fail = []
                judgement.warn.append(update.message)
        return judgement

    def unused_goldens(self, machine_keys: set[str]) -> list[Path]:
        """Golden files of the machine keys used this run that no test used."""
        if not self.config.golden:
            return []
        unused: list[Path] = []
        for key in sorted(machine_keys):
            unused += storage.unused_goldens(self.config.baselines / key, self.used_goldens)
        return unused
