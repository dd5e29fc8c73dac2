"""pytest hook implementations (and nothing else) for pytest-specenergy."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_specenergy import hookspec
from pytest_specenergy.atomic import write_json_atomic
from pytest_specenergy.config import SpecEnergyConfig
from pytest_specenergy.config import add_options
from pytest_specenergy.fixtures import PAIR_KEY
from pytest_specenergy.fixtures import SESSION_KEY
from pytest_specenergy.fixtures import spec_pair  # noqa: F401  (fixture registration)
from pytest_specenergy.fixtures import specenergy  # noqa: F401
from pytest_specenergy.fixtures import specenergy_case  # noqa: F401
from pytest_specenergy.markers import MARKERS
from pytest_specenergy.markers import MarkerError
from pytest_specenergy.markers import build_cases
from pytest_specenergy.report.json_out import build_document
from pytest_specenergy.report.terminal import render_table
from pytest_specenergy.results import SpecEnergyAssertionError
from pytest_specenergy.session import SpecEnergySession


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for help_line in MARKERS.values():
        config.addinivalue_line("markers", help_line)
    config.stash[SESSION_KEY] = SpecEnergySession(SpecEnergyConfig.from_pytest_config(config),
                                                  config.hook)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()


def pytest_report_header(config: pytest.Config) -> str:
    options = config.stash[SESSION_KEY].config
    return (f"specenergy: engine={options.engine} meter={options.meter} repeats={options.repeats} "
            f"warmup={options.warmup}")


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
        from pytest_specenergy.dry_run import render_dry_run

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
    result = yield
    pair = item.stash.get(PAIR_KEY, None)
    if pair is not None and pair.failed_checks:
        message = "; ".join(str(c) for c in pair.failed_checks)
        if item.config.stash[SESSION_KEY].config.checks == "fail":
            # A normal-looking row can hide broken speculation (paper s.10): fail closed.
            raise SpecEnergyAssertionError(f"validity checks failed: {message}\n{pair.describe()}")
        item.warn(pytest.PytestWarning(f"specenergy validity checks failed: {message}"))
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    spec = session.config.stash[SESSION_KEY]
    if spec.config.json and spec.results:
        document = build_document(spec.results, spec.describe_meters(), len(spec.pool.starts))
        session.config.hook.pytest_specenergy_update_json(data=document)
        write_json_atomic(spec.config.json, document)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    spec = config.stash[SESSION_KEY]
    if not spec.results:
        return
    terminalreporter.write_sep("=", "specenergy")
    terminalreporter.write_line(render_table(spec.results))
    sources = sorted({p.source for p in spec.results})
    terminalreporter.write_line(
        f"{len(spec.results)} pairs, {len(spec.pool.starts)} engine starts; energy figures: "
        f"{', '.join(sources)}")
    if spec.config.json:
        terminalreporter.write_line(f"specenergy JSON: {spec.config.json}")
