"""Two costs every reference engine pays, each timed against the way it was paid before, interleaved
in one run: building a tiny model (with the modules' random initialisers, which ``seed_weights``
overwrites, against without them) and prefilling one long prompt into a fresh cache (with the
explicit causal mask the engine builds for every other step, against none: SDPA's causal path). Each
pair must give the same tensors bit for bit; the table says whether it did.

Usage: .venv/bin/python benchmarks/engine_setup.py [--models tiny:dense,...] [--tokens 2400]
[--rounds 5]

Prints, per model, the best of ``--rounds`` for each way and the ratio (new / old). A CPU figure of
this machine, one thread: the test suite starts about 150 engines and prefills the long-document
corpus's 2.3-2.5k-token prompts in several end-to-end suites.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("tiny:dense", "tiny:dense-draft", "tiny:moe", "tiny:hybrid")


@dataclass(frozen=True)
class Pair:
    """One cost, the old way and the new, best of the rounds (seconds), and whether they agree."""

    model: str
    what: str
    old_s: float
    new_s: float
    identical: bool


def _tensors(model) -> dict:
    return {
        **dict(model.named_parameters()),
        **{f"buffer {k}": v for k, v in model.named_buffers()},
    }


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a
    )


def measure(models: list[str], tokens: int, rounds: int) -> list[Pair]:
    """Both costs for each model, the two ways alternating round by round."""
    import torch
    import transformers

    from pytest_specenergy.refserver import tiny_models
    from pytest_specenergy.refserver.kv import BatchKV
    from pytest_specenergy.refserver.models import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    new_construct = tiny_models._construct

    def old_construct(cls_name, config):  # the build as it was: the initialisers run
        return getattr(transformers, cls_name)(config)

    pairs = []
    try:
        for name in models:
            best = {"old": float("inf"), "new": float("inf")}
            built = {}
            for _ in range(rounds):
                for way, construct in (("old", old_construct), ("new", new_construct)):
                    tiny_models._construct = construct
                    t0 = time.perf_counter()
                    built[way] = tiny_models.build_tiny_model(name)
                    best[way] = min(best[way], time.perf_counter() - t0)
            tiny_models._construct = new_construct
            pairs.append(
                Pair(name, "build", best["old"], best["new"], _same(*map(_tensors, built.values())))
            )

            if name.endswith("-draft"):
                continue  # a draft prefills like its target
            loaded = load_model(name)
            kv = BatchKV(loaded.model, 1)
            mask, positions = kv.step_inputs(torch.ones((1, tokens), dtype=torch.bool))
            dtype = next(loaded.model.parameters()).dtype
            causal = torch.zeros((1, 1, tokens, tokens), dtype=dtype)
            causal.masked_fill_(
                ~torch.ones((tokens, tokens), dtype=torch.bool).tril(), torch.finfo(dtype).min
            )
            masks = {
                "old": {"full_attention": causal, "linear_attention": None}
                if kv.has_linear
                else causal,
                "new": mask,
            }
            ids = torch.randint(3, 250, (1, tokens), generator=torch.Generator().manual_seed(0))
            decoder = loaded.model.get_decoder()
            best = {"old": float("inf"), "new": float("inf")}
            hidden = {}
            with torch.inference_mode():
                for _ in range(rounds):
                    for way in ("old", "new"):
                        t0 = time.perf_counter()
                        hidden[way] = decoder(
                            input_ids=ids, position_ids=positions, attention_mask=masks[way]
                        ).last_hidden_state
                        best[way] = min(best[way], time.perf_counter() - t0)
            pairs.append(
                Pair(
                    name,
                    f"prefill {tokens}",
                    best["old"],
                    best["new"],
                    bool(torch.equal(hidden["old"], hidden["new"])),
                )
            )
    finally:
        tiny_models._construct = new_construct
        torch.set_num_threads(threads)
    return pairs


def format_pairs(pairs: list[Pair]) -> str:
    """The table: one row per model and cost."""
    lines = [
        f"{'model':18} {'cost':14} {'before s':>9} {'now s':>9} {'now/before':>10}  same tensors"
    ]
    for p in pairs:
        lines.append(
            f"{p.model:18} {p.what:14} {p.old_s:9.3f} {p.new_s:9.3f} {p.new_s / p.old_s:10.2f}  "
            f"{'yes' if p.identical else 'NO'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated tiny models")
    parser.add_argument("--tokens", type=int, default=2400, help="prompt length of the prefill")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds; the best of each way is kept"
    )
    args = parser.parse_args(argv)
    pairs = measure(args.models.split(","), args.tokens, args.rounds)
    print(format_pairs(pairs))
    return 0 if all(p.identical for p in pairs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
