"""The engine backend protocol: how a kind of server is launched.

A backend turns an :class:`EngineConfig` into a command line and environment. Every backend
starts a server speaking SGLang's HTTP protocol subset, so one client drives them all.
"""

from __future__ import annotations

from typing import Protocol

from pytest_specenergy.engines.config import EngineConfig


class EngineConfigError(ValueError):
    """An engine configuration that cannot run (bad combination, missing model, old version)."""


class EngineBackend(Protocol):
    """What the pool needs to start one kind of engine."""

    name: str
    #: Seconds to wait for ``/health`` before the start counts as failed.
    startup_timeout_s: float

    def check(self, config: EngineConfig) -> None:
        """Raise :class:`EngineConfigError` (naming the problem and the fix) if ``config`` cannot run."""

    def command(self, config: EngineConfig, host: str, port: int) -> list[str]:
        """The argv that starts a server for ``config`` listening on ``host:port``."""

    def environment(self, config: EngineConfig) -> dict[str, str]:
        """Extra environment variables for the server process."""

    def drafters(self) -> tuple[str, ...]:
        """Drafter names this backend implements."""


#: Every engine backend's name: the only list of them (options and markers read it).
ENGINES: tuple[str, ...] = ("reference", "sglang")


def get_backend(name: str) -> EngineBackend:
    """The backend registered under ``name`` (``reference`` or ``sglang``)."""
    if name == "reference":
        from pytest_specenergy.engines.refserver import ReferenceBackend

        return ReferenceBackend()
    if name == "sglang":
        from pytest_specenergy.engines.sglang import SGLangBackend

        return SGLangBackend()
    raise EngineConfigError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
