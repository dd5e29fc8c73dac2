"""Validity checks run on every pair, each a named flag in the result and the table: ``fail`` checks
fail closed (a broken drafter or engine must never pass because a number looked normal, paper s.10;
by default the test fails when one trips), ``warn`` checks mark a row the reader should not take at
face value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from pytest_specenergy import metrics
from pytest_specenergy.document import Check
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.document import RetractionFacts
from pytest_specenergy.engines import retractions
from pytest_specenergy.engines.backends import get_backend
from pytest_specenergy.engines.base import ENGINES
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.engines.meta_info import cuda_graph_setting
from pytest_specenergy.measure.coherence import DEFAULT_MAX_LOGPROB_GAP
from pytest_specenergy.measure.degeneracy import repeated_suffix_fraction
from pytest_specenergy.measure.equivalence import REAL
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult


def counter_problems(counters: Sequence[RequestCounters], drafted_per_step: int) -> list[str]:
    """Speculative counters that contradict the tokens the engine committed: every verify step
    commits its accepted drafts plus a bonus token and the first token is prefill's, so ``completion
    - 1 - verify_ct`` drafts were accepted, less at most ``drafted_per_step`` in a final step cut by
    ``max_new_tokens`` or EOS."""
    problems = []
    for index, c in enumerate(counters):
        # Each problem names the request: SGLang's rid where it sent one, else its position.
        problems += [p.replace("request None:", f"request {index}:") for p in c.problems()]
        if c.spec_verify_ct is None or c.spec_num_correct_drafts is None or c.ragged:
            # Ragged verify: drafts per step vary and accepted drafts can exceed committed
            # tokens, so no bound from a fixed width holds; the histogram identities still do.
            continue
        implied = c.completion_tokens - 1 - c.spec_verify_ct
        name = c.rid if c.rid is not None else index
        if not implied <= c.spec_num_correct_drafts <= implied + drafted_per_step:
            problems.append(
                f"request {name}: {c.spec_num_correct_drafts} accepted drafts reported, but "
                f"{c.completion_tokens} tokens over {c.spec_verify_ct} verify steps allow "
                f"{max(implied, 0)} to {implied + drafted_per_step}"
            )
        if (
            c.spec_num_proposed_drafts is not None
            and c.spec_num_proposed_drafts != c.spec_verify_ct * drafted_per_step
        ):
            problems.append(
                f"request {name}: {c.spec_num_proposed_drafts} proposed drafts "
                f"reported for {c.spec_verify_ct} steps of {drafted_per_step}"
            )
    return problems


#: Accept length (the plugin's count, ``1 + accepted drafts / verify steps``, pooled over the
#: repeats) at or below which the drafter is dead: at most one accepted draft per 50 verify steps.
#: Why 1.02 and why this count: every draft rejected reads exactly 1.000 here at any answer length,
#: while SGLang's own ``spec_accept_length`` (``completion_tokens / spec_verify_ct``) counts the
#: prefill's token too and reads ``1 + 1/verify_ct`` for the same dead drafter (1.03 for 32-token
#: answers, 1.5 for a request of 2 steps), which no fixed threshold near 1 could tell from a weak
#: drafter. A drafter whose drafts are unrelated to the target still lands a draft now and then
#: where the target's next token is a frequent one (a space, a newline, a closing bracket), so
#: "within a hair" leaves room for such coincidences; the weakest healthy drafter of this
#: project's suites accepts 1.25 (the hybrid's n-gram on the news corpus, 8 prompts x 32 tokens).
#: A tie at the threshold fails: the check fails closed.
DEAD_DRAFTER_ACCEPT_LENGTH = 1.02


def pair_checks(pair: PairResult, max_logprob_gap: float = DEFAULT_MAX_LOGPROB_GAP) -> list[Check]:
    """Every check that trips on ``pair``."""
    base, spec, batch = pair.baseline, pair.speculative, pair.case.batch
    found = _counter_checks(pair) + _restart_checks(pair) + _drafter_checks(pair)
    found += dead_drafter_checks(pair) + _acceptance_rate_checks(pair)
    found += _coherence_checks(pair, max_logprob_gap)
    # The removal arm's J/token is only comparable at the batch the speculative arm ran.
    for run in (base, spec, *((pair.removal,) if pair.removal is not None else ())):
        found += _concurrency_checks(run, batch) + _stability_checks(run)
    found += _pairing_checks(base, spec) + _window_checks(base, spec) + _replay_checks(pair)
    found += arm_agreement_checks(base, spec, batch) + _cut_short_checks(pair)
    found += twin_checks(pair) + retraction_checks(base, spec)
    return found


def checked(pair: PairResult, max_logprob_gap: float = DEFAULT_MAX_LOGPROB_GAP) -> PairResult:
    """``pair`` with its checks computed, once, and stored on it (what the measurer returns)."""
    return dataclasses.replace(pair, checks=tuple(pair_checks(pair, max_logprob_gap)))


def is_control(pair: PairResult) -> bool:
    """Whether ``pair`` is an A/A control: drafter ``none``, a second process of the baseline's
    engine config in place of the speculative one."""
    return pair.case.drafter.name == "none"


def matched_by_prompt(pair: PairResult) -> dict[int, bool]:
    """Per prompt (its pool index), whether the drafting arm matched the baseline: identical token
    ids, or a first divergence the tie rule classifies a numerical tie."""
    equivalence = pair.equivalence
    # Pool indices, so that two pairs are compared on the same prompts whatever each was cut to.
    indices = pair.baseline.prompts or tuple(range(len(equivalence.requests)))
    return {indices[r.prompt_index]: equivalence.kind_of(r) != REAL for r in equivalence.requests}


def control_checks(pair: PairResult, control: PairResult) -> list[Check]:
    """Fail ``pair`` whose exact-match fraction is below that of ``control``, the A/A control
    measured in the same cycles (same baseline arm, prompts and repeats), by more than one
    prompt's worth, both counted on the prompts the two pairs share.

    Numerical ties count as matches on both sides, as in every equivalence figure: the control's
    two arms run the same step shapes, so it never shows the rounding a verify step's shape brings
    (the ``numerical-noise`` fault, bf16 kernels), and a raw comparison would fail every healthy
    drafter that ties on a GPU; ties are bounded by the tie rule already (engine noise margin,
    per-token rule, share bound). What the control measures is the real divergence a second
    process of the baseline engine shows by itself (nondeterministic kernels, batch composition):
    a drafter may show as much, and one prompt more, never more than that.

    A case with no control measured with it gets no such check (the caller does not call this):
    the check exists only where a control exists, and its absence passes nothing."""
    if is_control(pair):
        return []
    mine, theirs = matched_by_prompt(pair), matched_by_prompt(control)
    common = sorted(set(mine) & set(theirs))
    matched, control_matched = sum(mine[i] for i in common), sum(theirs[i] for i in common)
    # More than one prompt's worth in counts: a difference of one prompt is within the slack.
    if control_matched - matched <= 1:
        return []
    n = len(common)
    return [
        Check(
            "exact-below-control",
            "fail",
            f"exact-match fraction {matched / n:.3f} ({matched} of {n} prompts, numerical ties "
            f"counting as matches) is below the A/A control {control.case_id}'s "
            f"{control_matched / n:.3f} ({control_matched} of {n}) by more than one prompt; the "
            "control was measured in the same cycles on the same prompts, so speculation changed "
            "the output beyond what a second process of the baseline engine does",
        )
    ]


def with_control(pair: PairResult, control: PairResult) -> PairResult:
    """``pair`` with :func:`control_checks` against ``control`` added to its checks."""
    return dataclasses.replace(pair, checks=pair.checks + tuple(control_checks(pair, control)))


def _counter_checks(pair: PairResult) -> list[Check]:
    """The speculative arm must report its counters, have verified, and agree with its tokens."""
    spec = pair.speculative
    found = [Check("counters-inconsistent", "fail", p) for p in spec.counter_problems]
    if pair.case.drafter.name == "none":
        return found  # the A/A control drafts nothing: no speculative counters to expect
    verify = spec.pooled("verify_steps")
    if verify is None:
        found.insert(
            0,
            Check(
                "missing-counters",
                "fail",
                "the speculative engine reported no spec_verify_ct / "
                "spec_num_correct_drafts for the measured requests",
            ),
        )
    elif verify == 0:
        found.insert(
            0,
            Check(
                "no-verify-steps",
                "fail",
                "the speculative arm ran zero verify steps: speculation never happened",
            ),
        )
    return found


def dead_drafter_checks(pair: PairResult) -> list[Check]:
    """Fail every drafting arm (the speculative one, and an in-job reference) whose accept length is
    within a hair of 1.0 (:data:`DEAD_DRAFTER_ACCEPT_LENGTH`): every draft rejected, the failure
    users hit after upgrades (a draft head loaded wrong, a missing token map), whatever the
    engine. The output stays exact and the energy merely rises, so nothing else fails it."""
    found = []
    arms = ((pair.speculative, pair.case.drafter), (pair.reference, pair.case.reference))
    for run, drafter in arms:
        if run is None or drafter is None or drafter.name == "none":
            continue  # the A/A control drafts nothing
        verify, correct = run.pooled("verify_steps"), run.pooled("correct_drafts")
        if not verify or correct is None:
            continue  # no counters or no verify step: _counter_checks fails those
        accept = run.accept_length
        if accept is not None and accept <= DEAD_DRAFTER_ACCEPT_LENGTH:
            found.append(
                Check(
                    "dead-drafter",
                    "fail",
                    f"the {run.arm} arm's drafter {drafter.id!r} is dead: accept length "
                    f"{accept:.3f} ({correct:g} drafts accepted over {verify:g} verify steps), "
                    f"at or below {DEAD_DRAFTER_ACCEPT_LENGTH}; nearly every draft was rejected "
                    "(a draft model or head that did not load, a wrong token map, a drafter the "
                    "engine version broke), so speculation only adds work",
                )
            )
    return found


def _acceptance_rate_checks(pair: PairResult) -> list[Check]:
    """Say why the acceptance rate is not reported where SGLang's proposed-draft count is nominal
    (``verify_ct x (num_draft_tokens - 1)`` from the static config): adaptive speculation per
    ``/server_info``, or ragged requests (their counters carry no trusted proposed count)."""
    spec = pair.speculative
    reason = spec.record.nominal_proposals
    if reason is None and not (
        spec.pooled("correct_drafts") is not None and spec.pooled("proposed_drafts") is None
    ):
        return []
    why = reason or "drafts per step varied in some request (ragged speculation)"
    return [
        Check(
            "acceptance-rate-nominal",
            "warn",
            f"acceptance rate not reported: {why}, while SGLang books spec_num_proposed_drafts "
            "as verify steps x (num_draft_tokens - 1) from the static config; accept length "
            "(from verify steps and accepted drafts) is unaffected",
        )
    ]


def _restart_checks(pair: PairResult) -> list[Check]:
    """An engine that died and was restarted between repeats: warmed up again before it was
    measured, but the repeats before and after ran on two processes."""
    return [
        Check(
            "engine-restarted",
            "warn",
            f"the {restart.arm} engine died and was started again "
            f"before its repeat {(restart.before_repeat or 0) + 1} (warmed up again); see its log",
        )
        for restart in pair.order.restarts
    ]


def _drafter_checks(pair: PairResult) -> list[Check]:
    """What a drafter must do on this text whatever the meter says: n-gram accepts on text that
    repeats itself, and the target drafting for itself accepts every draft."""
    found = []
    case, spec, accept = pair.case, pair.speculative, pair.accept_length
    if accept is not None and case.drafter.name == "ngram" and accept == 1.0:
        loops = [repeated_suffix_fraction(o) for o in pair.baseline.outputs]
        if loops and max(loops) >= 0.3:
            found.append(
                Check(
                    "accept-length-1-on-repetition",
                    "fail",
                    "n-gram accepted nothing although the baseline output repeats itself "
                    f"({max(loops):.0%} of a prompt's answer is a loop)",
                )
            )
    if case.drafter.draft_model != case.model:
        return found
    # Every verify step accepts all k drafts, except a request's last step, which EOS or
    # max_new_tokens may cut short: at most one short step per request and repeat.
    k = case.drafter.num_draft_tokens
    for sample in spec.samples:
        if sample.verify_steps is None or sample.correct_drafts is None:
            continue
        floor = (sample.verify_steps - len(spec.outputs)) * k
        if sample.correct_drafts < floor:
            found.append(
                Check(
                    "self-draft-not-exact",
                    "fail",
                    "drafting with the target itself must accept every draft: "
                    f"{sample.correct_drafts} accepted over {sample.verify_steps} steps of "
                    f"{k} for {len(spec.outputs)} requests (at least {floor}); accept length "
                    f"{accept:.3f}",
                )
            )
            break
    return found


def _coherence_checks(pair: PairResult, max_logprob_gap: float) -> list[Check]:
    """Text that diverged from the baseline must stay as likely under the target and must not
    degenerate (loops, distinct-n collapse, special-token leakage, length blow-up)."""
    coherence = pair.coherence
    if coherence is None or pair.equivalence.exact_fraction == 1.0:
        return []
    found = [Check("degenerate-output", "fail", p) for p in coherence.degeneracy.problems()]
    # A prompt that diverged at a numerical tie continues on another greedy path of the target:
    # its mean log-probability is no evidence of a bug (assert_coherent leaves it out too).
    mean_gap = coherence.mean_gap_without({r.prompt_index for r in pair.equivalence.ties})
    if mean_gap > max_logprob_gap:
        found.insert(
            0,
            Check(
                "incoherent",
                "fail",
                f"speculative text scores {mean_gap:.2f} nats/token "
                f"below the baseline's under the target (limit {max_logprob_gap:.2f})",
            ),
        )
    return found


def _stability_checks(run: RunResult) -> list[Check]:
    """Greedy outputs that change between repeats: the arm's text is not one workload."""
    if run.outputs_stable:
        return []
    return [Check("outputs-unstable", "warn", f"{run.arm} arm's outputs changed between repeats")]


