"""Measurement records: one :class:`RunResult` per arm, a :class:`PairResult` per case, whose
per-arm metrics (``r.energy_per_token``, ``r.tbt_ms``) are the speculative arm's and pair metrics
(``energy_saving``, ``speedup``, equivalence) compare the arms. An ``assert_*`` helper fails with
the value, the limit, both arms, the case, the source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from dataclasses import field
from functools import cached_property
from typing import Any
from typing import Mapping

from pytest_specenergy import metrics
from pytest_specenergy.cases.case import Case
from pytest_specenergy.document import Arm
from pytest_specenergy.document import CaseFacts
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import Check
from pytest_specenergy.document import DrafterFacts
from pytest_specenergy.document import EngineFacts
from pytest_specenergy.document import EquivalenceFacts
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.document import RunOrder
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure.coherence import DEFAULT_MAX_LOGPROB_GAP
from pytest_specenergy.measure.coherence import Coherence
from pytest_specenergy.measure.equivalence import Equivalence
from pytest_specenergy.measure.equivalence import compare_outputs
from pytest_specenergy.measure.numerics import NoiseMargin
from pytest_specenergy.measure.numerics import noise_margin


class SpecEnergyAssertionError(AssertionError):
    """An ``assert_*`` helper failed; the message carries the numbers."""


def _speculative(name: str, doc: str) -> property:
    return property(lambda pair: getattr(pair.speculative, name), doc=doc)


def _recorded(name: str, doc: str) -> property:
    return property(lambda run: getattr(run.record, name), doc=doc)


@dataclass(frozen=True)
class RunResult:
    """One arm of a pair: its record as the run document stores it (every repeat's sample, the
    engine, what ran, the figures computed from them) and the outputs of the measured requests,
    which the document does not keep."""

    record: Arm
    outputs: tuple[tuple[int, ...], ...] = ()
    #: The pool index of each output (the window prompts the arm's repeats measured; empty: the
    #: whole pool, in order).
    prompts: tuple[int, ...] = ()

    arm = _recorded("arm", "``baseline``, ``speculative``, ``reference`` or ``removal``.")
    engine = _recorded(
        "engine", "What ran the arm (:class:`~pytest_specenergy.document.EngineFacts`)."
    )
    source = _recorded(
        "source", "Where its energy came from: ``measured (nvml)``, ``modeled (h200)``."
    )
    samples = _recorded("samples", "Every measured repeat's decode-only sample.")
    finish_reasons = _recorded("finish_reasons", "Each prompt's finish reason, last repeat.")
    verified_per_step = _recorded("verified_per_step", "Tokens the target verifies per step.")
    concurrency = _recorded("concurrency", "What ran over its full windows.")
    outputs_stable = _recorded("outputs_stable", "Every repeat made the same outputs.")
    counter_problems = _recorded("counter_problems", "Counters contradicting the tokens.")
    replay_problems = _recorded("replay_problems", "Windows a replay did not replay like for like.")
    energy_per_token = _recorded("energy_per_token", "Median decode J per committed token.")
    tbt_ms = _recorded(
        "tbt_ms", "Median of the mean per-request time between tokens, its own decode steps, ms."
    )
    visible_tbt_ms = _recorded(
        "visible_tbt_ms",
        "Median of the mean per-request time between tokens a user sees (every engine step from "
        "its first token to its last, other requests' prefills included), ms.",
    )
    retractions = _recorded("retractions", "Retractions over every repeat's window.")
    accept_length = _recorded("accept_length", "Tokens per verify step over all repeats.")
    acceptance_rate = _recorded("acceptance_rate", "Accepted over proposed drafts, all repeats.")
    coverage = _recorded("coverage", "Mean share of the pool's decode tokens in the window.")

    @classmethod
    def measured(
        cls,
        arm: str,
        engine: EngineFacts | Mapping[str, Any],
        source: str,
        samples: tuple[RepeatSample, ...],
        outputs: tuple[tuple[int, ...], ...],
        finish_reasons: tuple[str, ...],
        verified_per_step: int,
        **fields: Any,
    ) -> RunResult:
        """A result from plain values (its figures computed from ``samples``); ``fields`` are the
        other fields of an :class:`~pytest_specenergy.document.Arm`. The engine and the
        ``concurrency`` may be given in their JSON form."""
        fields["finish_reasons"] = finish_reasons
        record = Arm.measured(arm, engine, source, samples, verified_per_step, **fields)  # type: ignore[arg-type]
        return cls(record, outputs)

    def pooled(self, attr: str) -> int | float | None:
        """A per-repeat count summed over the repeats (:meth:`Arm.pooled`)."""
        return self.record.pooled(attr)

    def replaced(self, **fields: Any) -> RunResult:
        """This result with fields of its record changed, its figures computed again."""
        return RunResult(
            dataclasses.replace(self.record, **fields).refigured(), self.outputs, self.prompts
        )

    def by_prompt(self) -> dict[int, tuple[tuple[int, ...], str]]:
        """Each output and its finish reason by pool index."""
        indices = self.prompts or tuple(range(len(self.outputs)))
        finish = self.finish_reasons or ("?",) * len(self.outputs)
        return dict(zip(indices, zip(self.outputs, finish)))

    def on_prompts(self, prompts: tuple[int, ...]) -> RunResult:
        """This arm's outputs on ``prompts`` alone (pool indices it measured), so that two arms
        measured over different repeats compare the same prompts."""
        if prompts == self.prompts:
            return self
        mine = self.by_prompt()
        record = dataclasses.replace(self.record, finish_reasons=tuple(mine[i][1] for i in prompts))
        return RunResult(record, tuple(mine[i][0] for i in prompts), prompts)

    def extended(self, more: RunResult) -> RunResult:
        """This arm with ``more``'s repeats added (same arm, same engine; the gate asked for
        more): its figures computed again over every sample, its outputs over every prompt."""
        record, added = self.record, more.record
        mine, theirs = self.by_prompt(), more.by_prompt()
        agree = all(mine[i][0] == theirs[i][0] for i in set(mine) & set(theirs))
        merged = dict(sorted({**theirs, **mine}.items()))
        stable = record.outputs_stable and added.outputs_stable and agree
        retractions = (
            None
            if record.retractions is None or added.retractions is None
            else record.retractions + added.retractions
        )
        grown = RunResult(
            dataclasses.replace(record, finish_reasons=tuple(f for _, f in merged.values())),
            tuple(o for o, _ in merged.values()),
            tuple(merged),
        )
        return grown.replaced(
            samples=record.samples + added.samples,
            outputs_stable=stable,
            counter_problems=tuple(dict.fromkeys(record.counter_problems + added.counter_problems)),
            replay_problems=tuple(dict.fromkeys(record.replay_problems + added.replay_problems)),
            retractions=retractions,
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record with every sample."""
        return self.record.as_dict()


