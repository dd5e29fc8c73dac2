"""Two drafters on one baseline, end to end on the reference server (issue 40 item 1): both are
measured in the baseline's interleaved cycles, so each gets a paired verdict - an identical rerun
ends unchanged for both within the default repeats, and a real regression of the second drafter
(it proposes 8 draft tokens instead of 5: +17.3% J/token over the baseline at this size, with
the draft model's prefill charged to the speculative arm, its accept length not worse: 2.06
against 1.94) is REGRESSED - with and without ``-n 2``.

Old: the second drafter shared the first one's baseline unpaired, with a 6.1% block-drift
allowance against a stored run: no number of repeats could make it unchanged at the default 5%
limit (INCONCLUSIVE after 11 repeats), and under ``-n 2`` its verdict depended on the worker.

Cost: five pytester runs of 2 cases (3 engines, 3 repeats, 3 prompts x 12 tokens at batch 1),
the two ``-n 2`` runs as subprocesses in which each worker measures the group's cycles: 105 s on
2 cores shared with other jobs (load 10), 2026-12-06.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_specenergy.gate.verdict import Verdict

# The suite is benchmarks/paired_drafters.py's, which prints the same verdicts as a table.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from paired_drafters import SUITE  # noqa: E402

OPTIONS = ["--specenergy-repeats=3", "--specenergy-warmup=0", "-p", "no:cacheprovider"]


def _verdicts(path) -> dict[str, tuple[str, dict]]:
    """Per case id: the energy_ratio row's verdict, and the record's order."""
    verdicts = {}
    for record in json.loads(path.read_text())["results"]:
        [row] = [r for r in record["comparison"]["rows"] if r["metric"] == "energy_ratio"]
        verdicts[record["case_id"]] = (row["verdict"], row, record["order"])
    return verdicts


def _judged(run, *args: str, out) -> dict[str, tuple[str, dict, dict]]:
    """Run the suite against the stored ``main`` and read the verdicts it wrote to ``out``."""
    run(*args, *OPTIONS, "--specenergy-compare=main", f"--specenergy-json={out}")
    return _verdicts(out)


def test_each_drafter_is_paired_unchanged_on_a_rerun_and_a_regression_is_regressed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    pytester.makepyfile(SUITE)
    monkeypatch.delenv("SPECENERGY_TEST_SECOND_K", raising=False)
    pytester.runpytest(*OPTIONS, "--specenergy-save=main").assert_outcomes(passed=2)
    for workers in ([], ["-n", "2"]):
        run = pytester.runpytest_subprocess if workers else pytester.runpytest
        monkeypatch.delenv("SPECENERGY_TEST_SECOND_K", raising=False)
        verdicts = _judged(run, *workers, out=pytester.path / f"again{len(workers)}.json")
        assert {case: v[0] for case, v in verdicts.items()} == {
            "code-ngram-b1": Verdict.UNCHANGED.value,
            "code-draft-b1": Verdict.UNCHANGED.value,
        }, (workers, verdicts)
        for _, row, order in verdicts.values():
            assert "unpaired" not in (row["method"] or "") and not order.get("baseline_from"), row
            assert row["n_current"] == 3  # the first look decided: within the default repeats
            assert len(order["cycled_with"]) == 1 and order["order"].count("baseline") == 3

        monkeypatch.setenv("SPECENERGY_TEST_SECOND_K", "8")  # the second drafter regresses
        verdicts = _judged(run, *workers, out=pytester.path / f"worse{len(workers)}.json")
        assert verdicts["code-ngram-b1"][0] == Verdict.UNCHANGED.value, (workers, verdicts)
        verdict, row, _ = verdicts["code-draft-b1"]
        assert verdict == Verdict.REGRESSED.value and 0.15 < row["estimate"] < 0.20, row