def _cut_short_checks(pair: PairResult) -> list[Check]:
    """Most baseline answers ending early (EOS) leave the window little decode to measure."""
    base, max_new_tokens = pair.baseline, pair.case.generation.max_new_tokens
    short = sum(
        1
        for o, f in zip(base.outputs, base.finish_reasons)
        if f == "stop" and len(o) < max_new_tokens // 2
    )
    if short * 2 <= len(base.outputs):
        return []
    return [
        Check(
            "answers-cut-short",
            "warn",
            f"{short} of {len(base.outputs)} baseline answers ended "
            f"before half of max_new_tokens: the window measures little decode",
        )
    ]


#: Mean running requests per decode step, as a share of the batch, below which an arm did not run
#: the batch it claims (issue #10): its energy per token belongs to a smaller batch.
MIN_CONCURRENCY_SHARE = 0.9


def _concurrency_checks(run: RunResult, batch: int) -> list[Check]:
    """Fail an arm whose mean concurrency (all windows merged, and the worst alone) is below 90% of
    the batch."""
    c = run.concurrency
    means = [m for m in [c.mean_running, *(c.window_means or ())] if m is not None]
    if not means:
        # A record from before the mean was kept (stored results): only the maximum to go by.
        top = c.max_running
        if top is not None and top < batch:
            return [
                Check(
                    "concurrency-below-batch",
                    "warn",
                    f"{run.arm} arm ran at most {top} requests at once, not {batch}",
                )
            ]
        return []
    worst = min(means)
    if worst >= MIN_CONCURRENCY_SHARE * batch:
        return []
    pool = c.pool
    hint = (
        f"; the pool of {pool} prompts is too small to keep {batch} in flight"
        if pool is not None and pool < 4 * batch
        else ""
    )
    cap = c.max_running_requests
    if cap is not None and cap < batch:
        hint += f"; the engine admits at most {cap} requests"
    return [
        Check(
            "concurrency-below-batch",
            "fail",
            f"{run.arm} arm ran {worst:.1f} requests per step on average (min "
            f"{c.min_running}, max {c.max_running}), below "
            f"{MIN_CONCURRENCY_SHARE:.0%} of the batch {batch}{hint}{_reruns_said(run)}",
        )
    ]


