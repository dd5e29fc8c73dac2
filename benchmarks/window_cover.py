"""The quickstart's rows against the full workload (issue 41 item 4): does a row's saving describe
its prompts, or which of them its window happened to hold?

**Full workload** (no window code of the plugin): each arm's engine (the reference server, the
case's own configs) admits exactly the batch; the pool's prompts, sent ``--cycles`` times over in
one batched ``/generate``, queue in the engine, which admits each the step a slot frees, so every
prompt runs whole at a constant batch. Its work trace is priced by the modeled meter's per-step
roofline (``modeled (h200, priced as Qwen3-8B)``, as the quickstart runs). Two figures:

* **full**: the steady state's joules per decode row - the iterations that ran exactly the batch,
  their decode or verify step and the draft passes before it, over their rows - times every
  request's rows per committed token, whole, plus the draft model's prefills (charged to the
  speculative arm, issue 41 item 2) per token: every prompt weighs by its whole output;
* **steps**: the constant-batch iterations' joules over the tokens they committed (from the
  trace's context lengths: a row's next context less this one, its last step what its answer
  still lacked), the audit's figure; it leaves out the drain, which is always the last prompts'
  last tokens (the n-gram pool's 8th prompt, which its drafter cannot help), so it reads the
  n-gram savings 0.5-0.7 points high.

**Rows**: each quickstart case's saving from a run document (``--specenergy-json``) against it,
``plugin - full`` in points, per document given.

Usage (CPU, about 3 minutes on 2 cores)::

    PYTHONPATH=. .venv/bin/python benchmarks/window_cover.py --runs before.json after.json
        [--cycles 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.meters.modeled import ModeledMeter
from pytest_specenergy.meters.modeled import step_cost

NGRAM = Drafter("ngram", num_draft_tokens=8)
DRAFT = Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft")
#: The quickstart's cases (example_suites/quickstart), by the id its tables give them.
QUICKSTART = (
    ("code-ngram-b1", "tiny:dense", NGRAM, 1, 40),
    ("code-ngram-b2", "tiny:dense", NGRAM, 2, 40),
    ("code-ngram-b4", "tiny:dense", NGRAM, 4, 40),
    ("code-draft-b1", "tiny:dense", DRAFT, 1, 40),
    ("code-draft-b4", "tiny:dense", DRAFT, 4, 40),
    ("hybrid code-ngram-b1", "tiny:hybrid", NGRAM, 1, 32),
    ("hybrid code-ngram-b4", "tiny:hybrid", NGRAM, 4, 32),
)
POOL = 8


@dataclass(frozen=True)
class Truth:
    """One arm's full-workload figures: joules and committed tokens of its constant-batch
    iterations (``steps``), and the steady state's joules per row at every request's rows per
    token (``full``)."""

    joules: float
    tokens: int
    full: float

    @property
    def per_token(self) -> float:
        """J per committed decode token of the constant-batch iterations."""
        return self.joules / self.tokens


def full_workload(
    pool: EnginePool, meter: ModeledMeter, case: Case, spec: bool, cycles: int
) -> Truth:
    """One arm of ``case`` run on its pool ``cycles`` times over at a constant batch."""
    server = pool.get(case.spec_config() if spec else case.baseline_config())
    server.admit_exactly(case.batch)
    prompts = list(case.pool()) * cycles
    sampling = {
        "max_new_tokens": case.generation.max_new_tokens,
        "temperature": 0.0,
        "ignore_eos": case.generation.ignore_eos,
    }
    start, _ = server.work_trace(10**12)  # the cursor: every step recorded so far
    rids = [f"cover-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    answers = server.client.generate(text=prompts, sampling_params=sampling, rids=rids)
    _, steps = server.work_trace(start)
    completion = {a["meta_info"]["id"]: int(a["meta_info"]["completion_tokens"]) for a in answers}
    return constant_batch(steps, completion, case.batch, meter, server)


def constant_batch(
    steps: Sequence[dict[str, Any]],
    completion: dict[str, int],
    batch: int,
    meter: ModeledMeter,
    server: Any,
) -> Truth:
    """The constant-batch iterations' joules and committed tokens (module docstring)."""
    pricing = meter.pricing(server)

    def joules(step: dict[str, Any]) -> float:
        model = str(step.get("model", "target"))
        return step_cost(
            step, meter.gpu, pricing.shape(model), pricing.cuda_graph, pricing.traced_moe.get(model)
        ).joules

    prompt: dict[str, int] = {}
    rounds = []  # per target decode/verify step: (its joules with the draft passes before it, rows)
    drafts = draft_prefill = 0.0
    for step in steps:
        model, phase = step.get("model", "target"), step.get("phase")
        if phase == "prefill":
            if model == "target":
                for rid, query in zip(step["rids"], step["query_tokens"]):
                    prompt[rid] = int(query)
            else:
                draft_prefill += joules(step)
        elif model == "draft":
            drafts += joules(step)
        else:
            rounds.append((joules(step) + drafts, step))
            drafts = 0.0
    # Committed tokens per row of each round: the row's next context less this one.
    last: dict[str, tuple[int, int]] = {}  # rid -> (round, context)
    committed: list[dict[str, int]] = [{} for _ in rounds]
    for index, (_, step) in enumerate(rounds):
        for rid, context in zip(step["rids"], step["context_lens"]):
            if rid in last:
                before, at = last[rid]
                committed[before][rid] = int(context) - at
            last[rid] = (index, int(context))
    for rid, (index, context) in last.items():
        committed[index][rid] = prompt[rid] + completion[rid] - 1 - context
    steady = [i for i, (_, step) in enumerate(rounds) if len(step["rids"]) == batch]
    tokens = sum(sum(committed[i].values()) for i in steady)
    every = sum(sum(c.values()) for c in committed)
    spent = sum(rounds[i][0] for i in steady)
    per_row = spent / (batch * len(steady))
    rows = sum(len(step["rids"]) for _, step in rounds)
    full = per_row * rows / every + draft_prefill / every
    return Truth(spent + draft_prefill * tokens / every, tokens, full)


