"""Engine configurations: what one server process is started with.

The pool keys server processes by :class:`EngineConfig`, so equal configs share one process
for the whole session. The baseline arm is always derived with :meth:`EngineConfig.twin`:
the same config with the drafter removed, so the matched pair cannot differ by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import Any
from typing import Mapping

from pytest_specenergy.engines.drafters import Drafter

#: Replay engines derived from a speculative config (see :class:`EngineConfig`).
REPLAY_MODES = ("", "verify", "proposals")


@dataclass(frozen=True)
class EngineConfig:
    """Everything that identifies one engine process.

    ``options`` are the engine keyword arguments of the ``model(...)`` marker (for SGLang,
    ``ServerArgs`` fields such as ``attention_backend``), kept sorted so that equal settings
    hash alike. ``faults`` are reference-server fault switches used by the plugin's own tests.

    ``replay`` derives the reference server's replay engines from a speculative config (draft
    removal, :mod:`pytest_specenergy.measure.removal`): ``verify`` verifies drafts that each
    request brings, recorded from this drafter, with no draft passes (the verify-only run);
    ``proposals`` runs the drafter's own passes but verifies the recorded drafts (a controlled-
    acceptance drafter measured without its oracle). ``""`` is the drafter itself.
    """

    engine: str
    model: str
    drafter: Drafter | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    max_running_requests: int | None = None
    options: tuple[tuple[str, Any], ...] = ()
    faults: tuple[str, ...] = ()
    replay: str = ""

    def __post_init__(self) -> None:
        if self.replay not in REPLAY_MODES:
            raise ValueError(f"replay={self.replay!r}: expected one of {REPLAY_MODES}")
        if self.replay and self.drafter is None:
            raise ValueError("a replay engine replays a drafter's drafts; this config has no drafter")

    @property
    def is_speculative(self) -> bool:
        """True for the speculative arm."""
        return self.drafter is not None

    def twin(self) -> EngineConfig:
        """The non-speculative twin: identical in everything but the drafter."""
        return replace(self, drafter=None, replay="")

    def replaying(self, mode: str) -> EngineConfig:
        """This speculative config's replay engine (``verify`` or ``proposals``)."""
        return replace(self, replay=mode)

    def option(self, key: str, default: Any = None) -> Any:
        """One engine option, or ``default``."""
        return dict(self.options).get(key, default)

    def label(self) -> str:
        """A short human-readable name for logs and tables."""
        arm = self.drafter.id if self.drafter else "baseline"
        if self.replay:
            arm += f", replay {self.replay}"
        return f"{self.engine}:{self.model}[{arm}]"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {
            "engine": self.engine,
            "model": self.model,
            "drafter": self.drafter.as_dict() if self.drafter else None,
            "dtype": self.dtype,
            "device": self.device,
            "seed": self.seed,
            "max_running_requests": self.max_running_requests,
            "options": {k: v for k, v in self.options},
            "faults": list(self.faults),
            **({"replay": self.replay} if self.replay else {}),
        }

    @staticmethod
    def freeze_options(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """Sorted, hashable engine options (lists become tuples)."""
        return tuple(sorted((k, _hashable(v)) for k, v in options.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
