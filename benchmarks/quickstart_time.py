"""The quickstart's wall time with the modeled prefill priced from the full window's own steps
(the plugin's path) vs. with the prefill-only twin run as well (the path before), interleaved.

Each round runs the README's quickstart command twice, in alternating order of the variants, so
the load of this shared machine falls on both alike; it prints every round, each variant's
median and the median of the per-round ratios. The twin variant is the same plugin with
``ArmMeasurer._prefill_window`` pointed back at ``_prefill_twin`` by a ``-p`` plugin written to
a temporary folder: nothing else differs.

Usage: .venv/bin/python benchmarks/quickstart_time.py [--rounds N]   (default 2; each round ~3 min)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Every arm runs its prefill-only twin instead of pricing it (the flag window_bias.py sets on its
# measurer).
FORCE_TWIN = """
from pytest_specenergy.measure import pairs
_init = pairs.PairMeasurer.__init__
def __init__(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.run_twin = True
pairs.PairMeasurer.__init__ = __init__
"""


def _run(extra: list[str], env: dict[str, str]) -> tuple[float, str]:
    began = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "example_suites/quickstart",
            "-q",
            "-p",
            "no:cacheprovider",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    wall = time.perf_counter() - began
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    if proc.returncode != 0:
        raise SystemExit(f"the quickstart failed (exit {proc.returncode}): {proc.stdout[-3000:]}")
    return wall, last


def main(rounds: int) -> None:
    import os

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "force_twin.py").write_text(FORCE_TWIN)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")])),
        }
        variants = {"priced": [], "twin": ["-p", "force_twin"]}
        walls: dict[str, list[float]] = {name: [] for name in variants}
        print(
            f"quickstart wall time, {rounds} interleaved rounds (python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f})"
        )
        for r in range(rounds):
            order = list(variants) if r % 2 else list(reversed(variants))
            for name in order:
                wall, last = _run(variants[name], env)
                walls[name].append(wall)
                print(f"  round {r + 1}  {name:6}  {wall:6.1f} s   {last}", flush=True)
        ratios = [p / t for p, t in zip(walls["priced"], walls["twin"])]
        medians = {name: statistics.median(w) for name, w in walls.items()}
        print(
            f"  median: priced {medians['priced']:.1f} s, twin {medians['twin']:.1f} s; "
            f"priced/twin per round: {', '.join(f'{x:.2f}' for x in ratios)} (median "
            f"{statistics.median(ratios):.2f})"
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[args.index("--rounds") + 1]) if "--rounds" in args else 2)