def _reruns_said(*runs: RunResult) -> str:
    """For a concurrency message: the windows already run again (a failure after that is no passing
    noise)."""
    said = [
        f"{run.arm} arm's {', '.join(f'{m:.2f}' for m in run.concurrency.rerun_means)}"
        for run in runs
        if run.concurrency.rerun_means
    ]
    return f" (windows run again after falling below their peak: {'; '.join(said)})" if said else ""


#: Largest gap between the arms' mean running requests per decode step, as a share of the batch
#: (each may pass the 90% floor alone, issue 21: 14.79 vs 15.67 at b16): rows share a memory-bound
#: step's weight read, so a 5% gap moves J/token by up to about 5% where weights dominate.
MAX_CONCURRENCY_GAP_SHARE = 0.05

#: Largest gap between the arms' coverage (share of the pool's decode tokens inside the window), in
#: points, where the pool is large enough: a window ends as the pool runs dry, leaving out late
#: positions of different requests; beyond this the figures describe visibly different workloads
#: (issue 21: 100% vs 89.1% for block16 b16).
MAX_COVERAGE_GAP = 0.10


def arm_agreement_checks(base: RunResult, spec: RunResult, batch: int) -> list[Check]:
    """The arms' concurrency and coverage must agree within :data:`MAX_CONCURRENCY_GAP_SHARE` of the
    batch and the coverage gap the pool allows; a record without the figures (an old file) is not
    judged."""
    found = []
    means = (base.concurrency.mean_running, spec.concurrency.mean_running)
    if (
        None not in means
        and batch > 0
        and abs(means[0] - means[1]) > MAX_CONCURRENCY_GAP_SHARE * batch
    ):
        found.append(
            Check(
                "concurrency-differs",
                "fail",
                f"the arms ran different batches: {means[0]:.2f} (baseline) vs {means[1]:.2f} "
                f"(speculative) requests per step, more than {MAX_CONCURRENCY_GAP_SHARE:.0%} of "
                f"the batch {batch} apart; J/token depends on the rows sharing each "
                f"step{_reruns_said(base, spec)}",
            )
        )
    cover = (base.coverage, spec.coverage)
    if None in cover or abs(cover[0] - cover[1]) <= MAX_COVERAGE_GAP:
        return found
    gap, pool = abs(cover[0] - cover[1]), len(base.outputs)
    # Past the bound ``coverage-differs`` fails (past MAX_COVERAGE_GAP it warns): at the window's
    # close ``batch - 1`` slots hold unfinished requests, so an arm covers at least ``1 - (batch -
    # 1) / pool`` of equal-length outputs (pool 8 at batch 4: 37.5 points apart).
    bound = max(MAX_COVERAGE_GAP, (batch - 1) / pool if pool > 0 else 1.0)
    said = (
        f"the arms' windows covered {cover[0]:.1%} (baseline) vs {cover[1]:.1%} (speculative) of "
        f"their prompts' decode tokens, {gap:.1%} apart (the fillers that hold the batch until "
        "the last prompt finishes ran out, so the close cut prompts)"
    )
    if gap > bound:
        found.append(
            Check(
                "coverage-differs",
                "fail",
                f"{said}, more than the {bound:.0%} a pool of {pool} prompts "
                f"at batch {batch} allows: the figures describe different requests",
            )
        )
    else:
        # The smallest pool whose structural allowance is within MAX_COVERAGE_GAP.
        enough = math.ceil((batch - 1) / MAX_COVERAGE_GAP)
        found.append(
            Check(
                "coverage-differs",
                "warn",
                f"{said}: within what a pool of {pool} prompts at batch {batch} allows (up to "
                f"{bound:.0%}), but the figures describe partly different requests; a pool of at "
                f"least {enough} prompts holds the arms within {MAX_COVERAGE_GAP:.0%}",
            )
        )
    return found


