"""The gate inside a test run: each measured case against its baseline (a stored run, a golden file
or a reference drafter's arm), as a :class:`Judgement`, or :class:`NeedsRepeats` (the gate never
calls back into the session). More: docs/gate.md#the-gatekeeper."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Mapping
from typing import Sequence

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import CoverageFacts
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.baseline import refusal
from pytest_specenergy.gate.baseline import refusal_message
from pytest_specenergy.gate.baseline import refused_comparison
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.compare import compare_in_job
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.compare import repeats_needed
from pytest_specenergy.gate.compare import resolve_inconclusive
from pytest_specenergy.gate.coverage import coverage_of
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.sequential import SequentialPlan
from pytest_specenergy.gate.session_term import HISTORY_RUNS
from pytest_specenergy.gate.settings import DEFAULT_ALPHA
from pytest_specenergy.gate.settings import DEFAULT_CAP
from pytest_specenergy.gate.storage import GoldenStore
from pytest_specenergy.gate.storage import RunNotFound
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.gate.storage import StorageError
from pytest_specenergy.gate.suite import fdr_pending
from pytest_specenergy.gate.verdict import Verdict


@dataclass
class Judgement:
    """What the gate decided for one test: its verdict, and what the test must do."""

    comparison: CaseComparison | None
    baseline_path: Path | None = None
    fail: list[str] = field(default_factory=list)
    warn: list[str] = field(default_factory=list)
    skip: str | None = None
    xfail: str | None = None
    #: ``--specenergy-fdr``: the comparisons that pass for now and BH decides at session end.
    fdr_pending: tuple[str, ...] = ()

    @property
    def verdict(self) -> str | None:
        """The verdict's name, or None when nothing was compared."""
        return self.comparison.verdict.value if self.comparison else None

    def applied_to(self, record: CaseRecord) -> CaseRecord:
        """``record`` with this verdict, its comparison, baseline file and pending FDR comparisons."""
        return record.judged(
            self.verdict,
            self.comparison.record() if self.comparison else None,
            self.baseline_path and str(self.baseline_path),
            self.fdr_pending or None,
        )

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
    """The case is INCONCLUSIVE; ``extra`` more repeats of every arm (the next look) could settle
    it."""

    extra: int


@dataclass(frozen=True)
class GatePolicies:
    """What a case does when it cannot be decided: ``fail``, ``warn``, ``skip`` or ``xfail``. A case
    that cannot be compared, or has no baseline, fails by default: a gate never passes quietly what
    it could not judge."""

    inconclusive: str = "warn"
    incomparable: str = "fail"
    missing_baseline: str = "fail"


