"""What ran, per case: mean/min concurrency of each arm, accept length, saving, draft share.

Issue #10's table: ngram and draft_model at batches 1, 4 and 16 on the code and conversation
corpora, served by the reference server and priced by the modeled meter (every energy figure
here is ``modeled (h200, priced as ...)``, never measured). It drives the plugin's own
:class:`PairMeasurer`, so it measures exactly what a test case would.

Run it from the repository root (``--pool`` sets ``generation(prompts=N)``; omit it for the
plugin's default)::

    .venv/bin/python benchmarks/workload_table.py --pool 32

The same script runs unchanged on an older checkout (``PYTHONPATH=<checkout>``) for a
before/after comparison: on one without a pool default, omitting ``--pool`` gives that
checkout's own default (``max(batch, 4)`` prompts).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure.pairs import PairMeasurer

DRAFTERS = {
    "ngram": Drafter("ngram", num_draft_tokens=8),
    "draft": Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft"),
}


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pool", type=int, default=None, help="prompts per pool (default: the plugin's)"
    )
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--corpora", default="code,conversation")
    parser.add_argument("--drafters", default="ngram,draft")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    generation = Generation(max_new_tokens=args.max_new_tokens, prompts=args.pool)
    cases = [
        Case.of(
            engine="reference",
            model="tiny:dense",
            drafter=DRAFTERS[d],
            batch=int(b),
            corpus=load_corpus(c),
            generation=generation,
        )
        for c in args.corpora.split(",")
        for d in args.drafters.split(",")
        for b in args.batches.split(",")
    ]
    with tempfile.TemporaryDirectory() as logs:
        measurer = PairMeasurer(
            log_dir=Path(logs), startup_timeout=300, meter="auto", repeats=args.repeats, warmup=0
        )
        measurer.plan(cases)
        print(
            "case | pool | base mean/min | spec mean/min | accept len | saving | draft share | "
            "source | s"
        )
        try:
            for case in cases:
                t0 = time.time()
                pair = measurer.measure(case)
                base, spec = pair.baseline.concurrency, pair.speculative.concurrency
                details = pair.speculative.samples[0].window.get("full", {}).get("details", {})
                print(
                    " | ".join(
                        [
                            case.id,
                            str(base.get("pool", "?")),
                            f"{_fmt(base.get('mean_running'), '.1f')}/{base.get('min_running', '?')}",
                            f"{_fmt(spec.get('mean_running'), '.1f')}/{spec.get('min_running', '?')}",
                            _fmt(pair.accept_length, ".2f"),
                            _fmt(pair.energy_saving, "+.1%"),
                            _fmt(details.get("draft_share"), ".1%"),
                            pair.speculative.source,
                            f"{time.time() - t0:.0f}",
                        ]
                    ),
                    flush=True,
                )
        finally:
            measurer.close()


if __name__ == "__main__":
    main()
