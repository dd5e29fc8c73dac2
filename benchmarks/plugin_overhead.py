"""Prints the plugin's own overheads, side by side, in one run.

1. Collection of a 500-case suite (issue 24, Deliver 8): ``pytest --collect-only -q`` of 500
   cases declared by the plugin's markers (model, corpus x drafter x batch = 5 x 10 x 10) with
   the plugin, vs. the same 500 ids written as plain ``pytest.mark.parametrize`` with the plugin
   disabled (``-p no:specenergy``). The runs alternate (A B A B ..., ``--rounds`` rounds) so load
   on this shared machine hits both alike; it prints every round, each variant's median and the
   median of the per-round ratios (the figure the issue's target, <= 1.15x, is about). Whole
   process: interpreter start, pytest, plugin load, collection, exit; wall time and CPU time
   (user + system: what the process itself did, barely moved by other jobs on the machine).

   Measured twice: in this environment as it is (here ``PYTHONDONTWRITEBYTECODE=1``, so no
   module of the project has a ``.pyc`` and pytest re-rewrites and compiles every plugin module
   it imports, every run) and with a bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary
   folder, warmed by one run of each variant: what an ordinary install sees).
   With ``--instructions``, also each variant's instruction count under valgrind (cachegrind,
   ``PYTHONHASHSEED=0``): the same figure the same every time, whatever else the machine runs.
2. The quickstart suite: wall time, engine starts vs. distinct engine configs.

Usage: .venv/bin/python benchmarks/plugin_overhead.py [--skip-quickstart] [--rounds N]
       [--no-cache-variant] [--instructions]
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: 1 model x 5 corpora x 10 drafters x 10 batch points = 500 cases.
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

CASES = 500


def _collect_once(folder: Path, args: tuple[str, ...], env: dict[str, str]) -> tuple[float, float]:
    """One ``--collect-only`` process: its wall time and its CPU time (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(folder),
            *args,
            str(folder),
        ],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    last = (
        proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-500:]
    )
    if proc.returncode != 0 or f"{CASES} tests collected" not in last:
        raise SystemExit(f"collection failed (exit {proc.returncode}) in {folder}: {last}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _interleaved(
    dirs: dict[str, Path], env: dict[str, str], rounds: int
) -> dict[str, list[tuple[float, float]]]:
    """``rounds`` x (plugin, plain), alternating, each a (wall, cpu) pair."""
    variants = (("plugin", ()), ("plain", ("-p", "no:specenergy")))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in variants}
    for _ in range(rounds):
        for name, args in variants:
            times[name].append(_collect_once(dirs[name], args, env))
    return times


def _print_times(title: str, times: dict[str, list[tuple[float, float]]]) -> None:
    plugin, plain = times["plugin"], times["plain"]
    print(title)
    print("  round   with the plugin (markers)     without it (plain parametrize)   ratio")
    print("          wall ms    cpu ms              wall ms    cpu ms               wall   cpu")
    for i, ((aw, ac), (bw, bc)) in enumerate(zip(plugin, plain), 1):
        print(
            f"  {i:5d}   {aw * 1000:7.0f}   {ac * 1000:7.0f}              {bw * 1000:7.0f}   "
            f"{bc * 1000:7.0f}               {aw / bw:4.2f}x {ac / bc:4.2f}x"
        )
    for k, what in ((0, "wall"), (1, "cpu")):
        a, b = [t[k] for t in plugin], [t[k] for t in plain]
        ratios = [x / y for x, y in zip(a, b)]
        print(
            f"  {what:4s} median {statistics.median(a) * 1000:6.0f} ms with, "
            f"{statistics.median(b) * 1000:6.0f} ms without: ratio "
            f"{statistics.median(ratios):4.2f}x (median of the per-round ratios; best of each "
            f"{min(a) * 1000:.0f} vs {min(b) * 1000:.0f} ms, {min(a) / min(b):4.2f}x)"
        )


def _instructions(folder: Path, args: tuple[str, ...], env: dict[str, str]) -> int:
    """Instructions one ``--collect-only`` process executes (valgrind's cachegrind)."""
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(folder),
            *args,
            str(folder),
        ],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**env, "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or not found or f"{CASES} tests collected" not in proc.stdout:
        raise SystemExit(
            f"valgrind collection failed (exit {proc.returncode}): {proc.stderr[-500:]}"
        )
    return int(found.group(1).replace(",", ""))


def _print_instructions(title: str, dirs: dict[str, Path], env: dict[str, str]) -> None:
    plugin = _instructions(dirs["plugin"], (), env)
    plain = _instructions(dirs["plain"], ("-p", "no:specenergy"), env)
    print(
        f"  {title}: {plugin / 1e6:7.0f} M instructions with, {plain / 1e6:7.0f} M without: "
        f"ratio {plugin / plain:4.2f}x"
    )


def collection_overhead(
    rounds: int = 15, cache_variant: bool = True, instructions: bool = False
) -> None:
    """The issue's figure: 500 marker cases with the plugin vs. 500 plain parametrize cases
    without it, interleaved, median of the per-round ratios."""
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {"plugin": Path(tmp, "plugin"), "plain": Path(tmp, "plain")}
        for name, text in (("plugin", PLUGIN_SUITE), ("plain", PLAIN_SUITE)):
            dirs[name].mkdir()
            (dirs[name] / "test_suite.py").write_text(text)
        env = dict(os.environ)
        bytecode = "off (PYTHONDONTWRITEBYTECODE)" if env.get("PYTHONDONTWRITEBYTECODE") else "on"
        print(
            f"collection of {CASES} cases, `pytest --collect-only -q`, {rounds} interleaved "
            f"rounds, whole process (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load "
            f"{os.getloadavg()[0]:.2f})"
        )
        _print_times(
            f"this environment (bytecode writing {bytecode}):", _interleaved(dirs, env, rounds)
        )
        if cache_variant:
            cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
            cached["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pycache"))
            _interleaved(dirs, cached, 1)  # warm the cache
            _print_times(
                "with a bytecode cache (PYTHONPYCACHEPREFIX, warmed):",
                _interleaved(dirs, cached, rounds),
            )
        if instructions:
            print("instruction counts (valgrind cachegrind, PYTHONHASHSEED=0, one run each):")
            _print_instructions(f"this environment (bytecode writing {bytecode})", dirs, env)
            if cache_variant:
                _print_instructions("with the bytecode cache", dirs, cached)


def quickstart() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "quickstart.json")
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "example_suites/quickstart",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--specenergy-json={report}",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
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


def _int_arg(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


if __name__ == "__main__":
    collection_overhead(
        _int_arg("--rounds", 15),
        cache_variant="--no-cache-variant" not in sys.argv,
        instructions="--instructions" in sys.argv,
    )
    if "--skip-quickstart" not in sys.argv:
        quickstart()