class Gatekeeper:
    """Finds each case's baseline, compares, and returns the verdict as a :class:`Judgement`; built
    from plain values and stores, so it is tested without pytest (the arguments:
    docs/gate.md)."""

    def __init__(
        self,
        *,
        runs: RunStore,
        goldens: GoldenStore | None = None,
        compare: str | None = None,
        golden: str | None = None,
        alpha: float = DEFAULT_ALPHA,
        repeats: int = 3,
        max_repeats: int = DEFAULT_CAP,
        policies: GatePolicies = GatePolicies(),
        plan: SequentialPlan | None = None,
        fdr: tuple[float, int] | None = None,
        preloaded: Mapping[Path, RunDocument] | None = None,
    ) -> None:
        self.runs = runs
        self.goldens = goldens or GoldenStore()
        self.compare = compare
        self.golden = golden
        self.alpha = alpha
        self.policies = policies
        self.plan = plan or gate_plan(alpha, repeats, max_repeats)
        #: ``--specenergy-fdr``: (Q, the number of gated comparisons collected).
        self.fdr = fdr
        #: Runs already read and checked (the session's start check): never read twice.
        self.preloaded = dict(preloaded or {})
        self.active = bool(compare or golden)
        self._run: tuple[RunDocument, Path] | None = None
        self._run_error: str | None = None
        self._unreadable: str | None = None
        #: Per machine key, the complete stored runs read for the between-session term.
        self._histories: dict[str, list[RunDocument]] = {}

    def reference_run(self, machine_key: str) -> tuple[RunDocument | None, Path | None, str | None]:
        """The whole compare run (document, path), or why there is none (read once per session)."""
        if self._run is None and self._run_error is None and self._unreadable is None:
            # An unreadable or interrupted run is not a missing baseline: it fails every case.
            try:
                path = self.runs.find_any(machine_key, str(self.compare))
                document = self.preloaded.get(path) or self.runs.load(path)
            except RunNotFound as exc:
                self._run_error = str(exc)
            except StorageError as exc:
                self._unreadable = f"specenergy: the baseline run cannot be read: {exc}"
            else:
                if document.interrupted:
                    self._unreadable = (
                        f"specenergy: the baseline run {path} was saved by an "
                        f"interrupted session; compare with a complete run"
                    )
                else:
                    self._run = (document, path)
        if self._run is None:
            return None, None, self._run_error or self._unreadable
        return self._run[0], self._run[1], None

    def coverage(
        self, records: Sequence[CaseRecord], accept: Sequence[str] = (), policy: str = "fail"
    ) -> list[CoverageFacts]:
        """Per baseline this session compared with (the compare run on each machine key, or the
        golden folder of each), the cases of it ``records`` did not measure; a session that
        measured nothing is held against every stored run the reference names."""
        measured = {r.key for r in records}
        if self.golden:
            return self._golden_coverage(records, accept, policy)
        if not self.compare:
            return []
        found: dict[Path, RunDocument] = {}
        for key in sorted({str(r.machine_key) for r in records if r.machine_key}):
            document, path, _ = self.reference_run(key)
            if document is not None and path is not None:
                found[path] = document
        if not records:
            found.update(self._references_anywhere())
        return [
            coverage_of(
                (r.key for r in document.results),
                measured,
                baseline=str(path),
                machine_key=document.machine_key,
                accept=accept,
                policy=policy,
            )
            for path, document in found.items()
        ]

    def _references_anywhere(self) -> dict[Path, RunDocument]:
        """The runs the compare reference names on every machine key stored (a PATH: that file),
        for a session that measured nothing and so has no machine key; unreadable ones are left
        out (a missing or unreadable baseline stops the session at start)."""
        ref = str(self.compare)
        paths: list[Path] = []
        if ref.endswith(".json") or "/" in ref or "\\" in ref:
            paths = [Path(ref)] if Path(ref).is_file() else []
        else:
            for key in self.runs.machine_keys():
                try:
                    paths.append(self.runs.find(key, ref))
                except StorageError:
                    continue
        found = {}
        for path in paths:
            try:
                found[path] = self.runs.load(path)
            except StorageError:
                continue
        return found

    def _golden_coverage(
        self, records: Sequence[CaseRecord], accept: Sequence[str], policy: str
    ) -> list[CoverageFacts]:
        """Per machine key measured (none measured: every key folder), the goldens no test used."""
        keys = {str(r.machine_key) for r in records if r.machine_key}
        if not records and self.goldens.root.is_dir():
            keys = {p.name for p in self.goldens.root.iterdir() if p.is_dir()}
        coverages = []
        for key in sorted(keys):
            unused = [self.goldens.nodeid_of(p) for p in self.goldens.unused([key])]
            used = [n for k, n in self.goldens.used if k == key]
            coverage = coverage_of(
                [*unused, *used],
                used,
                baseline=str(self.goldens.root / key),
                machine_key=key,
                accept=accept,
                policy=policy,
            )
            if coverage.unmeasured or coverage.accepted:
                coverages.append(coverage)
        return coverages

    def latency_references(
        self, machine_keys: set[str | None]
    ) -> dict[str, tuple[RunDocument | None, str, bool]]:
        """Per machine key, the compare run latency targets are judged against: (run or None, file
        or why, fatal)."""
        if not self.compare:
            return {}
        refs = {}
        for key in sorted(k for k in machine_keys if k):
            document, path, why = self.reference_run(key)
            fatal = self.policies.missing_baseline == "fail" or self._unreadable is not None
            refs[key] = (document, str(path) if document is not None else str(why), fatal)
        return refs

    def judge(self, record: CaseRecord, limits: Sequence[FailLimit]) -> Judgement | NeedsRepeats:
        """Compare ``record`` (its ``nodeid`` and ``machine_key`` set) with its baseline or
        reference arm; :class:`NeedsRepeats` while INCONCLUSIVE below the cap (the caller adds
        repeats and asks again); under ``fdr`` the comparisons BH decides at session end pass with a
        warning."""
        decision = self._decide(record, limits)
        if self.fdr and isinstance(decision, Judgement) and decision.comparison is not None:
            decision.fdr_pending, warnings = fdr_pending(record.key, decision.comparison, *self.fdr)
            decision.warn += warnings
        return decision

    def _decide(self, record: CaseRecord, limits: Sequence[FailLimit]) -> Judgement | NeedsRepeats:
        if record.reference is not None:
            comparison = compare_in_job(record, limits, self.alpha, plan=self.plan)
            return self._more_or_outcome(comparison, record, None)
        if self.golden:
            return self._judge_golden(record, limits)
        key = str(record.machine_key)
        document, path, error = self.reference_run(key)
        if self._unreadable:
            return Judgement(
                compare_case(None, record, limits, self.alpha), None, fail=[self._unreadable]
            )
        baseline = {r.key: r for r in document.results}.get(record.key) if document else None
        if baseline is None:
            comparison = compare_case(None, record, limits, self.alpha)
            why = error or f"no result for this test in {path}"
            message = f"specenergy: no baseline for {comparison.case_id}: {why}"
            return Judgement(comparison, path).apply_policy(self.policies.missing_baseline, message)
        why = refusal(baseline)
        if why:  # fails whatever the incomparable policy: a broken baseline is no baseline
            return Judgement(
                refused_comparison(record.key, why, self.alpha),
                path,
                fail=[refusal_message(record.key, path, why)],
            )
        comparison = compare_case(
            baseline,
            record,
            limits,
            self.alpha,
            plan=self.plan,
            baseline_info={"machine_key": document.machine_key},  # type: ignore[union-attr]
            current_info={"machine_key": key},
            history=self._history(key, record.key, baseline, path),
        )
        return self._more_or_outcome(comparison, record, path)

    def _history(
        self, machine_key: str, test: str, baseline: CaseRecord, path: Path | None
    ) -> list[CaseRecord]:
        """The test's records in the last complete stored runs of ``machine_key`` (read once per
        session), the compare run's ``baseline`` among them: what the between-session term is
        estimated from (``gate/session_term.py``). A stored run that cannot be read adds nothing
        here (the compare run itself was read and checked above)."""
        if machine_key not in self._histories:
            documents = []
            for stored in self.runs.list(machine_key)[-HISTORY_RUNS:]:
                if path is not None and stored.path == path:
                    continue
                try:
                    document = self.runs.load(stored.path)
                except StorageError:
                    continue
                if not document.interrupted:
                    documents.append(document)
            self._histories[machine_key] = documents
        others = [r for d in self._histories[machine_key] for r in d.results if r.key == test]
        return [baseline, *others]

    def _more_or_outcome(
        self, comparison: CaseComparison, record: CaseRecord, path: Path | None
    ) -> Judgement | NeedsRepeats:
        """More repeats up to the plan's next look while INCONCLUSIVE, else the outcome."""
        extra = min(repeats_needed(comparison), self.plan.cap - len(record.speculative.samples))
        return NeedsRepeats(extra) if extra > 0 else self._outcome(comparison, path)

    def _outcome(self, comparison: CaseComparison, path: Path | None) -> Judgement:
        judgement = Judgement(comparison, path)
        verdict = comparison.verdict
        if verdict is Verdict.REGRESSED:
            judgement.fail.append(comparison.failure_message(path))
        elif verdict is Verdict.INCONCLUSIVE:
            resolution = resolve_inconclusive(self.policies.inconclusive, comparison, path)
            if resolution.action == "xfail":
                judgement.xfail = resolution.message
            else:
                judgement.apply_policy(resolution.action, resolution.message)
        elif verdict is Verdict.INCOMPARABLE:
            judgement.apply_policy(self.policies.incomparable, comparison.failure_message(path))
        return judgement

    def _judge_golden(self, record: CaseRecord, limits: Sequence[FailLimit]) -> Judgement:
        key, nodeid = str(record.machine_key), str(record.nodeid)
        golden = self.goldens.load(key, nodeid)
        why = None if golden is None else refusal(golden.record)
        if golden is not None and why:
            self.goldens.used.add((key, nodeid))
            return Judgement(
                refused_comparison(record.key, why, self.alpha),
                golden.path,
                fail=[refusal_message(record.key, golden.path, why)],
            )
        broken = refusal(record, "current")
        if broken and (golden is None or self.golden in ("update", "regen-all")):
            # A golden written from a broken measurement would be refused by every later run.
            self.goldens.used.add((key, nodeid))
            return Judgement(
                compare_case(
                    None if golden is None else golden.record,
                    record,
                    limits,
                    self.alpha,
                    plan=self.plan,
                ),
                self.goldens.path(key, nodeid),
                fail=[f"specenergy: no golden baseline written for {nodeid}: {broken}"],
            )
        info = {"machine_key": key}
        # No golden: NO_BASELINE, which the outcome leaves to the golden mode below.
        comparison = compare_case(
            None if golden is None else golden.record,
            record,
            limits,
            self.alpha,
            plan=self.plan,
            baseline_info=info,
            current_info=info,
        )
        mismatched = comparison.verdict in (Verdict.REGRESSED, Verdict.IMPROVED)
        update = self.goldens.update(
            key, nodeid, record, mode=str(self.golden), mismatched=mismatched, run_info=info
        )
        judgement = self._outcome(comparison, update.path)
        if update.written:
            # A rewritten golden decides the outcome: snapshot tools fail "created"/"updated".
            if update.fails:
                judgement.fail = [update.message]
            else:
                judgement.fail = []
                judgement.warn.append(update.message)
        return judgement
