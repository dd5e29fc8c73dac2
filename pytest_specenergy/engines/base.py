"""The engine backend protocol (:mod:`.backends` picks one): a backend turns an
:class:`EngineConfig` into the command line and environment of a server speaking SGLang's HTTP
protocol subset, so one client drives them all."""

from __future__ import annotations

from typing import Any
from typing import Mapping
from typing import Protocol

from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.refserver.names import DTYPES as REFERENCE_DTYPES  # import-free: names only


class EngineConfigError(ValueError):
    """An engine configuration that cannot run (bad combination, missing model, old version)."""


class EngineBackend(Protocol):
    """What the pool needs to start one kind of engine."""

    name: str
    #: Seconds to wait for ``/health`` before the start counts as failed.
    startup_timeout_s: float

    def check(self, config: EngineConfig) -> None:
        """Raise :class:`EngineConfigError` (naming the problem and the fix) if ``config`` cannot
        run."""

    def command(self, config: EngineConfig, host: str, port: int) -> list[str]:
        """The argv that starts a server for ``config`` listening on ``host:port``."""

    def environment(self, config: EngineConfig) -> dict[str, str]:
        """Extra environment variables for the server process."""

    def drafters(self) -> tuple[str, ...]:
        """Drafter names this backend implements."""

    def twin_differences(
        self, spec_info: Mapping[str, Any], base_info: Mapping[str, Any]
    ) -> list[str]:
        """What differs between the two arms' ``/server_info`` outside the speculative settings."""


#: Every engine backend's name: the only list of them (options and markers read it).
ENGINES: tuple[str, ...] = ("reference", "sglang")
#: Drafters each engine implements: the markers check against it at collection, each backend's
#: ``drafters()`` answers from it. ``none`` on SGLang is the A/A control (engines/drafters.py).
ENGINE_DRAFTERS: dict[str, tuple[str, ...]] = {
    "reference": ("ngram", "draft_model", "block"),
    "sglang": ("ngram", "draft_model", "eagle", "eagle3", "nextn", "dflash", "dspark", "none"),
}
#: Compute dtypes each engine takes: the reference server's own list, SGLang's ``--dtype``
#: spellings (``engines/sglang.py`` maps each to the one it passes).
ENGINE_DTYPES: dict[str, tuple[str, ...]] = {
    "reference": REFERENCE_DTYPES,
    "sglang": ("auto", "half", "float16", "fp16", "bfloat16", "bf16", "float", "float32", "fp32"),
}
