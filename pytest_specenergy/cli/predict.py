"""``specenergy predict``: per batch, the verify step's FLOP/byte against the balance point and
speculation's energy per token against plain decode, from the modeled meter's roofline (an example:
``docs/report.md``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from typing import Any

from tabulate import tabulate

from pytest_specenergy.meters.prediction import DEFAULT_BATCHES
from pytest_specenergy.meters.prediction import predict
from pytest_specenergy.meters.roofline import PRESETS
from pytest_specenergy.meters.shapes import ModelShape
from pytest_specenergy.meters.shapes import get_shape


def _shape(text: str) -> ModelShape:
    try:
        return get_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def checked_number(cast: Any, ok: Any, expected: str) -> Any:
    """An argparse ``type=``: ``text`` cast and checked, else an error saying what is expected."""

    def parse(text: str) -> Any:
        with contextlib.suppress(ValueError):
            value = cast(text)
            if ok(value):
                return value
        raise argparse.ArgumentTypeError(f"{text!r} is not {expected}") from None

    return parse


_positive_int = checked_number(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = checked_number(int, lambda v: v >= 0, "an integer >= 0")
_finite_non_negative = checked_number(
    float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"
)
_accept_length = checked_number(
    float,
    lambda v: math.isfinite(v) and v >= 1,
    "an accept length >= 1 (tokens committed per verify step, the bonus token included)",
)


def add_predict_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``predict`` to the ``specenergy`` sub-commands; returns its parser."""
    parser = subparsers.add_parser(
        "predict",
        help="predict verify intensity, compute-bound flag and energy saving per batch",
        description="Roofline prediction of speculative decoding against plain decode at a real "
        "model shape: the verify step's FLOP/byte, whether it is past the GPU's "
        "balance point, and the energy saving per committed token. A model, not a "
        "measurement.",
    )
    parser.add_argument(
        "--shape",
        required=True,
        type=_shape,
        metavar="NAME",
        help="target model shape, e.g. qwen3-4b, qwen3-8b, qwen3-30b-a3b, qwen3.6-27b",
    )
    parser.add_argument(
        "--verified",
        required=True,
        type=_positive_int,
        metavar="K",
        help="tokens verified per request and step (block size for block drafters, draft tokens "
        "+ 1 for chains; 16 = DFlash-16, 7 = DSpark-7)",
    )
    parser.add_argument(
        "--context",
        type=_non_negative_int,
        default=260,
        metavar="C",
        help="tokens already in each request's context (default 260, the paper's s.9)",
    )
    parser.add_argument(
        "--gpu", choices=sorted(PRESETS), default="h200", help="GPU preset (default h200)"
    )
    parser.add_argument(
        "--accept-length",
        type=_accept_length,
        metavar="T",
        help="tokens committed per verify step; without it only the break-even accept length is "
        "shown",
    )
    parser.add_argument(
        "--batches",
        type=_positive_int,
        nargs="+",
        default=list(DEFAULT_BATCHES),
        metavar="B",
        help="batch sizes (default 1 2 4 8 16 32 64)",
    )
    parser.add_argument(
        "--draft-shape",
        type=_shape,
        metavar="NAME",
        help="shape of a draft model run per step (default: no draft cost)",
    )
    parser.add_argument(
        "--draft-passes",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="draft forwards per step (1 for block drafters, K-1 for chains; default 1)",
    )
    parser.add_argument(
        "--draft-tokens",
        type=_positive_int,
        metavar="Q",
        help="query tokens per request in each draft pass (default: --verified, a block)",
    )
    parser.add_argument(
        "--draft-cost",
        type=_finite_non_negative,
        default=0.0,
        metavar="F",
        help="extra draft energy per step as a fraction of a plain decode step (default 0)",
    )
    parser.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="price eager kernel launches (~5 us each) instead of one graph replay per forward",
    )
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")
    parser.set_defaults(func=cmd_predict)
    return parser


def cmd_predict(args: argparse.Namespace) -> int:
    """Print the prediction table; 2 on a bad argument."""
    try:
        shape = args.shape if isinstance(args.shape, ModelShape) else get_shape(args.shape)
        draft = args.draft_shape
        if draft is not None and not isinstance(draft, ModelShape):
            draft = get_shape(draft)
        rows = predict(
            shape,
            args.verified,
            args.context,
            args.gpu,
            args.accept_length,
            args.batches,
            draft_shape=draft,
            draft_passes=args.draft_passes,
            draft_tokens=args.draft_tokens,
            draft_cost=args.draft_cost,
            cuda_graph=not args.no_cuda_graph,
        )
    except ValueError as exc:
        print(f"specenergy predict: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    preset = PRESETS[args.gpu]
    accept = (
        f"accept length {args.accept_length:g}" if args.accept_length else "no accept length given"
    )
    drafting = []
    if draft is not None:
        drafting.append(
            f"draft {draft.name} x{args.draft_passes} pass(es) of "
            f"{args.draft_tokens or args.verified} token(s)"
        )
    if args.draft_cost:
        drafting.append(f"draft {args.draft_cost:g} x a decode step")
    print(
        f"{shape.name} ({shape.num_params / 1e9:.2f}B params, {8 * shape.dtype_bytes}-bit), "
        f"{args.verified} verified per request, context {args.context}, {accept}; "
        f"{'; '.join(drafting) or 'no draft cost'}"
    )
    fitted = (
        f"constants fitted to {preset.calibration_id} (benchmarks/mlenergy_calibration.py)"
        if preset.calibration
        else "uncalibrated constants"
    )
    print(
        f"modeled ({preset.name}): balance point {preset.balance_point:.0f} FLOP/byte, "
        f"CUDA graphs {'off' if args.no_cuda_graph else 'on'}; {fitted}"
    )
    table = [
        (
            r.batch,
            f"{r.verify_intensity:.1f}",
            "yes" if r.compute_bound else "no",
            f"{r.decode_joules_per_token:.4g}",
            "-" if r.spec_joules_per_token is None else f"{r.spec_joules_per_token:.4g}",
            "-" if r.saving is None else f"{r.saving:+.1%}",
            f"{r.break_even_accept_length:.2f}",
            "-" if r.speedup is None else f"{r.speedup:.2f}x",
        )
        for r in rows
    ]
    print(
        tabulate(
            table,
            headers=(
                "batch",
                "verify FLOP/byte",
                "compute-bound",
                "base J/tok",
                "spec J/tok",
                "saving",
                "break-even T",
                "speedup",
            ),
            tablefmt="simple",
            disable_numparse=True,
            colalign=("right",) * 8,
        )
    )
    print(
        "intensity = verify FLOPs / (weights + KV read + KV written + activations); saving = 1 - "
        "spec J/token / baseline J/token"
    )
    return 0
