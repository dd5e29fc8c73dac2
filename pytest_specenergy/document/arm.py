"""One arm of a case record, typed: its engine, what ran (the step record), and every repeat's
decode-only sample with the two metered windows it came from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from pytest_specenergy import metrics
from pytest_specenergy.document.fields import DocumentError
from pytest_specenergy.document.fields import Fields
from pytest_specenergy.document.fields import NonNegative
from pytest_specenergy.document.fields import Record


@dataclass(frozen=True)
class StepRecord(Record):
    """What an engine ran, from its own step record (SGLang's ``step_time_dict``): decode steps
    by the rows that ran in them, and their summary (None throughout: the engine keeps no record).
    """

    #: Decode steps by running rows (JSON keys are the row counts, as strings).
    steps_by_running: dict[str, int] | None = None
    steps: int | None = None
    min_running: int | None = None
    max_running: int | None = None
    #: Rows per decode step, averaged over the steps: the batch that really ran.
    mean_running: float | None = None
    #: The engine's cap on running requests, as it reported it.
    max_running_requests: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, summary: dict[str, Any]) -> StepRecord:
        """The record of an engine summary (:func:`~pytest_specenergy.engines.meta_info.
        concurrency_between`), whose row counts are integers."""
        return cls.from_dict(summary, "concurrency")


@dataclass(frozen=True)
class ArmConcurrency(StepRecord):
    """What ran over an arm's full windows: the merged step record, the batch requested, the
    pool, each window's mean (``window_means``: the worst repeat shows; None when a window has no
    record) and the means of windows run again because the host disturbed them."""

    omitted_when_empty = ("rerun_means",)

    requested: int | None = None
    pool: int | None = None
    window_means: tuple[float, ...] | None = None
    rerun_means: tuple[float, ...] = ()


@dataclass(frozen=True)
class WindowFacts(Record):
    """One metered window of a repeat: the meter's reading, the loops and requests it ran, and how
    (a priced prefill-only twin ran nothing: it has the reading and ``grouping`` only)."""

    omitted_when_empty = (
        "tokens_per_loop",
        "prefilled",
        "aborted",
        "concurrency",
        "groups",
        "grouping",
        "prompts",
        "idle_seconds",
        "twin_engine",
    )

    joules: float | None = None
    seconds: float | None = None
    loops: int | None = None
    requests: int | None = None
    source: str | None = None
    #: The meter's own facts about the window (GPUs read, priced steps, phases): meter-defined.
    details: dict[str, Any] = field(default_factory=dict)
    tokens_per_loop: float | None = None
    #: Per loop: requests prefilled, and requests the window's close cut short.
    prefilled: tuple[int, ...] | None = None
    aborted: tuple[int, ...] | None = None
    concurrency: StepRecord | None = None
    #: A prefill-only twin's groups (prompts per forward) and where the grouping came from.
    groups: tuple[int, ...] | None = None
    grouping: str | None = None
    #: A full window's prompts (its first ``prompts`` requests; the rest were fillers).
    prompts: int | None = None
    #: A prefill-only twin's seconds per loop between its forwards (its wall time less the
    #: forwards the engine stamped): a board meter reads idle power there, not prefill.
    idle_seconds: float | None = None
    #: A prefill-only twin's engine: ``baseline`` (the non-speculative twin: the target's prefill
    #: alone) or ``own`` (the arm's engine: a drafter's own prefill is subtracted too).
    twin_engine: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def per_loop_joules(self) -> float | None:
        """The reading per loop (the windows of one repeat run their work different times)."""
        return None if self.joules is None else self.joules / (self.loops or 1)


@dataclass(frozen=True)
class SampleWindow(Record):
    """A repeat's two windows: the full (steady-state) one and its prefill-only twin; and the
    decode times of repeats measured again because they timed no decode."""

    omitted_when_empty = ("full", "prefill", "rerun_decode_seconds")

    full: WindowFacts | None = None
    prefill: WindowFacts | None = None
    rerun_decode_seconds: tuple[float, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def prefill_share(self) -> float | None:
        """Prefill's share of one run's energy: per-loop prefill over per-loop full energy (the
        two windows repeat their run different ``loops`` times; window totals would give the ratio
        of average powers: 5% read as 84%)."""
        if self.full is None or self.prefill is None:
            return None
        full, prefill = self.full.per_loop_joules, self.prefill.per_loop_joules
        return None if not full or prefill is None else prefill / full

    def detail(self, key: str) -> Any:
        """The full window's meter detail ``key`` (None where the meter gives none)."""
        return None if self.full is None else self.full.details.get(key)


