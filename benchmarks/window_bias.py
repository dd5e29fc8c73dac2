"""How far the plugin's decode-only saving is from the decode steps' own saving (issue 21 item 2).

For each case the plugin's own pair measurer (:class:`PairMeasurer`, the reference server, the
modeled meter pricing the tiny models as the real shapes they declare: ``modeled (h200, priced as
Qwen3-8B)``, as the quickstart runs) measures the baseline and the speculative arm. Next to the
saving the plugin reports (full window minus prefill-only twin, per token), the script prices only
the full window's decode, verify and draft steps - the modeled meter's
``details["joules_by_phase"]``, prefill steps excluded - over the same tokens, and prints:

* **plugin** / **steps only**: the two savings, and **bias** = plugin - steps only, in points;
* **residue**: per arm, (plugin decode joules - decode-step joules) / plugin decode joules - the
  prefill energy the twin failed to subtract (negative: it subtracted too much);
* **coverage**: per arm, the window's decode tokens over the pool's (every prompt's whole output,
  its first token excluded: prefill makes it);
* **conc**: per arm, the mean requests per decode step the engine recorded in the window.

**An SGLang runner, emulated** (issue 41 item 1). ``--meta sglang`` rewrites every answer the
plugin reads into what SGLang 0.5.23 sends with ``--enable-metrics`` (the plugin passes it): no
``prefill_forward`` and no ``decode_seconds`` (the reference server's own), its time stats kept
(``forward_entry_time``, one stamp per prefill forward; ``prefill_finished_time``;
``request_finished_ts``), a queued abort without ``prompt_tokens``. ``--meta sglang-bare`` also
drops the time stats: SGLang without metrics, where the twin can only guess its groups from send
times. ``--board`` reads the modeled meter as a board counter reads a GPU (a window's total
joules and seconds only), so the twin runs and TBT comes from what the engine reports.
``--refills queued`` declares each engine's cap at the batch (``max_running_requests=B``: twice the
batch in flight, refills queued in the engine); ``--refills on-answer`` declares a cap of 64, so
each refill is sent on its slot's answer. The truth (**steps**) charges the draft model's prefill
to the speculative arm (issue 41 item 2) and weighs each arm's steps as the plugin weighs its
joules (``work_share``).

With ``--tbt`` a second table compares each arm's time between tokens as the plugin reports it -
the engine's own decode steps (``tbt``) and what a user sees (``visible``: every step from the
first token to the last, other requests' prefills included) - with the same figures computed
from the recorded work trace alone (modeled clock; wall clock under ``--board``).

Usage (CPU, the built-in tiny models; the default matrix takes about 10 minutes on 2 cores)::

    PYTHONPATH=. .venv/bin/python benchmarks/window_bias.py [--quick] [--cap-at-batch] [--drafters ngram block]
        [--batches 1 4 8 16] [--corpora code news] [--pool 32] [--max-new-tokens 32]
        [--meta reference|sglang|sglang-bare] [--board] [--refills queued|on-answer] [--tbt]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Iterator
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.engines.drafters import PAPER_BLOCK_TAU
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.drafters import accept_p_for
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.measure.pairs import PairMeasurer
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.meters.modeled import ModeledMeter
from pytest_specenergy.meters.modeled import step_cost

#: The drafters by the name ``--drafters`` takes.
DRAFTERS = {
    "ngram": Drafter("ngram", num_draft_tokens=4, id="ngram-k4"),
    "draft_model": Drafter(
        "draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft-k4"
    ),
    # Controlled acceptance at the paper's block drafters' accept length (its id states it).
    "block": Drafter(
        "block",
        draft_model="tiny:dense-draft",
        block_size=16,
        accept_p=accept_p_for(PAPER_BLOCK_TAU, 16),
        id="block16",
    ),
    # The A/A control: the baseline's engine twice (its saving is the plugin's noise floor).
    "none": Drafter("none", id="aa"),
}
#: Phases of the modeled meter that are decode work (everything but prefill).
DECODE_PHASES = ("decode", "verify", "draft")
#: ``meta_info`` keys only the reference server sends (SGLang has neither).
REFERENCE_ONLY = ("prefill_forward", "decode_seconds")
#: SGLang's ``--enable-metrics`` time stats (``observability/req_time_stats.py``).
TIME_STATS = ("forward_entry_time", "prefill_finished_time", "request_finished_ts")
#: The engine cap declared for ``--refills on-answer``: above every batch, so refills are sent on
#: answers, never queued.
ON_ANSWER_CAP = 64


def sglang_meta(meta: dict[str, Any], metrics: bool) -> dict[str, Any]:
    """A reference ``meta_info`` as SGLang 0.5.23 sends it (with ``--enable-metrics`` when
    ``metrics``): no reference-only keys, and an abort answered from the queue (no token made)
    without ``prompt_tokens`` (``tokenizer_manager.py`` ``_handle_abort_req``)."""
    drop = REFERENCE_ONLY + (() if metrics else TIME_STATS)
    out = {key: value for key, value in meta.items() if key not in drop}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort" and not meta["completion_tokens"]:
        out.pop("prompt_tokens", None)
    return out


@contextlib.contextmanager
def emulated(meta: str, completions: dict[str, int]) -> Iterator[None]:
    """Every ``/generate`` answer the plugin reads rewritten as ``meta`` says (``reference``: as
    sent), and each request's completion tokens kept in ``completions`` by rid."""
    original = EngineClient.generate

    def generate(self: EngineClient, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        answers = original(self, *args, **kwargs)
        for answer in answers:
            info = answer["meta_info"]
            completions[str(info.get("id"))] = int(info["completion_tokens"])
            if meta != "reference":
                answer["meta_info"] = sglang_meta(info, metrics=meta == "sglang")
        return answers

    EngineClient.generate = generate  # type: ignore[method-assign]
    try:
        yield
    finally:
        EngineClient.generate = original  # type: ignore[method-assign]


class RecordingMeter(ModeledMeter):
    """The modeled meter, keeping each window's steps and pricing; with ``board`` its windows
    carry only what a board counter reads (total joules and seconds), so the plugin runs its
    twin and reads request times from the engine, as under NVML."""

    def __init__(self, gpu: str, board: bool) -> None:
        super().__init__(gpu)
        self.board = board
        #: (joules, steps, pricing) of every window, in the order they closed.
        self.windows: list[tuple[float, list[dict[str, Any]], Any]] = []
        self._last: list[dict[str, Any]] = []

    def _advance(self, engine: Any) -> list[dict[str, Any]]:
        self._last = super()._advance(engine)
        return self._last

    def stop(self, token: Any) -> Any:
        window = super().stop(token)
        self.windows.append((window.joules, self._last, self.pricing(token)))
        if not self.board:
            return window
        hidden = ("request_seconds", "request_decode_seconds", "prefill_only")
        hidden += ("request_visible_seconds",) if hasattr(window, "request_visible_seconds") else ()
        return dataclasses.replace(window, **dict.fromkeys(hidden))

    def steps_of(self, joules: float | None) -> tuple[list[dict[str, Any]], Any] | None:
        """The steps and pricing of the window that read ``joules``."""
        for read, steps, pricing in self.windows:
            if read == joules:
                return steps, pricing
        return None


@dataclass(frozen=True)
class ArmTbt:
    """One arm's time between tokens (ms, first repeat): as the plugin reports it (its engine's
    own decode steps, and what a user sees) and as the work trace alone says."""

    reported: float | None
    visible: float | None
    trace_own: float | None
    trace_visible: float | None

    @staticmethod
    def agree(plugin: float | None, trace: float | None) -> float | None:
        """plugin / trace - 1 (None where either is unknown)."""
        return None if plugin is None or not trace else plugin / trace - 1


@dataclass(frozen=True)
class ArmBias:
    """One arm's decode energy as the plugin measured it and as its decode steps alone cost."""

    plugin_joules: float
    steps_joules: float
    tokens: float
    coverage: float | None
    concurrency: float | None
    #: The draft model's prefill in the steps (charged to the speculative arm).
    draft_prefill_joules: float = 0.0
    tbt: ArmTbt | None = None

    @property
    def residue(self) -> float:
        """Share of the plugin's decode energy that is no decode step (prefill left in)."""
        return (self.plugin_joules - self.steps_joules) / self.plugin_joules


@dataclass(frozen=True)
class BiasRow:
    """One case: both arms and the two savings."""

    case: str
    baseline: ArmBias
    speculative: ArmBias
    plugin_saving: float
    failed: tuple[str, ...]
    seconds: float
    #: The speculative arm's twin grouping (engine, engine stamps, send-time, priced).
    grouping: str = ""
    #: The most the twins' idle round trips can move the saving under a board meter, in points
    #: (None: no twin stamped its forwards).
    idle_points: float | None = None
    #: The speculative twin's idle seconds per loop and its wall seconds (first repeat).
    idle_seconds: float | None = None
    twin_seconds: float | None = None

    @property
    def steps_saving(self) -> float:
        """The saving from the decode, verify and draft steps alone, per token."""
        spec = self.speculative.steps_joules / self.speculative.tokens
        base = self.baseline.steps_joules / self.baseline.tokens
        return 1.0 - spec / base

    @property
    def bias(self) -> float:
        """Plugin saving minus steps-only saving, in percentage points."""
        return 100.0 * (self.plugin_saving - self.steps_saving)


def arm_bias(
    run: RunResult, meter: RecordingMeter | None = None, completions: dict[str, int] | None = None
) -> ArmBias:
    """Sum over the arm's repeats (per loop, as the plugin's own figures are), each repeat's steps
    weighed by its window prompts' share of the decode rows (``work_share``, as the plugin weighs
    its joules; 1 without fillers)."""
    plugin = steps = tokens = draft_prefill = 0.0
    for sample in run.samples:
        full = sample.window.full
        by_phase = full.details["joules_by_phase"]
        share = getattr(sample, "work_share", None) or 1.0
        drafts = full.details["by_phase"].get("draft:prefill", {}).get("joules", 0.0)
        plugin += sample.decode_joules
        steps += (sum(by_phase.get(p, 0.0) for p in DECODE_PHASES) + drafts) * share / full.loops
        draft_prefill += drafts * share / full.loops
        tokens += sample.decode_tokens
    tbt = None
    if meter is not None and completions is not None and run.samples:
        tbt = arm_tbt(run.samples[0], meter, completions)
    return ArmBias(
        plugin, steps, tokens, run.coverage, run.concurrency.mean_running, draft_prefill, tbt
    )


def arm_tbt(sample: Any, meter: RecordingMeter, completions: dict[str, int]) -> ArmTbt:
    """The sample's time between tokens, reported and recomputed from its full window's steps
    alone: per window prompt (the first ``prompts`` rids sent), its own decode steps' time and the
    time from the end of its target prefill to the end of its last step, over its ``n - 1``
    gaps, averaged (modeled clock; the steps' wall time under a board meter)."""
    found = meter.steps_of(sample.window.full.joules)
    reported = (sample.tbt_ms, getattr(sample, "visible_tbt_ms", None))
    if found is None:
        return ArmTbt(*reported, None, None)
    steps, pricing = found
    clock, own, first, last = 0.0, {}, {}, {}
    for step in steps:
        if meter.board:
            seconds = float(step["wall_s"])
        else:
            model = str(step.get("model", "target"))
            seconds = step_cost(
                step,
                meter.gpu,
                pricing.shape(model),
                pricing.cuda_graph,
                pricing.traced_moe.get(model),
            ).seconds
        clock += seconds
        for rid in step.get("rids", ()):
            if step.get("phase") == "prefill":
                if step.get("model", "target") == "target":
                    first.setdefault(rid, clock)
            else:
                own[rid] = own.get(rid, 0.0) + seconds
            last[rid] = clock
    rids = sorted(first, key=lambda rid: int(str(rid).rsplit("-", 1)[-1]))
    prompts = getattr(sample.window.full, "prompts", None) or len(rids)
    own_ms, visible_ms = [], []
    for rid in rids[:prompts]:
        gaps = completions.get(rid, 0) - 1
        if gaps > 0 and own.get(rid, 0.0) > 0:
            own_ms.append(1000.0 * own[rid] / gaps)
            visible_ms.append(1000.0 * (last[rid] - first[rid]) / gaps)
    mean = statistics.fmean
    return ArmTbt(
        *reported, mean(own_ms) if own_ms else None, mean(visible_ms) if visible_ms else None
    )


def bias_row(
    pair: PairResult,
    seconds: float = 0.0,
    meter: RecordingMeter | None = None,
    completions: dict[str, int] | None = None,
) -> BiasRow:
    """The row of one measured pair."""
    prefill = pair.speculative.samples[0].window.prefill if pair.speculative.samples else None
    try:  # the bound exists from issue 41 on
        from pytest_specenergy.measure.checks import idle_bound

        idle = idle_bound(pair.baseline, pair.speculative)
    except ImportError:
        idle = None
    return BiasRow(
        pair.case.id,
        arm_bias(pair.baseline, meter, completions),
        arm_bias(pair.speculative, meter, completions),
        pair.energy_saving,
        tuple(c.name for c in pair.failed_checks),
        seconds,
        grouping=str(getattr(prefill, "grouping", "") or ""),
        idle_points=idle,
        idle_seconds=getattr(prefill, "idle_seconds", None),
        twin_seconds=None if prefill is None else prefill.seconds,
    )


def make_cases(
    drafters: Sequence[str],
    batches: Sequence[int],
    corpora: Sequence[str],
    pool: int,
    max_new_tokens: int,
    cap_at_batch: bool = False,
    cap: int | None = None,
) -> list[Case]:
    """The matrix: every corpus x batch x drafter, one pool per corpus (as the plugin shares it).
    ``cap_at_batch`` starts each batch point's engines admitting exactly the batch
    (``max_running_requests=B``) instead of the reference server's cap set at run time; ``cap``
    declares that cap for every batch point instead."""
    generation = Generation(max_new_tokens=max_new_tokens, prompts=pool, ignore_eos=True)
    return [
        Case.of(
            engine="reference",
            model="tiny:dense",
            drafter=DRAFTERS[d],
            batch=b,
            corpus=load_corpus(c),
            generation=generation,
            max_running_requests=b if cap_at_batch else cap,
        )
        for c in corpora
        for b in batches
        for d in drafters
    ]


def measure_rows(
    cases: Sequence[Case],
    meter: str = "modeled:h200",
    log_dir: Path | None = None,
    progress: Any = None,
    meta: str = "reference",
    board: bool = False,
) -> list[BiasRow]:
    """Each case through the plugin's pair measurer (one repeat, no warm-up: the modeled meter
    needs none), as a :class:`BiasRow`; ``meta`` and ``board`` emulate an SGLang runner."""
    pool = EnginePool(
        log_dir or Path(tempfile.mkdtemp(prefix="specenergy-bias-")), startup_timeout_s=300
    )
    recording = RecordingMeter(meter.split(":", 1)[1], board)
    measurer = PairMeasurer(
        log_dir=pool.log_dir,
        startup_timeout=300,
        meter=meter,
        repeats=1,
        warmup=0,
        pool=pool,
        meter_factory=lambda kind, server: recording,
    )
    # The plugin prices a modeled window's prefill from its own steps; this script checks the
    # twin that a board meter needs against those steps, so the twin runs.
    measurer.run_twin = True
    measurer.plan(list(cases))
    rows = []
    completions: dict[str, int] = {}
    try:
        with emulated(meta, completions):
            for case in cases:
                began = time.monotonic()
                pair = measurer.measure(case)
                rows.append(bias_row(pair, time.monotonic() - began, recording, completions))
                if progress is not None:
                    progress(rows[-1])
    finally:
        measurer.close()
    return rows


def _pct(value: float | None, spec: str = ".1%") -> str:
    return "n/a" if value is None else format(value, spec)


def format_rows(rows: Sequence[BiasRow]) -> str:
    """A plain table: one line per case."""
    head = (
        f"{'case':<24} {'plugin':>7} {'steps':>7} {'bias':>6} {'res b':>6} {'res s':>6} "
        f"{'cov b':>6} {'cov s':>6} {'conc b':>6} {'conc s':>6} {'wall':>5}  failed"
    )
    lines = [head]
    for r in rows:
        b, s = r.baseline, r.speculative
        lines.append(
            f"{r.case:<24} {_pct(r.plugin_saving):>7} {_pct(r.steps_saving):>7} {r.bias:>+6.2f} "
            f"{_pct(b.residue, '.2%'):>6} {_pct(s.residue, '.2%'):>6} {_pct(b.coverage):>6} "
            f"{_pct(s.coverage):>6} {_pct(b.concurrency, '.2f'):>6} "
            f"{_pct(s.concurrency, '.2f'):>6} {r.seconds:>4.0f}s  {','.join(r.failed) or '-'}"
        )
    worst = max((abs(r.bias) for r in rows), default=0.0)
    residue = max(
        (max(abs(r.baseline.residue), abs(r.speculative.residue)) for r in rows), default=0.0
    )
    lines.append(f"max |bias| {worst:.2f} points; max |residue| {residue:.2%}")
    return "\n".join(lines)


def format_shares(rows: Sequence[BiasRow]) -> str:
    """Per case: the speculative twin's grouping and the draft model's prefill as a share of the
    speculative arm's decode steps (charged to it)."""
    lines = [
        f"{'case':<24} {'twin grouping':<30} {'draft prefill':>13} {'twin idle':>10} "
        f"{'idle bound':>10}"
    ]
    for r in rows:
        s = r.speculative
        share = s.draft_prefill_joules / s.steps_joules if s.steps_joules else 0.0
        idle = (
            r.idle_seconds / r.twin_seconds
            if r.idle_seconds is not None and r.twin_seconds
            else None
        )
        bound = "n/a" if r.idle_points is None else f"{r.idle_points:.2f} pt"
        lines.append(
            f"{r.case:<24} {r.grouping:<30} {share:>13.2%} {_pct(idle, '.1%'):>10} {bound:>10}"
        )
    return "\n".join(lines)


def format_tbt(rows: Sequence[BiasRow]) -> str:
    """Per case and arm: TBT reported (own decode steps) and user-visible, each against the work
    trace's own computation, and both speedups."""
    head = (
        f"{'case':<24} {'arm':<5} {'tbt':>7} {'trace':>7} {'agree':>7} {'visible':>8} "
        f"{'trace':>7} {'agree':>7}"
    )
    lines = [head]
    worst = 0.0
    for r in rows:
        for name, arm in (("base", r.baseline), ("spec", r.speculative)):
            t = arm.tbt
            if t is None:
                continue
            own, seen = (
                ArmTbt.agree(t.reported, t.trace_own),
                ArmTbt.agree(t.visible, t.trace_visible),
            )
            worst = max([worst] + [abs(v) for v in (own, seen) if v is not None])
            lines.append(
                f"{r.case:<24} {name:<5} {_pct(t.reported, '.3f'):>7} "
                f"{_pct(t.trace_own, '.3f'):>7} {_pct(own, '+.2%'):>7} "
                f"{_pct(t.visible, '.3f'):>8} {_pct(t.trace_visible, '.3f'):>7} "
                f"{_pct(seen, '+.2%'):>7}"
            )
        b, s = r.baseline.tbt, r.speculative.tbt
        if b is not None and s is not None:
            lines.append(
                f"{'':<24} speedup reported {_ratio(b.reported, s.reported)}, "
                f"user-visible {_ratio(b.visible, s.visible)}"
            )
    lines.append(f"max |plugin / trace - 1| {worst:.2%}")
    return "\n".join(lines)


def _ratio(base: float | None, spec: float | None) -> str:
    return "n/a" if base is None or not spec else f"{base / spec:.2f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--meter", default="modeled:h200", help="modeled:<gpu>[:shape] (default modeled:h200)"
    )
    parser.add_argument(
        "--drafters",
        nargs="+",
        default=["ngram", "draft_model", "block"],
        choices=list(DRAFTERS),
        help="none: the A/A control",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--corpora", nargs="+", default=["code", "news"])
    parser.add_argument("--pool", type=int, default=32, help="prompts per pool (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--cap-at-batch",
        action="store_true",
        help="declare max_running_requests=B in each case (one engine per batch point); "
        "without it the reference server's cap is set to the batch at run time",
    )
    parser.add_argument(
        "--quick", action="store_true", help="three rows: ngram b1 and b8, block b4, on code"
    )
    parser.add_argument(
        "--meta",
        choices=["reference", "sglang", "sglang-bare"],
        default="reference",
        help="the meta_info the plugin reads: the reference server's, SGLang's with "
        "--enable-metrics, or SGLang's without its time stats",
    )
    parser.add_argument(
        "--board", action="store_true", help="read the meter as a board counter (as NVML)"
    )
    parser.add_argument(
        "--refills",
        choices=["queued", "on-answer"],
        default=None,
        help="declare the engines' cap at the batch (queued) or at 64 (on-answer)",
    )
    parser.add_argument("--tbt", action="store_true", help="print the TBT table too")
    args = parser.parse_args(argv)
    cap_at_batch = args.cap_at_batch or args.refills == "queued"
    cap = ON_ANSWER_CAP if args.refills == "on-answer" else None
    if args.quick:
        cases = make_cases(
            ["ngram"], [1, 8], ["code"], args.pool, args.max_new_tokens, cap_at_batch, cap
        ) + make_cases(["block"], [4], ["code"], args.pool, args.max_new_tokens, cap_at_batch, cap)
    else:
        cases = make_cases(
            args.drafters,
            args.batches,
            args.corpora,
            args.pool,
            args.max_new_tokens,
            cap_at_batch,
            cap,
        )
    started = time.monotonic()
    rows = measure_rows(
        cases,
        args.meter,
        progress=lambda r: print(f"{r.case}: {r.seconds:.0f} s", file=sys.stderr),
        meta=args.meta,
        board=args.board,
    )
    print(format_rows(rows))
    print(format_shares(rows))
    if args.tbt:
        print(format_tbt(rows))
    print(f"total wall time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
