"""A fork server for reference engines: torch and transformers imported once per pytest process.

Each CPU reference engine is a fork of the zygote, under the same watchdog; processes a pytest
process starts share its zygote (:data:`SHARED`). See docs/design/engines.md, ``engines/zygote.py``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any
from typing import Sequence

#: The module path of the reference server's command (``python -m ...``).
REFSERVER = "pytest_specenergy.refserver"
#: Largest message on the socket (a request carries the engine's whole environment).
MAX_MESSAGE = 1 << 20
#: Environment variable that turns the zygote off (``0``): every engine a fresh interpreter.
SWITCH = "SPECENERGY_ZYGOTE"
#: Environment variable naming the Unix socket of the zygote this process's parent started
#: (set in that process's environment, inherited by the processes it starts).
SHARED = "SPECENERGY_ZYGOTE_SOCKET"


class ForkedChild:
    """A forked child of this process with the ``Popen`` methods the watchdog needs of its server."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)


def _fork_server(argv: Sequence[str]) -> ForkedChild:
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


def _engine_child(request: dict[str, Any], lifeline: int, zygote_fds: Sequence[int]) -> None:
    """In the zygote's fork: become the engine's session leader and run its watchdog."""
    status = 70
    try:
        for fd in zygote_fds:
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
        dog = watchdog.Watchdog(argv, os.getppid(), lifeline, spawn=lambda: _fork_server(argv))
        watchdog._exit_like(dog.run())
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(status)


def _preload() -> None:
    """Import what a reference server spends its start on (torch, transformers, the server's own
    modules), running no torch op; a tiny model's transformers classes load with its first build
    (:func:`_build_tiny_models`)."""
    import transformers  # noqa: F401

    import pytest_specenergy.refserver.engine  # noqa: F401
    import pytest_specenergy.refserver.server  # noqa: F401


def _build_tiny_models(argv: Sequence[str]) -> None:
    """Build the tiny models (target, draft) an engine asks for here, once: its fork and every later
    one share them (0.1 s of CPU a start otherwise). A built-in real checkpoint already in the
    cache is loaded here too, once: its forks share its 538 MB of weights (copy-on-write, never
    written) instead of loading them each, 15-20 s a start on the loaded 2-core machine. At one
    torch thread, so that OpenMP starts no thread for a fork to hang on."""
    import torch

    from pytest_specenergy.refserver.catalog import is_builtin_checkpoint
    from pytest_specenergy.refserver.catalog import is_ready
    from pytest_specenergy.refserver.models import load_model
    from pytest_specenergy.refserver.tiny_models import default_draft_for

    flags = dict(zip(argv, argv[1:]))  # --flag -> its value
    names = [flags.get("--model", "")]
    # the engine's own choice of draft (engine._load_draft)
    if flags.get("--drafter") in (
        "draft_model",
        "block",
    ):
        names.append(flags.get("--draft-model") or default_draft_for(names[0]))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with contextlib.suppress(Exception):  # a bad flag: the engine's own start says what is wrong
        for name in names:
            # never a fetch here: the backend's check fetched it, or the engine's start says why
            if name and (
                name.startswith("tiny:") or is_builtin_checkpoint(name) and is_ready(name)
            ):
                load_model(name, flags.get("--dtype", "auto"), "cpu", int(flags.get("--seed", 0)))
    torch.set_num_threads(threads)


def serve(sock: socket.socket, listen: str | None = None) -> int:
    """Fork an engine per request and report its exit to the connection that asked, until the
    launcher's ``sock`` closes; others connect at ``listen``."""
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    listening = []  # the socket other launchers connect at, once bound
    if listen:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(listen)
            listener.listen(16)
            listening.append(listener)
        except OSError:  # a TMPDIR too long for a socket path: serve this launcher alone
            listener.close()
    shared = listen if listening else None
    ready = {
        "ready": os.getpid(),
        "python": sys.executable,
        "package": _package(),
        "shared": shared,
    }
    clients = [sock]  # the first is the launcher that started this zygote
    asked_by: dict[int, socket.socket] = {}
    sock.send(json.dumps(ready).encode())
    try:
        while True:
            readable, _, _ = select.select([*clients, wake_r, *listening], [], [])
            if wake_r in readable:
                os.read(wake_r, 4096)
            while True:  # reap every ended engine, and say how it ended
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    break
                client = asked_by.pop(pid, None)
                if client in clients:
                    _send(client, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
            if listening and listening[0] in readable:
                conn, _ = listening[0].accept()
                if _send(conn, ready):
                    clients.append(conn)
            for client in [c for c in clients if c in readable]:
                try:
                    message, fds, _, _ = socket.recv_fds(client, MAX_MESSAGE, 1)
                except OSError:
                    message, fds = b"", []
                if not message:
                    if client is sock:
                        return 0
                    clients.remove(client)
                    client.close()
                    continue
                request = json.loads(message)
                _build_tiny_models(request["argv"])
                pid = os.fork()
                if pid == 0:
                    inherited = [c.fileno() for c in [*clients, *listening]] + [wake_r, wake_w]
                    _engine_child(request, fds[0], inherited)
                for fd in fds:
                    os.close(fd)
                asked_by[pid] = client
                _send(client, {"started": pid})
    finally:
        if listen:  # the socket, if it was bound, and its folder, made for it either way
            with contextlib.suppress(OSError):
                os.unlink(listen)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(listen))