@dataclass(frozen=True)
class RetractionFacts(Record):
    """What an arm's requests say about retraction (SGLang took a running request back to its
    queue, KV pool full): requests answered, how many were retracted and how often in all, and how
    many reported nothing (a release without ``num_retractions``)."""

    requests: int = 0
    retracted: int = 0
    total: int = 0
    unknown: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __add__(self, other: RetractionFacts) -> RetractionFacts:
        return RetractionFacts(
            requests=self.requests + other.requests,
            retracted=self.retracted + other.retracted,
            total=self.total + other.total,
            unknown=self.unknown + other.unknown,
        )


@dataclass(frozen=True)
class RepeatSample(Record):
    """One measured repeat of one arm: decode-only figures over exactly its requests."""

    omitted_when_empty = ("coverage", "visible_tbt_ms", "work_share", "retractions")

    decode_joules: float
    decode_seconds: float
    #: Committed decode tokens per loop (a mean over loops, so not always whole).
    decode_tokens: float
    tbt_ms: float | None
    verify_steps: int | None
    correct_drafts: int | None
    proposed_drafts: int | None
    loops: int = 1
    window: SampleWindow = field(default_factory=SampleWindow, compare=False)
    #: Per request, committed decode tokens per verify step; None: no speculative counters.
    accept_lengths: tuple[NonNegative, ...] | None = None
    #: The share of the window prompts' decode tokens made inside this repeat's window, per loop;
    #: None: not recorded.
    coverage: float | None = None
    #: The user-visible time between tokens: per request, from its first token to its last over
    #: every engine step in between (other requests' prefills included), averaged; ``tbt_ms`` is
    #: the engine's own decode steps alone. None: the engine and meter report no such times.
    visible_tbt_ms: float | None = None
    #: The window prompts' share of the window's decode rows (fillers kept the batch; their rows
    #: are not the window's): the decode joules and seconds are the window's times it. None: no
    #: fillers ran.
    work_share: float | None = None
    #: The window's retractions (SGLang's ``num_retractions``); None: not counted.
    retractions: RetractionFacts | None = None

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
        return {**super().as_dict(), "energy_per_token": self.energy_per_token}

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> RepeatSample:
        """A sample read back (``energy_per_token`` is derived, never read)."""
        where = where or "sample"
        f = Fields(data, where)
        f.read.add("energy_per_token")
        needed = {key: f.typed(key, "float") for key in cls._NEEDED}
        missing = [key for key, value in needed.items() if value is None]
        if missing:
            raise DocumentError(
                f"{where} lacks {missing[0]!r}; a sample needs decode_joules, decode_seconds and "
                "decode_tokens"
            )
        return f.fill(cls, **needed)

    _NEEDED = ("decode_joules", "decode_seconds", "decode_tokens")


@dataclass(frozen=True)
class DrafterFacts(Record):
    """A drafter as recorded: its method, its id in case ids and reports, and its settings (the
    drafter's own, per its schema)."""

    name: str | None = None
    id: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        """How tables name it: its id, else its method."""
        return str(self.id or self.name or self.extra.get("method") or "?")


@dataclass(frozen=True)
class EngineConfigFacts(Record):
    """The engine configuration an arm ran (``EngineConfig.as_dict``)."""

    omitted_when_empty = ("replay",)

    engine: str | None = None
    model: str | None = None
    drafter: DrafterFacts | None = None
    dtype: str | None = None
    device: str | None = None
    seed: int | None = None
    max_running_requests: int | None = None
    #: The ``model(...)`` marker's engine keywords (SGLang ``ServerArgs`` fields): engine-defined.
    options: dict[str, Any] = field(default_factory=dict)
    faults: tuple[str, ...] = ()
    replay: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class EngineFacts(Record):
    """What ran an arm: its configuration, command line, log, version and the engine's own
    ``/server_info`` (engine-defined: SGLang resolves its settings there)."""

    config: EngineConfigFacts | None = None
    argv: tuple[str, ...] | None = None
    log: str | None = None
    version: str | None = None
    engine: str | None = None
    identity: str | None = None
    server_info: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str | None:
        """The engine's name: its own, else its configuration's."""
        return self.engine or (self.config.engine if self.config is not None else None)

    @property
    def options(self) -> dict[str, Any]:
        """The engine options the arm was configured with."""
        return self.config.options if self.config is not None else {}


