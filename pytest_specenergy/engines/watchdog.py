"""A parent-death watchdog for one engine server: no orphan engines, even after ``kill -9``.

``python -m pytest_specenergy.engines.watchdog --parent PID --fd N -- CMD...`` runs ``CMD`` in its
own process group and stops the group when the parent goes. Stdlib only, and nothing from the
plugin: it must start in milliseconds. See docs/engines.md#the-parent-death-watchdog."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Sequence

#: Seconds between checks of the parent pid, which no event announces (its pipe closing, the child's
#: exit and a signal each wake the watchdog at once). Polling all at 0.02 s cost an idle engine 0.8%
#: of a core; suites run dozens.
POLL_S = 0.5
DEFAULT_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


def _say(message: str) -> None:
    # Goes to the server's log file (the launcher points our stderr there).
    print(f"specenergy watchdog[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _pdeathsig_setter(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` making the server die too if the watchdog itself is killed (Linux): without
    it a SIGKILL of the watchdog alone (the OOM killer) would orphan the server. ctypes is loaded
    here, before the fork, so the child only makes one system call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return functools.partial(prctl, _PR_SET_PDEATHSIG, signum, 0, 0, 0)


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, its ``/proc/PID/stat`` fields after the command: state, ppid, pgrp, ...) of every
    process; nothing where there is no ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            yield int(name), fields


def start_time(pid: int) -> str | None:
    """When ``pid`` started (``/proc/PID/stat`` field 22, clock ticks since boot), or None when it
    is gone or a zombie: a pid and its start time name one process, a pid alone may be reused."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None


def group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` (from ``/proc``; empty where there is none)."""
    # A zombie needs no signal.
    return [
        pid
        for pid, fields in proc_stats()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z"
    ]


def _kill_others(pgid: int) -> None:
    """SIGKILL every member of the group but us: stragglers of a server that has exited."""
    for pid in [p for p in group_members(pgid) if p != os.getpid()]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _exit_like(code: int) -> None:
    """Exit with the child's status; a signal death is re-raised so the parent sees -SIG."""
    if code >= 0:
        os._exit(code)
    signum = -code
    # Our handler of SIGTERM would catch it; SIGKILL and SIGSTOP have no handler to reset.
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signum)
        time.sleep(1.0)  # the signal is delivered before this returns
    os._exit(128 + signum)


class Watchdog:
    """Runs one server command and ties its process group's life to a parent process."""

    def __init__(
        self,
        command: Sequence[str],
        parent: int,
        fd: int | None,
        grace_s: float = DEFAULT_GRACE_S,
        spawn: Callable[[], Any] | None = None,
        launcher: tuple[int, str] | None = None,
    ) -> None:
        self.command = list(command)
        #: (pid, start time) of the process the engine serves when that is not our parent (a
        #: zygote's fork): a forked helper of it may hold its pipe's write end open, so its death
        #: is also polled here.
        self.launcher = launcher
        #: How the server starts: ``Popen(command)``, or a fork of a process that already
        #: imported it (:mod:`.zygote`), which returns a ``Popen``-like child.
        self.spawn = spawn or (
            lambda: subprocess.Popen(self.command, preexec_fn=_pdeathsig_setter())
        )
        self.parent = parent
        self.fd = fd
        self.grace_s = grace_s
        self.stopping: str | None = None
        self.child: Any = None
        if os.getpgrp() != os.getpid():
            # Started without start_new_session: lead a group of our own, or stopping "our"
            # group would signal whoever started us, and everything in their group.
            os.setpgid(0, 0)
        self.pgid = os.getpgrp()

    def _on_signal(self, signum: int, frame: object) -> None:
        # The launcher's stop SIGTERMs the whole group, the server too: we only remember to wait for
        # it (SIGKILL after the grace period). SIGUSR1 is the leader-only stop: the server was not
        # signalled, so we signal it.
        if signum == signal.SIGUSR1 and self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signal.SIGTERM)
        if self.stopping is None:
            self.stopping = f"received {signal.Signals(signum).name}"

    def _parent_gone(self, wake: int) -> str | None:
        """Waits up to ``POLL_S`` for the parent's pipe or ``wake`` (a signal); why to stop if the
        parent has gone."""
        readable, _, _ = select.select(
            [wake] if self.fd is None else [self.fd, wake], [], [], POLL_S
        )
        with contextlib.suppress(BlockingIOError):
            os.read(wake, 512)  # drained: it is non-blocking
        if self.fd in readable:
            try:
                data = os.read(self.fd, 1)
            except OSError:
                data = b""
            if not data:
                return f"parent {self.parent} died (its pipe closed)"
        if os.getppid() != self.parent:
            return f"parent {self.parent} died (now a child of {os.getppid()})"
        if self.launcher is not None and start_time(self.launcher[0]) != self.launcher[1]:
            return f"launcher {self.launcher[0]} died"
        return None

    def run(self) -> int:
        """Supervise until the server exits (its status) or the parent dies (group stopped)."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, self._on_signal)
        # Each signal with a handler writes to this pipe, which the wait watches: one arriving just
        # before the wait ends it at once. SIGCHLD (the server's exit) gets a handler for that
        # alone.
        wake, wake_w = os.pipe()
        os.set_blocking(wake, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        if os.getppid() != self.parent:  # the parent died before we got here
            _say(f"parent {self.parent} is already gone; not starting the server")
            return 1
        if self.launcher is not None and start_time(self.launcher[0]) != self.launcher[1]:
            _say(f"launcher {self.launcher[0]} is already gone; not starting the server")
            return 1
        try:
            child = self.child = self.spawn()
        except OSError as exc:
            _say(f"cannot start {self.command[0]!r}: {exc}")
            return 127
        while True:
            code = child.poll()
            if code is not None:
                _kill_others(self.pgid)
                return code
            if self.stopping is not None:  # a signal: the group was sent SIGTERM already
                self._stop_group(child, signal_first=False)
            # (A signal during this check sets self.stopping: it is seen on the next turn.)
            gone = self._parent_gone(wake)
            if gone is not None:
                self.stopping = gone
                _say(f"{gone}: stopping server group {self.pgid}")
                self._stop_group(child, signal_first=True)

    def _stop_group(self, child: Any, signal_first: bool) -> None:
        """SIGTERM the group (unless the launcher already did), wait, then SIGKILL it all."""
        if signal_first:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGTERM)
        try:
            code = child.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            _say(f"server {child.pid} ignored SIGTERM for {self.grace_s:.0f} s: SIGKILL")
            # Kills us as well; a stop this forced has nobody waiting for our status.
            os.killpg(self.pgid, signal.SIGKILL)
            code = child.wait()
        _kill_others(self.pgid)
        _exit_like(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point, ``--parent PID [--fd N] [--grace S] -- CMD...``; exits with the server's status."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_specenergy.engines.watchdog", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--parent", type=int, required=True, help="pid to watch")
    parser.add_argument(
        "--fd",
        type=int,
        default=None,
        help="read end of a pipe whose write end only the parent holds",
    )
    parser.add_argument(
        "--grace", type=float, default=DEFAULT_GRACE_S, help="seconds between SIGTERM and SIGKILL"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server argv")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command after --")
    code = Watchdog(command, args.parent, args.fd, args.grace).run()
    _exit_like(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