def _replay_checks(pair: PairResult) -> list[Check]:
    """A replayed arm must repeat the recorded run exactly (every verify step found its drafts, the
    outputs are the speculative arm's), else its energy (draft removal's or oracle-free) describes
    another run."""
    found = [
        Check("replay-unlike", "fail", f"{run.arm} arm: {p}")
        for run in (pair.speculative, pair.reference, pair.removal)
        if run is not None
        for p in run.replay_problems
    ]
    removal = pair.removal
    if removal is not None:
        found += [
            Check("replay-unlike", "fail", f"removal arm: {p}") for p in removal.counter_problems
        ]
        differ = sum(1 for a, b in zip(removal.outputs, pair.speculative.outputs) if a != b)
        if differ or len(removal.outputs) != len(pair.speculative.outputs):
            found.append(
                Check(
                    "replay-unlike",
                    "fail",
                    "the verify-only replay's outputs differ from the speculative arm's on "
                    f"{differ} of {len(pair.speculative.outputs)} prompts: it did not make the "
                    "same verify steps, so its energy is no draft-removal figure",
                )
            )
    return found


def _gpus(run: RunResult) -> list[str]:
    """The GPU UUIDs an arm's first measured window saw (empty for a modeled meter)."""
    if not run.samples:
        return []
    gpus = run.samples[0].window.detail("gpus") or []
    return sorted(str(g.get("uuid")) for g in gpus if isinstance(g, dict))


