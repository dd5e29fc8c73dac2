"""Throughput of the reference engine: plain vs ngram vs draft_model at several batch sizes.

Usage::

    python benchmarks/reference_engine.py [--model tiny:dense] [--max-new-tokens 128] [--k 4]
        [--batches 1,4,16] [--threads 0] [--dtype auto] [--reps 2] [--no-hf]

Prints output tokens per second (best of ``--reps``) and the mean accept length, side by side,
plus Hugging Face ``generate()`` at batch 1 (and its prompt-lookup mode) on the same weights for
comparison. All runs ignore EOS so every row produces exactly ``--max-new-tokens`` tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = (
    "The energy of the GPU per token is",
    "def forward(self, x):\n    return self.proj(x)\n\ndef",
    "Allegra! Co vai? Jau sun da Cuira e discur rumantsch.",
    "Summarise: speculative decoding saves energy when",
)


def _requests(engine, batch: int, max_new: int):
    from pytest_specenergy.refserver.records import GenerationRequest
    from pytest_specenergy.refserver.records import SamplingParams

    tok = engine.tokenizer
    return [
        GenerationRequest(
            tuple(tok.encode(PROMPTS[i % len(PROMPTS)] + f" {i}")),
            SamplingParams(max_new_tokens=max_new, ignore_eos=True),
        )
        for i in range(batch)
    ]


def _measure(engine, batch: int, max_new: int, reps: int) -> tuple[float, float | None]:
    engine.generate(_requests(engine, 1, 4))  # warm-up
    best = 0.0
    accept = None
    for _ in range(reps):
        reqs = _requests(engine, batch, max_new)
        t0 = time.perf_counter()
        results = engine.generate(reqs)
        dt = time.perf_counter() - t0
        best = max(best, sum(r.completion_tokens for r in results) / dt)
        specs = [r.spec for r in results if r.spec]
        if specs:
            accept = 1 + sum(s.num_correct_drafts for s in specs) / sum(s.verify_ct for s in specs)
    return best, accept


def _hf_generate(engine, max_new: int, reps: int) -> dict[str, float]:
    import torch

    model = engine.target.model
    ids = torch.tensor([_requests(engine, 1, max_new)[0].input_ids], device=engine.target.device)
    out: dict[str, float] = {}
    for label, extra in (
        ("HF generate", {}),
        ("HF prompt lookup (8)", {"prompt_lookup_num_tokens": 8}),
    ):
        best = 0.0
        for _ in range(reps):
            t0 = time.perf_counter()
            with torch.inference_mode():
                gen = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new,
                    min_new_tokens=max_new,
                    do_sample=False,
                    pad_token_id=0,
                    **extra,
                )
            best = max(best, (gen.shape[1] - ids.shape[1]) / (time.perf_counter() - t0))
        out[label] = best
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny:dense")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--no-hf", action="store_true")
    args = p.parse_args(argv)

    import torch

    from pytest_specenergy.refserver.engine import ReferenceEngine
    from pytest_specenergy.refserver.records import EngineConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    threads = torch.get_num_threads()
    print(
        f"model={args.model} dtype={args.dtype} K={args.k} max_new_tokens={args.max_new_tokens} "
        f"threads={threads}"
    )
    header = f"{'engine':<14}" + "".join(f"{'batch ' + str(b):>22}" for b in batches)
    print(header)
    plain = None
    for drafter in ("none", "ngram", "draft_model"):
        engine = ReferenceEngine(
            EngineConfig(
                model=args.model, drafter=drafter, num_draft_tokens=args.k, dtype=args.dtype
            )
        )
        plain = plain or engine
        cells = []
        for b in batches:
            tps, accept = _measure(engine, b, args.max_new_tokens, args.reps)
            cells.append(f"{tps:8.0f} tok/s" + (f" (acc {accept:.2f})" if accept else " " * 11))
        print(f"{drafter:<14}" + "".join(f"{c:>22}" for c in cells), flush=True)
    if not args.no_hf and plain is not None:
        for label, tps in _hf_generate(plain, args.max_new_tokens, args.reps).items():
            print(f"{label + ', batch 1':<30}{tps:8.0f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
