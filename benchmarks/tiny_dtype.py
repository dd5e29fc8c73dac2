"""What running the built-in tiny models in float32 instead of float64 buys and costs.

The test suite's end-to-end tests spend most of their time in the tiny engines' forward passes
(issue 24 item 7). The tiny models ran in float64 on the CPU so that greedy output was exact;
on these figures they now run in float32 there (``refserver/models.py`` says why), and the fault
tests judge divergences with a float32 engine's tie margin (2**-13, ``measure/numerics.py``). This
prints, for each tiny model and dtype, side by side and interleaved in one run:

- ``generate s``: the wall time of one ``generate`` of ``--prompts`` code prompts x
  ``--tokens`` tokens (n-gram drafter, 8 drafts, best of ``--rounds``), and its ratio to float64;
- ``spec != base``: prompts of every built-in corpus that the healthy speculative engine answers
  differently from the healthy baseline engine, a corpus's prompts in one batch (what the
  equivalence check would call a divergence at ``tie_margin=0``);
- ``b8 != b1``: prompts the baseline answers differently in that batch than one at a time;
- ``min gap`` and ``1% gap``: the smallest and the 1st-percentile gap between the top two logits
  of each greedy decode step (one prompt at a time, KV cache), and ``path noise``: the largest
  difference of any logit between that step and the same position read from one forward of the
  whole sequence (the shape a verify pass has). A position flips only where the gap is below
  the noise; the ratio of the two is the margin the dtype leaves.

``--divergences N`` prints only ``spec != base`` over N prompts of every corpus in one dtype
(batches of 8): the large sample that bounds a rare flip.

Usage: .venv/bin/python benchmarks/tiny_dtype.py [--rounds 3] [--prompts 8] [--tokens 64]
       [--models tiny:dense,tiny:hybrid] [--divergences N [--dtype float32]]
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPES = ("float64", "float32")


@dataclass(frozen=True)
class DtypeRow:
    """One model in one dtype: its best generate time and what its numerics leave."""

    model: str
    dtype: str
    generate_s: float
    vs_float64: float
    spec_differs: int
    batch_differs: int
    prompts: int
    min_gap: float
    gap_p01: float
    path_noise: float


def _requests(engine, prompts, tokens: int):
    from pytest_specenergy.refserver.records import GenerationRequest
    from pytest_specenergy.refserver.records import SamplingParams

    return [
        GenerationRequest(
            tuple(engine.tokenizer.encode(p)),
            SamplingParams(max_new_tokens=tokens, ignore_eos=True),
        )
        for p in prompts
    ]


def _outputs(engine, prompts, tokens: int, one_at_a_time: bool = False) -> list[tuple[int, ...]]:
    if one_at_a_time:
        return [
            tuple(engine.generate(_requests(engine, [p], tokens))[0].output_ids) for p in prompts
        ]
    return [tuple(r.output_ids) for r in engine.generate(_requests(engine, prompts, tokens))]


def _gaps_and_noise(model: str, dtype: str, prompts, tokens: int) -> tuple[list[float], float]:
    """Top-2 logit gaps of greedy decode steps, and the largest logit difference between a step
    and the same position in one forward of the whole sequence."""
    import torch

    from pytest_specenergy.refserver.models import load_model

    loaded = load_model(model, dtype=dtype, device="cpu")
    gaps: list[float] = []
    noise = 0.0
    with torch.inference_mode():
        for prompt in prompts:
            ids = list(loaded.tokenizer.encode(prompt))
            out = loaded.model(torch.tensor([ids]), use_cache=True)
            steps = []
            for _ in range(tokens):
                logits = out.logits[0, -1].double()
                steps.append(logits)
                ids.append(int(logits.argmax()))
                out = loaded.model(
                    torch.tensor([ids[-1:]]), cache=out.past_key_values, use_cache=True
                )
            whole = loaded.model(torch.tensor([ids]), use_cache=False).logits[0].double()
            first = len(ids) - tokens - 1  # the position whose logits chose the first new token
            for offset, logits in enumerate(steps):
                top = torch.topk(logits, 2).values
                gaps.append(float(top[0] - top[1]))
                noise = max(noise, float((logits - whole[first + offset]).abs().max()))
    return gaps, noise


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread, as the plugin runs tiny models (engines/refserver.py); the caller's
    setting comes back after, so a test calling a benchmark leaves its worker as it found it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def measure_rows(
    models: list[str], prompts: int = 8, tokens: int = 64, rounds: int = 3
) -> list[DtypeRow]:
    """Every model in both dtypes, the timings interleaved round by round, on one torch thread."""
    with _one_torch_thread():
        return _measure(models, prompts, tokens, rounds)


def _measure(models: list[str], prompts: int, tokens: int, rounds: int) -> list[DtypeRow]:
    import numpy as np

    from pytest_specenergy.cases.corpora.loader import BUILTIN_CORPORA
    from pytest_specenergy.cases.corpora.loader import load_corpus
    from pytest_specenergy.refserver.engine import ReferenceEngine
    from pytest_specenergy.refserver.records import EngineConfig

    engines = {}
    for model in models:
        for dtype in DTYPES:
            for drafter in ("none", "ngram"):
                engine = ReferenceEngine(
                    EngineConfig(model=model, drafter=drafter, num_draft_tokens=8, dtype=dtype)
                )
                engine.warmup()
                engines[model, dtype, drafter] = engine

    code = load_corpus("code").take(prompts)
    # Tokenized once, outside the timed calls (the requests are frozen records).
    timed = {
        (model, dtype): _requests(engines[model, dtype, "ngram"], code, tokens)
        for model in models
        for dtype in DTYPES
    }
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):  # every configuration once per round: host noise hits them alike
        for model in models:
            for dtype in DTYPES:
                started = time.perf_counter()
                engines[model, dtype, "ngram"].generate(timed[model, dtype])
                elapsed = time.perf_counter() - started
                best[model, dtype] = min(best.get((model, dtype), elapsed), elapsed)

    rows = []
    for model in models:
        for dtype in DTYPES:
            spec_differs = batch_differs = 0
            all_prompts = []
            for corpus in BUILTIN_CORPORA:
                taken = load_corpus(corpus).take(prompts)
                all_prompts += taken
                base = _outputs(engines[model, dtype, "none"], taken, tokens)
                spec = _outputs(engines[model, dtype, "ngram"], taken, tokens)
                alone = _outputs(engines[model, dtype, "none"], taken, tokens, one_at_a_time=True)
                spec_differs += sum(s != b for s, b in zip(spec, base))
                batch_differs += sum(a != b for a, b in zip(alone, base))
            gaps, noise = _gaps_and_noise(model, dtype, all_prompts, tokens)
            rows.append(
                DtypeRow(
                    model,
                    dtype,
                    best[model, dtype],
                    best[model, dtype] / best[model, "float64"],
                    spec_differs,
                    batch_differs,
                    len(all_prompts),
                    min(gaps),
                    float(np.quantile(gaps, 0.01)),
                    noise,
                )
            )
    return rows


def count_divergences(
    models: list[str],
    dtype: str,
    prompts: int,
    tokens: int,
    batch: int = 8,
    faults: tuple[str, ...] = (),
) -> list[str]:
    """Lines of ``spec != base`` for each model in ``dtype`` over ``prompts`` prompts of every
    built-in corpus (fewer where a corpus has fewer), ``batch`` prompts a ``generate``: the sample
    the table's 40 prompts are too small to bound a rare flip with. Each line names the prompts
    that differ, as (corpus, prompt index, first differing token). ``faults`` go to the
    speculative engine (the reference server's fault switches: a test's bad case)."""
    from pytest_specenergy.cases.corpora.loader import BUILTIN_CORPORA
    from pytest_specenergy.cases.corpora.loader import load_corpus
    from pytest_specenergy.refserver.engine import ReferenceEngine
    from pytest_specenergy.refserver.records import EngineConfig

    lines = []
    with _one_torch_thread():
        for model in models:
            base = ReferenceEngine(EngineConfig(model=model, drafter="none", dtype=dtype))
            spec = ReferenceEngine(
                EngineConfig(
                    model=model, drafter="ngram", num_draft_tokens=8, dtype=dtype, faults=faults
                )
            )
            total, differ = 0, []
            for corpus in BUILTIN_CORPORA:
                loaded = load_corpus(corpus)
                taken = loaded.take(min(prompts, len(loaded)))
                for start in range(0, len(taken), batch):
                    chunk = taken[start : start + batch]
                    for offset, (b, s) in enumerate(
                        zip(_outputs(base, chunk, tokens), _outputs(spec, chunk, tokens))
                    ):
                        total += 1
                        if b != s:
                            first = next(
                                (i for i, (x, y) in enumerate(zip(b, s)) if x != y),
                                min(len(b), len(s)),
                            )
                            differ.append((corpus, start + offset, first))
            lines.append(
                f"{model:<12} {dtype:<8} spec != base: {len(differ)} of {total} prompts "
                f"({total * tokens} tokens, batch {batch}) {differ if differ else ''}".rstrip()
            )
    return lines


def format_rows(rows: list[DtypeRow], tokens: int) -> str:
    """The rows as a fixed-width table."""
    lines = [
        f"{'model':<12} {'dtype':<8} {'generate s':>10} {'vs f64':>7} {'spec != base':>12} "
        f"{'b8 != b1':>8} {'min gap':>9} {'1% gap':>9} {'path noise':>10}"
    ]
    for r in rows:
        lines.append(
            f"{r.model:<12} {r.dtype:<8} {r.generate_s:>10.2f} {r.vs_float64:>6.2f}x "
            f"{r.spec_differs:>5} of {r.prompts:<3} {r.batch_differs:>8} {r.min_gap:>9.2e} "
            f"{r.gap_p01:>9.2e} {r.path_noise:>10.2e}"
        )
    lines.append(
        f"({tokens} tokens a prompt, EOS ignored; gaps and noise in logits, one run, interleaved)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved timing rounds (best kept)"
    )
    parser.add_argument(
        "--prompts", type=int, default=8, help="prompts per corpus (and in the timed batch)"
    )
    parser.add_argument(
        "--tokens", type=int, default=64, help="max_new_tokens per prompt, EOS ignored"
    )
    parser.add_argument(
        "--models", default="tiny:dense,tiny:hybrid", help="comma-separated tiny models"
    )
    parser.add_argument(
        "--divergences",
        type=int,
        metavar="N",
        default=0,
        help="instead of the table: spec != base over N prompts of every corpus in --dtype",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="the dtype --divergences runs in"
    )
    args = parser.parse_args(argv)
    if args.divergences:
        print(
            "\n".join(
                count_divergences(args.models.split(","), args.dtype, args.divergences, args.tokens)
            )
        )
        return 0
    print(
        format_rows(
            measure_rows(args.models.split(","), args.prompts, args.tokens, args.rounds),
            args.tokens,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
