"""The gate inside a test run: each measured case against its baseline, as a :class:`Judgement`.

Where the baseline comes from: ``--specenergy-compare=last|NAME|NNNN|PATH`` (a stored run of
this machine key) or ``--specenergy-golden=MODE`` (committed golden files, one per test).
Limits come from ``--specenergy-compare-fail`` / ``specenergy_compare_fail`` and, per test,
the ``tolerance(...)`` marker (marker > command line > ini). The gatekeeper decides; the
session applies the decision to the test (:mod:`pytest_specenergy.outcome`). When more
repeats could settle a case, :meth:`Gatekeeper.judge` says so with :class:`NeedsRepeats`
and the caller measures them and asks again: the gate never calls back into the session.

A record with a reference drafter's arm (``record["reference"]``, in-job A/B) is judged
against that arm with the paired sequential rule and needs no stored baseline. Every
verdict follows the sequential plan (:func:`~pytest_specenergy.gate.compare.gate_plan`):
looks at ``repeats, repeats + 2, ...`` up to ``max_repeats``; the policies apply at the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Mapping
from typing import Sequence

from pytest_specenergy.gate import storage
from pytest_specenergy.gate.compare import DEFAULT_CAP
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.compare import Verdict
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.compare import compare_in_job
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.compare import repeats_needed
from pytest_specenergy.gate.compare import resolve_inconclusive
from pytest_specenergy.gate.limits import DEFAULT_ALPHA
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.sequential import SequentialPlan


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

    def apply_policy(self, policy: str, message: str) -> Judgement:
        """A ``fail`` / ``skip`` / ``warn`` policy applied to ``message``."""
        if policy == "fail":
            self.fail.append(message)
        elif policy == "skip":
            self.skip = message
        else:
            self.warn.append(message)
        return self


@dataclass(frozen=True)
class NeedsRepeats:
    """The case is INCONCLUSIVE and ``extra`` more repeats of every arm (the plan's next
    look) could settle it."""

    extra: int


@dataclass(frozen=True)
class GatePolicies:
    """What a case does when it cannot be decided: ``fail``, ``warn``, ``skip`` or ``xfail``."""

    inconclusive: str = "warn"
    incomparable: str = "warn"
    missing_baseline: str = "warn"


class Gatekeeper:
    """Finds each case's baseline, compares, and returns the verdict as a :class:`Judgement`.

    Built from plain values, so it is tested without pytest. ``plan`` overrides the
    sequential plan built from ``alpha``, ``repeats`` and ``max_repeats`` (the FDR mode's).
    """

    def __init__(self, *, storage_dir: Path, compare: str | None = None, golden: str | None = None,
                 baselines: Path | None = None, alpha: float = DEFAULT_ALPHA, repeats: int = 3,
                 max_repeats: int = DEFAULT_CAP, policies: GatePolicies = GatePolicies(),
                 plan: SequentialPlan | None = None) -> None:
        self.storage_dir = storage_dir
        self.compare = compare
        self.golden = golden
        self.baselines = baselines
        self.alpha = alpha
        self.repeats = repeats
        self.max_repeats = max_repeats
        self.policies = policies
        self.plan = plan or gate_plan(alpha, repeats, max_repeats)
        self.active = bool(compare or golden)
        self._run: tuple[dict[str, Any], Path] | None = None
        self._run_error: str | None = None
        self._unreadable: str | None = None
        self.used_goldens: set[str] = set()

    def _stored_baseline(self, machine_key: str,
                         nodeid: str) -> tuple[Mapping[str, Any] | None, Path | None, str | None]:
        document, path, error = self.reference_run(machine_key)
        if document is None:
            return None, None, error
        by_node = {r.get("nodeid"): r for r in document.get("results", [])}
        return by_node.get(nodeid), path, None

    @property
    def reference_unreadable(self) -> str | None:
        """Why the compare run exists but cannot be used (unreadable, interrupted), if so."""
        return self._unreadable

    def reference_run(self, machine_key: str) -> tuple[Mapping[str, Any] | None, Path | None, str | None]:
        """The whole compare run (document, path), or why there is none (read once per session)."""
        if self._run is None and self._run_error is None:
            try:
                path = self._find(machine_key)
            except storage.RunNotFound as exc:
                self._run_error = str(exc)
            else:
                # A file that exists but cannot be read, or that an interrupted session wrote,
                # is not a missing baseline: it fails every case compared against it.
                try:
                    document = storage.load_run(path)
                except storage.StorageError as exc:
                    self._unreadable = f"specenergy: the baseline run cannot be read: {exc}"
                else:
                    if storage.is_interrupted(document):
                        self._unreadable = (f"specenergy: the baseline run {path} was saved by an "
                                            f"interrupted session; compare with a complete run")
                    else:
                        self._run = (document, path)
        if self._run is None:
            return None, None, self._run_error or self._unreadable
        document, path = self._run
        return document, path, None

    def _find(self, machine_key: str) -> Path:
        """The compare run: this machine key's, else the same reference stored under another
        key - which the comparison then reports as INCOMPARABLE instead of silently missing."""
        ref = str(self.compare)
        try:
            return storage.find_run(self.storage_dir, machine_key, ref)
        except storage.RunNotFound:
            for other in storage.machine_keys(self.storage_dir):
                if other == machine_key:
                    continue
                try:
                    return storage.find_run(self.storage_dir, other, ref)
                except storage.RunNotFound:
                    continue
            raise

    def judge(self, nodeid: str, record: Mapping[str, Any], machine_key: str,
              limits: Sequence[FailLimit]) -> Judgement | NeedsRepeats:
        """Compare ``record`` with its baseline.

        Returns :class:`NeedsRepeats` while the case is INCONCLUSIVE on a per-repeat metric
        and below the repeat cap; the caller adds the repeats and judges the new record. A
        record with a reference arm is judged in-job against it (no baseline needed).
        """
        if isinstance(record.get("reference"), Mapping):
            comparison = compare_in_job(record, limits, self.alpha, plan=self.plan)
            return self._more_or_outcome(comparison, record, None)
        if self.golden:
            return self._judge_golden(nodeid, record, machine_key, limits)
        baseline, path, error = self._stored_baseline(machine_key, nodeid)
        if self._unreadable:
            comparison = compare_case(None, record, limits, self.alpha)
            return Judgement(comparison, None, fail=[self._unreadable])
        if baseline is None:
            comparison = compare_case(None, record, limits, self.alpha)
            why = error or f"no result for this test in {path}"
            message = f"specenergy: no baseline for {comparison.case_id}: {why}"
            return Judgement(comparison, path).apply_policy(self.policies.missing_baseline, message)
        baseline_info = {"machine_key": self._run[0].get("machine_key")} if self._run else {}
        comparison = compare_case(baseline, record, limits, self.alpha, plan=self.plan,
                                  baseline_info=baseline_info, current_info={"machine_key": machine_key})
        return self._more_or_outcome(comparison, record, path)

    def _more_or_outcome(self, comparison: CaseComparison, record: Mapping[str, Any],
                         path: Path | None) -> Judgement | NeedsRepeats:
        """More repeats up to the plan's next look while INCONCLUSIVE, else the outcome."""
        have = len(record["speculative"]["samples"])
        extra = min(repeats_needed(comparison), self.plan.cap - have)
        if extra > 0:
            return NeedsRepeats(extra)
        return self._outcome(comparison, path)

    def _outcome(self, comparison: CaseComparison, path: Path | None) -> Judgement:
        judgement = Judgement(comparison, path)
        verdict = comparison.verdict
        if verdict is Verdict.REGRESSED:
            judgement.fail.append(comparison.failure_message(path))
        elif verdict is Verdict.INCONCLUSIVE:
            resolution = resolve_inconclusive(self.policies.inconclusive, comparison, path)
            if resolution.action == "fail":
                judgement.fail.append(resolution.message)
            elif resolution.action == "xfail":
                judgement.xfail = resolution.message
            else:
                judgement.warn.append(resolution.message)
        elif verdict is Verdict.INCOMPARABLE:
            judgement.apply_policy(self.policies.incomparable, comparison.failure_message(path))
        return judgement

    def _judge_golden(self, nodeid: str, record: Mapping[str, Any], machine_key: str,
                      limits: Sequence[FailLimit]) -> Judgement:
        folder = Path(self.baselines or "specenergy_baselines") / machine_key
        self.used_goldens.add(nodeid)
        golden = storage.load_golden(folder, nodeid)
        info = {"machine_key": machine_key}
        comparison = None
        if golden is not None:
            comparison = compare_case(golden.record, record, limits, self.alpha, plan=self.plan,
                                      baseline_info={"machine_key": machine_key}, current_info=info)
        mismatched = comparison is not None and comparison.verdict in (Verdict.REGRESSED, Verdict.IMPROVED)
        update = storage.update_golden(folder, nodeid, record, mode=str(self.golden),
                                       mismatched=mismatched, run_info=info)
        if comparison is None:
            judgement = Judgement(compare_case(None, record, limits, self.alpha), update.path)
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
        if not self.golden:
            return []
        unused: list[Path] = []
        for key in sorted(machine_keys):
            unused += storage.unused_goldens(Path(self.baselines or "specenergy_baselines") / key,
                                             self.used_goldens)
        return unused
