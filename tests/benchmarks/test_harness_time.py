"""benchmarks/harness_time.py runs a real suite and splits its wall time (issue 24 item 2).

It wraps the measurer's own methods, so a change of their signatures breaks it; this runs it
on a one-case suite against the reference server and reads its printed split."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code"),
              pytest.mark.generation(max_new_tokens=12, prompts=3)]


@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=4))
@pytest.mark.batch(1)  # no concurrency check to trip on a loaded machine: the harness is under test
def test_one_case(spec_pair):
    spec_pair.measure().assert_equivalent()
"""


def test_harness_time_splits_a_real_suite_into_its_buckets(tmp_path: Path) -> None:
    suite = tmp_path / "test_tiny_suite.py"
    suite.write_text(SUITE)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "harness_time.py"),
            str(suite),
            "--specenergy-repeats=1",
            f"--specenergy-log-dir={tmp_path / 'logs'}",
            f"--rootdir={tmp_path}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "1 passed" in out, out[-4000:]
    seconds = {
        name: float(value)
        for name, value in re.findall(
            r"^  (engine starts|full windows \(metered\)|prefill twins \(metered\))\s+([\d.]+) s",
            out,
            re.MULTILINE,
        )
    }
    assert set(seconds) == {"engine starts", "full windows (metered)", "prefill twins (metered)"}, (
        out[-3000:]
    )
    # The modeled meter prices the prefill from the full window's own steps: no twin runs.
    assert seconds["engine starts"] > 0 and seconds["full windows (metered)"] > 0, seconds
    assert seconds["prefill twins (metered)"] == 0, seconds
    assert re.search(r"share of wall time inside measured windows: [\d.]+%", out), out[-3000:]
