"""Why a modeled arm's J/token moves between identical repeats at batch > 1 and not at batch 1:
the quickstart's n-gram case (tiny:dense, 8 prompts x 40 tokens) at batch 1 and 4, two sessions of
3 repeats, each repeat's J/token, window tokens, coverage, accept length and mean rows per step
(from the run documents: every figure is the plugin's own). Prints a table; ``--output`` writes it
headed by the command (results/modeled_batch_noise.txt)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code"),
              pytest.mark.generation(max_new_tokens=40, prompts=8)]

@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=8))
@pytest.mark.batch(1, 4)
def test_noise(spec_pair):
    spec_pair.measure()
"""


def session(folder: Path, index: int) -> dict:
    """One pytest session of the suite; its run document."""
    out = folder / f"run{index}.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(folder / "test_noise.py"),
            "--specenergy-repeats=3",
            f"--specenergy-json={out}",
        ],
        check=True,
        capture_output=True,
    )
    return json.loads(out.read_text())


def rows(document: dict, index: int) -> list[str]:
    """One line per arm and repeat."""
    lines = []
    for record in document["results"]:
        batch = record["case"]["batch"]
        for arm in ("baseline", "speculative"):
            for i, sample in enumerate(record[arm]["samples"]):
                steps = sample["window"]["full"].get("concurrency") or {}
                accept = (
                    (sample["verify_steps"] + sample["correct_drafts"]) / sample["verify_steps"]
                    if sample.get("verify_steps")
                    else None
                )
                lines.append(
                    f"{index:>7} {batch:>5} {arm:<11} {i + 1:>6} "
                    f"{sample['energy_per_token']:>8.4f} {sample['decode_tokens']:>6} "
                    f"{sample['coverage']:>8.3f} {'-' if accept is None else f'{accept:.3f}':>6} "
                    f"{steps.get('mean_running', float('nan')):>9.2f}"
                )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run two sessions and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_noise.py").write_text(SUITE)
        documents = [session(folder, i) for i in (1, 2)]
    lines = [
        "modeled (h200, priced as Qwen3-8B), tiny:dense ngram k8, code, 8 prompts x 40 tokens; "
        "J/token, window tokens, coverage, accept length and mean rows per decode step per repeat",
        f"{'session':>7} {'batch':>5} {'arm':<11} {'repeat':>6} {'J/token':>8} {'tokens':>6} "
        f"{'coverage':>8} {'accept':>6} {'rows/step':>9}",
    ]
    for i, document in enumerate(documents, 1):
        lines += rows(document, i)
    report = "\n".join(lines)
    if args.output is None:
        print(report)
    else:
        args.output.write_text(
            f"# python benchmarks/modeled_batch_noise.py --output {args.output}\n{report}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
