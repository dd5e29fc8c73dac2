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


def _collect_once(folder: Path, *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "--rootdir", str(folder), *args, str(folder)],
                          capture_output=True, text=True, cwd=folder)
    elapsed = time.perf_counter() - started
    return elapsed, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr


def collection_overhead(runs: int = 9) -> None:
    """Best of ``runs`` for each variant, the runs interleaved (A B A B ...) so that load on
    this shared machine hits both alike."""
    with tempfile.TemporaryDirectory() as tmp:
        plugin_dir, plain_dir = Path(tmp, "plugin"), Path(tmp, "plain")
        plugin_dir.mkdir()
        plain_dir.mkdir()
        (plugin_dir / "test_suite.py").write_text(PLUGIN_SUITE)
        (plain_dir / "test_suite.py").write_text(PLAIN_SUITE)
        best = {"plugin": float("inf"), "plain": float("inf")}
        what = {}
        for _ in range(runs):
            for name, folder, args in (("plugin", plugin_dir, ()),
                                       ("plain", plain_dir, ("-p", "no:specenergy"))):
                elapsed, out = _collect_once(folder, *args)
                best[name] = min(best[name], elapsed)
                what[name] = out
    print(f"collection of a 500-case suite (best of {runs}, interleaved, includes interpreter start):")
    print(f"  with the plugin (markers):        {best['plugin']:6.3f} s   [{what['plugin']}]")
    print(f"  without it (plain parametrize):   {best['plain']:6.3f} s   [{what['plain']}]")
    print(f"  ratio with/without:               {best['plugin'] / best['plain']:6.2f}x")


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
