"""The engine pool: one supervised server per distinct engine config, for the whole session; handles
SIGTERM while it holds engines. See docs/engines.md#the-engine-pool-and-signals."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import OrderedDict
from pathlib import Path
from types import FrameType
from typing import Any
from typing import Callable

from pytest_specenergy.engines.backends import get_backend
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.launch import describe_exit

#: ``progress(level, text)``: where the pool reports each engine start (level 0); a plain
#: callback, so this layer knows nothing of who prints it.
Progress = Callable[[int, str], None]


#: The signals that end a session like Ctrl-C while engines run (a platform without SIGHUP has
#: SIGTERM alone).
STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None
)


class EngineTerminated(KeyboardInterrupt):
    """pytest got SIGTERM or SIGHUP while engines ran: end the session like Ctrl-C, so teardown
    runs."""


class EnginePool:
    """Starts engines on first use and keeps them until :meth:`close` (or eviction)."""

    def __init__(
        self,
        log_dir: Path,
        startup_timeout_s: float | None = None,
        max_live: int = 0,
        request_timeout_s: float | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.progress = progress
        self.startup_timeout_s = startup_timeout_s
        #: Seconds one request may take (None: the client's default); see EngineClient.
        self.request_timeout_s = request_timeout_s
        self.max_live = max_live
        self._live: OrderedDict[EngineConfig, ServerProcess] = OrderedDict()
        #: Every start, in order: how the benchmarks and tests count engine starts.
        self.starts: list[EngineConfig] = []
        self.failed: dict[EngineConfig, Exception] = {}
        self._previous_handler: dict[int, Any] = {}
        self._handling = False
        self._terminations = 0

    def get(self, config: EngineConfig) -> ServerProcess:
        """The running server for ``config``, started now if needed."""
        server = self._live.get(config)
        if server is not None and server.alive():
            self._live.move_to_end(config)
            return server
        if config in self.failed:
            # A config that failed to start fails every case fast, with the same message.
            raise self.failed[config]
        backend = get_backend(config.engine)
        backend.check(config)
        while self.max_live and len(self._live) >= self.max_live:
            self._live.popitem(last=False)[1].stop()
        if server is not None:  # it died (or was stopped after a hang): sweep what is left
            self._live.pop(config, None)
            code = server.exit_code()
            server.stop()
            # Never silent: the next measurement runs on a new process (see its log).
            how = f"exit code {describe_exit(code)}" if code is not None else "stopped"
            self._report(
                f"engine {config.label()} died ({how}) and is restarted; log {server.log_path}"
            )
        self._install_sigterm_handler()
        server = ServerProcess(
            config,
            backend,
            self.log_dir,
            self.startup_timeout_s,
            request_timeout_s=self.request_timeout_s,
        )
        self.starts.append(config)
        began = time.monotonic()
        try:
            server.start()
        except Exception as exc:
            self.failed[config] = exc
            self._report(
                f"engine {config.label()} failed to start after {time.monotonic() - began:.1f} s"
            )
            raise
        except BaseException:  # Ctrl-C or SIGTERM mid-start: it is in no list close() sees
            server.stop()
            raise
        self._live[config] = server
        self._report(f"engine {config.label()} started in {time.monotonic() - began:.1f} s")
        return server

    def _report(self, text: str) -> None:
        if self.progress is not None:
            self.progress(0, text)

    def start_together(self, configs: list[EngineConfig]) -> None:
        """Start the engines of ``configs`` not running yet side by side when the pool is unbounded
        (a start is mostly imports and model building, which overlap on separate cores); a failed
        config's :meth:`get` raises its error."""
        pending = [
            c for c in dict.fromkeys(configs) if c not in self._live and c not in self.failed
        ]
        if self.max_live or len(pending) < 2:
            return
        self._install_sigterm_handler()  # only the main thread can; the starting threads cannot
        threads = [
            threading.Thread(
                target=self._start_quietly, args=(c,), name="specenergy-start", daemon=True
            )
            for c in pending
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _start_quietly(self, config: EngineConfig) -> None:
        with contextlib.suppress(Exception):  # kept in self.failed; get() raises it for the case
            self.get(config)

    def pids(self) -> list[int]:
        """The pids of every engine running now (their process group leaders)."""
        return [pid for server in list(self._live.values()) if (pid := server.pid) is not None]

    def close(self) -> None:
        """Stop every server (all are signalled first, so they shut down side by side)."""
        for server in self._live.values():
            server.terminate()
        while self._live:
            _, server = self._live.popitem()
            server.stop()
        self._restore_sigterm_handler()

    # -- SIGTERM and SIGHUP -------------------------------------------------------------
    def _install_sigterm_handler(self) -> None:
        """Handle SIGTERM and SIGHUP while engines may run; only the main thread can set handlers.
        SIGHUP (a closed terminal or SSH session, some supervisors) ends a session as SIGTERM does:
        unhandled, it lost every finished result."""
        if self._handling or threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            if previous == signal.SIG_IGN:
                continue  # whoever started us asked for it to be ignored (nohup): respect that
            signal.signal(signum, self._on_sigterm)
            self._previous_handler[signum] = previous
        self._handling = True

    def _restore_sigterm_handler(self) -> None:
        if not self._handling or threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous_handler.items():
            # Only undo our own handler: something installed later keeps its place.
            if signal.getsignal(signum) == self._on_sigterm:
                signal.signal(signum, previous or signal.SIG_DFL)
        self._handling = False
        self._previous_handler = {}

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._terminations += 1
        servers = list(self._live.values())
        if self._terminations == 2:
            # A second SIGTERM (coreutils timeout signals the whole group) will not wait: kill the
            # engines now but keep unwinding, so what was measured is still written (table, JSON,
            # run marked interrupted); a third ends it.
            for server in servers:
                server.kill()
            return
        if self._terminations > 2:
            self._restore_sigterm_handler()
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        for server in servers:
            server.terminate()  # they stop side by side while pytest unwinds
        previous = self._previous_handler.get(signum)
        if callable(previous):
            previous(signum, frame)  # chain: a handler installed before ours still runs
        raise EngineTerminated(
            f"{signal.Signals(signum).name} received: stopping {len(servers)} engine(s) and "
            "ending the session"
        )
