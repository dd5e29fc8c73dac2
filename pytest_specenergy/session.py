"""The session object: the registered plugin whose hook methods delegate; to whom:
docs/engines.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import pytest

from pytest_specenergy import xdist
from pytest_specenergy.cases.markers import MarkerError
from pytest_specenergy.cases.markers import build_cases

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_specenergy.cases.case import Case
    from pytest_specenergy.document import CaseRecord
    from pytest_specenergy.document import MachineInfo
    from pytest_specenergy.document import RunDocument
    from pytest_specenergy.gate.gatekeeper import Gatekeeper
    from pytest_specenergy.gate.limits import FailLimit
    from pytest_specenergy.measure.pairs import PairMeasurer
    from pytest_specenergy.measure.results import PairResult
    from pytest_specenergy.options import SpecEnergyConfig
    from pytest_specenergy.report.summary import SummaryReport

# Collection needs only the markers: measurement, gate and report modules (numpy, HTTP, the run
# document) load on first use (benchmarks/plugin_overhead.py measures the start,
# tests/unit/test_lazy_imports.py guards it).

SESSION_KEY = pytest.StashKey["SpecEnergySession"]()
#: The pair a test measured, for the post-call validity checks and the gate.
PAIR_KEY = pytest.StashKey["PairResult"]()


class SpecEnergySession:
    """Session-wide state and the hook methods: what the ``specenergy`` fixture returns."""

    def __init__(
        self,
        config: SpecEnergyConfig,
        hook: Any = None,
        progress: Any = None,
        preloaded: dict[Path, RunDocument] | None = None,
    ) -> None:
        self.config, self.hook = config, hook
        #: The compare runs the start check read (``preflight.compare_problem``), read once.
        self.preloaded = dict(preloaded or {})
        self.progress = progress  # a progress.Progress
        self.planned: list[Case] = []
        self.xdist_worker = False  # a worker collects every case and runs the ones it is sent
        self._measurer: PairMeasurer | None = None
        self._gate: Gatekeeper | None = None
        #: One record per test that measured a pair, with its verdict (xdist: every worker's).
        self.records: list[CaseRecord] = []
        #: machine key -> machine description, for every key this run measured on.
        self.machines: dict[str, MachineInfo] = {}
        #: xdist: spec_pair tests failed unmeasured (--specenergy-xdist=off); a worker crashed (run
        #: saved interrupted).
        self.xdist_skipped, self.worker_lost = 0, False
        #: ``--specenergy-fdr``: gated per-repeat comparisons collected (BH's N).
        self.fdr_tests = 0
        #: Why nothing can be measured here (an xdist worker's start check; elsewhere a usage error).
        self.refusal: str | None = None
        #: What the terminal summary prints, built when the session finishes.
        self.report: SummaryReport | None = None
        #: Cases whose pair the ``pytest_specenergy_pair_measured`` hook was told of.
        self._announced: set[Case] = set()

    @property
    def measurer(self) -> PairMeasurer:
        """The pair measurer, built on first use with the planned cases."""
        if self._measurer is None:
            self._measurer = self.config.pair_measurer(self._hook_meter, self.progress)
            self._measurer.plan(self.planned)
            if not self.xdist_worker:
                self._measurer.start_planned()
        return self._measurer

    @property
    def gate(self) -> Gatekeeper:
        """The gatekeeper, built on first use from the options."""
        if self._gate is None:
            self._gate = self.config.gatekeeper(self.fdr_tests, self.preloaded)
        return self._gate

    def _hook_meter(self, kind: str, server: Any) -> Any:
        return (
            None
            if self.hook is None
            else self.hook.pytest_specenergy_make_meter(kind=kind, engine=server)
        )

    def measure(self, case: Case) -> PairResult:
        """The pair for ``case``, measured once per session; the hook hears of each pair once,
        when its test first asks (a case measured in a sibling's cycles was measured before)."""
        if self.refusal:
            pytest.fail(self.refusal, pytrace=False)
        pair = self.measurer.measure(case)
        if case not in self._announced and self.hook is not None:
            self._announced.add(case)
            self.hook.pytest_specenergy_pair_measured(pair=pair)
        return pair

    def limits_for(self, item: pytest.Item, strict: bool = True) -> list[FailLimit]:
        """The limits of one test: marker > command line/ini > defaults; for a bad marker, none
        unless ``strict``."""
        from pytest_specenergy.gate.limits import FailExprError
        from pytest_specenergy.gate.limits import limits_of_test

        try:
            return limits_of_test(self.config.compare_fail, item.get_closest_marker("tolerance"))
        except FailExprError as exc:
            if not strict:
                return []  # the test itself reports its bad marker
            raise pytest.UsageError(f"{item.nodeid}: {exc}") from None

    def settle(self, item: pytest.Item, pair: PairResult, body_failed: bool) -> None:
        """Record the pair, judge it (adding repeats while the gate asks), apply the outcome."""
        __tracebackhide__ = True
        from pytest_specenergy import outcome
        from pytest_specenergy.gate.gatekeeper import NeedsRepeats
        from pytest_specenergy.gate.machine import pair_machine

        # The machine key of the run the pair was measured in (meter + engine + GPUs).
        key, info = pair_machine(
            pair.speculative.engine, self.measurer.meter_description(pair.source), pair.source
        )
        self.machines.setdefault(key, info)
        record = pair.record(item.nodeid, key)
        judgement = None
        # A reference drafter's arm is judged in-job, with or without a stored baseline.
        if self.config.compare or self.config.golden or record.reference is not None:
            limits = self.limits_for(item)
            decision = self.gate.judge(record, limits)
            while isinstance(decision, NeedsRepeats):
                pair = self.measurer.add_repeats(pair.case, decision.extra)
                record = pair.record(item.nodeid, key)
                decision = self.gate.judge(record, limits)
            judgement, record = decision, decision.applied_to(record)
        self.records.append(record)
        item.stash[xdist.RECORD_KEY] = record  # under xdist it travels on the test's report
        outcome.add_properties(item, record)
        outcome.apply(
            item, pair.failed_checks, self.config.checks, judgement, pair.describe(), body_failed
        )

    # -- hooks ----------------------------------------------------------------------------
    def pytest_report_header(self, config: pytest.Config) -> str:
        """One header line with the measurement options."""
        return self.config.header()

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize ``specenergy_case`` from the test's markers."""
        if "spec_pair" not in metafunc.fixturenames:
            return
        definition = metafunc.definition
        try:  # the tolerance marker too: a typo is a collection error, not found after measuring
            if definition.get_closest_marker("tolerance") is not None:  # else only parsed options
                self.limits_for(definition)
            cases = build_cases(
                definition.nodeid, definition.get_closest_marker, self.config.case_defaults()
            )
        except (
            MarkerError,
            pytest.UsageError,
        ) as exc:  # the message, not a traceback from the plugin
            raise pytest.Collector.CollectError(f"specenergy: {exc}") from None
        metafunc.parametrize("specenergy_case", cases, ids=[c.id for c in cases])

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Plan the collected cases; under ``--specenergy-dry-run`` print their command lines."""
        items = [
            item
            for item in session.items
            if hasattr(item, "callspec") and "specenergy_case" in item.callspec.params
        ]
        self.planned = [item.callspec.params["specenergy_case"] for item in items]
        self.xdist_worker = xdist.is_worker(session.config)
        # BH's N: the gated per-repeat comparisons (case x limit) of the collected tests
        if self.config.fdr:
            from pytest_specenergy.gate.limits import per_repeat_count

            self.fdr_tests = per_repeat_count(self.limits_for(item, strict=False) for item in items)
        if self._measurer is not None:
            self._measurer.plan(self.planned)
        self._refuse_unpairable(items)
        measuring = not (
            self.config.dry_run or self.config.plan or session.config.option.collectonly
        )
        if measuring:  # an engine that cannot start here is found before the first one starts
            from pytest_specenergy.preflight import start_problems

            if problems := start_problems(self.config, self.planned):
                if not self.xdist_worker:
                    raise pytest.UsageError("specenergy: " + "; ".join(problems))
                # A worker's usage error reaches the controller as a bare INTERNALERROR: each of
                # its cases fails with the message instead, before measuring anything.
                self.refusal = "specenergy: " + "; ".join(problems)
        if (self.config.plan or self.config.budget) and not self.xdist_worker:
            self._show_plan(items, session.config)
        if self.config.dry_run:
            from pytest_specenergy.engines.dry_run import show_dry_run

            if refused := show_dry_run(
                self.planned, session.config.pluginmanager.get_plugin("terminalreporter")
            ):
                raise pytest.UsageError(refused)

    def _refuse_unpairable(self, items: list[pytest.Item]) -> None:
        """A gated test whose arms will run blocked (one GPU engine at a time), with a limit no
        block-drift allowance leaves room in, is a usage error now, not INCONCLUSIVE after the cap
        (``gate/pairing.py``). Where the GPU's memory is unknown here (no NVML) the runner
        decides, and nothing is refused."""
        stored = bool(self.config.compare or self.config.golden)
        gated = [
            item
            for item in items
            if stored or item.callspec.params["specenergy_case"].reference is not None
        ]
        if not gated:
            return
        from pytest_specenergy.engines.sglang_residency import UNKNOWN_MEMORY
        from pytest_specenergy.gate.limits import DEFAULT_BLOCK_DRIFT
        from pytest_specenergy.gate.pairing import allowance_refusals
        from pytest_specenergy.measure import pairs
        from pytest_specenergy.plan.residency import gpu_residency
        from pytest_specenergy.plan.residency import on_gpu

        if not any(on_gpu(item.callspec.params["specenergy_case"]) for item in gated):
            return
        residency = gpu_residency(
            self.planned, pairs.engine_gpu_memory, pairs.installed_server_fields
        )
        if residency is None or residency.resident or residency.reason == UNKNOWN_MEMORY:
            return
        refusals = allowance_refusals(
            (
                (
                    item.nodeid,
                    self.limits_for(item, strict=False),
                    residency.reason if on_gpu(item.callspec.params["specenergy_case"]) else None,
                )
                for item in gated
            ),
            DEFAULT_BLOCK_DRIFT,
            sides=2 if stored else 1,
        )
        if refusals:
            raise pytest.UsageError("specenergy: " + "; ".join(refusals))

    def _show_plan(self, items: list[pytest.Item], config: pytest.Config) -> None:
        """Print the suite's modeled GPU minutes; refuse it when it cannot fit the budget."""
        from pytest_specenergy.plan.budget import plan_lines

        options = self.config
        lines, refusal = plan_lines(
            [(item.nodeid, item.callspec.params["specenergy_case"]) for item in items],
            options.plan_gpu,
            repeats=options.measured_repeats,
            cap=options.max_repeats,
            warmup=1 if options.warmup is None else options.warmup,
            gated=bool(options.compare or options.golden),
            budget=options.budget,
        )
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        for line in lines:
            reporter.write_line(line) if reporter is not None else print(line)
        if refusal:
            raise pytest.UsageError(f"specenergy: {refusal}")

    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """Under a dry run or a plan, run nothing: the cases were printed at collection."""
        return True if self.config.dry_run or self.config.plan else None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """After the body: record the pair it measured, run checks and gate, set the outcome."""
        __tracebackhide__ = (
            True  # a failure shows the test's line and the message, not this wrapper
        )
        body_error: BaseException | None = None
        try:
            result = yield
        except BaseException as exc:  # re-raised below, after the pair is recorded
            body_error, result = exc, None
        pair = item.stash.get(PAIR_KEY, None)
        if pair is not None:
            self.settle(
                item,
                pair,
                body_error is not None and not isinstance(body_error, pytest.skip.Exception),
            )
        if body_error is not None:
            raise body_error
        return result

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: a worker's skipped count; a worker that crashed interrupts the run."""
        self.xdist_skipped += int(getattr(node, "workeroutput", {}).get(xdist.SKIPPED_KEY, 0))
        self.worker_lost = self.worker_lost or error is not None

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Decide the suite, write the outputs, build the summary; a session cut short (Ctrl-C,
        SIGTERM, ``-x``, a crashed worker) is saved marked ``interrupted``, which no reference
        (``last``, a name) selects."""
        if xdist.is_worker(session.config):
            session.config.workeroutput[xdist.SKIPPED_KEY] = self.xdist_skipped  # type: ignore[attr-defined]
            return
        interrupted = (
            exitstatus == pytest.ExitCode.INTERRUPTED
            or bool(session.shouldstop or session.shouldfail)
            or self.worker_lost
        )
        if (
            self.finish(session.config.hook, interrupted)
            and session.exitstatus == pytest.ExitCode.OK
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def finish(self, hook: Any, interrupted: bool) -> bool:
        """Judge the suite, write the run document and the queued goldens, build the summary; True:
        fail the session."""
        coverage = self._coverage()
        if not self.records:  # a collection, or nothing measured: no run; the gate's coverage
            return self._finish_unmeasured(coverage)
        import pytest_specenergy.gate.machine as machine
        from pytest_specenergy.document import RunDocument
        from pytest_specenergy.gate.suite import judge_suite
        from pytest_specenergy.outputs import write_outputs
        from pytest_specenergy.report.terminal import summary_report

        suite = judge_suite(
            self.records,
            plan=self.gate.plan,
            fdr_q=self.config.fdr,
            fdr_collected=self.fdr_tests,
            latency_targets=self.config.latency_targets,
            references=self.gate.latency_references({r.machine_key for r in self.records}),
            coverage=coverage,
        )
        meters, starts = (
            (self._measurer.describe_meters(), len(self._measurer.pool.starts))
            if self._measurer
            else ({}, 0)
        )
        document = RunDocument.build(
            self.records,
            meters,
            starts,
            self.machines,
            host=machine.machine_info(),
            interrupted=interrupted,
            fdr=suite.fdr,
            latency_targets=suite.latency_targets,
            commit=machine.source_commit(self.config.rootdir),
            coverage=suite.coverage,
        )
        written = write_outputs(document, self.config, self.gate, hook)
        self.report = summary_report(
            document, suite, written, self.xdist_skipped, self.config.verbose > 0
        )
        return suite.failed or bool(written.failures)

    def _coverage(self) -> list[Any]:
        """The gate's coverage (``gate/coverage.py``): per baseline, its cases this session did not
        measure; nothing when no stored or golden baseline is compared with."""
        if not (self.config.compare or self.config.golden):
            return []
        from pytest_specenergy.gate.coverage import resolve_policy

        return self.gate.coverage(
            self.records, self.config.unmeasured_ok, resolve_policy(self.config.unmeasured)
        )

    def _finish_unmeasured(self, coverage: list[Any]) -> bool:
        """A session that measured no pair: the xdist refusal and the gate's coverage (a ``-k``
        that deselects every gated case covers nothing of its baseline); True: fail it."""
        from pytest_specenergy.gate.coverage import coverage_section
        from pytest_specenergy.report.summary import SummaryReport

        sections = SummaryReport.of_nothing(self.xdist_skipped).sections
        covered = coverage_section(coverage)
        if covered is not None:
            sections += (covered,)
        self.report = SummaryReport(sections) if sections else None
        return covered is not None and covered.failed

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        """The report :meth:`finish` built (controller only)."""
        if self.report is not None and not xdist.is_worker(config):
            self.report.write(terminalreporter)

    def close(self) -> None:
        """Stop every engine and release meters."""
        if self._measurer is not None:
            self._measurer.close()
