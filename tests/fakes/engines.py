"""Fakes of the engine layer's protocols (``pytest_specenergy/engines/base.py``): a server and a
pool that the measurer drives without a process, around a test's own fake client.

They are fakes, not engines: a client class of the test answers ``/generate`` the way SGLang
does. What the real classes decide from the engine's answers (the admission cap, the special
token ids) is the real code, borrowed from :class:`ServerProcess` and run on the fake's fields,
so a fake cannot drift from it.
"""

from __future__ import annotations

from typing import Any
from typing import Callable

from pytest_specenergy.engines.base import BackendDefaults
from pytest_specenergy.engines.client import ABORT_RETRY_S
from pytest_specenergy.engines.client import abort_until_answered
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess


class FakeBackend(BackendDefaults):
    """A backend with every default (no prompt token ids, plain ``/flush_cache``, ...)."""

    name = "fake"
    startup_timeout_s = 1.0

    def __init__(self, returns_prompt_token_ids: bool | None = None) -> None:
        self.returns_prompt_token_ids = returns_prompt_token_ids

    def check(self, config: EngineConfig) -> None:
        """Every config runs."""

    def command(self, config: EngineConfig, host: str, port: int) -> list[str]:
        """Nothing is started."""
        return []

    def environment(self, config: EngineConfig) -> dict[str, str]:
        """No environment."""
        return {}

    def drafters(self) -> tuple[str, ...]:
        """Any drafter a test names."""
        return ("ngram", "draft_model", "block", "none")


class AbortingClient:
    """The part of :class:`~pytest_specenergy.engines.client.EngineClient` a window's close uses:
    a fake client subclasses this and implements ``abort(rid=None)``; the aborts until answered
    are the real function's, over that ``abort``."""

    timeout_s = 30.0

    def abort(self, rid: str | None = None) -> None:
        raise NotImplementedError

    def abort_until_answered(
        self, pending: Callable[[], set[str]], *, retry_s: float = ABORT_RETRY_S
    ) -> int:
        return abort_until_answered(self, pending, retry_s=retry_s)


class FakeServer:
    """A running engine as far as the measurer and the meters look: a config, a client, the
    ``/server_info`` it answered, and the real :class:`ServerProcess` methods over them."""

    admit_exactly = ServerProcess.admit_exactly
    special_token_ids = ServerProcess.special_token_ids

    def __init__(
        self,
        config: EngineConfig,
        client: Any,
        server_info: dict[str, Any] | None = None,
        backend: Any = None,
    ) -> None:
        self.config = config
        self.client = client
        self.server_info = {"device": "cpu"} if server_info is None else server_info
        self.backend = backend if backend is not None else FakeBackend()
        self.env: dict[str, str] = {}
        self.pid: int | None = None
        #: The cap :meth:`admit_exactly` set (None: the engine's own), as on a real server.
        self.admission_cap: int | None = None

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake", "version": "0", "config": self.config.as_dict()}

    def work_trace(self, start: int) -> tuple[int, list[dict[str, Any]]]:
        return start, []


def fake_config(max_running_requests: int | None = None) -> EngineConfig:
    """A config for a fake server built outside a pool."""
    return EngineConfig("reference", "tiny:dense", max_running_requests=max_running_requests)


class FakePool:
    """One fake server per config for the session, as the real pool keeps its processes:
    ``server(config)`` makes it on first use."""

    #: 0: unbounded, as the CPU pool; a test of the one-GPU pool sets 1.
    max_live = 0

    def __init__(self) -> None:
        self.starts: list[EngineConfig] = []
        self.live: dict[EngineConfig, Any] = {}

    def server(self, config: EngineConfig) -> Any:
        raise NotImplementedError

    def get(self, config: EngineConfig) -> Any:
        if config not in self.live:
            self.starts.append(config)
            self.live[config] = self.server(config)
        return self.live[config]

    def start_together(self, configs: list[EngineConfig]) -> None:
        """Nothing to overlap: a fake starts in no time, on first :meth:`get`."""

    def pids(self) -> list[int]:
        """The live fakes' pids (a fake server has one only where a test gave it one)."""
        return [pid for server in self.live.values() if (pid := server.pid) is not None]

    def close(self) -> None:
        pass
