"""Supervised server processes: each engine in its own process group under a parent-death watchdog,
with start-up, identity and request checks; see docs/engines.md#supervised-server-processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pytest_specenergy.engines.base import EngineBackend
from pytest_specenergy.engines.client import DEFAULT_REQUEST_TIMEOUT_S
from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.engines.client import EngineHTTPError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.identity import EngineIdentityError
from pytest_specenergy.engines.identity import EngineStartError
from pytest_specenergy.engines.identity import PortTakenError
from pytest_specenergy.engines.identity import check_identity
from pytest_specenergy.engines.identity import port_in_use
from pytest_specenergy.engines.zygote import LOST_EXIT
from pytest_specenergy.engines.zygote import ZygoteChild
from pytest_specenergy.engines.zygote import zygote_for

__all__ = ["EngineIdentityError", "EngineStartError", "ServerProcess", "free_port"]

#: Fresh ports tried when the picked one turns out to be taken before the launch.
PORT_TRIES = 5
#: Launches tried when another process's server takes the port between our pick and bind (it answers
#: our /health first): the identity check catches it, a fresh port is the remedy; bounded, so a port
#: thief following us still fails.
LAUNCH_TRIES = 2
#: How long a request failure waits for the engine's exit to become visible: a killed
#: engine closes its socket a moment before the watchdog reports its status.
EXIT_WAIT_S = 3.0


#: Ports this process has handed out: engines started side by side (threads) each call
#: :func:`free_port` before either binds, and the kernel may give the same free port twice.
_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host``, never one this process handed out before."""
    with _HANDED_OUT_LOCK:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise EngineStartError(f"no TCP port on {host} that this process has not used already")


def describe_exit(code: int) -> str:
    """``3``, or ``-9 (SIGKILL)`` for a signal death."""
    if code == LOST_EXIT:
        return "unknown (the engine zygote that forked it died; its log says how it ended)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(-code).name})"
    return str(code)


def _killpg(proc: subprocess.Popen[bytes] | ZygoteChild | None, sig: int) -> None:
    if proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


