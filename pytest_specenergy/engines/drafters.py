"""Drafter declarations: which speculative scheme a case uses, with validated settings. A
:class:`Drafter` is a value object: equal name, settings and id share one pool engine.
``num_draft_tokens`` always means *drafted* tokens per verify step; the target verifies one more
(the last committed token); SGLang's ``speculative_num_draft_tokens`` counts it, so its builder adds
one."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Mapping

from pytest_specenergy.refserver.names import EARLY_EXIT_PREFIX

__all__ = ["EARLY_EXIT_PREFIX", "Drafter", "DrafterError"]


class DrafterError(ValueError):
    """A drafter was declared with an unknown name or an invalid setting."""


@dataclass(frozen=True)
class _Setting:
    kind: type
    default: Any = None
    required: bool = False
    minimum: int = 1  # integer settings only
    help: str = ""


def _int(default: int, minimum: int = 1, help: str = "") -> _Setting:
    return _Setting(int, default, False, minimum, help)


def _path(required: bool, help: str) -> _Setting:
    return _Setting(str, None, required, help=help)


_ACCEPT_P = _Setting(
    float,
    help="controlled acceptance (reference server, calibration): verify the target's own "
    "greedy continuation with each drafted token kept with this probability",
)


def _tree(required: bool, help: str) -> dict[str, _Setting]:
    """The settings of SGLang's tree drafters (EAGLE, EAGLE3, MTP): a head and its tree's shape."""
    return {
        "draft_model": _path(required, help),
        "num_steps": _int(3),
        "topk": _int(1),
        "num_draft_tokens": _int(3),
    }


# One schema per scheme. The reference server implements `ngram` and `draft_model`; SGLang
# implements the rest (engines/sglang.py maps each to its algorithm and flags).
SCHEMAS: dict[str, dict[str, _Setting]] = {
    "ngram": {
        "num_draft_tokens": _int(8, help="tokens proposed per step"),
        "min_match_window": _int(1, help="shortest suffix matched against earlier tokens"),
        "max_match_window": _int(4, help="longest suffix matched against earlier tokens"),
        "max_bfs_breadth": _int(1, help="SGLang only: tree breadth (1 = chain, keeps fa3)"),
    },
    "draft_model": {
        "draft_model": _path(
            True,
            "path or tiny:* name of the smaller draft model, or (reference server) early-exit:K, "
            "the target's own first K layers and head",
        ),
        "num_draft_tokens": _int(4, help="tokens proposed per step"),
        "accept_p": _ACCEPT_P,
    },
    # The DFlash/DSpark shape on the reference server: one draft forward proposes a whole block.
    "block": {
        "draft_model": _path(True, "path or tiny:* name of the block draft model"),
        "block_size": _int(
            16,
            minimum=2,
            help="positions verified per step: the last token + block_size - 1 drafts",
        ),
        "accept_p": _ACCEPT_P,
    },
    "eagle": _tree(True, "EAGLE head checkpoint"),
    "eagle3": _tree(True, "EAGLE3 head checkpoint"),
    "nextn": _tree(False, "MTP head checkpoint (default: inside the target)"),
    "dflash": {
        "draft_model": _path(True, "DFlash block drafter checkpoint"),
        "num_draft_tokens": _int(15, help="block size minus one"),
    },
    "dspark": {
        "draft_model": _path(True, "DSpark block drafter checkpoint"),
        "num_draft_tokens": _int(6, help="block size minus one"),
    },
    # The A/A control: the "speculative" arm is the baseline's own non-speculative engine, started
    # as a second process. Its pair must pass every check and the gate: it measures the plugin's
    # noise floor, and it is what runs on engines that cannot speculate (SGLang on CPU). Nothing is
    # drafted: no setting, 0 tokens proposed per step.
    "none": {},
}

#: The accept length (tokens per verify step) of the paper's block drafters at serving batch:
#: DFlash-16 accepts fewer than 3 of its 16 proposals per step (s.9). A controlled block drafter
#: in the suites sits here by default (:func:`accept_p_for`), not at the tau ~4.4 of accept_p 0.8,
#: where the saving turned negative one power of two of batch later than the paper's (issue 41).
PAPER_BLOCK_TAU = 2.9


def accept_p_for(tau: float, block_size: int) -> float:
    """The ``accept_p`` whose expected accept length is ``tau`` for a block of ``block_size``:
    each draft kept with probability p until the first rejection, so a step commits
    ``1 + p + p**2 + ... + p**(block_size - 1)`` tokens (a step cut by ``max_new_tokens`` commits
    fewer). Rounded to 3 digits, as ids show it."""
    if block_size < 2 or not 1.0 <= tau <= block_size:
        raise DrafterError(
            f"accept length {tau!r} is out of reach for a block of {block_size}: expected a block "
            f"of at least 2 and an accept length between 1 and {block_size}"
        )
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the accept length grows with p
        mid = (low + high) / 2
        low, high = (mid, high) if sum(mid**j for j in range(block_size)) < tau else (low, mid)
    return round((low + high) / 2, 3)


_ID_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
_ID_ABBREV = {
    "num_draft_tokens": "k",
    "num_steps": "s",
    "topk": "t",
    "min_match_window": "min",
    "max_match_window": "w",
    "max_bfs_breadth": "bfs",
    "block_size": "b",
    "accept_p": "p",
}


@dataclass(frozen=True, init=False)
class Drafter:
    """A speculative drafter for one case: ``Drafter("ngram", num_draft_tokens=8)``. ``id`` names it
    in test ids and baselines: by default the scheme plus its non-default settings (``ngram-k4``,
    ``draft_model-dense-draft``), so a changed setting starts a new history. Pass ``id=`` to keep a
    case's stored baseline across a checkpoint swap or retune: how a pull request is gated against
    main."""

    name: str
    settings: tuple[tuple[str, Any], ...]
    id: str = field(compare=True)

    def __init__(self, name: str, id: str | None = None, **kwargs: Any) -> None:
        if not isinstance(name, str) or name.lower() not in SCHEMAS:
            raise DrafterError(f"unknown drafter {name!r}; expected one of {', '.join(SCHEMAS)}")
        name = name.lower()
        settings = _validate(name, kwargs)
        if id is None:
            id = _default_id(name, settings)
        elif not isinstance(id, str) or not _ID_RE.match(id):
            raise DrafterError(
                f"Drafter id {id!r} must be a non-empty string of letters, digits, '_', '.', '+', "
                "'-'"
            )
        elif settings.get("accept_p") is not None and f"p{settings['accept_p']}" not in id:
            # A controlled acceptance sets the accept length every figure of the case depends on:
            # every table names it (issue 41 item 6), whatever id the suite chose.
            id = f"{id}-p{settings['accept_p']}"
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "settings", tuple(sorted(settings.items())))
        object.__setattr__(self, "id", id)

    def get(self, key: str) -> Any:
        """The value of ``key`` (explicit or the scheme's default)."""
        return dict(self.settings)[key]

    @property
    def num_draft_tokens(self) -> int:
        """Tokens proposed per verify step (the target verifies one more)."""
        if self.name == "block":
            return int(self.get("block_size")) - 1
        return 0 if self.name == "none" else int(self.get("num_draft_tokens"))

    @property
    def draft_model(self) -> str | None:
        """The draft checkpoint, for schemes that have one."""
        return dict(self.settings).get("draft_model")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description: name, id and every setting."""
        return {"name": self.name, "id": self.id, "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Drafter:
        """Rebuild a drafter from :meth:`as_dict` output."""
        return cls(data["name"], id=data.get("id"), **dict(data.get("settings", {})))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings)
        return f"Drafter({self.name!r}, id={self.id!r}{', ' if args else ''}{args})"


def _validate(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    schema = SCHEMAS[name]
    unknown = sorted(set(kwargs) - set(schema))
    if unknown:
        raise DrafterError(
            f"Drafter({name!r}) got unknown setting(s) {', '.join(unknown)}; valid settings are "
            f"{', '.join(schema)}"
        )
    values: dict[str, Any] = {}
    for key, spec in schema.items():
        value = kwargs.get(key, spec.default)
        if value is None:
            if spec.required:
                raise DrafterError(f"Drafter({name!r}) needs {key}= ({spec.help})")
            continue
        if spec.kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < spec.minimum:
                raise DrafterError(
                    f"Drafter({name!r}) {key}={value!r}: expected an integer >= {spec.minimum}"
                )
        elif spec.kind is float:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0.0 <= value <= 1.0
            ):
                raise DrafterError(
                    f"Drafter({name!r}) {key}={value!r}: expected a probability in [0, 1]"
                )
            value = float(value)
        elif not isinstance(value, (str, os.PathLike)) or not str(value):
            raise DrafterError(f"Drafter({name!r}) {key}={value!r}: expected a path or model name")
        values[key] = str(value) if spec.kind is str else value
    if name == "ngram" and values["min_match_window"] > values["max_match_window"]:
        raise DrafterError(
            f"Drafter('ngram') min_match_window={values['min_match_window']} exceeds "
            f"max_match_window={values['max_match_window']}"
        )
    return values


def _default_id(name: str, settings: Mapping[str, Any]) -> str:
    schema = SCHEMAS[name]
    parts = [name]
    for key in sorted(settings):
        value = settings[key]
        if key == "draft_model":
            base = os.path.basename(str(value).rstrip("/")) or str(value)
            parts.append(re.sub(r"[^A-Za-z0-9_.+-]+", "-", base.split(":")[-1]))
        elif value != schema[key].default:
            parts.append(f"{_ID_ABBREV.get(key, key)}{value}")
    return "-".join(parts)
