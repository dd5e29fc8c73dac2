"""The session object: the one registered plugin instance that carries the hook methods.

``plugin.pytest_configure`` builds :class:`SpecEnergySession` from the resolved options and
registers it (as pytest's ``junitxml.LogXML`` is registered). Each hook method delegates in a
few lines: cases from :mod:`.cases.markers`, pairs from :class:`.measure.pairs.PairMeasurer`,
verdicts from :class:`.gate.gatekeeper.Gatekeeper`, outcomes by :mod:`.outcome`, the run
document by :mod:`.document`. Lower layers never call back into this object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import pytest

from pytest_specenergy import xdist
from pytest_specenergy.cases.markers import MarkerError
from pytest_specenergy.cases.markers import build_cases

if TYPE_CHECKING:
    from pytest_specenergy.cases.case import Case
    from pytest_specenergy.gate.gatekeeper import Gatekeeper
    from pytest_specenergy.gate.limits import FailLimit
    from pytest_specenergy.measure.pairs import PairMeasurer
    from pytest_specenergy.measure.results import PairResult
    from pytest_specenergy.options import SpecEnergyConfig

# Collection needs only the markers: measurement, gate and report modules (numpy, HTTP,
# subprocess supervision) are imported when first used, so a suite collects about as fast as
# plain parametrize (benchmarks/plugin_overhead.py).

SESSION_KEY = pytest.StashKey["SpecEnergySession"]()
#: The pair a test measured, for the post-call validity checks and the gate.
PAIR_KEY = pytest.StashKey["PairResult"]()


class SpecEnergySession:
    """Session-wide state and the hook methods: what the ``specenergy`` fixture returns."""

    def __init__(self, config: SpecEnergyConfig, hook: Any = None) -> None:
        self.config = config
        self.hook = hook
        self.planned: list[Case] = []
        self._measurer: PairMeasurer | None = None
        self._gate: Gatekeeper | None = None
        #: One JSON-ready record per test that measured a pair (``PairResult.as_dict()`` plus
        #: ``nodeid`` and the gate's verdict), in test order; under xdist the controller
        #: receives the workers' records here.
        self.records: list[dict[str, Any]] = []
        #: machine key -> machine description, for every key this run measured on.
        self.machines: dict[str, dict[str, Any]] = {}
        #: Run files written to the history this session.
        self.saved: list[Any] = []
        #: spec_pair tests skipped because xdist ran without --specenergy-xdist=per-gpu.
        self.xdist_skipped = 0
        #: ``--specenergy-fdr``: gated per-repeat comparisons collected (BH's N), and the
        #: suite's BH result once the session finished.
        self.fdr_tests = 0
        self.fdr_result: Any = None
        self.latency_lines: list[str] = []
        self.latency_failed = False

    @property
    def measurer(self) -> PairMeasurer:
        """The pair measurer, built on first use with the planned cases."""
        if self._measurer is None:
            from pytest_specenergy.engines.pool import EnginePool
            from pytest_specenergy.measure.pairs import PairMeasurer

            config = self.config
            pool = EnginePool(config.log_dir, config.startup_timeout,
                              request_timeout_s=config.request_timeout)
            self._measurer = PairMeasurer(
                log_dir=config.log_dir, startup_timeout=config.startup_timeout, meter=config.meter,
                repeats=config.repeats, warmup=config.warmup, meter_factory=self._hook_meter,
                pool=pool, cooldown_s=config.cooldown, draft_removal=config.draft_removal)
            self._measurer.plan(self.planned)
        return self._measurer

    @property
    def gate(self) -> Gatekeeper:
        """The gatekeeper, built on first use from the options."""
        if self._gate is None:
            from pytest_specenergy.gate.compare import gate_plan
            from pytest_specenergy.gate.fdr import fdr_plan
            from pytest_specenergy.gate.gatekeeper import Gatekeeper
            from pytest_specenergy.gate.gatekeeper import GatePolicies

            config = self.config
            plan = gate_plan(config.alpha, config.repeats, config.max_repeats)
            if config.fdr:
                # REGRESSED early only where BH fails the case whatever the others show.
                plan = fdr_plan(plan, config.fdr, max(1, self.fdr_tests))
            self._gate = Gatekeeper(
                storage_dir=config.storage, compare=config.compare, golden=config.golden,
                baselines=config.baselines, alpha=config.alpha, repeats=config.repeats,
                max_repeats=config.max_repeats, plan=plan,
                policies=GatePolicies(config.inconclusive, config.incomparable, config.missing_baseline))
        return self._gate

    @property
    def gate_active(self) -> bool:
        """Whether any case is compared with a baseline this session."""
        return bool(self.config.compare or self.config.golden)

    @property
    def engine_starts(self) -> int:
        """How many engine processes this session started."""
        return len(self._measurer.pool.starts) if self._measurer else 0

    @property
    def pool(self) -> Any:
        """The engine pool (one server process per engine config)."""
        return self.measurer.pool

    def _hook_meter(self, kind: str, server: Any) -> Any:
        if self.hook is None:
            return None
        return self.hook.pytest_specenergy_make_meter(kind=kind, engine=server)

    # -- measuring ------------------------------------------------------------------------
    def measure(self, case: Case) -> PairResult:
        """The pair for ``case``, measured once per session."""
        fresh = not self.measurer.measured(case)
        pair = self.measurer.measure(case)
        if fresh and self.hook is not None:
            self.hook.pytest_specenergy_pair_measured(pair=pair)
        return pair

    def machine_key_for(self, pair: PairResult) -> str:
        """The machine key of the run a pair was measured in (meter + engine + GPUs)."""
        from pytest_specenergy.gate.machine import machine_info
        from pytest_specenergy.gate.machine import machine_key

        engine = pair.speculative.engine
        name, version = str(engine.get("engine")), str(engine.get("version"))
        version = version.removeprefix(f"{name}-")  # the reference server says "reference-0.1.0"
        meter = self.measurer.meter_description(pair.source)
        info = machine_info(meter or {"kind": pair.source, "label": pair.source},
                            engine={"name": name, "version": version})
        key = machine_key(info)
        self.machines.setdefault(key, info)
        return key

    def limits_for(self, item: pytest.Item) -> list[FailLimit]:
        """The regression limits of one test: marker > command line/ini > defaults."""
        from pytest_specenergy.gate.limits import FailExprError
        from pytest_specenergy.gate.limits import limits_for
        from pytest_specenergy.gate.limits import tolerance_limits

        mark = item.get_closest_marker("tolerance")
        try:
            marker = tolerance_limits(mark.args, mark.kwargs) if mark else []
        except FailExprError as exc:
            raise pytest.UsageError(f"{item.nodeid}: {exc}") from None
        return limits_for(self.config.compare_fail, marker)

    def settle(self, item: pytest.Item, pair: PairResult, body_failed: bool) -> None:
        """Record the pair, judge it (adding repeats while the gate asks), apply the outcome."""
        from pytest_specenergy import outcome
        from pytest_specenergy.document import record_of
        from pytest_specenergy.gate.gatekeeper import NeedsRepeats

        key = self.machine_key_for(pair)
        record = record_of(item.nodeid, pair, key)
        judgement = None
        # A reference drafter's arm is judged in-job, with or without a stored baseline.
        if self.gate_active or record.get("reference") is not None:
            limits = self.limits_for(item)
            decision = self.gate.judge(item.nodeid, record, key, limits)
            while isinstance(decision, NeedsRepeats):
                pair = self.measurer.add_repeats(pair.case, decision.extra)
                record = record_of(item.nodeid, pair, key)
                decision = self.gate.judge(item.nodeid, record, key, limits)
            judgement = decision
            record["verdict"] = judgement.verdict
            record["comparison"] = judgement.comparison.as_dict() if judgement.comparison else None
            record["baseline_file"] = str(judgement.baseline_path) if judgement.baseline_path else None
            if self.config.fdr:
                self._fdr_immediate(item.nodeid, record, judgement)
        self.records.append(record)
        outcome.add_properties(item, record)
        outcome.apply(item, pair.failed_checks, self.config.checks, judgement, pair.describe(),
                      body_failed)

    def _fdr_immediate(self, nodeid: str, record: dict[str, Any], judgement: Any) -> None:
        """``--specenergy-fdr``: what each comparison can be told now. REGRESSED rows are
        BH's "fail now" (the FDR plan stops there only at p <= Q/N); a p-value in (Q/N, Q]
        passes for now with a warning and is decided when the session finishes."""
        from pytest_specenergy.gate.fdr import PENDING
        from pytest_specenergy.gate.fdr import immediate_decision

        q, n = float(self.config.fdr or 0), max(1, self.fdr_tests)
        pending = []
        for row in _fdr_rows(record):
            key = f"{nodeid}::{row['metric']}"
            if immediate_decision(float(row["p_sequential"]), q, n) == PENDING:
                pending.append(key)
                judgement.warn.append(f"specenergy: pending FDR: {key} p_sequential="
                                      f"{row['p_sequential']:.3g} lies in (Q/N, Q] = ({q / n:.3g}, "
                                      f"{q:g}]; Benjamini-Hochberg decides it at session end")
        record["fdr_pending"] = pending

    def _finish_fdr(self, session: pytest.Session) -> dict[str, Any] | None:
        """BH over every gated comparison of the suite; a pending one it rejects fails the
        session (exit status 1), since its test already passed."""
        if not self.config.fdr:
            return None
        from pytest_specenergy.gate.fdr import suite_fdr

        pvalues, pending = {}, set()
        for record in self.records:
            for row in _fdr_rows(record):
                pvalues[f"{record['nodeid']}::{row['metric']}"] = float(row["p_sequential"])
            pending.update(record.get("fdr_pending") or ())
        result = suite_fdr(pvalues, float(self.config.fdr), pending=tuple(pending))
        self.fdr_result = result
        if result.pending_rejected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return {"q": result.q, "method": result.method, "n_collected": self.fdr_tests,
                "n_tests": result.n_tests, "rejected": list(result.rejected),
                "pending_rejected": list(result.pending_rejected),
                "adjusted": dict(result.adjusted)}

    def _finish_latency(self, session: pytest.Session, document: dict[str, Any]) -> dict[str, Any]:
        """Per latency target, the lowest-energy configuration meeting it; with a compare
        reference, a target whose choice got costlier than LATENCY_TOLERANCE (or that nothing
        meets any more) fails the session (exit status 1), naming both configurations."""
        from pytest_specenergy.report.latency import LATENCY_TOLERANCE
        from pytest_specenergy.report.latency import latency_choices
        from pytest_specenergy.report.latency import latency_regressions
        from pytest_specenergy.report.rows import rows_from_document

        targets = self.config.latency_targets
        rows = rows_from_document(document)
        choices = latency_choices(rows, targets)
        lines = [choice.line() for choice in choices]
        failures: list[str] = []
        if self.config.compare:
            for key in sorted({r["machine_key"] for r in self.records}):
                reference, _path, error = self.gate.reference_run(key)
                if reference is None:
                    message = f"latency targets not compared on {key}: {error}"
                    # A reference that exists but cannot be used fails, as it does for every case.
                    fatal = self.config.missing_baseline == "fail" or self.gate.reference_unreadable
                    (failures if fatal else lines).append(message)
                    continue
                current = [r for r in rows if r.case_id in {x["case_id"] for x in self.records
                                                             if x["machine_key"] == key}]
                try:
                    found = latency_regressions(current, rows_from_document(reference), targets,
                                                LATENCY_TOLERANCE)
                except ValueError as exc:  # different meters: never compared, never passed quietly
                    failures.append(f"latency targets on {key}: {exc}")
                    continue
                failures += [f.message() for f in found]
        self.latency_lines = lines + failures
        self.latency_failed = bool(failures)
        if failures and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return {"targets_ms": list(targets), "tolerance": LATENCY_TOLERANCE,
                "choices": [c.as_dict() for c in choices], "failures": failures}

    # -- hooks ----------------------------------------------------------------------------
    def pytest_report_header(self, config: pytest.Config) -> str:
        """One header line with the measurement options."""
        options = self.config
        gate = f" compare={options.compare}" if options.compare else ""
        gate += f" golden={options.golden}" if options.golden else ""
        return (f"specenergy: engine={options.engine} meter={options.meter} repeats={options.repeats} "
                f"warmup={'auto' if options.warmup is None else options.warmup}{gate}")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize ``specenergy_case`` from the test's markers."""
        if "spec_pair" not in metafunc.fixturenames:
            return
        definition = metafunc.definition
        try:
            cases = build_cases(definition.nodeid, definition.get_closest_marker, self.config.case_defaults(),
                                str(metafunc.config.rootpath))
        except MarkerError as exc:
            # A collection error that shows the message, not a traceback from inside the plugin.
            raise pytest.Collector.CollectError(f"specenergy: {exc}") from None
        metafunc.parametrize("specenergy_case", cases, ids=[c.id for c in cases])

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Plan the collected cases; under ``--specenergy-dry-run`` print their command lines."""
        cases = [item.callspec.params["specenergy_case"] for item in session.items
                 if hasattr(item, "callspec") and "specenergy_case" in item.callspec.params]
        self.planned = cases
        if self.config.fdr:
            self.fdr_tests = self._count_gated(session.items)
        if self._measurer is not None:
            self._measurer.plan(cases)
        if self.config.dry_run:
            from pytest_specenergy.engines.dry_run import render_dry_run

            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            text = render_dry_run(cases)
            if reporter is not None:
                reporter.write_sep("=", "specenergy dry run")
                reporter.write_line(text)
            else:
                print(text)

    def _count_gated(self, items: list[pytest.Item]) -> int:
        """BH's N: the gated per-repeat comparisons (case x limit) of the collected tests."""
        from pytest_specenergy.gate.limits import GATE_METRICS

        count = 0
        for item in items:
            if not (hasattr(item, "callspec") and "specenergy_case" in item.callspec.params):
                continue
            try:
                limits = self.limits_for(item)
            except pytest.UsageError:
                continue  # the test itself reports its bad marker
            count += sum(1 for limit in limits if GATE_METRICS[limit.metric].per_repeat)
        return count

    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """Under a dry run, run nothing: the cases were printed at collection."""
        return True if self.config.dry_run else None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """After the body: record the pair it measured, run checks and gate, set the outcome."""
        body_error: BaseException | None = None
        try:
            result = yield
        except BaseException as exc:  # re-raised below, after the pair is recorded
            body_error = exc
            result = None
        pair = item.stash.get(PAIR_KEY, None)
        if pair is not None:
            body_failed = body_error is not None and not isinstance(body_error, pytest.skip.Exception)
            self.settle(item, pair, body_failed)
        if body_error is not None:
            raise body_error
        return result

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: collect a finished worker's records."""
        records, skipped = xdist.receive(node)
        self.records.extend(records)
        self.xdist_skipped += skipped

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Write the run document (JSON file and/or history); a worker ships its records.

        A session that did not run to its end (Ctrl-C, SIGTERM, ``-x``, a crashed worker) is
        saved marked ``interrupted``: no reference (``last``, a name, a counter) selects it.
        """
        config = session.config
        if xdist.is_worker(config):
            xdist.ship(config, self.records, self.xdist_skipped)
            return
        if not self.records:
            return
        fdr = self._finish_fdr(session)
        from pytest_specenergy.atomic import write_json_atomic
        from pytest_specenergy.document import build_document
        from pytest_specenergy.gate import storage
        from pytest_specenergy.gate.machine import machine_info

        meters = self._measurer.describe_meters() if self._measurer else {}
        document = build_document(self.records, meters, self.engine_starts, self.machines,
                                  host=machine_info())
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop) \
            or bool(session.shouldfail)
        if interrupted:
            document["interrupted"] = True
        if fdr is not None:
            document["fdr"] = fdr
        if self.config.latency_targets:
            document["latency_targets"] = self._finish_latency(session, document)
        config.hook.pytest_specenergy_update_json(data=document)
        if self.config.json:
            write_json_atomic(self.config.json, document)
        if self.config.save or self.config.autosave:
            for key in sorted({r["machine_key"] for r in self.records}):
                part = {**document, "machine_key": key,
                        "results": [r for r in self.records if r["machine_key"] == key]}
                self.saved.append(storage.save_run(part, self.config.storage, self.config.save,
                                                   machine_key=key, interrupted=interrupted))

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        """The specenergy table and summary lines (controller only)."""
        if xdist.is_worker(config) or not (self.records or self.xdist_skipped):
            return
        from pytest_specenergy.report.terminal import summary_lines

        unused = self.gate.unused_goldens({r["machine_key"] for r in self.records}) \
            if self.config.golden else []
        for sep, line in summary_lines(self.records, self.xdist_skipped, self.engine_starts,
                                       unused, self.saved, self.config.json):
            if sep:
                terminalreporter.write_sep("=", line, yellow=sep == "warning")
            else:
                terminalreporter.write_line(line)
        if self.latency_lines:
            terminalreporter.write_sep("=", "specenergy latency targets", red=self.latency_failed)
            for line in self.latency_lines:
                terminalreporter.write_line(line)
        if self.fdr_result is not None:
            failed = bool(self.fdr_result.pending_rejected)
            terminalreporter.write_sep("=", "specenergy false-discovery rate", red=failed)
            for line in self.fdr_result.summary().splitlines():
                terminalreporter.write_line(line)
            if failed:
                terminalreporter.write_line(
                    f"{len(self.fdr_result.pending_rejected)} comparison(s) that passed pending "
                    "FDR regressed at session end: exit status 1")

    def close(self) -> None:
        """Stop every engine and release meters."""
        if self._measurer is not None:
            self._measurer.close()


def _fdr_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The comparison rows of a record that enter the FDR family (those with a sequential
    p-value: the per-repeat metrics)."""
    rows = (record.get("comparison") or {}).get("rows") or []
    return [r for r in rows if r.get("p_sequential") is not None]