class ServerProcess:
    """One running engine server; also the meters' :class:`EngineHandle`."""

    def __init__(
        self,
        config: EngineConfig,
        backend: EngineBackend,
        log_dir: Path,
        startup_timeout_s: float | None = None,
        host: str = "127.0.0.1",
        request_timeout_s: float | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.host = host
        self.env: dict[str, str] = {**os.environ, **backend.environment(config)}
        # Child Python processes must see the plugin even when it is not installed.
        root = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (root, self.env.get("PYTHONPATH")) if p)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s or backend.startup_timeout_s
        self.request_timeout_s = request_timeout_s or DEFAULT_REQUEST_TIMEOUT_S
        self.server_info: dict[str, Any] = {}
        #: The admission cap the measurer set at run time (``/set_internal_state``); None: the
        #: engine's own, as started (a restarted engine is a new ServerProcess).
        self.admission_cap: int | None = None
        #: How the identity check proved the answering server is ours (see identity.py).
        self.identity: str | None = None
        self._proc: subprocess.Popen[bytes] | ZygoteChild | None = None
        #: Write end of the watchdog's pipe: the kernel closes it when we die, whatever kills us.
        self._lifeline: int | None = None
        #: The diagnosis that stopped the engine (it died, or hung): every request that was in
        #: flight with the one that found it gets it too.
        self._diagnosis: str | None = None
        self._diagnosing = threading.Lock()
        self._use_port(free_port(host))

    def _use_port(self, port: int) -> None:
        """Point argv, client and log name at ``port`` (re-picked if it was taken)."""
        self.port = port
        self.argv = self.backend.command(self.config, self.host, port)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.config.label())
        self.log_path = self.log_dir / f"{stamp}-{safe}-{port}.log"
        self.client = EngineClient(
            f"http://{self.host}:{port}",
            timeout_s=self.request_timeout_s,
            diagnose=self._diagnose,
            flush_path=self.backend.flush_cache_path(self.config),
        )

    @property
    def pid(self) -> int | None:
        """The group leader's pid: the watchdog, whose child (and group) is the server."""
        return self._proc.pid if self._proc else None

    def _pick_free_port(self) -> None:
        """Another process may have taken our port since :func:`free_port`: pick again."""
        taken = []
        for _ in range(PORT_TRIES):
            if not port_in_use(self.host, self.port):
                return
            taken.append(self.port)
            self._use_port(free_port(self.host))
        raise EngineStartError(
            f"engine {self.config.label()} was not started: ports {', '.join(map(str, taken))} on "
            f"{self.host} were already in use by another process ({self._foreign(taken[-1])}); is "
            "another session's engine running there?"
        )

    def _foreign(self, port: int) -> str:
        try:
            info = EngineClient(f"http://{self.host}:{port}")._request(
                "GET", "/server_info", timeout_s=2.0, diagnose=False
            )
        except EngineHTTPError:
            return "no /server_info: not an engine"
        if not isinstance(info, dict):
            return "not an engine"
        return (
            f"an engine serving model {info.get('model_path')!r}, pid "
            f"{info.get('pid', 'not reported')}"
        )

    def start(self) -> ServerProcess:
        """Launch and wait until ``/health`` answers; raise :class:`EngineStartError` otherwise."""
        lost: list[int] = []
        while True:
            self._pick_free_port()
            try:
                return self._launch()
            except PortTakenError as exc:
                # Our engine was stopped before it could bind; a fresh port avoids the thief.
                lost.append(self.port)
                if len(lost) >= LAUNCH_TRIES:
                    raise PortTakenError(
                        f"{exc}\n(ports lost to other processes this start: "
                        f"{', '.join(map(str, lost))})"
                    ) from None
                self._use_port(free_port(self.host))

    def _launch(self) -> ServerProcess:
        """One launch on ``self.port``, under the watchdog, up to a proven identity."""
        self._diagnosis = None
        read_end, self._lifeline = os.pipe()  # both non-inheritable; the watchdog gets read_end
        command = [
            sys.executable,
            "-m",
            "pytest_specenergy.engines.watchdog",
            "--parent",
            str(os.getpid()),
            "--fd",
            str(read_end),
            "--",
            *self.argv,
        ]
        try:
            with open(self.log_path, "ab") as log:
                log.write(f"$ {' '.join(self.argv)}\n".encode())
                log.flush()
                self._proc = self._spawn_forked(read_end) or subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                    pass_fds=(read_end,),
                )
        except BaseException:
            self._close_lifeline()
            raise
        finally:
            os.close(read_end)
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.05
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                self.stop()
                raise EngineStartError(
                    f"engine {self.config.label()} exited with code {describe_exit(code)} "
                    f"during start-up; {self._log()}"
                )
            if self.client.health(timeout_s=2.0):
                self._check_identity()
                return self
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        self.stop()
        raise EngineStartError(
            f"engine {self.config.label()} did not answer /health within "
            f"{self.startup_timeout_s:.0f} s; {self._log()}"
        )

    def _log(self) -> str:
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-25:])
        except OSError:
            tail = "(no log)"
        return f"log {self.log_path}:\n{tail}"

    def _spawn_forked(self, lifeline: int) -> ZygoteChild | None:
        """A fork of the zygote (torch and transformers already imported), or None where the plain
        start applies."""
        zygote = zygote_for(self.argv, self.env)
        if zygote is None:
            return None
        try:
            return zygote.spawn(self.argv, self.env, self.log_path, lifeline)
        except OSError:
            return None  # the zygote died: this and every later engine start the plain way

    def _check_identity(self) -> None:
        """``/health`` answered: prove it was our engine, or stop ours and say what answered."""
        proc = self._proc
        assert proc is not None
        try:
            self.server_info = self.client.server_info()
            if not isinstance(self.server_info, dict):
                raise EngineIdentityError(
                    f"/server_info on {self.host}:{self.port} answered "
                    f"{type(self.server_info).__name__}, not an object"
                )
            self.identity = check_identity(
                self.config, self.server_info, proc.pid, self.host, self.port
            )
        except (EngineIdentityError, EngineHTTPError) as exc:
            code = proc.poll()
            ours = (
                ("exited with code " + describe_exit(code)) if code is not None else "was stopped"
            )
            self.stop()
            error = PortTakenError if isinstance(exc, PortTakenError) else EngineIdentityError
            raise error(f"{exc}; engine {self.config.label()} {ours}; {self._log()}") from None

    def _diagnose(self, what: str, exc: BaseException, timed_out: bool) -> str | None:
        """The client's hook for a request that got no answer: did the engine die or hang? Requests
        in flight side by side fail together; the first one's diagnosis stops the engine, and the
        others get the same (whichever error the caller raises, it names the cause)."""
        with self._diagnosing:
            proc = self._proc
            if proc is None:
                return self._diagnosis
            diagnosis = self._diagnose_running(proc, what, exc, timed_out)
            if self._proc is None:  # it was stopped: later failures are this one's
                self._diagnosis = diagnosis
            return diagnosis

    def _diagnose_running(
        self,
        proc: subprocess.Popen[bytes] | ZygoteChild,
        what: str,
        exc: BaseException,
        timed_out: bool,
    ) -> str:
        label, pid = self.config.label(), proc.pid
        try:
            code = proc.wait(timeout=0 if timed_out else EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        log = self._log()
        if code is not None:
            self.stop()  # sweep what is left of its group, close the lifeline
            return (
                f"engine {label} (pid {pid}) exited with code {describe_exit(code)} during "
                f"{what}; {log}"
            )
        if timed_out:
            # A hung engine would stall every later case: stop it, so the pool starts a fresh one
            # for the next case.
            self.stop(grace_s=5.0)
            return (
                f"engine {label} (pid {pid}) did not answer {what} within "
                f"{self.client.timeout_s:g} s (hung, or slower than the request timeout: "
                f"raise --specenergy-request-timeout); the engine was stopped; {log}"
            )
        return f"engine {label} (pid {pid}) is running but {what} got no answer ({exc}); {log}"

    def alive(self) -> bool:
        """True while the process runs."""
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The process's exit code once it has ended (negative: the signal), else None."""
        return self._proc.poll() if self._proc is not None else None

    def terminate(self) -> None:
        """Ask the engine to exit without waiting, as :meth:`stop` starts. SIGTERM to SGLang's whole
        group made its scheduler die mid-drain ("crashed with exit code -15. Triggering SIGQUIT"),
        hence :meth:`_ask_leader`."""
        if not self._ask_leader(self._proc):
            _killpg(self._proc, signal.SIGTERM)

    def _ask_leader(self, proc: subprocess.Popen[bytes] | ZygoteChild | None) -> bool:
        """SIGUSR1 to the group's leader (the watchdog), which sends SIGTERM to the server alone,
        for a leader-only backend; False for any other (nothing sent)."""
        if proc is None or not self.backend.stop_signal_leader_only:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
        return True

    def kill(self) -> None:
        """SIGKILL the whole group at once, without waiting (a second SIGTERM to pytest)."""
        _killpg(self._proc, signal.SIGKILL)

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the whole process group and wait for it."""
        proc, self._proc = self._proc, None
        if proc is None:
            self._close_lifeline()
            return
        if self._ask_leader(proc):  # SGLang drains cleanly on SIGTERM to the server alone
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                pass
            break
        # The leader may be gone while other members of its group linger: sweep them too.
        _killpg(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # reap it, so no zombie stays behind
        self._close_lifeline()

    def _close_lifeline(self) -> None:
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            with contextlib.suppress(OSError):
                os.close(lifeline)

    def admit_exactly(self, batch: int) -> int | None:
        """The engine's cap on running requests, set to ``batch`` where it can be set at run time
        (``settable_internal_state`` lists it) and the case declares no cap of its own, so that
        requests sent beyond the batch queue inside the engine instead of travelling (both arms
        alike; one engine serves every batch point). Returns the cap in force (None: the engine
        reports none); a batch above the engine's configured cap leaves that cap."""
        info = self.server_info
        configured = info.get("max_running_requests")
        settable = "max_running_requests" in (info.get("settable_internal_state") or ())
        declared = self.config.max_running_requests is not None
        if declared or not settable or not isinstance(configured, int) or batch > configured:
            return configured
        if self.admission_cap != batch:
            self.client.set_internal_state(max_running_requests=batch)
            self.admission_cap = batch
        return batch

    def work_trace(self, start: int) -> tuple[int, list[dict[str, Any]]]:
        """Steps recorded since ``start`` (reference server only)."""
        return self.client.work_trace(start)

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """The served model's special token ids: the engine's ``/server_info`` list (the reference
        server's), else what the backend reads from the checkpoint (SGLang's ``/server_info`` has
        none)."""
        reported = self.server_info.get("special_token_ids")
        if reported:
            return tuple(int(t) for t in reported)
        return tuple(self.backend.special_token_ids(self.config))

    def describe(self) -> dict[str, Any]:
        """What ran: argv, log, and the engine's own ``/server_info`` facts."""
        info = self.server_info
        return {
            "config": self.config.as_dict(),
            "argv": self.argv,
            "log": str(self.log_path),
            "version": info.get("version"),
            "engine": info.get("engine", self.backend.name),
            "identity": self.identity,
            "server_info": {k: v for k, v in info.items() if k != "internal_states"},
        }
