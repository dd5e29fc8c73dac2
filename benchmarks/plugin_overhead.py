"""Prints the plugin's own overheads, side by side, in one run.

1. Collection of a 500-case suite: markers expanded by the plugin vs. the same 500 ids
   written as plain ``pytest.mark.parametrize`` with the plugin disabled (ratio).
2. The quickstart suite: wall time, engine starts vs. distinct engine configs.

Usage: .venv/bin/python benchmarks/plugin_overhead.py [--skip-quickstart]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLUGIN_SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [pytest.mark.model("tiny:dense"),
              pytest.mark.corpus("code", "conversation", "news", "rm-news", "long-document")]

@pytest.mark.drafter(*[Drafter("ngram", num_draft_tokens=k) for k in range(1, 11)])
@pytest.mark.batch(*range(1, 11))
def test_case(spec_pair):
    pass
"""

PLAIN_SUITE = """
import pytest

IDS = [f"{c}-ngram-k{k}-b{b}" for c in ("code", "conversation", "news", "rm-news", "long-document")
       for k in range(1, 11) for b in range(1, 11)]

@pytest.fixture
def spec_pair():
    return None

@pytest.mark.parametrize("case", IDS, ids=IDS)
def test_case(case, spec_pair):
    pass
"""


def _collect(folder: Path, *args: str, runs: int = 5) -> tuple[float, str]:
    best = float("inf")
    out = ""
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                               "-p", "no:cacheprovider", "--rootdir", str(folder), *args, str(folder)],
                              capture_output=True, text=True, cwd=folder)
        best = min(best, time.perf_counter() - started)
        out = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    return best, out


def collection_overhead() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plugin_dir, plain_dir = Path(tmp, "plugin"), Path(tmp, "plain")
        plugin_dir.mkdir()
        plain_dir.mkdir()
        (plugin_dir / "test_suite.py").write_text(PLUGIN_SUITE)
        (plain_dir / "test_suite.py").write_text(PLAIN_SUITE)
        with_plugin, what_a = _collect(plugin_dir)
        without, what_b = _collect(plain_dir, "-p", "no:specenergy")
    print("collection of a 500-case suite (best of 5, includes interpreter start):")
    print(f"  with the plugin (markers):        {with_plugin:6.3f} s   [{what_a}]")
    print(f"  without it (plain parametrize):   {without:6.3f} s   [{what_b}]")
    print(f"  ratio with/without:               {with_plugin / without:6.2f}x")


def quickstart() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "quickstart.json")
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "example_suites/quickstart", "-q",
                               "-p", "no:cacheprovider", f"--specenergy-json={report}"],
                              capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - started
        print("quickstart suite:")
        print(f"  wall time:                        {wall:6.1f} s   (exit code {proc.returncode})")
        if not report.exists():
            print(proc.stdout[-3000:])
            return
        data = json.loads(report.read_text())
        configs = set()
        for result in data["results"]:
            for arm in ("baseline", "speculative"):
                configs.add(json.dumps(result[arm]["engine"]["config"], sort_keys=True))
        print(f"  pairs measured:                   {len(data['results'])}")
        print(f"  engine starts / distinct configs: {data['engine_starts']} / {len(configs)}")


if __name__ == "__main__":
    collection_overhead()
    if "--skip-quickstart" not in sys.argv:
        quickstart()
