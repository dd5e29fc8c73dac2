"""The protocols of the engine layer: a backend (how one kind of engine is started), a running
server (what the measurer may ask of it) and the pool (where servers come from). The measurer
and the meters see engines only through these; the test fakes implement them.

A backend turns an :class:`EngineConfig` into the command line and environment of a server
speaking SGLang's HTTP protocol subset, so one client drives them all; :mod:`.backends` picks
one by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping
from typing import Protocol

from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.refserver.names import DTYPES as REFERENCE_DTYPES  # import-free: names only

if TYPE_CHECKING:  # the markers read this module at collection, before any HTTP is spoken
    from pytest_specenergy.engines.client import EngineClient


class EngineConfigError(ValueError):
    """An engine configuration that cannot run (bad combination, missing model, old version)."""


class EngineBackend(Protocol):
    """Everything the plugin asks of one kind of engine: how to start and stop it, what it
    implements, and the facts its server does not report itself."""

    name: str
    #: Seconds to wait for ``/health`` before the start counts as failed.
    startup_timeout_s: float
    #: Whether ``/generate`` answers ``return_prompt_token_ids``: True, False, or None when it
    #: cannot be known (SGLang releases differ); coherence tokenises without a forward if True.
    returns_prompt_token_ids: bool | None
    #: Stop by signalling the group's leader (the watchdog) alone, which passes SIGTERM to the
    #: server only: for servers that crash when their whole group gets SIGTERM at once.
    stop_signal_leader_only: bool

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

    def flush_cache_path(self, config: EngineConfig) -> str:
        """The ``/flush_cache`` request path for ``config``'s engine (with query, if any)."""

    def special_token_ids(self, config: EngineConfig) -> tuple[int, ...]:
        """The served model's special token ids where ``/server_info`` does not list them."""

    def dry_run_notes(self, config: EngineConfig) -> list[str]:
        """What a reader of ``--specenergy-dry-run`` should know about this engine's lines."""


class BackendDefaults:
    """The defaults of the optional :class:`EngineBackend` members, in one place: a backend
    subclasses this and overrides what its engine does differently."""

    returns_prompt_token_ids: bool | None = None
    stop_signal_leader_only = False

    def twin_differences(
        self, spec_info: Mapping[str, Any], base_info: Mapping[str, Any]
    ) -> list[str]:
        """Nothing resolved by the engine itself: the arms' command lines are the whole story."""
        return []

    def flush_cache_path(self, config: EngineConfig) -> str:
        """Plain ``/flush_cache``."""
        return "/flush_cache"

    def special_token_ids(self, config: EngineConfig) -> tuple[int, ...]:
        """None known beyond ``/server_info``'s."""
        return ()

    def dry_run_notes(self, config: EngineConfig) -> list[str]:
        """No notes."""
        return []


class Server(Protocol):
    """A running engine as the measurer and the meters use it (:class:`.launch.ServerProcess`)."""

    config: EngineConfig
    backend: EngineBackend
    client: EngineClient
    #: ``/server_info`` as read after the start (the engine's own facts).
    server_info: dict[str, Any]
    #: Environment the server process was started with (``CUDA_VISIBLE_DEVICES`` lives here).
    env: Mapping[str, str]

    @property
    def pid(self) -> int | None:
        """The process group leader's pid, while it runs."""

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """The served model's special token ids (leak detection in coherence)."""

    def admit_exactly(self, batch: int) -> int | None:
        """Cap the running requests at ``batch`` where the engine can be told at run time and
        the config declares no cap; the cap in force afterwards (None: unknown)."""

    def describe(self) -> dict[str, Any]:
        """What ran: argv, log, and the engine's own ``/server_info`` facts."""

    def work_trace(self, start: int) -> tuple[int, list[dict[str, Any]]]:
        """Steps recorded since cursor ``start`` and the next cursor (reference server only)."""


class Pool(Protocol):
    """Where the measurer gets running servers (:class:`.pool.EnginePool`)."""

    #: Engines the pool keeps running at once (0: unbounded; 1: one GPU holds one engine).
    max_live: int
    #: Every engine start, in order (the run document counts them).
    starts: list[EngineConfig]

    def get(self, config: EngineConfig) -> Server:
        """The running server for ``config``, started now if needed."""

    def start_together(self, configs: list[EngineConfig]) -> None:
        """Start the engines of ``configs`` side by side where the pool is unbounded."""

    def pids(self) -> list[int]:
        """The process group leaders' pids of every engine running now (the NVML meter counts a
        resident sibling of the measured engine as the plugin's own process)."""

    def close(self) -> None:
        """Stop every server."""


#: Every engine backend's name: the only list of them (options and markers read it).
ENGINES: tuple[str, ...] = ("reference", "sglang")
#: Drafters each engine implements: the markers check against it at collection, each backend's
#: ``drafters()`` answers from it. ``none`` is the A/A control on either engine
#: (engines/drafters.py): the CPU path gets the noise floor a GPU runner gets (issue 41 item 6).
ENGINE_DRAFTERS: dict[str, tuple[str, ...]] = {
    "reference": ("ngram", "draft_model", "block", "none"),
    "sglang": ("ngram", "draft_model", "eagle", "eagle3", "nextn", "dflash", "dspark", "none"),
}
#: Compute dtypes each engine takes: the reference server's own list, SGLang's ``--dtype``
#: spellings (``engines/sglang.py`` maps each to the one it passes).
ENGINE_DTYPES: dict[str, tuple[str, ...]] = {
    "reference": REFERENCE_DTYPES,
    "sglang": ("auto", "half", "float16", "fp16", "bfloat16", "bf16", "float", "float32", "fp32"),
}