def _pairing_checks(base: RunResult, spec: RunResult) -> list[Check]:
    """The two arms must differ only by the drafter (paper s.3, s.10)."""
    found = []
    base_graph = cuda_graph_setting(base.engine.server_info, base.engine.options)
    spec_graph = cuda_graph_setting(spec.engine.server_info, spec.engine.options)
    if base_graph != spec_graph:
        found.append(
            Check(
                "cuda-graph-differs",
                "fail",
                f"CUDA-graph settings differ between the arms (baseline "
                f"{base_graph}, speculative {spec_graph}); CUDA graphs change the result",
            )
        )
    engine = spec.engine.engine
    if engine in ENGINES and base.engine.engine == engine:
        differences = get_backend(engine).twin_differences(
            spec.engine.server_info, base.engine.server_info
        )
        if differences:
            found.append(
                Check(
                    "twin-differs",
                    "fail",
                    f"the arms' resolved {engine} settings differ outside the "
                    "speculative fields: " + "; ".join(differences),
                )
            )
    if _gpus(base) != _gpus(spec):
        found.append(
            Check(
                "gpu-differs",
                "fail",
                f"the arms ran on different GPUs (baseline {_gpus(base)}, "
                f"speculative {_gpus(spec)})",
            )
        )
    return found


def _window_checks(base: RunResult, spec: RunResult) -> list[Check]:
    """Decode energy (full minus prefill-only window) must stay positive; a prefill share over half
    leaves little."""
    found = []
    for run in (base, spec):
        # Time is differenced like energy: a full window no longer than its prefill-only one
        # measured no decode, and every per-second or per-token-time figure would be nonsense.
        times = [s.decode_seconds for s in run.samples if s.decode_seconds <= 0]
        if times:
            # The repeats already measured again: the failure is no one passing stall.
            again = [t for s in run.samples for t in s.window.rerun_decode_seconds]
            said = (
                " (measured again after repeats whose decode time was "
                f"{', '.join(f'{t:.3g}' for t in again)} s)"
            )
            found.append(
                Check(
                    "decode-time-not-positive",
                    "fail",
                    f"{run.arm} arm: decode time {min(times):.3g} s (full-run window minus its "
                    "prefill-only window) is not positive, so no decode was timed; the windows "
                    "ran unlike work (a drain, a stall or a cold engine in one of "
                    f"them){said if again else ''}",
                )
            )
            continue
        if any(s.decode_joules <= 0 for s in run.samples):
            found.append(
                Check(
                    "prefill-in-window",
                    "fail",
                    f"{run.arm} arm: a full-run window used no more energy "
                    f"than its prefill-only window, so no decode energy was measured",
                )
            )
            continue
        shares = [s.window.prefill_share for s in run.samples if s.window.prefill_share is not None]
        if shares and max(shares) > 0.5:
            found.append(
                Check(
                    "prefill-dominates-window",
                    "warn",
                    f"{run.arm} arm: prefill takes {max(shares):.0%} "
                    f"of a run's energy; generate more tokens per request for a decode-only figure",
                )
            )
    return found


