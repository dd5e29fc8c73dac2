"""A two-drafter suite's verdicts (issue 40 item 1): ngram and a draft model on one baseline
(tiny:dense, batch 1, 3 prompts x 12 tokens, the modeled meter), stored as ``main``, then judged
on an identical rerun and on a rerun where the second drafter proposes 8 draft tokens instead of 5
(+17.3% J/token, the draft model's prefill charged): against the stored run in one process and
under ``-n 2``, and in-job (each drafter against itself as the reference drafter, in the same
cycles). Per mode and drafter: the energy_ratio verdict, the change and how it was judged (paired
or the unpaired allowance).

Run it with the checkout to measure on ``PYTHONPATH`` (``PYTHONPATH=/path/to/other/checkout``
gives another version's verdicts: the before and after of the closing note)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

SUITE = """
import os

import pytest

from pytest_specenergy import Drafter

SECOND = int(os.environ.get("SPECENERGY_TEST_SECOND_K", "5"))

pytestmark = [
    pytest.mark.model("tiny:dense"),
    pytest.mark.corpus("code"),
    pytest.mark.generation(max_new_tokens=12, prompts=3),
]


@pytest.mark.drafter(
    Drafter("ngram", num_draft_tokens=4, id="ngram"),
    Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=SECOND, id="draft"),
)
@pytest.mark.batch(1)
def test_two_drafters(spec_pair):
    spec_pair.measure()
"""

#: In-job: each drafter against main's version of itself (the second's main proposes 5 tokens).
IN_JOB_SUITE = SUITE.replace(
    """@pytest.mark.drafter(
    Drafter("ngram", num_draft_tokens=4, id="ngram"),
    Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=SECOND, id="draft"),
)
@pytest.mark.batch(1)
def test_two_drafters(spec_pair):
    spec_pair.measure()""",
    """@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=4, id="ngram"))
@pytest.mark.reference_drafter(Drafter("ngram", num_draft_tokens=4, id="ngram-main"))
@pytest.mark.batch(1)
def test_first(spec_pair):
    spec_pair.measure()


@pytest.mark.drafter(
    Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=SECOND, id="draft")
)
@pytest.mark.reference_drafter(
    Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=5, id="draft-main")
)
@pytest.mark.batch(1)
def test_second(spec_pair):
    spec_pair.measure()""",
)
OPTIONS = ["--specenergy-repeats=3", "--specenergy-warmup=0", "-p", "no:cacheprovider", "-q"]


def run(folder: Path, name: str, *args: str, second: int = 5) -> list[str]:
    """One pytest session; per case a line: verdict, change, how judged."""
    out = folder / f"{name}.json"
    env = {**os.environ, "SPECENERGY_TEST_SECOND_K": str(second)}
    subprocess.run(
        [sys.executable, "-m", "pytest", *OPTIONS, *args, f"--specenergy-json={out}"],
        cwd=folder,
        env=env,
        check=False,
        capture_output=True,
    )
    lines = []
    for record in json.loads(out.read_text())["results"]:
        comparison = record.get("comparison") or {}
        [row] = [r for r in comparison.get("rows", []) if r["metric"] == "energy_ratio"] or [{}]
        how = "unpaired" if "unpaired" in (row.get("method") or "") else "paired"
        allowance = "allowance" in (row.get("note") or "")
        change = row.get("estimate")
        lines.append(
            f"{name:<28} {record['case_id']:<22} {row.get('verdict', '-'):<13} "
            f"{'-' if change is None else f'{change:+.2%}':>8} {how}"
            f"{' (block-drift allowance)' if allowance else ''}, n={row.get('n_current')}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run every mode; print the table (``--output``: write it, headed by the command)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    lines = [f"{'mode':<28} {'case':<22} {'verdict':<13} {'change':>8} judged"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_suite.py").write_text(SUITE)
        run(folder, "save", "--specenergy-save=main")
        compare = "--specenergy-compare=main"
        lines += run(folder, "stored, identical", compare)
        lines += run(folder, "stored, draft +11%", compare, second=8)
        lines += run(folder, "stored -n 2, identical", compare, "-n", "2")
        lines += run(folder, "stored -n 2, draft +11%", compare, "-n", "2", second=8)
        (folder / "test_suite.py").write_text(IN_JOB_SUITE)
        lines += run(folder, "in-job, draft +11%", second=8)
    report = "\n".join(lines)
    if args.output is None:
        print(report)
    else:
        source = os.environ.get("PYTHONPATH", "this checkout")
        args.output.write_text(
            f"# python benchmarks/paired_drafters.py --output {args.output}  (package: {source}; "
            "modeled meter, tiny models, CPU)\n" + report + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
