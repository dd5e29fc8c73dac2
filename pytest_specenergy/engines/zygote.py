"""A fork server for reference engines: torch and transformers imported once per pytest process.

Each CPU reference engine is a fork of the zygote (:mod:`.zygote_serve`), under the same watchdog;
processes a pytest process starts share its zygote (:data:`SHARED`). This is the launcher's side:
the socket, the engines' exit statuses, a dead zygote noticed and replaced. See
docs/engines.md#the-engine-zygote."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any
from typing import Sequence

from pytest_specenergy.engines.watchdog import start_time
from pytest_specenergy.engines.zygote_serve import MAX_MESSAGE
from pytest_specenergy.engines.zygote_serve import REFSERVER
from pytest_specenergy.engines.zygote_serve import package
from pytest_specenergy.engines.zygote_trust import ZygoteTrustError
from pytest_specenergy.engines.zygote_trust import check_peer
from pytest_specenergy.engines.zygote_trust import check_socket_path
from pytest_specenergy.engines.zygote_trust import engine_environment

__all__ = ["LOST_EXIT", "REFSERVER", "SHARED", "SWITCH", "Zygote", "ZygoteChild", "zygote_for"]

#: Environment variable that turns the zygote off (``0``): every engine a fresh interpreter.
SWITCH = "SPECENERGY_ZYGOTE"
#: Environment variable naming the Unix socket of the zygote this process's parent started
#: (set in that process's environment, inherited by the processes it starts).
SHARED = "SPECENERGY_ZYGOTE_SOCKET"
#: The exit code of an engine whose zygote died before it could report the engine's own: no real
#: status is 256 (0-255, or minus a signal's number). ``launch.describe_exit`` names it.
LOST_EXIT = 256
#: Zygotes a process may lose (killed, crashed) before it starts its engines the plain way: one
#: that keeps dying should not take every engine with it again and again.
MAX_LOST = 3
#: Seconds between looks at a lost zygote's engine, which only ``/proc`` can still tell about.
_LOOK_S = 0.05


class ZygoteWarning(UserWarning):
    """A zygote named by :data:`SHARED` was not used (not provably this user's own)."""


def _read(ref: weakref.ref[Zygote], sock: socket.socket) -> None:
    """The launcher's reader: the zygote's replies and exit statuses, until it or the
    :class:`Zygote` is gone."""
    import select

    while True:
        readable, _, _ = select.select([sock], [], [], 1.0)
        zygote = ref()
        if zygote is None:
            sock.close()
            return
        if not readable:
            del zygote
            continue
        try:
            message = sock.recv(MAX_MESSAGE)
            answer = json.loads(message) if message else None
        except (OSError, ValueError):
            answer = None
        with zygote.changed:
            if not isinstance(answer, dict):  # closed, or nothing a zygote of ours sends
                zygote.alive = False
                zygote.changed.notify_all()
                return
            if "exited" in answer:
                zygote.exits[answer["exited"]] = answer["code"]
            else:
                zygote.replies.append(answer)
            zygote.changed.notify_all()
        del zygote


class ZygoteChild:
    """The launcher's ``Popen``-like handle on one engine the zygote forked, with the exit status it
    reported; once the zygote is gone, :data:`LOST_EXIT` when the engine has ended too."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        #: Its start time: with the pid, it names this process (a pid may be reused).
        self.started = start_time(pid)

    @property
    def returncode(self) -> int | None:
        """The exit status the zygote reported, or :data:`LOST_EXIT` for an engine that ended after
        its zygote died (its watchdog stops it when the zygote goes); None while it runs."""
        code = self.zygote.exits.get(self.pid)
        if code is not None or self.zygote.alive:
            return code
        if self.started is None or start_time(self.pid) != self.started:
            return LOST_EXIT
        return None

    def poll(self) -> int | None:
        """As ``Popen.poll``."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As ``Popen.wait``: the exit status, or ``subprocess.TimeoutExpired``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        zygote = self.zygote
        with zygote.changed:
            zygote.changed.wait_for(lambda: self.pid in zygote.exits or not zygote.alive, timeout)
        # A dead zygote reports no more exits: the engine's end is seen in /proc.
        while self.returncode is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(_LOOK_S)
        return self.returncode


class Zygote:
    """The launcher's side: the socket to one zygote, started by this process (:meth:`start`) or its
    parent (:meth:`connect`)."""

    def __init__(
        self,
        sock: socket.socket,
        proc: subprocess.Popen[bytes] | None = None,
        peer: int | None = None,
    ) -> None:
        self.sock = sock
        self.proc = proc
        self.exits: dict[int, int] = {}
        self.changed = threading.Condition()
        self.replies: list[dict[str, Any]] = []
        self.lock = threading.Lock()  # one request at a time: replies come in order
        self.alive = True
        _OPEN.add(self)
        # The reader holds the zygote weakly: a zygote nobody refers to any more (its module
        # dropped by an in-process pytester run) closes the socket, and the process exits.
        threading.Thread(
            target=_read, args=(weakref.ref(self), sock), name="specenergy-zygote", daemon=True
        ).start()
        ready = self._reply()
        if "ready" not in ready:
            self.sock.shutdown(socket.SHUT_RDWR)
            raise OSError(f"the engine zygote did not start: {ready}")
        self.pid = int(ready["ready"])
        #: The socket path other launchers connect at (None: this launcher's alone).
        self.shared: str | None = ready.get("shared")
        # A fork runs the zygote's interpreter and the zygote's copy of this package (a nested
        # run of another checkout must not get this one's reference server); the zygote is the
        # process listening on the socket.
        theirs, ours = (ready.get("python"), ready.get("package")), (sys.executable, package())
        if theirs != ours or (peer is not None and peer != self.pid):
            self.sock.shutdown(socket.SHUT_RDWR)  # the reader sees it end, and so does the zygote
            raise OSError(
                f"the engine zygote (pid {self.pid}, listening pid {peer}) runs {theirs}, not "
                f"{ours}"
            )

    @classmethod
    def start(cls, env: dict[str, str]) -> Zygote:
        """A zygote of this process's own, listening for the processes it starts (:data:`SHARED`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listen = os.path.join(tempfile.mkdtemp(prefix="specenergy-zygote-"), "socket")
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pytest_specenergy.engines.zygote_serve",
                    "--fd",
                    str(theirs.fileno()),
                    "--listen",
                    listen,
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=engine_environment(env),
                start_new_session=True,
            )
        finally:
            theirs.close()
        try:
            zygote = cls(ours, proc)
        except OSError:
            shutil.rmtree(os.path.dirname(listen), ignore_errors=True)
            raise
        if zygote.shared:
            os.environ[SHARED] = zygote.shared
        return zygote

    @classmethod
    def connect(cls, path: str) -> Zygote:
        """The zygote a parent process started, at ``path``; :class:`ZygoteTrustError` when the
        socket is not provably this user's own (nothing is sent to it), OSError when it is gone or
        not ours."""
        check_socket_path(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
            peer = check_peer(sock, path)
        except OSError:
            sock.close()
            raise
        return cls(sock, peer=peer)

    def _reply(self) -> dict[str, Any]:
        with self.changed:
            self.changed.wait_for(lambda: self.replies or not self.alive, 120)
            if not self.replies:
                return {"error": "the zygote exited" if not self.alive else "no answer in 120 s"}
            return self.replies.pop(0)

    def spawn(
        self, argv: Sequence[str], env: dict[str, str], log_path: Path, lifeline: int
    ) -> ZygoteChild:
        """Fork one engine (its watchdog, then its server) from the zygote; it gets only the part
        of ``env`` a reference server uses (:func:`.zygote_trust.engine_environment`)."""
        request = {
            "argv": list(argv),
            "env": engine_environment(env),
            "cwd": os.getcwd(),
            "log": str(Path(log_path).absolute()),
        }
        with self.lock:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [lifeline])
            except OSError:
                self._lost()
                raise
            answer = self._reply()
        if "started" not in answer:
            if not self.alive:
                self._lost()
            raise OSError(f"the engine zygote did not fork: {answer.get('error', answer)}")
        return ZygoteChild(self, int(answer["started"]))

    def _lost(self) -> None:
        with self.changed:
            self.alive = False
            self.changed.notify_all()

    def retire(self) -> None:
        """After its death: reap this process's own zygote and remove the folder of its socket (its
        own exit would have; ``kill -9`` leaves both)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        if self.shared:
            shutil.rmtree(os.path.dirname(self.shared), ignore_errors=True)


