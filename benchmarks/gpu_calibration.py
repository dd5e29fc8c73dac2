"""GPU calibration of the block-drafter crossover (issue 14 item 7): measured (nvml) vs modeled vs
the paper.

Energy depends on shapes, not trained weights, so a randomly initialised model of Qwen3-4B's shape
(``random:qwen3-4b``: built from the shape's config on the GPU in bf16, nothing downloaded) served
by the reference server on CUDA stands in for the real one. The drafter is a block drafter of 16
(the DFlash-16 shape) with controlled acceptance (``accept_p``), so the accept length is a knob
rather than an accident of random weights; under NVML the plugin measures that arm on a
``--replay-proposals`` engine (the block draft model's own passes, the drafts recorded from the
controlled run), so the controlled run's oracle is never in a measured window. Draft removal is on:
a verify-only replay arm in every repeat gives the draft share and the verify-only saving.

Per batch it prints the measured saving (speculative vs the non-speculative twin, both nvml), the
verify-only saving, the draft share, the accept length, and next to them the roofline prediction for
the same shape, verified count, context and measured accept length (``specenergy predict``'s model,
priced without CUDA graphs like the reference server runs), and the paper's crossover (DFlash-16 on
Qwen3-4B at 260-token contexts: the saving turns negative at batch 16 on H200 and between 16 and 32
on H100).

Caveat stated in the output: the reference server is HF transformers in eager mode (no CUDA graphs,
no paged attention kernels), so its per-step overhead is larger than SGLang's and the measured
crossover is an upper bound on SGLang's.

Usage, on a machine with an NVIDIA GPU, torch with CUDA, transformers and nvidia-ml-py (about
5 minutes of GPU time at the defaults)::

    PYTHONPATH=. python benchmarks/gpu_calibration.py --gpu h200

Check the script on a CPU (modeled meter, a cut-down shape; minutes)::

    PYTHONPATH=. .venv/bin/python benchmarks/gpu_calibration.py --device cpu --meter modeled:h200 \\
        --model random:qwen3-4b:layers=2,vocab=1024 --draft-model random:qwen3-0.6b:layers=1,vocab=1024 \\
        --batches 1 4 --max-new-tokens 24

Writes ``$OUT/gpu_calibration.json`` (every pair's record) when OUT is set. Exits 2 when it cannot
measure here (no CUDA device or no NVML for the nvml meter).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.measure.pairs import PairMeasurer
from pytest_specenergy.meters import make_meter
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.prediction import predict
from pytest_specenergy.meters.shapes import get_shape
from pytest_specenergy.metrics import energy_saving

#: The paper (s.9): DFlash-16 on Qwen3-4B at 260-token contexts, where the saving turns negative.
PAPER_LOSS_FROM = {"h200": "16", "h100": "16-32"}
PAPER_COMPUTE_BOUND_FROM = {"h200": 16, "h100": 32}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--gpu",
        choices=("h100", "h200"),
        default="h200",
        help="the GPU the prediction and the paper's figures are for (default h200)",
    )
    parser.add_argument(
        "--model", default="random:qwen3-4b", help="target (default random:qwen3-4b)"
    )
    parser.add_argument(
        "--draft-model",
        default="random:qwen3-0.6b",
        help="block draft model (default random:qwen3-0.6b)",
    )
    parser.add_argument(
        "--shape", default="qwen3-4b", help="shape the prediction prices the target as"
    )
    parser.add_argument(
        "--draft-shape", default="qwen3-0.6b", help="shape the prediction prices the draft as"
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--accept-p",
        type=float,
        default=0.5,
        help="controlled acceptance; 0.5 gives about 2 accepted tokens per step, as "
        "DFlash-16 accepts fewer than 3 past the balance point (paper s.9)",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--pool-factor", type=int, default=3, help="prompts per pool = factor x batch"
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--min-window-s", type=float, default=2.0, help="nvml: shortest metered window"
    )
    parser.add_argument("--corpus", default="news", help="news: prompts of about 260 tokens")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA")
    parser.add_argument("--meter", default="nvml", help="nvml (default) or modeled:<gpu> on a CPU")
    args = parser.parse_args(argv)

    try:
        meter = _meter(args)
    except (ImportError, MeterError, RuntimeError) as exc:
        print(f"gpu_calibration: cannot measure here: {exc}", file=sys.stderr)
        return 2
    corpus = load_corpus(args.corpus)
    drafter = Drafter(
        "block",
        draft_model=args.draft_model,
        block_size=args.block_size,
        accept_p=args.accept_p,
        id=f"block{args.block_size}",
    )
    # One engine at a time: an idle engine still holds a CUDA context on the measured GPU.
    pool = EnginePool(
        Path(tempfile.mkdtemp(prefix="specenergy-calibration-")), startup_timeout_s=900, max_live=1
    )
    measurer = PairMeasurer(
        log_dir=pool.log_dir,
        startup_timeout=900,
        meter=args.meter,
        repeats=args.repeats,
        warmup=None,
        meter_factory=lambda kind, server: meter,
        pool=pool,
        draft_removal="on",
    )
    cases = [
        Case.of(
            engine="reference",
            model=args.model,
            drafter=drafter,
            batch=b,
            corpus=corpus,
            generation=Generation(
                max_new_tokens=args.max_new_tokens, prompts=args.pool_factor * b, ignore_eos=True
            ),
            dtype=args.dtype,
            device=args.device,
        )
        for b in args.batches
    ]
    measurer.plan(cases)
    started = time.monotonic()
    pairs = []
    try:
        for case in cases:
            pairs.append(measurer.measure(case))
            print(
                f"batch {case.batch}: measured in {time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
    finally:
        measurer.close()
    print(render(pairs, args, meter.label))
    print(f"total wall time {time.monotonic() - started:.0f} s")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_calibration.json").write_text(
            json.dumps(
                {
                    "meter": meter.describe(),
                    "args": vars(args),
                    "pairs": [p.as_dict() for p in pairs],
                },
                indent=1,
                default=str,
            )
        )
    return 0


def _meter(args: argparse.Namespace):
    if args.meter != "nvml":
        return make_meter(args.meter)
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    from pytest_specenergy.meters.nvml import NvmlMeter

    return NvmlMeter.open(min_window_s=args.min_window_s)


def render(pairs: list, args: argparse.Namespace, label: str) -> str:
    """Measured against modeled, per batch, with the crossovers and the paper's."""
    shape, draft = get_shape(args.shape), get_shape(args.draft_shape)
    rows, measured_loss, modeled_loss = [], None, None
    for pair in pairs:
        batch = pair.case.batch
        accept = pair.accept_length
        context = _mean_context(pair)
        verify_only = (
            energy_saving(pair.removal.energy_per_token, pair.baseline.energy_per_token)
            if pair.removal is not None
            else None
        )
        (model,) = (
            predict(
                shape,
                args.block_size,
                round(context),
                args.gpu,
                accept_length=accept,
                batches=[batch],
                draft_shape=draft,
                draft_passes=1,
                cuda_graph=False,
            )
            if accept
            else (None,)
        )
        if measured_loss is None and pair.energy_saving is not None and pair.energy_saving < 0:
            measured_loss = batch
        if (
            modeled_loss is None
            and model is not None
            and model.saving is not None
            and model.saving < 0
        ):
            modeled_loss = batch
        rows.append(
            (
                batch,
                _f(accept, ".2f"),
                f"{context:.0f}",
                _f(pair.energy_saving, "+.1%"),
                _f(verify_only, "+.1%"),
                _f(pair.draft_share, ".0%"),
                _f(model.saving if model else None, "+.1%"),
                _f(model.verify_intensity if model else None, ".0f"),
                "yes" if model and model.compute_bound else "no",
                ", ".join(c.name for c in pair.failed_checks) or "-",
            )
        )
    table = tabulate(
        rows,
        headers=(
            "batch",
            "accept len",
            "context",
            "saving (measured)",
            "verify-only saving",
            "draft share",
            "saving (modeled)",
            "verify FLOP/B (modeled)",
            "compute-bound",
            "failed checks",
        ),
        disable_numparse=True,
    )
    return (
        f"{args.model} + block {args.block_size} ({args.draft_model}, accept_p {args.accept_p}); "
        f"measured: {label}; modeled: roofline {args.gpu}, {args.shape} + {args.draft_shape}, no "
        f"CUDA graphs\n{table}\nsaving turns negative from batch: measured "
        f"{measured_loss or 'none tested'}, modeled {modeled_loss or 'none tested'}, paper "
        f"{PAPER_LOSS_FROM[args.gpu]} (SGLang, CUDA graphs); paper's compute-bound crossover: "
        f"batch {PAPER_COMPUTE_BOUND_FROM[args.gpu]}\nnote: the reference server runs HF "
        "transformers eagerly (no CUDA graphs), so its per-step overhead is above SGLang's"
    )


def _mean_context(pair) -> float:
    """Mean prompt tokens plus half the answer: the context a mid-answer verify step sees
    (random:* and tiny:* models share the reference server's byte tokenizer)."""
    from pytest_specenergy.refserver.tokenizer import ByteTokenizer

    tokenizer = ByteTokenizer()
    prompts = [len(tokenizer.encode(p)) for p in pair.case.pool()]
    return sum(prompts) / len(prompts) + pair.case.generation.max_new_tokens / 2


def _f(value, spec):
    return "n/a" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