def truths(cycles: int) -> dict[str, tuple[float, float]]:
    """Each quickstart case's full-workload savings (full, steps), by id."""
    pool = EnginePool(Path(tempfile.mkdtemp(prefix="specenergy-cover-")), startup_timeout_s=300)
    meter = ModeledMeter("h200")
    out = {}
    try:
        for key, model, drafter, batch, tokens in QUICKSTART:
            case = Case.of(
                engine="reference",
                model=model,
                drafter=drafter,
                batch=batch,
                corpus=load_corpus("code"),
                generation=Generation(max_new_tokens=tokens, prompts=POOL),
            )
            base = full_workload(pool, meter, case, False, cycles)
            spec = full_workload(pool, meter, case, True, cycles)
            out[key] = (1.0 - spec.full / base.full, 1.0 - spec.per_token / base.per_token)
            print(f"{key}: full {out[key][0]:+.2%}, steps {out[key][1]:+.2%}", file=sys.stderr)
    finally:
        pool.close()
    return out


def plugin_rows(path: Path) -> dict[str, float]:
    """Each case's saving in a run document, by the quickstart's id (the hybrid's prefixed)."""
    rows = {}
    for result in json.loads(path.read_text())["results"]:
        case = result["case"]
        hybrid = "hybrid" in str(case.get("model", ""))
        rows[("hybrid " if hybrid else "") + result["case_id"]] = result["energy_saving"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", nargs="+", type=Path, default=[], help="run documents")
    parser.add_argument("--cycles", type=int, default=8, help="times the pool is sent")
    args = parser.parse_args(argv)
    truth = truths(args.cycles)
    runs = [plugin_rows(path) for path in args.runs]
    head = f"{'case':<22} {'full':>7} {'steps':>7}" + "".join(
        f" {path.stem[:14]:>14} {'- full':>7}" for path in args.runs
    )
    lines = [head]
    for key, (full, steps) in truth.items():
        cells = ""
        for rows in runs:
            got = rows.get(key)
            cells += " " + (
                f"{got:>14.2%} {100 * (got - full):>+7.2f}" if got is not None else f"{'-':>22}"
            )
        lines.append(f"{key:<22} {full:>+7.2%} {steps:>+7.2%}{cells}")
    for path, rows in zip(args.runs, runs):
        gaps = [abs(rows[k] - v[0]) for k, v in truth.items() if k in rows]
        lines.append(f"{path.stem}: max |plugin - full| {100 * max(gaps, default=0):.2f} points")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
