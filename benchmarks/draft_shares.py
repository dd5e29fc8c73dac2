"""Where decode energy goes, per drafter, at batch 1 and 64 (issue 14 item 3; paper s.8).

For each drafter the plugin's own pair measurer runs the baseline, the speculative arm and the
verify-only replay of the speculative arm's recorded drafts (draft removal: the same verify
steps over the same contexts, no draft passes), in one interleaved repeat cycle, on the
reference server with the modeled meter. It prints the draft share found by removal
(``1 - replay J/token / speculative J/token``) next to the share the meter priced for the draft
passes in the speculative arm's own trace (the two must agree: the replay leaves out exactly
the draft passes), with the accept length and the saving.

The paper: verification, not drafting, dominates on dense models; a block drafter takes at
most 23% of decode energy and no drafter more than 45%.

Usage (CPU, the built-in tiny models; several minutes on 2 cores)::

    PYTHONPATH=. .venv/bin/python benchmarks/draft_shares.py [--meter modeled:h200] [--batches 1 64]
"""

from __future__ import annotations

import argparse
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

DRAFTERS = (
    Drafter("ngram", num_draft_tokens=4, id="ngram-k4"),
    Drafter(
        "draft_model",
        draft_model="tiny:dense-draft",
        num_draft_tokens=4,
        accept_p=0.8,
        id="chain-k4",
    ),
    Drafter("block", draft_model="tiny:dense-draft", block_size=7, accept_p=0.8, id="block7"),
    Drafter("block", draft_model="tiny:dense-draft", block_size=16, accept_p=0.8, id="block16"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--meter", default="modeled:h200", help="modeled:<gpu>[:shape] (default modeled:h200)"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--pool", type=int, default=96, help="prompts per pool (default 96)")
    parser.add_argument("--corpus", default="code")
    args = parser.parse_args(argv)

    corpus = load_corpus(args.corpus)
    pool = EnginePool(Path(tempfile.mkdtemp(prefix="specenergy-shares-")), startup_timeout_s=300)
    measurer = PairMeasurer(
        log_dir=pool.log_dir,
        startup_timeout=300,
        meter=args.meter,
        repeats=1,
        warmup=0,
        pool=pool,
        draft_removal="on",
    )
    # The reference server admits 32 rows per step unless told: batch 64 needs the cap raised.
    cases = [
        Case.of(
            engine="reference",
            model="tiny:dense",
            drafter=d,
            batch=b,
            corpus=corpus,
            generation=Generation(
                max_new_tokens=args.max_new_tokens, prompts=args.pool, ignore_eos=True
            ),
            max_running_requests=max(args.batches),
        )
        for b in args.batches
        for d in DRAFTERS
    ]
    measurer.plan(cases)
    started, rows = time.monotonic(), []
    try:
        for case in cases:
            pair = measurer.measure(case)
            rows.append(
                (
                    case.batch,
                    case.drafter.id,
                    _f(pair.accept_length, ".2f"),
                    _f(pair.energy_saving, "+.1%"),
                    _f(pair.draft_share, ".1%"),
                    _f(pair.draft_share_priced, ".1%"),
                    ", ".join(c.name for c in pair.failed_checks) or "-",
                    pair.source,
                )
            )
            print(f"{case.id}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    finally:
        measurer.close()
    print(
        tabulate(
            rows,
            headers=(
                "batch",
                "drafter",
                "accept len",
                "saving",
                "draft share (removal)",
                "draft share (priced)",
                "failed checks",
                "source",
            ),
            disable_numparse=True,
        )
    )
    print(f"total wall time {time.monotonic() - started:.0f} s")
    return 0


def _f(value, spec):
    return "n/a" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