def _package() -> str:
    """The folder of the pytest_specenergy this process imported."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _send(conn: socket.socket, message: dict[str, Any]) -> bool:
    """``message`` to one launcher; False when it has gone (its engines' exits go nowhere)."""
    try:
        conn.send(json.dumps(message).encode())
        return True
    except OSError:
        return False


def _read(ref: weakref.ref[Zygote], sock: socket.socket) -> None:
    """The launcher's reader: the zygote's replies and exit statuses, until it or the
    :class:`Zygote` is gone."""
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
        except OSError:
            message = b""
        with zygote.changed:
            if not message:
                zygote.alive = False
                zygote.changed.notify_all()
                return
            answer = json.loads(message)
            if "exited" in answer:
                zygote.exits[answer["exited"]] = answer["code"]
            else:
                zygote.replies.append(answer)
            zygote.changed.notify_all()
        del zygote


class ZygoteChild:
    """The launcher's ``Popen``-like handle on one engine the zygote forked, with the exit status it
    reported."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self.zygote.exits.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        zygote = self.zygote
        with zygote.changed:
            # A dead zygote reports no more exits (its engines stop with it: their watchdogs
            # see their parent go), so waiting on it ends as a timeout, never a hang.
            zygote.changed.wait_for(lambda: self.pid in zygote.exits or not zygote.alive, timeout)
            if self.pid not in zygote.exits:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            return zygote.exits[self.pid]


class Zygote:
    """The launcher's side: the socket to one zygote, started by this process (:meth:`start`) or its
    parent."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.sock = sock
        self.proc = proc
        self.exits: dict[int, int] = {}
        self.changed = threading.Condition()
        self.replies: list[dict[str, Any]] = []
        self.lock = threading.Lock()  # one request at a time: replies come in order
        self.alive = True
        # The reader holds the zygote weakly: a zygote nobody refers to any more (its module
        # dropped by an in-process pytester run) closes the socket, and the process exits.
        threading.Thread(
            target=_read, args=(weakref.ref(self), sock), name="specenergy-zygote", daemon=True
        ).start()
        ready = self._reply()
        if "ready" not in ready:
            raise OSError(f"the engine zygote did not start: {ready}")
        self.pid = int(ready["ready"])
        #: The socket path other launchers connect at (None: this launcher's alone).
        self.shared: str | None = ready.get("shared")
        # A fork runs the zygote's interpreter and the zygote's copy of this package (a nested
        # run of another checkout must not get this one's reference server).
        theirs, ours = (ready.get("python"), ready.get("package")), (sys.executable, _package())
        if theirs != ours:
            self.sock.shutdown(socket.SHUT_RDWR)  # the reader sees it end, and so does the zygote
            raise OSError(f"the engine zygote runs {theirs}, not {ours}")

    @classmethod
    def start(cls, env: dict[str, str]) -> Zygote:
        """A zygote of this process's own, listening for the processes it starts (:data:`SHARED`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listen = os.path.join(tempfile.mkdtemp(prefix="specenergy-zygote-"), "socket")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__, "--fd", str(theirs.fileno()), "--listen", listen],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
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
        """The zygote a parent process started, at ``path``; OSError when it is gone or not ours."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return cls(sock)

    def _reply(self) -> dict[str, Any]:
        with self.changed:
            self.changed.wait_for(lambda: self.replies or not self.alive, 120)
            if not self.replies:
                return {"error": "the zygote exited" if not self.alive else "no answer in 120 s"}
            return self.replies.pop(0)

    def spawn(
        self, argv: Sequence[str], env: dict[str, str], log_path: Path, lifeline: int
    ) -> ZygoteChild:
        """Fork one engine (its watchdog, then its server) from the zygote."""
        request = {"argv": list(argv), "env": env, "cwd": os.getcwd(), "log": str(log_path)}
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], [lifeline])
            answer = self._reply()
        if "started" not in answer:
            self.alive = False
            raise OSError(f"the engine zygote did not fork: {answer.get('error', answer)}")
        return ZygoteChild(self, int(answer["started"]))


_zygote: Zygote | None = None
_zygote_failed = False
_zygote_lock = threading.Lock()


def _on_gpu(argv: Sequence[str]) -> bool:
    # a function, not a local: evaluated only for a reference server's argv (the checks before it
    # are cheaper)
    device = argv[argv.index("--device") + 1] if "--device" in argv[:-1] else "auto"
    return device.startswith("cuda") or (device == "auto" and os.path.exists("/proc/driver/nvidia"))


def zygote_for(argv: Sequence[str], env: dict[str, str]) -> Zygote | None:
    """This process's zygote (started on first use) when ``argv`` starts a reference server with
    this interpreter on a CPU and the zygote is not switched off, else None. A GPU engine starts
    fresh: CUDA in a fork of a process that imported torch is untried there, and the model's load
    outweighs the imports anyway."""
    global _zygote, _zygote_failed
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
            _zygote, _zygote_failed = None, True
        if _zygote is None and not _zygote_failed and os.environ.get(SHARED):
            with contextlib.suppress(OSError):
                _zygote = Zygote.connect(os.environ[SHARED])
        if _zygote is None and not _zygote_failed:
            try:
                _zygote = Zygote.start(env)
            except OSError:
                _zygote_failed = True
        return _zygote


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_specenergy.engines.zygote --fd N``: serve on the inherited socket."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {__name__}", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--fd", type=int, required=True, help="the launcher's socket (SOCK_SEQPACKET)"
    )
    parser.add_argument("--listen", help="a Unix socket path where other launchers connect")
    args = parser.parse_args(argv)
    return serve(socket.socket(fileno=args.fd), args.listen)


if __name__ == "__main__":
    sys.exit(main())
