"""pytest hook implementations (and nothing else) for pytest-specenergy."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_specenergy import hookspec
from pytest_specenergy.gate import storage
from pytest_specenergy import xdist as xdist_support
from pytest_specenergy.atomic import write_json_atomic
from pytest_specenergy.options import SpecEnergyConfig
from pytest_specenergy.options import add_options
from pytest_specenergy.fixtures import GATE_KEY
from pytest_specenergy.fixtures import PAIR_KEY
from pytest_specenergy.fixtures import SESSION_KEY
from pytest_specenergy.fixtures import spec_pair  # noqa: F401  (fixture registration)
from pytest_specenergy.fixtures import specenergy  # noqa: F401
from pytest_specenergy.fixtures import specenergy_case  # noqa: F401
from pytest_specenergy.gate.gatekeeper import Gatekeeper
from pytest_specenergy.outcome import settle
from pytest_specenergy.cases.markers import MARKERS
from pytest_specenergy.cases.markers import MarkerError
from pytest_specenergy.cases.markers import build_cases
from pytest_specenergy.document import build_document
from pytest_specenergy.report.terminal import render_table
from pytest_specenergy.report.terminal import verdict_line
from pytest_specenergy.session import SpecEnergySession


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for help_line in MARKERS.values():
        config.addinivalue_line("markers", help_line)
    options = SpecEnergyConfig.from_pytest_config(config)
    if xdist_support.is_worker(config) and options.xdist == "per-gpu":
        xdist_support.pin_worker(config)
    config.stash[SESSION_KEY] = SpecEnergySession(options, config.hook)
    config.stash[GATE_KEY] = Gatekeeper(options)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()


def pytest_report_header(config: pytest.Config) -> str:
    options = config.stash[SESSION_KEY].config
    gate = f" compare={options.compare}" if options.compare else ""
    gate += f" golden={options.golden}" if options.golden else ""
    return (f"specenergy: engine={options.engine} meter={options.meter} repeats={options.repeats} "
            f"warmup={'auto' if options.warmup is None else options.warmup}{gate}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spec_pair" not in metafunc.fixturenames:
        return
    session: SpecEnergySession = metafunc.config.stash[SESSION_KEY]
    definition = metafunc.definition
    try:
        cases = build_cases(definition.nodeid, definition.get_closest_marker, session.config,
                            str(metafunc.config.rootpath))
    except MarkerError as exc:
        # A collection error that shows the message, not a traceback from inside the plugin.
        raise pytest.Collector.CollectError(f"specenergy: {exc}") from None
    metafunc.parametrize("specenergy_case", cases, ids=[c.id for c in cases])


def pytest_collection_finish(session: pytest.Session) -> None:
    spec = session.config.stash[SESSION_KEY]
    cases = [item.callspec.params["specenergy_case"] for item in session.items
             if hasattr(item, "callspec") and "specenergy_case" in item.callspec.params]
    spec.plan(cases)
    if spec.config.dry_run:
        from pytest_specenergy.engines.dry_run import render_dry_run

        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = render_dry_run(cases)
        if reporter is not None:
            reporter.write_sep("=", "specenergy dry run")
            reporter.write_line(text)
        else:
            print(text)


def pytest_runtestloop(session: pytest.Session) -> bool | None:
    if session.config.stash[SESSION_KEY].config.dry_run:
        return True  # cases were printed at collection; start nothing
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    body_error: BaseException | None = None
    try:
        result = yield
    except BaseException as exc:  # re-raised below, after the pair is recorded
        body_error = exc
        result = None
    pair = item.stash.get(PAIR_KEY, None)
    if pair is not None:
        body_failed = body_error is not None and not isinstance(body_error, pytest.skip.Exception)
        settle(item, pair, item.config.stash[SESSION_KEY], item.config.stash[GATE_KEY], body_failed)
    if body_error is not None:
        raise body_error
    return result


def pytest_testnodedown(node: Any, error: Any) -> None:
    records, skipped = xdist_support.receive(node)
    spec = node.config.stash[SESSION_KEY]
    spec.records.extend(records)
    spec.xdist_skipped += skipped


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    spec = config.stash[SESSION_KEY]
    if xdist_support.is_worker(config):
        xdist_support.ship(config, spec.records, spec.xdist_skipped)
        return
    if not spec.records:
        return
    document = build_document(spec.records, spec.describe_meters(), len(spec.pool.starts),
                              spec.machines)
    config.hook.pytest_specenergy_update_json(data=document)
    if spec.config.json:
        write_json_atomic(spec.config.json, document)
    if spec.config.save or spec.config.autosave:
        keys = sorted({r["machine_key"] for r in spec.records})
        for key in keys:
            part = {**document, "machine_key": key,
                    "results": [r for r in spec.records if r["machine_key"] == key]}
            spec.saved.append(storage.save_run(part, spec.config.storage, spec.config.save,
                                               machine_key=key))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    spec = config.stash[SESSION_KEY]
    if xdist_support.is_worker(config):
        return
    if spec.xdist_skipped:
        terminalreporter.write_sep("=", "specenergy warning", yellow=True)
        terminalreporter.write_line(
            f"{spec.xdist_skipped} spec_pair tests were skipped: energy is not measured under "
            f"pytest-xdist, because workers would share GPUs. Use --specenergy-xdist=per-gpu "
            f"(one GPU per worker) or run without -n.")
    if not spec.records:
        return
    terminalreporter.write_sep("=", "specenergy")
    terminalreporter.write_line(render_table(spec.records))
    sources = sorted({r["source"] for r in spec.records})
    pairs = len({(r["case"]["model"], r["case_id"], r["machine_key"]) for r in spec.records})
    starts = f", {len(spec.pool.starts)} engine starts" if spec.pool.starts else ""
    terminalreporter.write_line(f"{len(spec.records)} results of {pairs} distinct pairs{starts}; "
                                f"energy figures: {', '.join(sources)}")
    line = verdict_line(spec.records)
    if line:
        terminalreporter.write_line(line)
    unused = config.stash[GATE_KEY].unused_goldens({r["machine_key"] for r in spec.records})
    if unused:
        terminalreporter.write_line(f"{len(unused)} golden baseline(s) no test used: "
                                    + ", ".join(str(p) for p in unused))
    for path in spec.saved:
        terminalreporter.write_line(f"specenergy run saved: {path}")
    if spec.config.json:
        terminalreporter.write_line(f"specenergy JSON: {spec.config.json}")
