"""Divergence and log-probability figures, healthy vs faulted, on each tiny target.

Runs one generated suite (dense, moe, hybrid x ngram and draft_model, batch 4, code corpus)
through the plugin twice - healthy, then with a reference-server fault - and prints, per
target and drafter, what the checks see: exact-match fraction, the earliest divergence, the
mean log-probability gap of the speculative text under the target, accept length, and the
checks that tripped.

Usage: .venv/bin/python benchmarks/fault_figures.py [--fault skip-state-rollback]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [pytest.mark.corpus("code"), pytest.mark.batch(4), pytest.mark.generation(max_new_tokens=48)]


def drafters(target):
    return pytest.mark.drafter(Drafter("ngram", num_draft_tokens=8, id="ngram"),
                               Drafter("draft_model", draft_model=f"{target}-draft", id="draft"))


@pytest.mark.model("tiny:dense")
@drafters("tiny:dense")
def test_dense(spec_pair):
    spec_pair.measure()


@pytest.mark.model("tiny:moe")
@drafters("tiny:moe")
def test_moe(spec_pair):
    spec_pair.measure()


@pytest.mark.model("tiny:hybrid")
@drafters("tiny:hybrid")
def test_hybrid(spec_pair):
    spec_pair.measure()
"""


def run(folder: Path, fault: str | None) -> list[dict]:
    out = folder / f"{fault or 'healthy'}.json"
    args = [
        sys.executable,
        "-m",
        "pytest",
        str(folder),
        "-q",
        "-p",
        "no:cacheprovider",
        "--specenergy-repeats=1",
        "--specenergy-warmup=0",
        "--specenergy-checks=warn",
        f"--specenergy-json={out}",
        "--rootdir",
        str(folder),
    ]
    if fault:
        args.append(f"--specenergy-fault={fault}")
    proc = subprocess.run(args, capture_output=True, text=True, cwd=folder)
    if not out.exists():
        raise SystemExit(f"the suite did not run:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return json.loads(out.read_text())["results"]


def rows(results: list[dict], label: str) -> list[tuple]:
    table = []
    for r in results:
        eq, coherence = r["equivalence"], r["coherence"] or {}
        divergences = [d for d in eq["first_divergence"] if d is not None]
        table.append(
            (
                r["case"]["model"],
                r["case"]["drafter"]["id"],
                label,
                f"{eq['exact_fraction']:.0%}",
                min(divergences) if divergences else "-",
                f"{coherence.get('mean_gap', 0.0):.3f}",
                f"{r['accept_length']:.2f}",
                ", ".join(c["name"] for c in r["checks"] if c["severity"] == "fail") or "-",
            )
        )
    return table


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fault", default="skip-state-rollback")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_targets.py").write_text(SUITE)
        table = rows(run(folder, None), "healthy") + rows(run(folder, args.fault), args.fault)
    table.sort(key=lambda row: (row[0], row[1], row[2] != "healthy"))
    print(
        tabulate(
            table,
            headers=(
                "target",
                "drafter",
                "run",
                "exact",
                "first divergence",
                "logprob gap (nats/token)",
                "accept len",
                "failed checks",
            ),
            disable_numparse=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
