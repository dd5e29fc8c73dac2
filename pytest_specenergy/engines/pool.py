"""The engine pool: one supervised server per distinct engine config, for the whole session.

A config starts once and is reused by every case that needs it, whichever module the case
sits in. ``max_live`` bounds how many servers run at once (one GPU holds one SGLang engine
at a time); the plugin orders items so that cases of one engine are adjacent.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from pytest_specenergy.engines.base import get_backend
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess


class EnginePool:
    """Starts engines on first use and keeps them until :meth:`close` (or eviction)."""

    def __init__(self, log_dir: Path, startup_timeout_s: float | None = None,
                 max_live: int = 0) -> None:
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.max_live = max_live
        self._live: OrderedDict[EngineConfig, ServerProcess] = OrderedDict()
        #: Every start, in order: how the benchmarks and tests count engine starts.
        self.starts: list[EngineConfig] = []
        self.failed: dict[EngineConfig, Exception] = {}

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
        if self.max_live:
            while len(self._live) >= self.max_live:
                _, oldest = self._live.popitem(last=False)
                oldest.stop()
        server = ServerProcess(config, backend, self.log_dir, self.startup_timeout_s)
        self.starts.append(config)
        try:
            server.start()
        except Exception as exc:
            self.failed[config] = exc
            raise
        self._live[config] = server
        return server

    def close(self) -> None:
        """Stop every server (all are signalled first, so they shut down side by side)."""
        for server in self._live.values():
            server.terminate()
        while self._live:
            _, server = self._live.popitem()
            server.stop()
