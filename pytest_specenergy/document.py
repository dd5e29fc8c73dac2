"""The run document, typed: a run, its case records, each record's arms and their samples; standard
library and :mod:`.measure.metrics` only, so every layer can use it. Who writes and reads it:
docs/design/root-cases.md."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass
from dataclasses import field
from importlib import metadata
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Mapping

from pytest_specenergy import metrics

#: ``kind`` of a run document and of a golden file; readers refuse any other kind.
RUN_KIND = "specenergy-run"
GOLDEN_KIND = "specenergy-golden"
SCHEMA_VERSION = 1
#: Schema versions this plugin reads, per kind.
SUPPORTED_SCHEMAS: dict[str, tuple[int, ...]] = {RUN_KIND: (1,), GOLDEN_KIND: (1,)}


class DocumentError(ValueError):
    """A document field is missing or of the wrong kind; the message names where."""


def plugin_version() -> str:
    """The installed plugin's version (``unknown`` when run from a bare source tree)."""
    try:
        return metadata.version("pytest-specenergy")
    except metadata.PackageNotFoundError:
        return "unknown"


class _Fields:
    """One JSON object's fields, read with their kinds checked; ``where`` names it in errors."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise DocumentError(f"{where} is {data!r:.60}, expected a JSON object")
        self.data, self.where = data, where
        self.read: set[str] = set()

    def _refuse(self, key: str, expected: str) -> DocumentError:
        return DocumentError(
            f"{self.where}: {key!r} is {self.data.get(key)!r:.60}, expected {expected}"
        )

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def _checked(self, key: str, default: Any, ok: Callable[[Any], bool], expected: str) -> Any:
        value = self.get(key)
        if value is None:
            return default
        if not ok(value):
            raise self._refuse(key, expected)
        return value

    def number(self, key: str, default: float | None = None) -> Any:
        return self._checked(key, default, _finite, "a finite number or null")

    def integer(self, key: str, default: int | None = None) -> Any:
        if self.number(key) is None:
            return default
        return self._checked(key, default, lambda v: isinstance(v, int), "an integer or null")

    def text(self, key: str, default: str | None = None) -> Any:
        return self._checked(key, default, lambda v: isinstance(v, str), "a string or null")

    def flag(self, key: str, default: bool) -> bool:
        return self._checked(key, default, lambda v: isinstance(v, bool), "true or false")

    def obj(self, key: str, default: dict[str, Any] | None = None) -> Any:
        value = self._checked(key, None, lambda v: isinstance(v, Mapping), "a JSON object or null")
        return default if value is None else dict(value)

    def items(self, key: str) -> list[Any]:
        return self._checked(key, [], lambda v: isinstance(v, list), "a JSON array or null")

    def texts(self, key: str, default: tuple[str, ...] | None = ()) -> tuple[str, ...] | None:
        values = self.items(key)
        if not all(isinstance(v, str) for v in values):
            raise self._refuse(key, "an array of strings")
        return default if self.get(key) is None else tuple(values)

    def numbers(self, key: str, default: None = None) -> tuple[float, ...] | None:
        value = self._checked(
            key,
            None,
            lambda v: isinstance(v, list) and all(_finite(x) and x >= 0 for x in v),
            "an array of finite numbers >= 0 or null",
        )
        return None if value is None else tuple(float(v) for v in value)

    def checks(self, key: str, default: tuple[Check, ...] = ()) -> tuple[Check, ...]:
        return tuple(
            Check.from_dict(c, f"{self.where}.{key}[{i}]") for i, c in enumerate(self.items(key))
        )

    def extra(self) -> dict[str, Any]:
        """The fields no reader asked for (kept, and written back)."""
        return {k: v for k, v in self.data.items() if k not in self.read}

    def fill(self, cls: Any, **known: Any) -> Any:
        """A ``cls`` of ``known`` and its other fields, in field order, each read by its declared
        type (null or missing: the field's default); ``extra`` last, from the fields no reader asked
        for."""
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                known["extra"] = self.extra()
            elif f.name not in known:
                default = (
                    f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                )
                read = _READERS[f.type.removesuffix(" | None")]  # type: ignore[union-attr]
                known[f.name] = read(
                    self, f.name, None if default is dataclasses.MISSING else default
                )
        return cls(**known)


#: The :class:`_Fields` reader of each field type a record declares (``X | None`` is read as ``X``).
_READERS: dict[str, Callable[..., Any]] = {
    "float": _Fields.number,
    "int": _Fields.integer,
    "str": _Fields.text,
    "bool": _Fields.flag,
    "dict[str, Any]": _Fields.obj,
    "tuple[str, ...]": _Fields.texts,
    "tuple[float, ...]": _Fields.numbers,
    "tuple[Check, ...]": _Fields.checks,
}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.as_dict()  # type: ignore[attr-defined]
    return [_json(v) for v in value] if isinstance(value, tuple) else value


def _to_dict(record: Any, omit_empty: Iterable[str] = ()) -> dict[str, Any]:
    """A record's JSON object: its fields, ``extra`` merged in, ``omit_empty`` ones left out while
    None or empty."""
    omit = set(omit_empty)
    out = {
        f.name: _json(getattr(record, f.name))
        for f in dataclasses.fields(record)
        if f.name != "extra" and not (f.name in omit and getattr(record, f.name) in (None, ()))
    }
    return {**getattr(record, "extra", {}), **out}


@dataclass(frozen=True)
class Check:
    """One tripped validity check of a pair."""

    name: str
    severity: str  # "fail" | "warn"
    message: str

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return {"name": self.name, "severity": self.severity, "message": self.message}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Check:
        """A check read back; ``where`` names it in a refusal."""
        f = _Fields(data, where)
        severity = f.text("severity", "warn")
        if severity not in ("fail", "warn"):
            raise f._refuse("severity", "'fail' or 'warn'")
        return cls(f.text("name", "?"), severity, f.text("message", ""))


@dataclass(frozen=True)
class RepeatSample:
    """One measured repeat of one arm: decode-only figures over exactly its requests."""

    decode_joules: float
    decode_seconds: float
    decode_tokens: int
    tbt_ms: float | None
    verify_steps: int | None
    correct_drafts: int | None
    proposed_drafts: int | None
    loops: int = 1
    window: dict[str, Any] = field(default_factory=dict, compare=False)
    #: Per request, committed decode tokens per verify step; None: no speculative counters
    #: (docs/design/root-cases.md).
    accept_lengths: tuple[float, ...] | None = None
    #: The share of the pool's decode tokens made inside this repeat's window, per loop; None: not
    #: recorded.
    coverage: float | None = None

    @property
    def energy_per_token(self) -> float | None:
        """Joules per committed decode token in this repeat."""
        return metrics.energy_per_token(self.decode_joules, self.decode_tokens)

    @property
    def accept_length(self) -> float | None:
        """Tokens committed per verify step in this repeat."""
        return metrics.accept_length(self.correct_drafts, self.verify_steps)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over proposed drafts in this repeat."""
        return metrics.acceptance_rate(self.correct_drafts, self.proposed_drafts)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object (``energy_per_token`` included, for readers of the file)."""
        return {
            **_to_dict(self, omit_empty=("coverage",)),
            "energy_per_token": self.energy_per_token,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "sample") -> RepeatSample:
        """A sample read back (``energy_per_token`` is derived, never read)."""
        f = _Fields(data, where)
        f.read.add("energy_per_token")
        needed = {
            "decode_joules": f.number("decode_joules"),
            "decode_seconds": f.number("decode_seconds"),
            "decode_tokens": f.integer("decode_tokens"),
        }
        for key, value in needed.items():
            if value is None:
                raise DocumentError(
                    f"{where} lacks {key!r}; a sample needs decode_joules, decode_seconds and "
                    "decode_tokens"
                )
        return f.fill(cls, **needed)


@dataclass(frozen=True)
class Arm:
    """One arm of a case record (``baseline``, ``speculative``, ``reference``, ``removal``)."""

    arm: str
    engine: dict[str, Any]
    source: str
    energy_per_token: float | None
    tbt_ms: float | None
    accept_length: float | None
    acceptance_rate: float | None
    verified_per_step: int | None
    samples: tuple[RepeatSample, ...]
    concurrency: dict[str, Any] = field(default_factory=dict)
    outputs_stable: bool = True
    counter_problems: tuple[str, ...] = ()
    replay_problems: tuple[str, ...] = ()
    finish_reasons: tuple[str, ...] = ()
    #: Mean of the repeats' coverage (None: not recorded); the coverage-differs check compares the
    #: arms' figures.
    coverage: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return _to_dict(self, omit_empty=("replay_problems", "coverage"))

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Arm:
        """An arm read back; ``where`` names it in a refusal."""
        f = _Fields(data, where)
        samples = tuple(
            RepeatSample.from_dict(s, f"{where}.samples[{i}]")
            for i, s in enumerate(f.items("samples"))
        )
        return f.fill(
            cls,
            samples=samples,
            arm=f.text("arm", where.rsplit(".", 1)[-1]),
            engine=f.obj("engine", {}),
            source=f.text("source", "unknown"),
        )

    def values(self, metric: str) -> list[float | None]:
        """Per-repeat values of a per-arm metric (None where a repeat cannot give it)."""
        return [getattr(s, metric) for s in self.samples]


#: Arms a case record may carry besides the baseline.
DRAFTER_ARMS = ("speculative", "reference", "removal")


@dataclass(frozen=True)
class CaseRecord:
    """One test's measured pair, as stored: the case, its figures, checks, arms and verdict."""

    case_id: str
    case: dict[str, Any]
    source: str
    baseline: Arm
    speculative: Arm
    energy_saving: float | None = None
    speedup: float | None = None
    accept_length: float | None = None
    acceptance_rate: float | None = None
    energy_per_token: float | None = None
    tbt_ms: float | None = None
    verified_per_step: int | None = None
    verify_intensity: float | None = None
    balance_point: float | None = None
    compute_bound: bool | None = None
    draft_share: float | None = None
    draft_share_method: str | None = None
    draft_share_priced: float | None = None
    equivalence: dict[str, Any] = field(default_factory=dict)
    coherence: dict[str, Any] | None = None
    checks: tuple[Check, ...] = ()
    order: dict[str, Any] = field(default_factory=dict)
    #: In-job A/B: the reference drafter's arm, its drafter, and its own match with the baseline.
    reference: Arm | None = None
    reference_drafter: dict[str, Any] | None = None
    reference_equivalence: dict[str, Any] | None = None
    removal: Arm | None = None
    #: Set by the session: the test, its machine key, and what the gate decided.
    nodeid: str | None = None
    machine_key: str | None = None
    verdict: str | None = None
    comparison: dict[str, Any] | None = None
    baseline_file: str | None = None
    fdr_pending: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # -- what the case says ----------------------------------------------------------------
    @property
    def key(self) -> str:
        """What matches this record with its baseline in another run: nodeid, else case id."""
        return self.nodeid or self.case_id

    @property
    def model(self) -> str:
        """The target model."""
        return str(self.case.get("model", "?"))

    @property
    def batch(self) -> int | None:
        """The declared batch (requests kept in flight)."""
        batch = self.case.get("batch")
        return batch if isinstance(batch, int) and not isinstance(batch, bool) else None

    @property
    def pool(self) -> int | None:
        """The prompts per pool the case declared (None: the corpus's first 96)."""
        generation = self.case.get("generation")
        return generation.get("prompts") if isinstance(generation, dict) else None

    @property
    def corpus(self) -> dict[str, Any]:
        """The corpus description (name, source, digest, size)."""
        corpus = self.case.get("corpus")
        return corpus if isinstance(corpus, dict) else {}

    @property
    def drafter(self) -> dict[str, Any]:
        """The drafter description (name, id, settings)."""
        drafter = self.case.get("drafter")
        return drafter if isinstance(drafter, dict) else {}

    @property
    def corpus_name(self) -> str:
        """The corpus's name."""
        return str(self.corpus.get("name", "?"))

    @property
    def drafter_name(self) -> str:
        """The drafter's method (``ngram``, ``eagle3``, ...)."""
        return str(self.drafter.get("name", "?"))

    @property
    def drafter_id(self) -> str:
        """The drafter's id in case ids and reports."""
        return str(self.drafter.get("id") or self.drafter.get("name") or "?")

    @property
    def exact_fraction(self) -> float | None:
        """The share of prompts whose output matched the baseline exactly."""
        return self.equivalence.get("exact_fraction")

    @property
    def matched_fraction(self) -> float | None:
        """The share of prompts that matched the baseline exactly or diverged only at a numerical
        tie (what the ``equivalence`` limit compares); a file written before ties were classified:
        its exact fraction."""
        return _matched(self.equivalence)

    @property
    def ties(self) -> int:
        """Prompts whose first divergence was a numerical tie (0 where not classified)."""
        return int(self.equivalence.get("ties") or 0)

    @property
    def reference_matched_fraction(self) -> float | None:
        """In-job A/B: the reference arm's :attr:`matched_fraction`."""
        return _matched(self.reference_equivalence or {})

    @property
    def reference_ties(self) -> int:
        """In-job A/B: the reference arm's numerical ties with the baseline."""
        return int((self.reference_equivalence or {}).get("ties") or 0)

    @property
    def scenario(self) -> dict[str, Any]:
        """What must match, besides the machine, for two records to be compared: meter, engine,
        version, workload."""
        engine, case, corpus = self.speculative.engine, self.case, self.corpus
        return {
            "meter": self.source,
            "engine": engine.get("engine")
            or (engine.get("config") or {}).get("engine")
            or case.get("engine"),
            "engine_version": engine.get("version"),
            "model": case.get("model"),
            "batch": case.get("batch"),
            "corpus": f"{corpus.get('name')}@{corpus['digest']}" if corpus.get("digest") else None,
            "generation": case.get("generation"),
        }

    @property
    def baseline_from(self) -> str | None:
        """The case whose baseline this record shares (``order.baseline_from``), or None."""
        return self.order.get("baseline_from") or None

    @property
    def interleaved(self) -> bool:
        """Whether the arms' repeats alternated (``order.interleaved``; false: blocked arms)."""
        return self.order.get("interleaved") is not False

    @property
    def sequential_pvalues(self) -> dict[str, float]:
        """The gate's comparison rows with a sequential p-value, by metric (the FDR family)."""
        rows = (self.comparison or {}).get("rows") or []
        return {
            r["metric"]: float(r["p_sequential"]) for r in rows if r.get("p_sequential") is not None
        }

    @property
    def logprob_gap(self) -> float | None:
        """Mean log-probability gap of the speculative text after a divergence."""
        return (self.coherence or {}).get("mean_gap")

    @property
    def reference_label(self) -> str:
        """The reference drafter of an in-job A/B record, in words."""
        drafter = self.reference_drafter or {}
        return str(drafter.get("id") or drafter.get("name") or drafter.get("method") or "reference")

    @property
    def failed(self) -> bool:
        """A fail-closed check tripped: the record's numbers must not be trusted."""
        return any(c.severity == "fail" for c in self.checks)

    def arm(self, name: str) -> Arm | None:
        """An arm by name (``baseline``, ``speculative``, ``reference``, ``removal``)."""
        return getattr(self, name) if name in ("baseline", *DRAFTER_ARMS) else None

    def judged(
        self,
        verdict: str | None,
        comparison: dict[str, Any] | None,
        baseline_file: str | None,
        fdr_pending: tuple[str, ...] | None = None,
    ) -> CaseRecord:
        """This record with the gate's verdict."""
        return dataclasses.replace(
            self,
            verdict=verdict,
            comparison=comparison,
            baseline_file=baseline_file,
            fdr_pending=fdr_pending,
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return _to_dict(
            self,
            omit_empty=(
                "reference",
                "reference_drafter",
                "reference_equivalence",
                "removal",
                "nodeid",
                "machine_key",
                "verdict",
                "comparison",
                "baseline_file",
                "fdr_pending",
            ),
        )

    @classmethod
    def from_dict(cls, data: Any, where: str = "record") -> CaseRecord:
        """A record read back; ``where`` names it in a refusal."""
        f = _Fields(data, where)
        case_id = f.text("case_id") or str(f.obj("case", {}).get("id") or "?")
        f.where = where = f"{where} ({case_id})"
        arms = {
            name: (
                Arm.from_dict(f.get(name), f"{where}.{name}") if f.get(name) is not None else None
            )
            for name in ("baseline", *DRAFTER_ARMS)
        }
        for name in ("baseline", "speculative"):
            if arms[name] is None:
                raise DocumentError(f"{where} lacks its {name!r} arm")
        equivalence = _Fields(f.obj("equivalence", {}), f"{where}.equivalence")
        equivalence.number("exact_fraction")
        equivalence.number("matched_fraction")
        equivalence.integer("ties")
        # The rest in field order; compute_bound is kept as written (a reader never refused it).
        return f.fill(
            cls,
            case_id=case_id,
            **arms,
            equivalence=equivalence.data,
            case=f.obj("case", {}),
            source=f.text("source") or arms["speculative"].source,  # type: ignore[union-attr]
            compute_bound=f.get("compute_bound"),
        )


def _matched(equivalence: dict[str, Any]) -> float | None:
    """``matched_fraction`` of an equivalence block, else (an older file) its ``exact_fraction``."""
    value = equivalence.get("matched_fraction")
    return equivalence.get("exact_fraction") if value is None else value


@dataclass(frozen=True)
class RunDocument:
    """A session's results with the machines, meters and engines they were measured on."""

    results: tuple[CaseRecord, ...]
    machine_key: str | None = None
    machine_info: dict[str, Any] = field(default_factory=dict)
    machines: dict[str, Any] = field(default_factory=dict)
    meters: dict[str, Any] = field(default_factory=dict)
    engine_starts: int = 0
    datetime: str = ""
    plugin_version: str = "unknown"
    schema_version: int = SCHEMA_VERSION
    kind: str = RUN_KIND
    #: A session that did not run to its end: never a baseline.
    interrupted: bool = False
    #: Set by storage: the name the run was saved under.
    name: str | None = None
    #: The suite's verdicts (false-discovery rate, latency targets), when asked for.
    fdr: dict[str, Any] | None = None
    latency_targets: dict[str, Any] | None = None
    #: ``specenergy merge``: the shards this run was merged from.
    shards: tuple[str, ...] | None = None
    #: The source the run measured: ``{"sha": ..., "dirty": bool}`` of the rootdir's git
    #: checkout, so a nightly trend says which change moved it (None outside git).
    commit: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def build(
        cls,
        records: Iterable[CaseRecord],
        meters: Mapping[str, Any],
        engine_starts: int,
        machines: Mapping[str, Any] | None = None,
        host: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> RunDocument:
        """A new document of ``records``; ``machines`` maps each machine key to its description,
        ``host`` describes this machine for a document whose records span several keys (or none)."""
        records = tuple(records)
        machines = dict(machines or {})
        keys = sorted({r.machine_key for r in records if r.machine_key})
        one = keys[0] if len(keys) == 1 else None
        return cls(
            results=records,
            machine_key=one,
            # One key per document when saved; a session measuring on several keeps them all.
            machine_info=dict((machines.get(one) if one else None) or host or {}),
            machines=machines,
            meters=dict(meters),
            engine_starts=engine_starts,
            datetime=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            plugin_version=plugin_version(),
            **fields,
        )

    def on(self, machine_key: str) -> RunDocument:
        """The part of this document measured on ``machine_key`` (what one history file holds)."""
        return dataclasses.replace(
            self,
            machine_key=machine_key,
            results=tuple(r for r in self.results if r.machine_key == machine_key),
        )

    @property
    def label(self) -> str:
        """How history tables name this run: its saved name, else its time."""
        return self.name or self.datetime

    def as_dict(self) -> dict[str, Any]:
        """The JSON object."""
        out = _to_dict(self, omit_empty=("name", "fdr", "latency_targets", "shards", "commit"))
        if not self.interrupted:
            del out["interrupted"]
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "document") -> RunDocument:
        """A document read back (kind and schema checked by the caller); a refusal names the file,
        record and field."""
        f = _Fields(data, source)
        results = f.items("results")
        if "results" not in f.data:
            raise DocumentError(
                f"{source}: 'results' is missing; the run is incomplete or corrupted"
            )
        records = tuple(
            CaseRecord.from_dict(r, f"{source}: results[{i}]") for i, r in enumerate(results)
        )
        return f.fill(
            cls,
            results=records,
            datetime=str(f.get("datetime", "")),
            plugin_version=str(f.get("plugin_version", "unknown")),
            interrupted=f.get("interrupted") is True,
        )
