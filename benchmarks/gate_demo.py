"""The regression gate, end to end on CPU: the verdict tables of three runs, and the
false-positive rate of unchanged reruns under injected noise.

1. ``main``: ngram with 8 drafted tokens (``Drafter(id="ngram")``), saved as the baseline.
2. The same drafter again, compared with ``main``: expected unchanged.
3. The drafter changed to 1 drafted token under the same id: expected REGRESSED.
4. N unchanged reruns whose meter adds 2% multiplicative noise per window (the modeled meter
   wrapped through the ``pytest_specenergy_make_meter`` hook): the share that REGRESSED is
   the measured false-positive rate.

Usage: .venv/bin/python benchmarks/gate_demo.py [--noise-runs 10]
       .venv/bin/python benchmarks/gate_demo.py --write-results   (both results files, one command)
       .venv/bin/python benchmarks/gate_demo.py --simulate [--suites 50]   (figures of the
       sequential rule vs pytest-benchmark and asv; last output in results/gate_simulation.txt)

``--simulate``: simulated suites of 200 cases at 1, 3 and 5% per-repeat noise plus a 2-3%
session offset; false failures per suite and power at a true +10% within the repeat cap, for
our gate against a stored run (energy_ratio, Welch) and in-job A/B (paired), and on the same
samples pytest-benchmark's ``--benchmark-compare-fail=mean:5%`` and asv's rule (factor plus
Mann-Whitney p < 0.002). The figures are the wired gate's: the tables use the vectorized form
of the sequential rule, and the report's last section runs the same samples through the
plugin's own path (run records -> ``Gatekeeper.judge`` / ``compare_case``, repeats added per
``NeedsRepeats``) and counts the agreement (all of them, or the run says otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE = """
import os
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code", "conversation")
@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=int(os.environ.get("GATE_K", "8")), id="ngram"))
@pytest.mark.batch(1, 4)
@pytest.mark.generation(max_new_tokens=32)
def test_drafter(spec_pair):
    spec_pair.measure()
"""

CONFTEST = """
import os
import random
from dataclasses import replace

from pytest_specenergy.meters.modeled import ModeledMeter


class NoisyMeter(ModeledMeter):
    def __init__(self):
        super().__init__("h200")
        self.rng = random.Random(int(os.environ.get("NOISE_SEED", "0")))
        self.noise = float(os.environ.get("NOISE_SD", "0"))

    def stop(self, token):
        window = super().stop(token)
        factor = 1 + self.rng.gauss(0, self.noise)
        # The prefill part of the window (what the plugin subtracts) is read at the same power.
        prefill = replace(window.prefill_only, joules=window.prefill_only.joules * factor)
        return replace(window, joules=window.joules * factor, prefill_only=prefill)


def pytest_specenergy_make_meter(kind, engine):
    return NoisyMeter() if kind == "modeled:h200" else None
"""

# energy = energy_ratio, the session-robust default (speculative / baseline per repeat).
LIMITS = ["--specenergy-compare-fail=energy:5%", "--specenergy-compare-fail=accept_length:5%"]


def pytest_run(folder: Path, *args: str, **env: str) -> tuple[str, list[dict]]:
    out = folder / "run.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(folder),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(folder),
            f"--specenergy-json={out}",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**os.environ, **env},
    )
    section = proc.stdout[proc.stdout.find("= specenergy =") :]
    return section, json.loads(out.read_text())["results"] if out.exists() else []


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--noise-runs", type=int, default=10)
    parser.add_argument("--noise-sd", type=float, default=0.02)
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="instead: the sequential rule (pytest_specenergy.gate.sequential) against "
        "pytest-benchmark's and asv's rules on the same simulated 200-case suites",
    )
    parser.add_argument(
        "--suites", type=int, default=50, help="simulated suites per cell (--simulate)"
    )
    parser.add_argument(
        "--write-results",
        action="store_true",
        help="regenerate results/gate_demo.txt and results/gate_simulation.txt (both runs)",
    )
    args = parser.parse_args()
    if args.write_results:
        results = Path(__file__).resolve().parent / "results"
        for name, extra in (
            ("gate_demo.txt", ["--noise-runs", str(args.noise_runs)]),
            ("gate_simulation.txt", ["--simulate", "--suites", str(args.suites)]),
        ):
            command = [sys.executable, __file__, *extra]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            title = " ".join(["benchmarks/gate_demo.py", *extra])
            (results / name).write_text(
                f"# {title}   (written by gate_demo.py --write-results)\n{out}"
            )
        return 0
    if args.simulate:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import gate_simulation as simulate

        return simulate.main(["--suites", str(args.suites)])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_gate.py").write_text(SUITE)
        pytest_run(folder, "--specenergy-save=main", GATE_K="8")
        for title, k in (
            ("run 2: unchanged drafter (8 drafted tokens)", "8"),
            ("run 3: ngram with 1 drafted token under the same id", "1"),
        ):
            table, _ = pytest_run(folder, "--specenergy-compare=main", *LIMITS, GATE_K=k)
            print(f"\n### {title}\n{table}")
        (folder / "conftest.py").write_text(CONFTEST)
        pytest_run(
            folder, "--specenergy-save=noisy-main", NOISE_SD=str(args.noise_sd), NOISE_SEED="1"
        )
        regressed = total = 0
        last = ""
        for seed in range(args.noise_runs):
            last, results = pytest_run(
                folder,
                "--specenergy-compare=noisy-main",
                *LIMITS,
                NOISE_SD=str(args.noise_sd),
                NOISE_SEED=str(100 + seed),
            )
            total += len(results)
            regressed += sum(r.get("verdict") == "regressed" for r in results)
        print(
            f"\n### run 4: unchanged drafter, {args.noise_sd:.0%} noise per window "
            f"(last of {args.noise_runs})\n{last}"
        )
        print(
            f"false positives: {regressed} of {total} case comparisons REGRESSED "
            f"({regressed / total:.1%}) over {args.noise_runs} noisy unchanged reruns"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
