"""Engine configurations: what one server process is started with. Equal configs share one pool
process for the session; the baseline arm is always :meth:`EngineConfig.twin`, so the matched pair
cannot differ by accident."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields
from dataclasses import replace
from typing import Any
from typing import Mapping

from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.refserver.faults import TARGET_FAULTS

#: Replay engines derived from a speculative config (see :class:`EngineConfig`).
REPLAY_MODES = ("", "verify", "proposals")


@dataclass(frozen=True)
class EngineConfig:
    """Everything that identifies one engine process. ``options``: the ``model(...)`` marker's
    engine keywords (SGLang ``ServerArgs`` fields), sorted so equal settings hash alike; ``faults``:
    reference-server fault switches for the plugin's own tests. ``replay`` (draft removal,
    :mod:`pytest_specenergy.measure.removal`): ``verify`` verifies the drafts each request brings,
    recorded from this drafter, with no draft passes; ``proposals`` runs the drafter's passes but
    verifies the recorded drafts (controlled acceptance without its oracle); ``""`` is the drafter
    itself."""

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
            raise ValueError(
                "a replay engine replays a drafter's drafts; this config has no drafter"
            )

    @property
    def is_speculative(self) -> bool:
        """True for the speculative arm."""
        return self.drafter is not None

    def twin(self) -> EngineConfig:
        """The non-speculative twin: identical in everything but the drafter and the faults only
        speculation runs."""
        return replace(
            self,
            drafter=None,
            replay="",
            faults=tuple(f for f in self.faults if f in TARGET_FAULTS),
        )

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
        """A JSON-ready description of every field, in field order (``replay`` only when set)."""
        data = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name != "replay" or self.replay
        }
        data.update(
            drafter=self.drafter.as_dict() if self.drafter else None,
            options=dict(self.options),
            faults=list(self.faults),
        )
        return data

    @staticmethod
    def freeze_options(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """Sorted, hashable engine options (lists become tuples)."""
        return tuple(sorted((k, _hashable(v)) for k, v in options.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return (
        tuple(sorted((k, _hashable(v)) for k, v in value.items()))
        if isinstance(value, dict)
        else value
    )
