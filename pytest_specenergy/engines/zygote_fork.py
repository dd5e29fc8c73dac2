"""What runs in a fork of the engine zygote: the engine's watchdog, then the reference server it
forks in turn, as ``python -m`` would have run it. A fork never returns into the zygote's loop.
See docs/engines.md#the-engine-zygote."""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from typing import Any
from typing import Sequence

#: The module path of the reference server's command (``python -m ...``).
REFSERVER = "pytest_specenergy.refserver"


class ForkedChild:
    """A forked child of this process with the ``Popen`` methods the watchdog needs of its server."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit status once it has ended (reaped here), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        """``os.kill`` it."""
        os.kill(self.pid, signum)


def _fork_server(argv: Sequence[str], lifeline: int) -> ForkedChild:
    """The watchdog's server: a fork running the reference server as ``python -m`` would, dying with
    the watchdog."""
    from pytest_specenergy.engines.watchdog import _pdeathsig_setter

    set_pdeathsig = _pdeathsig_setter()
    pid = os.fork()
    if pid:
        return ForkedChild(pid)
    status = 1
    try:
        if set_pdeathsig is not None:
            set_pdeathsig()
        os.close(lifeline)  # the watchdog's to read; the server has no use for it
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD):
            # the watchdog's handlers and wake-up pipe, as exec would reset
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # What ``python -m`` does: the server is a program of its own (the layers), run as
        # __main__ on its flags; its __main__ block exits with main's status.
        sys.argv = [REFSERVER, *argv[3:]]
        runpy.run_module(REFSERVER, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exc:  # argparse's bad flag: status 2, its line already printed
        status = exc.code if isinstance(exc.code, int) else 2
    except BaseException:
        traceback.print_exc()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _engine_child(
    request: dict[str, Any], lifeline: int, zygote_fds: Sequence[int], launcher: tuple[int, str]
) -> None:
    """In the zygote's fork: become the engine's session leader and run its watchdog, which also
    watches ``launcher`` (pid, start time): the process the engine serves is not its parent."""
    try:
        for fd in zygote_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (log, 1), (log, 2)):
            os.dup2(fd, target)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from pytest_specenergy.engines import watchdog

        argv = request["argv"]
        dog = watchdog.Watchdog(
            argv,
            os.getppid(),
            lifeline,
            spawn=lambda: _fork_server(argv, lifeline),
            launcher=launcher,
        )
        watchdog._exit_like(dog.run())
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()


def fork_engine(
    request: dict[str, Any], lifeline: int, zygote_fds: Sequence[int], launcher: tuple[int, str]
) -> int:
    """Fork one engine (:func:`_engine_child`); its pid. The child never returns here: an error in
    it must not run the zygote's own clean-up (which removes the zygote's socket)."""
    pid = os.fork()
    if pid == 0:
        try:
            _engine_child(request, lifeline, zygote_fds, launcher)
        finally:
            os._exit(70)
    return pid