@dataclass(frozen=True)
class Arm(Record):
    """One arm of a case record (``baseline``, ``speculative``, ``reference``, ``removal``)."""

    omitted_when_empty = (
        "replay_problems",
        "coverage",
        "nominal_proposals",
        "visible_tbt_ms",
        "retractions",
    )

    arm: str
    engine: EngineFacts
    source: str
    energy_per_token: float | None
    tbt_ms: float | None
    accept_length: float | None
    acceptance_rate: float | None
    verified_per_step: int | None
    samples: tuple[RepeatSample, ...]
    concurrency: ArmConcurrency = field(default_factory=ArmConcurrency)
    outputs_stable: bool = True
    #: Speculative counters that contradict the committed tokens, per repeat.
    counter_problems: tuple[str, ...] = ()
    #: A replay engine's arm: windows that did not replay the recorded drafts like for like.
    replay_problems: tuple[str, ...] = ()
    finish_reasons: tuple[str, ...] = ()
    #: Mean of the repeats' coverage (None: not recorded); the coverage-differs check compares the
    #: arms' figures.
    coverage: float | None = None
    #: Why the engine's proposed-draft counts are nominal, not the drafts proposed (adaptive
    #: speculation): then no acceptance rate is computed from them. None: they are real.
    nominal_proposals: str | None = None
    #: Median of the repeats' user-visible time between tokens (latency targets judge it).
    visible_tbt_ms: float | None = None
    #: Retractions over every repeat's window (None: not counted).
    retractions: RetractionFacts | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def measured(
        cls,
        arm: str,
        engine: EngineFacts,
        source: str,
        samples: tuple[RepeatSample, ...],
        verified_per_step: int | None,
        **fields: Any,
    ) -> Arm:
        """An arm from its samples, its figures computed from them (medians and pooled counts)."""
        return cls(
            arm=arm,
            engine=engine,
            source=source,
            verified_per_step=verified_per_step,
            samples=samples,
            **_figures(samples, fields.get("nominal_proposals")),
            **fields,
        )

    def refigured(self) -> Arm:
        """This arm with its figures computed again from its samples (after samples changed)."""
        return dataclasses.replace(self, **_figures(self.samples, self.nominal_proposals))

    def pooled(self, attr: str) -> int | float | None:
        """A per-repeat count (``verify_steps``, ``correct_drafts``, ``proposed_drafts``,
        ``coverage``) summed over the repeats; None, never a partial sum, when a repeat lacks it."""
        return _pooled(self.samples, attr)

    def values(self, metric: str) -> list[float | None]:
        """Per-repeat values of a per-arm metric (None where a repeat cannot give it)."""
        return [getattr(s, metric) for s in self.samples]

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> Arm:
        """An arm read back; ``where`` names it in a refusal."""
        where = where or "arm"
        f = Fields(data, where)
        return f.fill(
            cls,
            arm=f.typed("arm", "str", where.rsplit(".", 1)[-1]),
            engine=f.typed("engine", "EngineFacts", EngineFacts()),
            source=f.typed("source", "str", "unknown"),
        )


def _figures(
    samples: tuple[RepeatSample, ...], nominal_proposals: str | None = None
) -> dict[str, float | None]:
    """An arm's figures over its samples: medians of the per-repeat ones, ratios of the pooled
    counts (never a mean of per-repeat ratios), the mean coverage. No acceptance rate where the
    proposed-draft counts are nominal (the ``acceptance-rate-nominal`` check says so)."""
    correct, verify = _pooled(samples, "correct_drafts"), _pooled(samples, "verify_steps")
    coverage = _pooled(samples, "coverage")
    proposed = None if nominal_proposals else _pooled(samples, "proposed_drafts")
    return {
        "energy_per_token": metrics.median([s.energy_per_token for s in samples]),
        "tbt_ms": metrics.median([s.tbt_ms for s in samples]),
        "visible_tbt_ms": metrics.median([s.visible_tbt_ms for s in samples]),
        "accept_length": metrics.accept_length(correct, verify),
        "acceptance_rate": metrics.acceptance_rate(correct, proposed),
        "coverage": None if coverage is None else coverage / len(samples),
    }


def _pooled(samples: tuple[RepeatSample, ...], attr: str) -> int | float | None:
    values = [getattr(s, attr) for s in samples]
    return None if not values or any(v is None for v in values) else sum(values)
