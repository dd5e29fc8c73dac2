"""Throughput of the reference engine against transformers' own ``generate``, interleaved.

Usage::

    python benchmarks/reference_engine.py [--model smollm2-135m] [--batches 1,4,16]
        [--max-new-tokens 32] [--reps 3] [--threads 1] [--dtype auto] [--corpus code]
        [--drafters none,ngram]

Both run the same model object (same weights, dtype and threads) on the same prompts (the corpus's
first prompts, chat-templated when the model has a template, as ``generation(chat=True)`` sends
them), greedy, EOS ignored so every row makes exactly ``--max-new-tokens`` tokens. ``generate``
gets the batch left-padded with its attention mask; the engine gets the requests at once and
batches them itself. Each repeat runs both back to back, alternating which goes first, so the
shared machine's drift falls on both; the table prints every repeat's ratio (engine tokens/s /
``generate`` tokens/s) side by side and their median. Wall time includes prefill for both.

``--drafters none,ngram`` adds the engine's speculative drafters (accept length in brackets);
their ratio is against the same ``generate`` run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _prompt_ids(engine, corpus: str, n: int) -> list[list[int]]:
    from pytest_specenergy.cases.chat import chat_template_ids
    from pytest_specenergy.cases.corpora import load_corpus

    texts = load_corpus(corpus).take(n)
    inner = getattr(engine.tokenizer, "_tok", None)  # a checkpoint's HF tokenizer
    if inner is not None and getattr(inner, "chat_template", None):
        return [list(chat_template_ids(inner, t)) for t in texts]
    return [engine.tokenizer.encode(t) for t in texts]


def _engine_tps(engine, prompts: list[list[int]], max_new: int) -> tuple[float, float | None]:
    from pytest_specenergy.refserver.records import GenerationRequest
    from pytest_specenergy.refserver.records import SamplingParams

    requests = [
        GenerationRequest(tuple(p), SamplingParams(max_new_tokens=max_new, ignore_eos=True))
        for p in prompts
    ]
    t0 = time.perf_counter()
    results = engine.generate(requests)
    seconds = time.perf_counter() - t0
    specs = [r.spec for r in results if r.spec]
    accept = (
        1 + sum(s.num_correct_drafts for s in specs) / sum(s.verify_ct for s in specs)
        if specs and sum(s.verify_ct for s in specs)
        else None
    )
    return sum(r.completion_tokens for r in results) / seconds, accept


def _generate_tps(model, prompts: list[list[int]], max_new: int, pad: int) -> float:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            pad_token_id=pad,
        )
    return (out.shape[0] * (out.shape[1] - width)) / (time.perf_counter() - t0)


def _row(label: str, ratios: list[float], tps: list[float], accept: float | None) -> str:
    cells = " ".join(f"{r:5.2f}" for r in ratios)
    extra = f" (accept {accept:.2f})" if accept else ""
    return (
        f"{label:<22} {statistics.median(tps):8.1f} tok/s   ratio per repeat: {cells}   "
        f"median {statistics.median(ratios):.2f}{extra}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--corpus", default="code")
    p.add_argument("--drafters", default="none", help="engine drafters, comma-separated")
    p.add_argument("--k", type=int, default=4, help="draft tokens per step for the drafters")
    args = p.parse_args(argv)

    import torch

    from pytest_specenergy.refserver.engine import ReferenceEngine
    from pytest_specenergy.refserver.records import EngineConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    drafters = args.drafters.split(",")
    engines = {
        d: ReferenceEngine(
            EngineConfig(model=args.model, drafter=d, num_draft_tokens=args.k, dtype=args.dtype)
        )
        for d in drafters
    }
    first = engines[drafters[0]]
    model, pad = first.target.model, first.tokenizer.pad_token_id
    print(
        f"model={args.model} dtype={first.target.dtype} threads={torch.get_num_threads()} "
        f"max_new_tokens={args.max_new_tokens} corpus={args.corpus} reps={args.reps} "
        "(ratio = engine tok/s / transformers generate tok/s, same batch, dtype, threads)"
    )
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = _prompt_ids(first, args.corpus, batch)
        for engine in engines.values():  # warm-up: first-call allocations stay out of the figures
            _engine_tps(engine, prompts[:1], 2)
        _generate_tps(model, prompts[:1], 2, pad)
        hf: list[float] = []
        ours: dict[str, list[float]] = {d: [] for d in drafters}
        accepts: dict[str, float | None] = {}
        for rep in range(args.reps):
            order = ["hf", *drafters] if rep % 2 else [*drafters, "hf"]
            for who in order:
                if who == "hf":
                    hf.append(_generate_tps(model, prompts, args.max_new_tokens, pad))
                else:
                    tps, accepts[who] = _engine_tps(engines[who], prompts, args.max_new_tokens)
                    ours[who].append(tps)
        print(f"batch {batch}: prompt tokens {min(map(len, prompts))}-{max(map(len, prompts))}")
        print(f"  {'transformers generate':<22} {statistics.median(hf):8.1f} tok/s")
        for d in drafters:
            ratios = [e / h for e, h in zip(ours[d], hf)]
            print("  " + _row(f"engine ({d})", ratios, ours[d], accepts.get(d)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