#: Every Zygote of this process, so that a fork of it can close their sockets.
_OPEN: weakref.WeakSet[Zygote] = weakref.WeakSet()
_zygote: Zygote | None = None
_zygote_failed = False
_zygotes_lost = 0
_zygote_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """In a fork of this process (a test's helper, a fork-started worker): let go of the zygote.
    The fork must not keep its socket open after this process dies (the zygote would see no EOF),
    nor share it (the replies would go to either); it starts or connects to a zygote of its own
    if it starts engines."""
    global _zygote, _zygote_lock
    for zygote in list(_OPEN):
        with contextlib.suppress(OSError):
            zygote.sock.close()
        zygote.alive = False
        zygote.proc = None  # not the fork's child: never its to reap
    _OPEN.clear()
    _zygote = None
    _zygote_lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _on_gpu(argv: Sequence[str]) -> bool:
    # a function, not a local: evaluated only for a reference server's argv (the checks before it
    # are cheaper)
    device = argv[argv.index("--device") + 1] if "--device" in argv[:-1] else "auto"
    return device.startswith("cuda") or (device == "auto" and os.path.exists("/proc/driver/nvidia"))


def zygote_for(argv: Sequence[str], env: dict[str, str]) -> Zygote | None:
    """This process's zygote (started on first use, and again after a death, :data:`MAX_LOST`
    times) when ``argv`` starts a reference server with this interpreter on a CPU and the zygote is
    not switched off, else None. A GPU engine starts fresh: CUDA in a fork of a process that
    imported torch is untried there, and the model's load outweighs the imports anyway."""
    global _zygote, _zygote_failed, _zygotes_lost
    if (
        list(argv[:3]) != [sys.executable, "-m", REFSERVER]
        or env.get(SWITCH, "1") == "0"
        or _on_gpu(argv)
        or not hasattr(socket, "send_fds")
        or not hasattr(os, "fork")
    ):
        return None
    with _zygote_lock:
        if _zygote is not None and not _zygote.alive:
            # Killed (the OOM killer's likely pick: it holds torch) or crashed: its engines stop
            # with it, and the pool restarts them as crashed engines, forked from a new zygote.
            _zygote.retire()
            _zygote, _zygotes_lost = None, _zygotes_lost + 1
        if _zygote is None and not _zygote_failed and _zygotes_lost < MAX_LOST:
            _zygote = _connect_shared() or _start_own(env)
        return _zygote


def _connect_shared() -> Zygote | None:
    """The zygote named by :data:`SHARED` (a parent process's), if there is one and it is provably
    this user's own; a warning when it is not."""
    path = os.environ.get(SHARED)
    if not path:
        return None
    try:
        return Zygote.connect(path)
    except ZygoteTrustError as exc:
        warnings.warn(
            ZygoteWarning(
                f"{SHARED}: {exc}; engines are forked from a zygote of this process's own instead"
            ),
            stacklevel=3,
        )
    except OSError:  # gone (its pytest ended, or it died), or another interpreter's
        pass
    return None


def _start_own(env: dict[str, str]) -> Zygote | None:
    global _zygote_failed
    try:
        return Zygote.start(env)
    except OSError:
        _zygote_failed = True  # it cannot start here: every engine the plain way
        return None
