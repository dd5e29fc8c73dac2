"""How the run document is read and written: one validating reader for every typed part, driven
by each part's declared field types, and the JSON each part writes back. Standard library only.

A part of the document is a :class:`Record`: a frozen dataclass whose fields are read from JSON by
their annotations (``float``, ``int``, ``str``, ``bool``, ``tuple[X, ...]``, ``dict[str, X]``,
another record, any of them ``| None``), so a file that holds the wrong kind of value is refused
with the file, the record and the field named, never half read. Fields a record does not declare
are kept in its ``extra`` and written back, so an older plugin rewriting a newer plugin's file
loses nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from typing import Callable
from typing import ClassVar
from typing import Mapping
from typing import TypeVar

R = TypeVar("R", bound="Record")


class DocumentError(ValueError):
    """A document field is missing or of the wrong kind; the message names where."""


def finite(value: Any) -> bool:
    """A JSON number that is neither NaN nor infinite (booleans are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: Every record class by name: the field annotations name them (``"StepRecord | None"``).
_RECORDS: dict[str, type[Record]] = {}


class Record:
    """A typed part of the run document (a frozen dataclass that subclasses this).

    :meth:`from_dict` reads every field by its declared type; :meth:`as_dict` writes the JSON
    object back: the declared fields, then what ``extra`` kept. A field named in
    ``omitted_when_empty`` is left out while None or empty, as files written before it existed
    lack it; a field whose JSON key is not a Python name (``class``) maps through ``json_names``.
    """

    omitted_when_empty: ClassVar[tuple[str, ...]] = ()
    json_names: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RECORDS[cls.__name__] = cls

    def __post_init__(self) -> None:
        # A nested record may be given in its JSON form (a mapping), as code that builds a record
        # from plain values has it: read it the way a file is read, validation included.
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            base = str(f.type).removesuffix(" | None")
            if isinstance(value, Mapping) and base in _RECORDS:
                where = f"{type(self).__name__}.{f.name}"
                object.__setattr__(self, f.name, _RECORDS[base].from_dict(value, where))

    def as_dict(self) -> dict[str, Any]:
        """The JSON object."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name in self.omitted_when_empty and _empty(value)):
                continue
            out[self.json_names.get(f.name, f.name)] = to_json(value)
        return {**getattr(self, "extra", {}), **out}

    @classmethod
    def from_dict(cls: type[R], data: Any, where: str | None = None) -> R:
        """A record read back; a refusal names ``where`` (the file, record and field)."""
        return Fields(data, where or cls.__name__).fill(cls)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (tuple, dict)) and not value)


def to_json(value: Any) -> Any:
    """A record, tuple or mapping as JSON values, all the way down."""
    if isinstance(value, Record):
        return value.as_dict()
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


class _Wrong(Exception):
    """A value of the wrong kind; ``expected`` says what would be right."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


#: A field type: a finite number that is never negative (a count per step, a share).
NonNegative = float

#: Scalar types: the test a JSON value must pass, and what a refusal says was expected, of one
#: value and of an array of them.
_SCALARS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "float": (finite, "a finite number", "finite numbers"),
    "NonNegative": (lambda v: finite(v) and v >= 0, "a finite number >= 0", "finite numbers >= 0"),
    "int": (lambda v: finite(v) and isinstance(v, int), "an integer", "integers"),
    "str": (lambda v: isinstance(v, str), "a string", "strings"),
    "bool": (lambda v: isinstance(v, bool), "true or false", "true or false values"),
}


def _expected(text: str) -> str:
    """What a value of type ``text`` is, in words, for a refusal."""
    base = text.removesuffix(" | None")
    if base in _SCALARS:
        return _SCALARS[base][1]
    if base.startswith("tuple["):
        inner = base[len("tuple[") : -len(", ...]")].removesuffix(" | None")
        return f"an array of {_SCALARS[inner][2]}" if inner in _SCALARS else "a JSON array"
    return "a JSON object"


def convert(text: str, value: Any, where: str) -> Any:
    """``value`` read as the declared type ``text`` (an annotation, as a string); raises
    :class:`_Wrong` for a value of another kind, or DocumentError from inside a nested record."""
    base = text.removesuffix(" | None")
    if base == "Any":  # a value the plugin does not define (an engine's, a meter's): kept as is
        return value
    if value is None:
        if base != text:
            return None
        raise _Wrong(_expected(base))
    if base in _SCALARS:
        test, expected, _ = _SCALARS[base]
        if not test(value):
            raise _Wrong(expected)
        return value
    if base.startswith("tuple[") and base.endswith(", ...]"):
        if not isinstance(value, (list, tuple)):
            raise _Wrong(_expected(base))
        inner = base[len("tuple[") : -len(", ...]")]
        try:
            return tuple(convert(inner, v, f"{where}[{i}]") for i, v in enumerate(value))
        except _Wrong:
            raise _Wrong(_expected(base)) from None
    if base.startswith("dict[str, ") and base.endswith("]"):
        if not isinstance(value, Mapping):
            raise _Wrong("a JSON object")
        inner = base[len("dict[str, ") : -1]
        try:
            return {str(k): convert(inner, v, f"{where}.{k}") for k, v in value.items()}
        except _Wrong as wrong:
            raise _Wrong(f"a JSON object whose values are each {wrong.expected}") from None
    if base in _RECORDS:
        return _RECORDS[base].from_dict(value, where)
    raise TypeError(f"no document reader for the field type {text!r}")


class Fields:
    """One JSON object's fields, read with their kinds checked; ``where`` names it in errors."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise DocumentError(f"{where} is {data!r:.60}, expected a JSON object")
        self.data, self.where = data, where
        self.read: set[str] = set()

    def refuse(self, key: str, expected: str) -> DocumentError:
        """The error for field ``key`` holding the wrong kind of value."""
        return DocumentError(
            f"{self.where}: {key!r} is {self.data.get(key)!r:.60}, expected {expected}"
        )

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value (``default`` when missing or null), marked as read."""
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def typed(self, key: str, text: str, default: Any = None) -> Any:
        """Field ``key`` read as the declared type ``text``; missing or null is ``default``."""
        value = self.get(key)
        if value is None:
            return default
        try:
            return convert(text.removesuffix(" | None"), value, f"{self.where}.{key}")
        except _Wrong as wrong:
            # Null is a field's default, so a refusal offers it, except for a flag.
            flag = text.removesuffix(" | None") == "bool"
            raise self.refuse(
                key, wrong.expected if flag else f"{wrong.expected} or null"
            ) from None

    def extra(self) -> dict[str, Any]:
        """The fields no reader asked for (kept, and written back)."""
        return {k: v for k, v in self.data.items() if k not in self.read}

    def fill(self, cls: type[R], **known: Any) -> R:
        """A ``cls`` of ``known`` and its other fields, in field order, each read by its declared
        type (null or missing: the field's default); ``extra`` last, from the fields no reader
        asked for."""
        names = getattr(cls, "json_names", {})
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name == "extra" or f.name in known:
                continue
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            default = None if default is dataclasses.MISSING else default
            known[f.name] = self.typed(names.get(f.name, f.name), str(f.type), default)
        if any(f.name == "extra" for f in dataclasses.fields(cls)):  # type: ignore[arg-type]
            known["extra"] = self.extra()
        return cls(**known)