#: The most the twin's idle round trips may move the saving, in points, before a case fails: the
#: issue's bound on the decode-only figure (issue 41 item 1).
MAX_TWIN_IDLE_POINTS = 0.5
#: Where a prefill-only window's grouping was guessed from the client's send times.
SEND_TIME = "send-time"


def twin_checks(pair: PairResult) -> list[Check]:
    """The prefill-only twin must subtract the prefill forwards the engine ran, and only the
    target's: a grouping guessed from send times (SGLang without ``--enable-metrics``) misses
    queued refills' forwards (issue 41: up to 6 points at b16); a twin on the speculative engine
    subtracts a draft model's own prefill; and under a board meter the twin's idle round trips
    between groups read as prefill."""
    found = []
    arms = [pair.baseline, pair.speculative, *([pair.reference] if pair.reference else [])]
    guessed = [run.arm for run in arms if any(_grouping(s) == SEND_TIME for s in run.samples)]
    if guessed:
        found.append(
            Check(
                "prefill-grouping-guessed",
                "fail",
                f"the {', '.join(guessed)} arm's prefill-only twin was grouped by send time: the "
                "engine reported no prefill forward per request (the reference server's "
                "meta_info.prefill_forward, SGLang's forward_entry_time with --enable-metrics), "
                "and send times do not tell which forward prefilled a refill (queued refills are "
                "sent a request-lifetime before it), so the decode-only figure cannot be trusted; "
                "start SGLang with enable_metrics (the plugin passes it unless the model marker "
                "turns it off)",
            )
        )
    drafting = [pair.speculative, *([pair.reference] if pair.reference else [])]
    if pair.case.drafter.draft_model is not None:
        own = [run.arm for run in drafting if any(_twin_engine(s) == "own" for s in run.samples)]
        if own:
            found.append(
                Check(
                    "draft-prefill-uncharged",
                    "fail",
                    f"the {', '.join(own)} arm's prefill-only twin ran on its own engine, whose "
                    "draft model prefills the prompts too: that prefill exists only because of "
                    "speculation, yet it was subtracted, so the saving reads high (issue 41: 4-6 "
                    "points at b16); it runs on the non-speculative twin only when both engines "
                    "are live together: let them be resident (resident=True where they fit) or "
                    "use the modeled meter",
                )
            )
    bound = twin_idle_bound(pair)
    if bound is not None and bound > MAX_TWIN_IDLE_POINTS:
        found.append(
            Check(
                "twin-idle",
                "fail",
                f"the prefill-only twins idled between their groups (client round trips), and a "
                f"board meter reads that idle power as prefill: at most {bound:.2f} points of the "
                f"saving, past the {MAX_TWIN_IDLE_POINTS} a decode-only figure allows; generate "
                "more tokens per request so that prefill is a smaller share",
            )
        )
    return found


