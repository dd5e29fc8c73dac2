"""The engine zygote's own process: torch, transformers and the reference server imported once,
then one fork per launcher request, each fork an engine's watchdog (:mod:`.zygote_fork`).

It serves the launcher that started it (the socket it inherited) and the launchers that connect
at its listening socket; a request it cannot serve (not JSON, a field missing or of the wrong type,
no lifeline descriptor, a fork that fails) is answered with an error naming what was wrong, and the
zygote serves on. It exits when the launcher that started it closes its socket or dies, whoever
else holds that socket (a forked test helper). See docs/engines.md#the-engine-zygote."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import stat
import sys
from typing import Any
from typing import Sequence

from pytest_specenergy.engines.watchdog import start_time
from pytest_specenergy.engines.zygote_fork import REFSERVER
from pytest_specenergy.engines.zygote_fork import fork_engine
from pytest_specenergy.engines.zygote_trust import peer_credentials

#: Largest message on the socket (a request carries the engine's environment).
MAX_MESSAGE = 1 << 20
#: Launchers served at once: the one that started the zygote, and the nested pytest processes,
#: xdist workers and suites that inherit its socket's name. A connection past this is refused.
MAX_CLIENTS = 64
#: Seconds between checks that the launcher which started the zygote is alive (its socket's EOF
#: says so at once unless a fork of it still holds the socket).
POLL_S = 0.5
#: The keys of a request, each with the type its value must have.
REQUEST_FIELDS = {"argv": list, "env": dict, "cwd": str, "log": str}


class RequestError(ValueError):
    """A request the zygote refuses; the message says what was wrong and what is expected."""


def check_request(message: bytes, fds: Sequence[int], flags: int) -> dict[str, Any]:
    """The request in ``message`` with its one descriptor ``fds``; :class:`RequestError` when it is
    not one the zygote can serve (the descriptors are the caller's to close)."""
    if flags & getattr(socket, "MSG_CTRUNC", 0) or len(fds) != 1:
        raise RequestError(
            "a request carries exactly one descriptor, the read end of the engine's lifeline "
            f"pipe; got {'more than one' if len(fds) == 1 else len(fds)}"
        )
    try:
        kind = os.fstat(fds[0]).st_mode
    except OSError as exc:
        raise RequestError(f"the request's descriptor cannot be read: {exc}") from None
    if not stat.S_ISFIFO(kind):
        raise RequestError("the request's descriptor must be the read end of a pipe (the lifeline)")
    if flags & getattr(socket, "MSG_TRUNC", 0):
        raise RequestError(f"the request is larger than {MAX_MESSAGE} bytes")
    try:
        request = json.loads(message.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError(f"the request is not a JSON object: {str(exc)[:200]}") from None
    return _check_fields(request)


def _check_fields(request: Any) -> dict[str, Any]:
    """``request`` when it has exactly the fields of :data:`REQUEST_FIELDS`, well typed."""
    expected = ", ".join(f"{k!r}: {t.__name__}" for k, t in REQUEST_FIELDS.items())
    if not isinstance(request, dict) or set(request) != set(REQUEST_FIELDS):
        got = sorted(request) if isinstance(request, dict) else type(request).__name__
        raise RequestError(f"a request is an object {{{expected}}}; got {got}")
    wrong = [k for k, t in REQUEST_FIELDS.items() if not isinstance(request[k], t)]
    argv, env = request["argv"], request["env"]
    if not wrong and not all(isinstance(a, str) for a in argv):
        wrong.append("argv")
    if not wrong and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        wrong.append("env")
    if wrong:
        raise RequestError(
            f"a request is an object {{{expected}}} (argv a list of strings, env "
            f"strings to strings); wrong: {', '.join(wrong)}"
        )
    head = [sys.executable, "-m", REFSERVER]
    if argv[:3] != head:
        raise RequestError(
            f"argv must start with {head} (this zygote forks only that); got {argv[:3]}"
        )
    if not os.path.isdir(request["cwd"]):
        raise RequestError(f"cwd {request['cwd']!r} is not a directory")
    log = request["log"]
    if not os.path.isabs(log) or not os.path.isdir(os.path.dirname(log)):
        raise RequestError(f"log {log!r} must be an absolute path in an existing folder")
    return request


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
    if flags.get("--drafter") in ("draft_model", "block"):
        names.append(flags.get("--draft-model") or default_draft_for(names[0]))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with contextlib.suppress(Exception):  # a bad flag: the engine's own start says what is wrong
        for name in names:
            # never a fetch here: the backend's check fetched it, or the engine's start says why
            ready = is_builtin_checkpoint(name) and is_ready(name)
            if name and (name.startswith("tiny:") or ready):
                load_model(name, flags.get("--dtype", "auto"), "cpu", int(flags.get("--seed", 0)))
    torch.set_num_threads(threads)


def package() -> str:
    """The folder of the pytest_specenergy this process imported."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def send(conn: socket.socket, message: dict[str, Any]) -> bool:
    """``message`` to one launcher; False when it has gone (its engines' exits go nowhere)."""
    try:
        conn.send(json.dumps(message).encode())
        return True
    except OSError:
        return False


class _Zygote:
    """The zygote's loop: its sockets, the engines it forked and which launcher asked for each."""

    def __init__(self, sock: socket.socket, listen: str | None) -> None:
        self.first = sock
        pid = peer_credentials(sock)[0]  # of a socket pair: the process that made it
        self.launcher = (pid, start_time(pid) or "gone")
        self.owner = os.getpid()  # a fork of this process must never clean up the zygote's socket
        self.listen = listen
        self.poller = select.poll()
        #: fd -> (the launcher's socket, its (pid, start time)): its engines' watchdogs watch it.
        self.clients: dict[int, tuple[socket.socket, tuple[int, str]]] = {}
        self.asked_by: dict[int, socket.socket] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.poller.register(self.wake_r, select.POLLIN)
        self.listener: socket.socket | None = None
        if listen:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                listener.bind(listen)
                listener.listen(16)
                self.listener = listener
                self.poller.register(listener.fileno(), select.POLLIN)
            except OSError:  # a TMPDIR too long for a socket path: serve this launcher alone
                listener.close()
        self.ready = {
            "ready": os.getpid(),
            "python": sys.executable,
            "package": package(),
            "shared": listen if self.listener else None,
        }

    def _add(self, conn: socket.socket, launcher: tuple[int, str]) -> None:
        self.clients[conn.fileno()] = (conn, launcher)
        self.poller.register(conn.fileno(), select.POLLIN)

    def _drop(self, fd: int) -> None:
        conn, _ = self.clients.pop(fd)
        self.poller.unregister(fd)
        conn.close()  # its engines stop with their launcher (lifeline, pid), not with this socket

    def _fds(self) -> list[int]:
        """Every descriptor of the zygote's own, which a forked engine closes."""
        own = [*self.clients, self.wake_r, self.wake_w]
        return own + ([self.listener.fileno()] if self.listener else [])

    def run(self) -> int:
        """Serve until the launcher that started the zygote closes its socket or dies."""
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wake_w)
        self._add(self.first, self.launcher)
        send(self.first, self.ready)
        while True:
            events = self.poller.poll(POLL_S * 1000)
            if start_time(self.launcher[0]) != self.launcher[1]:
                return 0  # a forked helper of it may hold its socket: no EOF would come
            for fd, mask in events:
                if fd == self.wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 4096)
                elif self.listener is not None and fd == self.listener.fileno():
                    self._accept()
                elif fd in self.clients and not self._serve(fd, mask):
                    if fd == self.first.fileno():
                        return 0
                    self._drop(fd)
            self._reap()

    def _accept(self) -> None:
        """A launcher connecting at the listening socket: this user's only, and a bounded number."""
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
            pid, uid, _ = peer_credentials(conn)
        except OSError:
            return
        started = start_time(pid)
        if uid != os.getuid() or started is None:
            conn.close()
            return
        if len(self.clients) >= MAX_CLIENTS:
            send(conn, {"error": f"the engine zygote serves at most {MAX_CLIENTS} launchers"})
            conn.close()
            return
        if send(conn, self.ready):
            self._add(conn, (pid, started))
        else:
            conn.close()

    def _serve(self, fd: int, mask: int) -> bool:
        """One message from a launcher; False when its connection has ended."""
        conn, launcher = self.clients[fd]
        try:
            message, fds, flags, _ = socket.recv_fds(conn, MAX_MESSAGE, 1)
        except OSError:
            return False
        if not message and not fds and mask & (select.POLLHUP | select.POLLERR):
            return False
        try:
            pid = self._fork(message, fds, flags, launcher)
        except RequestError as exc:
            send(conn, {"error": str(exc)})
            return True
        except Exception as exc:  # noqa: BLE001 - the zygote serves on, whatever one request did
            send(conn, {"error": f"the engine zygote could not fork the engine: {exc!r}"})
            return True
        finally:
            for received in fds:
                with contextlib.suppress(OSError):
                    os.close(received)
        self.asked_by[pid] = conn
        send(conn, {"started": pid})
        return True

    def _fork(
        self, message: bytes, fds: Sequence[int], flags: int, launcher: tuple[int, str]
    ) -> int:
        request = check_request(message, fds, flags)
        _build_tiny_models(request["argv"])
        return fork_engine(request, fds[0], self._fds(), launcher)

    def _reap(self) -> None:
        """Reap every ended engine, and say how it ended to the launcher that asked for it."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            conn = self.asked_by.pop(pid, None)
            if conn is not None and conn.fileno() in self.clients:
                send(conn, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def close(self) -> None:
        """Remove the listening socket and the folder made for it (the zygote's own process only:
        a fork that got here by mistake leaves them)."""
        if os.getpid() != self.owner or not self.listen:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.listen)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.listen))


def serve(sock: socket.socket, listen: str | None = None) -> int:
    """Fork an engine per request and report its exit to the connection that asked, until the
    launcher's ``sock`` closes or its process dies; others connect at ``listen``."""
    _preload()
    zygote = None
    try:
        zygote = _Zygote(sock, listen)
        return zygote.run()
    finally:
        if zygote is not None:
            zygote.close()
        elif listen and os.path.exists(os.path.dirname(listen)):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(listen))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_specenergy.engines.zygote_serve --fd N [--listen PATH]``: serve on the
    inherited socket."""
    import argparse

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
    status = main()
    # Skip the interpreter's teardown of torch and transformers (seconds of finalisation, during
    # which the zygote lingered after its launcher had gone): nothing is left to write.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
