"""The pytest11 entry point: hook specs, options, and the registered session object; everything else
is a method of :class:`pytest_specenergy.session.SpecEnergySession`, which ``pytest_configure``
builds and registers."""

from __future__ import annotations

import pytest

from pytest_specenergy import hookspec
from pytest_specenergy.fixtures import spec_pair  # noqa: F401  (fixture registration)
from pytest_specenergy.fixtures import specenergy  # noqa: F401
from pytest_specenergy.fixtures import specenergy_case  # noqa: F401
from pytest_specenergy.options import SpecEnergyConfig
from pytest_specenergy.options import add_options

_PLUGIN_NAME = "specenergy-session"
_PROGRESS_NAME = "specenergy-progress"
_COURIER_NAME = "specenergy-xdist-records"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Register the ``pytest_specenergy_*`` hook specifications."""
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--specenergy-*`` options and ``specenergy_*`` ini keys."""
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Resolve the options, pin an xdist worker to its GPU, register the session object."""
    # Imported here, not at module level, so that loading the entry point stays cheap.
    from pytest_specenergy import xdist
    from pytest_specenergy.cases.markers import MARKERS
    from pytest_specenergy.outputs import unwritable_outputs
    from pytest_specenergy.preflight import compare_problem
    from pytest_specenergy.progress import Progress
    from pytest_specenergy.session import SESSION_KEY
    from pytest_specenergy.session import SpecEnergySession

    for help_line in MARKERS.values():
        config.addinivalue_line("markers", help_line)
    options = SpecEnergyConfig.from_pytest_config(config)
    if xdist.is_worker(config) and options.xdist == "per-gpu":
        xdist.pin_worker(config)
    if xdist.is_controller(config):
        xdist.interrupt_on_sigterm()
    # An output that cannot be written, or a baseline that is not there, is found now, not after
    # the last case has measured.
    checking = not (xdist.is_worker(config) or config.option.help)
    problems = unwritable_outputs(options) if checking else []
    measuring = checking and not (options.dry_run or options.plan or config.option.collectonly)
    baseline, loaded = compare_problem(options) if measuring and not problems else (None, {})
    problems += [baseline] if baseline else []
    if problems:
        raise pytest.UsageError("specenergy: " + "; ".join(problems))
    progress = Progress(config)
    session = SpecEnergySession(options, config.hook, progress, preloaded=loaded)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, _PLUGIN_NAME)
    config.pluginmanager.register(progress, _PROGRESS_NAME)
    config.pluginmanager.register(xdist.RecordCourier(config, session.records), _COURIER_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop every engine and unregister the session object."""
    from pytest_specenergy.session import SESSION_KEY

    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()
        for name in (_PLUGIN_NAME, _PROGRESS_NAME, _COURIER_NAME):
            config.pluginmanager.unregister(name=name)  # a no-op where it is not registered
        del config.stash[SESSION_KEY]
