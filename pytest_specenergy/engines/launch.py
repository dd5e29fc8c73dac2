"""Supervised server processes.

Each engine runs as a child in its own process group, logging to a file. Start-up waits for
``/health`` with a timeout and notices an early exit; teardown terminates the whole group
and waits, so GPU memory is released before the next engine starts. Never an in-process
``sglang.Engine``: its shutdown kills every child of the host (reference/sglang-api.md s.4).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pytest_specenergy.engines.base import EngineBackend
from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.engines.config import EngineConfig


class EngineStartError(RuntimeError):
    """An engine did not come up; the message quotes its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, for failure messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    """One running engine server; also the meters' :class:`EngineHandle`."""

    def __init__(self, config: EngineConfig, backend: EngineBackend, log_dir: Path,
                 startup_timeout_s: float | None = None, host: str = "127.0.0.1") -> None:
        self.config = config
        self.backend = backend
        self.host = host
        self.port = free_port(host)
        self.argv = backend.command(config, host, self.port)
        self.env: dict[str, str] = {**os.environ, **backend.environment(config)}
        # Child Python processes must see the plugin even when it is not installed.
        root = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (root, self.env.get("PYTHONPATH")) if p)
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in config.label())
        self.log_path = log_dir / f"{stamp}-{safe}-{self.port}.log"
        self.startup_timeout_s = startup_timeout_s or backend.startup_timeout_s
        self.client = EngineClient(f"http://{host}:{self.port}")
        self.server_info: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id (its process group leader)."""
        return self._proc.pid if self._proc else None

    def start(self) -> ServerProcess:
        """Launch and wait until ``/health`` answers; raise :class:`EngineStartError` otherwise."""
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.env,
                                          start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.05
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise EngineStartError(
                    f"engine {self.config.label()} exited with code {code} during start-up; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}")
            if self.client.health(timeout_s=2.0):
                self.server_info = self.client.server_info()
                return self
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        self.stop()
        raise EngineStartError(
            f"engine {self.config.label()} did not answer /health within "
            f"{self.startup_timeout_s:.0f} s; log {self.log_path}:\n{log_tail(self.log_path)}")

    def alive(self) -> bool:
        """True while the process runs."""
        return self._proc is not None and self._proc.poll() is None

    def terminate(self) -> None:
        """Ask the process group to exit (SIGTERM) without waiting; :meth:`stop` finishes."""
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the whole process group and wait for it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The leader may be gone while other members of its group linger: sweep them too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def work_trace(self, start: int) -> tuple[int, list[dict[str, Any]]]:
        """Steps recorded since ``start`` (reference server only)."""
        return self.client.work_trace(start)

    def describe(self) -> dict[str, Any]:
        """What ran: argv, log, and the engine's own ``/server_info`` facts."""
        info = self.server_info
        return {"config": self.config.as_dict(), "argv": self.argv, "log": str(self.log_path),
                "version": info.get("version"), "engine": info.get("engine", self.backend.name),
                "server_info": {k: v for k, v in info.items() if k != "internal_states"}}


def python_executable() -> str:
    """The interpreter running pytest; servers start with the same one."""
    return sys.executable