def _grouping(sample: RepeatSample) -> str | None:
    prefill = sample.window.prefill
    return None if prefill is None else prefill.grouping


def _twin_engine(sample: RepeatSample) -> str | None:
    prefill = sample.window.prefill
    return None if prefill is None else prefill.twin_engine


def _idle_joules(sample: RepeatSample) -> float | None:
    """The most a twin's idle round trips can have added to its per-loop reading: their share of
    its wall time at the twin's own mean power (idle power is below it)."""
    twin = sample.window.prefill
    if twin is None or twin.idle_seconds is None or not twin.seconds or twin.joules is None:
        return None
    loops = twin.loops or 1
    return min(twin.idle_seconds * loops / twin.seconds, 1.0) * twin.joules / loops


def twin_idle_bound(pair: PairResult) -> float | None:
    """The most, in points, that the twins' idle round trips can move the saving under a board
    meter (each arm's decode joules read low by up to its twins' idle energy); None where no twin
    ran under a board meter, or its engine stamped no forwards to tell idle from prefill."""
    if not pair.speculative.source.startswith("measured"):
        return None
    return idle_bound(pair.baseline, pair.speculative)


def idle_bound(base: RunResult, spec: RunResult) -> float | None:
    """:func:`twin_idle_bound` for two arms whatever their meter (a benchmark reading a modeled
    meter as a board counter sizes it so)."""
    saving = metrics.energy_saving(spec.energy_per_token, base.energy_per_token)
    if saving is None:
        return None
    shifted = []
    for run in (base, spec):
        idle = [_idle_joules(s) for s in run.samples]
        if not idle or None in idle:
            return None
        joules = sum(s.decode_joules for s in run.samples)
        tokens = sum(s.decode_tokens for s in run.samples)
        shifted.append((joules + sum(idle)) / tokens if tokens else None)  # type: ignore[arg-type]
    if None in shifted or base.energy_per_token is None or spec.energy_per_token is None:
        return None
    low = 1 - spec.energy_per_token / shifted[0]  # the baseline's idle given back
    high = 1 - shifted[1] / base.energy_per_token  # the speculative arm's
    return 100.0 * max(abs(low - saving), abs(high - saving))


def retraction_checks(base: RunResult, spec: RunResult) -> list[Check]:
    """Requests SGLang retracted inside the windows (KV pool full): arms that retracted differently
    did different work (fail); both alike still recomputed prefills inside the window (warn)."""
    if base.retractions is None or spec.retractions is None:
        return []
    flag = retractions.arms_differ(
        retractions.Retractions(**_counts(base.retractions)),
        retractions.Retractions(**_counts(spec.retractions)),
    )
    return [] if flag is None else [Check(flag.name, flag.severity, flag.message)]


def _counts(facts: RetractionFacts) -> dict[str, int]:
    return {
        "requests": facts.requests,
        "retracted": facts.retracted,
        "total": facts.total,
        "unknown": facts.unknown,
    }
