"""GPU smoke test without SGLang: the reference server on CUDA, measured live with NVML.

Runs the plugin's own pipeline - supervised reference server on ``--device cuda``, the NVML
meter (energy-counter deltas cross-checked by a 20 Hz power sampler), the decode-only
protocol - for the baseline, ngram and draft_model arms of ``tiny:dense`` at two batch sizes,
and prints measured J/token for each arm, the saving, and the counter-vs-sampler gap.

Usage (on a machine with an NVIDIA GPU, torch with CUDA, transformers, nvidia-ml-py):
    PYTHONPATH=. python benchmarks/gpu_smoke.py [--batches 1 16] [--max-new-tokens 128]
Writes the full records to $OUT/gpu_smoke.json when OUT is set. Exits 2 when no GPU/NVML.
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
from pytest_specenergy.measure.arm import ArmMeasurer
from pytest_specenergy.meters import make_meter
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.metrics import energy_saving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-window-s", type=float, default=3.0)
    parser.add_argument("--corpus", default="code")
    parser.add_argument(
        "--device",
        default="cuda",
        help="reference server device (cpu only to "
        "check this script without a GPU, with --meter modeled:h200)",
    )
    parser.add_argument("--meter", default="nvml", help="nvml (default) or modeled:<gpu>")
    args = parser.parse_args(argv)

    try:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            print("gpu_smoke: torch sees no CUDA device; nothing to measure", file=sys.stderr)
            return 2
        if args.meter == "nvml":
            from pytest_specenergy.meters.nvml import NvmlMeter

            meter = NvmlMeter.open(min_window_s=args.min_window_s)
        else:
            meter = make_meter(args.meter)
    except (ImportError, MeterError) as exc:
        print(f"gpu_smoke: cannot measure here: {exc}", file=sys.stderr)
        return 2

    facts = meter.describe()
    gpu = (facts.get("gpus") or [{}])[0]
    print(
        f"meter {meter.label}; GPU: {gpu.get('name')} {gpu.get('uuid')} driver "
        f"{facts.get('driver')} power limit {gpu.get('power_limit_w')} W; torch "
        f"{torch.__version__}"
    )
    corpus = load_corpus(args.corpus)
    drafters = [
        Drafter("ngram", num_draft_tokens=8),
        Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft"),
    ]
    # One engine at a time: an idle engine still holds a CUDA context on the measured GPU.
    pool = EnginePool(
        Path(tempfile.mkdtemp(prefix="specenergy-smoke-")), startup_timeout_s=600, max_live=1
    )
    rows, records = [], []
    started = time.monotonic()
    try:
        for batch in args.batches:
            base_result = None
            for drafter in drafters:
                case = Case.of(
                    engine="reference",
                    model="tiny:dense",
                    drafter=drafter,
                    batch=batch,
                    corpus=corpus,
                    generation=Generation(max_new_tokens=args.max_new_tokens),
                    device=args.device,
                )
                if base_result is None:
                    server = pool.get(case.baseline_config())
                    base_result = ArmMeasurer(server, meter, case, args.repeats, 1).measure(
                        "baseline"
                    )
                    rows.append(_row(batch, "baseline", base_result, None))
                    records.append(base_result.as_dict())
                server = pool.get(case.spec_config())
                spec = ArmMeasurer(server, meter, case, args.repeats, 1).measure("speculative")
                rows.append(_row(batch, drafter.id, spec, base_result))
                records.append(spec.as_dict())
    finally:
        pool.close()
        meter.close()
    print(
        tabulate(
            rows,
            headers=(
                "batch",
                "arm",
                "J/token",
                "saving",
                "accept len",
                "tbt ms",
                "decode s/repeat",
                "counter-vs-sampler gap",
                "source",
            ),
            disable_numparse=True,
        )
    )
    print(f"total wall time {time.monotonic() - started:.0f} s")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_smoke.json").write_text(
            json.dumps({"meter": facts, "arms": records}, indent=1, default=str)
        )
    return 0


def _row(batch, arm, run, base):
    gaps = [s.window.detail("power_gap") for s in run.samples]
    gaps = [g for g in gaps if g is not None]
    saving = energy_saving(run.energy_per_token, base.energy_per_token) if base else None
    decode_s = sum(s.decode_seconds for s in run.samples) / len(run.samples)
    return (
        batch,
        arm,
        _f(run.energy_per_token, ".4g"),
        _f(saving, "+.1%"),
        _f(run.accept_length, ".2f"),
        _f(run.tbt_ms, ".2f"),
        f"{decode_s:.2f}",
        ", ".join(f"{g:+.1%}" for g in gaps) or "n/a",
        run.source,
    )


def _f(value, spec):
    return "n/a" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
