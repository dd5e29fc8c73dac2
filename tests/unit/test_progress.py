"""Progress lines: who prints them (never an xdist worker), at which verbosity, and how a
worker's lines reach the controller whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_specenergy.progress import REPORT_ATTRIBUTE
from pytest_specenergy.progress import Progress


class Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._tw = SimpleNamespace(width_of_current_line=0)

    def write(self, text: str) -> None:
        self.lines.append(text)
        self._tw.width_of_current_line = 0 if text.endswith("\n") else len(text)

    def ensure_newline(self) -> None:
        pass  # pytest's: ends the line only after a file name it wrote itself

    def write_line(self, line: str) -> None:
        self.lines.append(line)
        self._tw.width_of_current_line = 0


class Capture:
    def __init__(self) -> None:
        self.suspended = 0

    def global_and_fixture_disabled(self) -> Any:
        capture = self

        class Suspended:
            def __enter__(self) -> None:
                capture.suspended += 1

            def __exit__(self, *exc: object) -> None:
                pass

        return Suspended()


def _config(verbose: int = 0, worker: str | None = None) -> Any:
    plugins = {"terminalreporter": Reporter(), "capturemanager": Capture()}
    config = SimpleNamespace(
        option=SimpleNamespace(verbose=verbose),
        pluginmanager=SimpleNamespace(get_plugin=plugins.get),
        plugins=plugins,
    )
    if worker:
        config.workerinput = {"workerid": worker}
    return config


def _run_wrapper(progress: Progress, report: Any) -> Any:
    wrapper = progress.pytest_runtest_makereport(item=None, call=None)
    next(wrapper)
    with pytest.raises(StopIteration) as stop:
        wrapper.send(report)
    return stop.value.value


def test_engine_starts_print_by_default_and_repeats_at_verbose():
    for verbose, expected in (
        (-1, []),
        (0, ["specenergy: engine a started in 1.0 s"]),
        (1, ["specenergy: engine a started in 1.0 s", "specenergy: c baseline repeat 1/2"]),
    ):
        config = _config(verbose)
        progress = Progress(config)
        progress(0, "engine a started in 1.0 s")
        progress(1, "c baseline repeat 1/2")
        assert config.plugins["terminalreporter"].lines == expected
        # Written with pytest's capture suspended, as live logging writes.
        assert config.plugins["capturemanager"].suspended == len(expected)


def test_a_worker_never_writes_and_ships_its_lines_on_the_report():
    worker = _config(worker="gw1")
    progress = Progress(worker)
    progress(0, "engine a started in 1.0 s")
    assert worker.plugins["terminalreporter"].lines == []
    report = _run_wrapper(progress, SimpleNamespace())
    assert getattr(report, REPORT_ATTRIBUTE) == ["specenergy: engine a started in 1.0 s"]
    assert progress.pending == []
    assert not hasattr(_run_wrapper(progress, SimpleNamespace()), REPORT_ATTRIBUTE)  # nothing new
    # The controller prints the worker's lines whole, prefixed with the worker's id.
    controller = _config()
    received = SimpleNamespace(
        **{REPORT_ATTRIBUTE: getattr(report, REPORT_ATTRIBUTE)},
        node=SimpleNamespace(gateway=SimpleNamespace(id="gw1")),
    )
    controller.plugins["terminalreporter"].write("..")  # xdist's dots, the line not ended
    Progress(controller).pytest_runtest_logreport(received)
    assert controller.plugins["terminalreporter"].lines == [
        "..",
        "\n",
        "[gw1] specenergy: engine a started in 1.0 s",
    ]


def test_the_report_attribute_survives_xdist_serialization():
    report = pytest.TestReport("t.py::t", ("t.py", 0, "t"), {}, "passed", None, "call")
    setattr(report, REPORT_ATTRIBUTE, ["specenergy: engine a started in 1.0 s"])
    data = report._to_json()
    assert getattr(pytest.TestReport._from_json(data), REPORT_ATTRIBUTE) == [
        "specenergy: engine a started in 1.0 s"
    ]


def test_without_a_terminal_nothing_is_written():
    config = _config()
    config.pluginmanager = SimpleNamespace(get_plugin=lambda name: None)
    Progress(config)(0, "engine a started in 1.0 s")  # -p no:terminal: no error
