"""Progress lines: engine starts and, at ``-v``, repeats; how workers' lines get out:
docs/engines.md."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from pytest_specenergy import xdist

#: The report attribute that carries a worker's lines to the controller (xdist ships a report's
#: plain attributes).
REPORT_ATTRIBUTE = "specenergy_progress"


class Progress:
    """The progress printer: a pytest plugin, and the callback handed to the engine pool and the
    pair measurer."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.verbosity = int(getattr(config.option, "verbose", 0) or 0)
        self.worker = xdist.is_worker(config)
        #: A worker's lines not yet attached to a report.
        self.pending: list[str] = []
        # Engines of one case start on threads side by side: one line at a time.
        self._lock = threading.Lock()

    def __call__(self, level: int, text: str) -> None:
        """Report ``text`` if the verbosity asks for lines of ``level`` (0: engine starts, 1:
        repeats, at ``-v``)."""
        if level > self.verbosity:
            return
        line = f"specenergy: {text}"
        with self._lock:
            if self.worker:
                self.pending.append(line)
            else:
                self.write(line)

    def write(self, line: str) -> None:
        """One whole line on pytest's terminal (nothing without a terminal reporter)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with contextlib.nullcontext() if capture is None else capture.global_and_fixture_disabled():
            reporter.ensure_newline()  # after a test's file name or -v location
            # Under xdist the reporter does not track its line: end a line of dots too.
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")
            reporter.write_line(line)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        """On a worker: attach the lines this test phase produced to its report."""
        report = yield
        if self.worker and self.pending:
            with self._lock:
                setattr(report, REPORT_ATTRIBUTE, list(self.pending))
                self.pending.clear()
        return report

    @pytest.hookimpl(tryfirst=True)  # before the reporter marks the test's outcome
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """On the controller: print the lines a worker attached, prefixed with its id."""
        lines = getattr(report, REPORT_ATTRIBUTE, None)
        if not lines or self.worker:
            return
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None) or getattr(
            report, "worker_id", None
        )
        prefix = f"[{worker}] " if worker else ""
        with self._lock:
            for line in lines:
                self.write(prefix + line)
