"""The typed facts a case record carries besides its arms: the case as declared, how the arms'
outputs compared, how their repeats ran, and what the gate decided."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any

from pytest_specenergy.document.arm import DrafterFacts
from pytest_specenergy.document.fields import Fields
from pytest_specenergy.document.fields import Record


@dataclass(frozen=True)
class Check(Record):
    """One tripped validity check of a pair."""

    name: str
    severity: str  # "fail" | "warn"
    message: str

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> Check:
        """A check read back; ``where`` names it in a refusal."""
        f = Fields(data, where or "check")
        severity = f.typed("severity", "str", "warn")
        if severity not in ("fail", "warn"):
            raise f.refuse("severity", "'fail' or 'warn'")
        return cls(f.typed("name", "str", "?"), severity, f.typed("message", "str", ""))


@dataclass(frozen=True)
class CorpusFacts(Record):
    """The prompt corpus: its name, where it came from, its digest (order included) and size."""

    name: str | None = None
    source: str | None = None
    digest: str | None = None
    size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class GenerationFacts(Record):
    """How each request was generated, and the pool measured per repeat (None: the corpus's
    first 96 prompts)."""

    omitted_when_empty = ("chat",)

    max_new_tokens: int | None = None
    prompts: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    #: The prompts went through the model's chat template (written only when they did).
    chat: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CaseFacts(Record):
    """The case as the test declared it (``Case.as_dict``)."""

    id: str | None = None
    engine: str | None = None
    model: str | None = None
    drafter: DrafterFacts = field(default_factory=DrafterFacts)
    reference: DrafterFacts | None = None
    batch: int | None = None
    corpus: CorpusFacts = field(default_factory=CorpusFacts)
    generation: GenerationFacts = field(default_factory=GenerationFacts)
    #: The ``model(...)`` marker's engine keywords: engine-defined.
    engine_options: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None
    seed: int | None = None
    faults: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class MarginFacts(Record):
    """The baseline's two best tokens at a divergence: their margin (nats), ids, whether the arms'
    tokens were exactly those two, and the largest shortfall of a later speculative token."""

    margin: float | None = None
    top_ids: tuple[int, ...] = ()
    between_top2: bool | None = None
    later_gap: float | None = None
    later_index: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class DivergenceFacts(Record):
    """One prompt whose output diverged: where, the margin there, and its class (``tie`` or
    ``real``)."""

    json_names = {"kind": "class"}

    prompt: int | None = None
    first_divergence: int | None = None
    margin: float | None = None
    kind: str | None = None
    top2: MarginFacts | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class EquivalenceFacts(Record):
    """The arms' outputs compared prompt by prompt: exact and matched fractions (ties counted as
    matches), common prefixes, and every divergence."""

    omitted_when_empty = ("tie_margin_source", "max_tie_share", "near_ties")

    exact_fraction: float | None = None
    min_common_prefix: int | None = None
    median_common_prefix: float | None = None
    first_divergence: tuple[int | None, ...] = ()
    tie_margin: float | None = None
    #: Where ``tie_margin`` came from (the engine's dtype or emulated rounding); None in files
    #: written before the tie rule read the engine's numerics (a fixed 0.125 then).
    tie_margin_source: str | None = None
    #: The largest share of prompts ties may excuse; None in older files (unbounded).
    max_tie_share: float | None = None
    #: Divergences with a tie's evidence before the share bound; None in older files.
    near_ties: int | None = None
    ties: int = 0
    real_divergences: int | None = None
    matched_fraction: float | None = None
    divergences: tuple[DivergenceFacts, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def matched(self) -> float | None:
        """The share of prompts that matched exactly or diverged only at a numerical tie; a file
        written before ties were classified: its exact fraction."""
        return self.exact_fraction if self.matched_fraction is None else self.matched_fraction


@dataclass(frozen=True)
class DegeneracyFacts(Record):
    """Degeneracy of the speculative text against the baseline's (loops, distinct bigrams, special
    tokens leaked, length)."""

    loop_fraction_spec: float | None = None
    loop_fraction_base: float | None = None
    distinct2_spec: float | None = None
    distinct2_base: float | None = None
    special_leaks: int | None = None
    length_ratio: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CoherenceFacts(Record):
    """The speculative text scored under the target against the baseline's, per prompt."""

    baseline_logprob: tuple[float, ...] = ()
    speculative_logprob: tuple[float, ...] = ()
    diverged: tuple[bool, ...] = ()
    mean_gap: float | None = None
    worst_gap: float | None = None
    margins: tuple[MarginFacts | None, ...] = ()
    degeneracy: DegeneracyFacts | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class RepeatEntry(Record):
    """One measured repeat in run order: its arm, index and wall-clock start and finish
    (``added``: one the gate asked for after the first verdict)."""

    omitted_when_empty = ("added",)

    arm: str | None = None
    repeat: int | None = None
    started: float | None = None
    finished: float | None = None
    added: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Restart(Record):
    """An engine that died between repeats and was started (and warmed up) again."""

    arm: str | None = None
    before_repeat: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class PoolEngine(Record):
    """One engine of a KV-pool plan: the memory free at its start and after its weights, and
    the tokens its pool holds there."""

    label: str | None = None
    free_at_start_gib: float | None = None
    free_after_weights_gib: float | None = None
    tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class PoolPlan(Record):
    """Equal KV pools on one GPU: the capacity every arm is pinned to (``max_total_tokens``), the
    memory share that reaches it for the engine starting with the least memory free, and each
    engine's figures."""

    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    resident: bool | None = None
    reason: str | None = None
    engines: tuple[PoolEngine, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ResidencyFacts(Record):
    """How the GPU's engines ran: all resident with an equal memory share, or one at a time, and
    why; the KV-pool plan that pins every arm to one capacity, or why the case was refused."""

    omitted_when_empty = ("pools", "refused")

    resident: bool | None = None
    engines: int | None = None
    mem_fraction_static: float | None = None
    sleep_on_idle: bool | None = None
    reason: str | None = None
    gpu_memory_gib: float | None = None
    weights_gib: float | None = None
    pools: PoolPlan | None = None
    refused: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class RunOrder(Record):
    """How a pair's repeats ran: interleaved (ABAB) or blocked, the pause before each, every
    repeat in run order, engines restarted, GPU residency, the case a shared baseline came
    from, and the cases measured in the same cycles."""

    omitted_when_empty = ("restarts", "residency", "baseline_from", "cycled_with")

    interleaved: bool = True
    cooldown_s: float = 0.0
    #: The arm of each repeat, in run order.
    order: tuple[str, ...] = ()
    repeats: tuple[RepeatEntry, ...] = ()
    restarts: tuple[Restart, ...] = ()
    residency: ResidencyFacts | None = None
    baseline_from: str | None = None
    #: The other cases whose drafting arms ran in the same repeat cycles, sharing the baseline's
    #: repeats (each paired with it by index): a file written before they did reads as none.
    cycled_with: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ComparisonRow(Record):
    """One metric of a case against its baseline, as the gate judged it."""

    metric: str | None = None
    stat: str | None = None
    unit: str | None = None
    baseline: float | None = None
    current: float | None = None
    change_abs: float | None = None
    change_rel: float | None = None
    #: The limit's expression (``energy:5%``).
    limit: str | None = None
    p_value: float | None = None
    method: str | None = None
    n_baseline: int | None = None
    n_current: int | None = None
    interval: tuple[float, ...] | None = None
    verdict: str | None = None
    note: str = ""
    p_sequential: float | None = None
    more_repeats: int = 0
    estimate: float | None = None
    #: ``equivalence`` only: the numerical ties counted as matches, (baseline, current).
    ties: tuple[int, ...] | None = None
    #: True where neither side had any spread (a deterministic meter): the change is exact, with no
    #: p-value and no interval; absent in files written before it was recorded.
    exact: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    omitted_when_empty = ("exact",)


@dataclass(frozen=True)
class Comparison(Record):
    """A case's verdict against its baseline (``mode``: a stored ``baseline`` or an ``in-job``
    A/B against ``reference``), with a row per checked metric."""

    case_id: str | None = None
    verdict: str | None = None
    reasons: tuple[str, ...] = ()
    alpha: float | None = None
    mode: str | None = None
    reference: str | None = None
    rows: tuple[ComparisonRow, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
