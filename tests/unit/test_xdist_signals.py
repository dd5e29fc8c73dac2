"""The xdist controller runs no engine (so no pool handler): SIGTERM and SIGHUP interrupt its session
like Ctrl-C, so what the workers reported is still written, marked interrupted (reliability-audit-3
T44 for SIGHUP)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a child process: an unhandled SIGHUP would end the test run itself.
CONTROLLER = r"""
import os, signal, sys, time
from pytest_specenergy import xdist
signum = getattr(signal, sys.argv[1])
signal.signal(signum, signal.SIG_DFL)
xdist.interrupt_on_sigterm()
try:
    os.kill(os.getpid(), signum)
    time.sleep(10)
    print("not interrupted")
except KeyboardInterrupt as exc:
    print(f"interrupted: {exc}; then {signal.getsignal(signum) == signal.SIG_DFL}")
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_the_xdist_controller_is_interrupted_by_sigterm_and_sighup(name):
    done = subprocess.run(
        [sys.executable, "-c", CONTROLLER, name],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    # A second signal ends the process: the handler is the default again.
    assert (
        done.stdout.strip() == f"interrupted: {name} received by the xdist controller; then True"
    ), (
        done.returncode,
        done.stdout,
        done.stderr[-2000:],
    )


def test_an_ignored_sighup_stays_ignored():
    """nohup asked for SIGHUP to be ignored: the controller leaves it so."""
    script = (
        "import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
        "from pytest_specenergy import xdist; xdist.interrupt_on_sigterm(); "
        "print(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.strip() == "True", done.stderr[-2000:]