@dataclass(frozen=True)
class PairResult:
    """The speculative arm against its non-speculative twin, for one case."""

    case: Case
    case_id: str
    baseline: RunResult
    speculative: RunResult
    coherence: Coherence | None = None
    #: How the repeats ran: ``order`` (arm per repeat, in run order), ``repeats`` (arm, index,
    #: wall-clock start and finish), ``interleaved``, ``cooldown_s``, and ``baseline_from`` when the
    #: baseline came from another pair.
    order: RunOrder = field(default_factory=RunOrder, compare=False)
    #: In-job A/B: the reference drafter's arm (``case.reference``), measured in the same repeat
    #: cycles as both other arms: sample i of each arm comes from one cycle.
    reference: RunResult | None = None
    #: Draft removal: the verify-only replay of the speculative arm's recorded drafts: the same
    #: verify steps over the same contexts with no draft passes, sample i in cycle i.
    removal: RunResult | None = None
    #: In-job A/B: the reference arm's text scored against the baseline, so its ties are told apart
    #: too.
    reference_coherence: Coherence | None = None
    #: Every validity check that tripped on this pair (fail-closed controls and warnings), computed
    #: once by the measurer (:func:`pytest_specenergy.measure.checks.checked`).
    checks: tuple[Check, ...] = field(default=(), compare=False)

    energy_per_token = _speculative(
        "energy_per_token", "Speculative J per committed token (median over repeats)."
    )
    tbt_ms = _speculative("tbt_ms", "Speculative mean time between tokens, ms.")
    visible_tbt_ms = _speculative(
        "visible_tbt_ms", "Speculative mean time between tokens a user sees, ms."
    )
    accept_length = _speculative("accept_length", "Speculative tokens committed per verify step.")
    acceptance_rate = _speculative("acceptance_rate", "Speculative accepted / proposed drafts.")
    verified_per_step = _speculative(
        "verified_per_step", "Tokens the target verifies per request per step."
    )

    @property
    def arms(self) -> dict[str, RunResult]:
        """Every arm measured, by name: ``baseline``, ``speculative``, and ``reference`` (in-job
        A/B) and ``removal`` (draft removal) where measured."""
        arms = {"baseline": self.baseline, "speculative": self.speculative}
        extra = {"reference": self.reference, "removal": self.removal}
        return {**arms, **{name: arm for name, arm in extra.items() if arm is not None}}

    @property
    def energy_saving(self) -> float | None:
        """``1 - spec / baseline`` energy per token; negative = speculation costs energy."""
        return metrics.energy_saving(
            self.speculative.energy_per_token, self.baseline.energy_per_token
        )

    @property
    def speedup(self) -> float | None:
        """Baseline over speculative time between tokens (each request's own decode steps)."""
        return metrics.speedup(self.baseline.tbt_ms, self.speculative.tbt_ms)

    @property
    def visible_speedup(self) -> float | None:
        """Baseline over speculative time between tokens a user sees (other requests' refill
        prefills included: a speculative request lives fewer steps, so meets more of them)."""
        return metrics.speedup(self.baseline.visible_tbt_ms, self.speculative.visible_tbt_ms)

    def _meter_detail(self, key: str) -> list[Any]:
        """``key`` from the speculative arm's full-window meter details, per repeat (None-free)."""
        values = [s.window.detail(key) for s in self.speculative.samples]
        return [v for v in values if v is not None]

    @property
    def verify_intensity(self) -> float | None:
        """The verify step's FLOP/byte under the meter's GPU and shape (mean over repeats; None:
        steps not modeled)."""
        values = self._meter_detail("verify_intensity")
        return sum(values) / len(values) if values else None

    @property
    def balance_point(self) -> float | None:
        """The meter's GPU balance point, FLOP/byte (peak FLOP/s over bandwidth)."""
        values = self._meter_detail("balance_point")
        return values[0] if values else None

    @property
    def compute_bound(self) -> bool | None:
        """Whether the verify step lies past the balance point (the saving turns into a loss there)."""
        return metrics.compute_bound(self.verify_intensity, self.balance_point)

    @property
    def draft_share(self) -> float | None:
        """The drafter's share of speculative decode energy (:attr:`draft_share_method` says how):
        measured by draft removal (:func:`metrics.removal_draft_share`), else the modeled meter's
        price of the draft passes, else None. The removal share can come out slightly negative on
        a board meter for a drafter with no draft passes: that is the meter's noise, kept as
        measured."""
        if self.removal is not None:
            return metrics.removal_draft_share(
                [s.energy_per_token for s in self.speculative.samples],
                [s.energy_per_token for s in self.removal.samples],
            )
        return self.draft_share_priced

    @property
    def draft_share_priced(self) -> float | None:
        """The modeled meter's priced draft share (mean over repeats), None under a board meter."""
        values = self._meter_detail("draft_share")
        return sum(values) / len(values) if values else None

    @property
    def draft_share_method(self) -> str | None:
        """``removal`` (a verify-only replay was measured), ``priced`` (the modeled meter's split)
        or None."""
        return (
            "removal"
            if self.removal is not None
            else "priced"
            if self.draft_share_priced is not None
            else None
        )

    @property
    def noise_margin(self) -> NoiseMargin:
        """The largest top-2 margin the baseline engine's own rounding can flip (its dtype, or the
        reference server's emulated rounding): the tie rule's threshold."""
        return noise_margin(self.baseline.engine.server_info)

    @cached_property
    def equivalence(self) -> Equivalence:
        """Per-prompt comparison of the two arms' output token ids, judged by the tie rule."""
        # The baseline's top-2 margins at each divergence come from coherence's scoring.
        margins = self.coherence.margins if self.coherence is not None else ()
        noise = self.noise_margin
        return compare_outputs(
            self.baseline.outputs, self.speculative.outputs, margins, noise.margin, noise.source
        )

    @cached_property
    def reference_equivalence(self) -> Equivalence | None:
        """In-job A/B: the reference arm's comparison with the baseline (None without one)."""
        if self.reference is None:
            return None
        margins = self.reference_coherence.margins if self.reference_coherence is not None else ()
        noise = self.noise_margin
        return compare_outputs(
            self.baseline.outputs, self.reference.outputs, margins, noise.margin, noise.source
        )

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        """The checks of severity ``fail``."""
        return tuple(c for c in self.checks if c.severity == "fail")

    @property
    def source(self) -> str:
        """Where the energy figures came from."""
        return self.speculative.source

    # -- assertions ---------------------------------------------------------------------
    def describe(self) -> str:
        """Both arms' numbers on a few lines, for failure messages."""
        return (
            f"case {self.case_id} [{self.source}]\n{_arm_line('baseline:   ', self.baseline)}"
            f"{_arm_line('speculative:', self.speculative)}  accept length "
            f"{metrics.fmt(self.accept_length, '.3f')}, acceptance rate "
            f"{metrics.fmt(self.acceptance_rate, '.3f')}, verified/step {self.verified_per_step}, "
            f"energy saving {metrics.fmt(self.energy_saving, '+.1%')}, speedup "
            f"{metrics.fmt(self.speedup, '.2f')}x (a user sees "
            f"{metrics.fmt(self.visible_speedup, '.2f')}x), equivalence "
            f"{self.equivalence.summary()}"
            + (f", logprob gap {self.coherence.mean_gap:.3f} nats/token" if self.coherence else "")
            + "".join(f"\n  check {c}" for c in self.checks)
        )

    def _fail(self, headline: str) -> None:
        __tracebackhide__ = True  # a failure shows the user's line and this message, not ours
        raise SpecEnergyAssertionError(f"{headline}\n{self.describe()}")

    def assert_saves_energy(self, at_least: float = 0.0) -> PairResult:
        """Speculation lowers J per token by at least ``at_least`` (0.1 = 10%); zero never passes."""
        __tracebackhide__ = True
        saving = self.energy_saving
        if saving is None:
            self._fail("energy saving could not be computed (no energy or no tokens in a window)")
        elif saving < at_least or saving <= 0:
            self._fail(f"energy saving {saving:+.2%} is below the required {at_least:+.2%}")
        return self

    def assert_acceptance(self, at_least: float) -> PairResult:
        """Accept length (tokens per verify step) is at least ``at_least``."""
        __tracebackhide__ = True
        value = self.accept_length
        if value is None:
            self._fail(
                "accept length could not be computed: the engine reported no verify steps "
                "or no speculative counters for the measured requests"
            )
        elif value < at_least:
            self._fail(f"accept length {value:.3f} is below the required {at_least:.3f}")
        return self

    def assert_equivalent(
        self,
        min_common_prefix: int | None = None,
        min_exact_fraction: float | None = None,
        tie_margin: float | None = None,
        max_tie_share: float | None = None,
    ) -> PairResult:
        """Greedy outputs match the baseline's token ids, up to numerical ties
        (:mod:`~pytest_specenergy.measure.equivalence`; the text after one is
        :meth:`assert_coherent`'s). A first divergence is a tie only if the evidence says noise:
        between the baseline's two best tokens, less than ``tie_margin`` nats apart (default: the
        engine's noise margin, :attr:`noise_margin`, from its dtype; 0: exact equality), the
        speculative text after it greedy within the same margin, and at most ``max_tie_share`` of
        the prompts (default 0.5) so excused. Any other divergence, or one whose margin was not
        measured, is real. With no arguments any real divergence fails; ``min_common_prefix=N``
        asks each prompt to agree on its first N tokens (or all of a shorter answer) unless it
        diverged at a tie; ``min_exact_fraction`` bounds the share of prompts that match."""
        __tracebackhide__ = True
        eq = self.equivalence.classified(tie_margin, max_tie_share)
        if min_common_prefix is None and min_exact_fraction is None:
            min_exact_fraction = 1.0
        real = eq.real_divergences
        if not eq.requests:
            self._fail("equivalence cannot be judged: the arms answered no prompts")
        if min_exact_fraction is not None and eq.matched_fraction < min_exact_fraction:
            self._fail(
                "outputs differ from the baseline: exact-match fraction "
                f"{eq.matched_fraction:.3f} (counting {len(eq.ties)} numerical tie(s) as matches) "
                f"is below the required {min_exact_fraction:.3f}\n  {len(real)} real "
                f"divergence(s), the first at {eq.describe(real[0])}"
            )
        if min_common_prefix is not None:
            # An identical answer shorter than N (it ended at EOS) still agrees on all of it.
            short = [r for r in real if r.common_prefix < min_common_prefix]
            if short:
                worst = short[0]
                self._fail(
                    f"outputs diverge from the baseline at token {worst.common_prefix} of "
                    f"prompt {worst.prompt_index}, before the required common prefix of "
                    f"{min_common_prefix} ({len(short)} of {len(eq.requests)} prompts short; "
                    f"a real divergence: {eq.describe(worst)})"
                )
        return self

    def assert_coherent(
        self,
        max_logprob_gap: float = DEFAULT_MAX_LOGPROB_GAP,
        tie_margin: float | None = None,
    ) -> PairResult:
        """The speculative text is as likely under the target as the baseline's own text, shows no
        degeneracy (loops, distinct-n collapse, special-token leakage, length blow-up), and from
        each prompt's first divergence on no token of it lies more than ``tie_margin`` nats below
        the target's best (default: the engine's noise margin, :attr:`noise_margin`; ``inf``: not
        judged). For where exact equality cannot hold (GPU numerics).

        Why it tells noise from a bug: greedy decoding under noise picks the best token or a
        near-tie everywhere, while a verify bug that commits a token the target rejected fails the
        per-token rule even where the mean gap is small. That rule reads each divergence's
        ``later_gap``, scored where its top-2 were scored (the plugin scores them), so a drafter
        bug that first shows at a near-tie still shows after it. The mean gap leaves out the
        prompts that diverged at a numerical tie: their text is the target's greedy text up to
        noise at every token, another greedy path, whose mean log-probability says nothing of a
        bug."""
        __tracebackhide__ = True
        coherence = self.coherence
        if coherence is None:
            self._fail("coherence was not measured for this pair")
            return self
        # ``inf`` turns the per-token rule off; it never makes every divergence a tie.
        finite = tie_margin is not None and tie_margin < float("inf")
        eq = self.equivalence.classified(tie_margin if finite else None)
        per_token = eq.tie_margin if tie_margin is None else tie_margin
        worst = eq.first_divergent
        where = (
            f"first divergence at token {worst.first_divergence} of prompt {worst.prompt_index}"
            if worst
            else "no divergence"
        )
        tied = {r.prompt_index for r in eq.ties}
        mean_gap = coherence.mean_gap_without(tied)
        if mean_gap > max_logprob_gap:
            self._fail(
                f"speculative output is incoherent: {where}; log-probability gap "
                f"{mean_gap:.3f} nats/token (worst prompt {coherence.worst_gap:.3f}; "
                f"{len(tied)} prompt(s) tied, left out) exceeds {max_logprob_gap:.3f}"
            )
        off = coherence.off_greedy(per_token)
        if off:
            prompt, m = max(off, key=lambda e: e[1].later_gap)
            diverged = sum(coherence.diverged) or len(off)
            self._fail(
                f"speculative output is not the target's greedy text: {len(off)} of {diverged} "
                "diverged prompt(s) commit a token the target ranks more than the tie margin "
                f"{per_token:.3g} nats below its best; the worst is token {m.later_index} of "
                f"prompt {prompt}, {m.later_gap:.3f} nats below ({where}; mean gap "
                f"{coherence.mean_gap:.3f} nats/token; tie margin: {eq.tie_margin_source})"
            )
        problems = coherence.degeneracy.problems()
        if problems:
            self._fail(f"speculative output is degenerate ({where}): " + "; ".join(problems))
        return self

    def assert_valid(self) -> PairResult:
        """No fail-closed check tripped (the plugin also enforces this after each test)."""
        __tracebackhide__ = True
        if self.failed_checks:
            self._fail("validity checks failed: " + "; ".join(str(c) for c in self.failed_checks))
        return self

    def record(self, nodeid: str | None = None, machine_key: str | None = None) -> CaseRecord:
        """The pair as the run document stores it, with every sample of every arm."""
        ab = self.reference is not None and self.case.reference is not None
        reference = self.reference.record if ab else None  # type: ignore[union-attr]
        return CaseRecord(
            case_id=self.case_id,
            case=CaseFacts.from_dict(self.case.as_dict(), "case"),
            source=self.source,
            baseline=self.baseline.record,
            speculative=self.speculative.record,
            energy_saving=self.energy_saving,
            speedup=self.speedup,
            accept_length=self.accept_length,
            acceptance_rate=self.acceptance_rate,
            energy_per_token=self.energy_per_token,
            tbt_ms=self.tbt_ms,
            verified_per_step=self.verified_per_step,
            verify_intensity=self.verify_intensity,
            balance_point=self.balance_point,
            compute_bound=self.compute_bound,
            draft_share=self.draft_share,
            draft_share_method=self.draft_share_method,
            draft_share_priced=self.draft_share_priced,
            equivalence=_equivalence(self.equivalence),
            coherence=None if self.coherence is None else self.coherence.record(),
            checks=self.checks,
            order=self.order,
            reference=reference,
            reference_drafter=_drafter(self.case.reference) if ab else None,
            # The reference arm's own match with the baseline: an A/B compares equivalence too.
            reference_equivalence=_equivalence(self.reference_equivalence) if ab else None,
            removal=self.removal.record if self.removal is not None else None,
            nodeid=nodeid,
            machine_key=machine_key,
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record of the pair with every sample."""
        return self.record().as_dict()


def _arm_line(label: str, run: RunResult) -> str:
    samples = ", ".join(metrics.fmt(s.energy_per_token, ".4g") for s in run.samples)
    return (
        f"  {label} {metrics.fmt(run.energy_per_token, '.4g')} J/token, tbt "
        f"{metrics.fmt(run.tbt_ms, '.3f')} ms, a user sees {metrics.fmt(run.visible_tbt_ms, '.3f')}"
        f" ms ({len(run.samples)} repeats: {samples})\n"
    )


def _equivalence(equivalence: Equivalence | None) -> EquivalenceFacts | None:
    return None if equivalence is None else EquivalenceFacts.from_dict(equivalence.as_dict())


def _drafter(drafter: Drafter | None) -> DrafterFacts | None:
    return None if drafter is None else DrafterFacts.from_dict(drafter.as_dict())
