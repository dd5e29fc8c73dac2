"""Tests of benchmarks/fault_matrix.py: a probe's verdict follows its expectation (cheap CLI probes
only)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fault_matrix as matrix  # noqa: E402  (a benchmark script, not a package)


def _probe(id: str) -> matrix.Probe:
    return next(p for p in matrix.PROBES if p.id == id)


def test_probe_ids_are_unique_and_skips_have_reasons() -> None:
    ids = [p.id for p in matrix.PROBES]
    assert len(ids) == len(set(ids))
    assert all(p.run is not None or p.skip for p in matrix.PROBES)


def test_a_met_expectation_passes(tmp_path: Path) -> None:
    verdict, observed, _ = matrix.run_probe(_probe("N11.predict-context/I23-15"), tmp_path)
    assert verdict == "PASS", observed
    assert observed.startswith("rc 2: ") and "--context" in observed


def test_a_wrong_expectation_is_reported_as_fail(tmp_path: Path) -> None:
    # The same probe, told to expect success: the refusal it observes must be a FAIL with the
    # reason.
    wrong = dataclasses.replace(
        _probe("N11.predict-context/I23-15"), rc=(0,), text=r"a table of predictions"
    )
    verdict, observed, _ = matrix.run_probe(wrong, tmp_path)
    assert verdict == "FAIL"
    assert "rc 2 not in (0,)" in observed and "expected text absent" in observed


def test_unexpected_text_fails_and_is_the_decisive_line(tmp_path: Path) -> None:
    wrong = dataclasses.replace(_probe("N11.predict-context/I23-15"), absent=r"is not an integer")
    verdict, observed, _ = matrix.run_probe(wrong, tmp_path)
    assert verdict == "FAIL"
    assert "unexpected: is not an integer" in observed


def test_skipped_probes_are_listed_with_the_reason(tmp_path: Path) -> None:
    verdict, observed, _ = matrix.run_probe(_probe("GPU.nvml-meter"), tmp_path)
    assert verdict == "SKIPPED" and "GPU" in observed


def test_only_selects_by_id_or_prefix() -> None:
    parsed = matrix.argparse.Namespace(only="R-4e,I23-13", quick=False)
    ids = [p.id for p in matrix.select(parsed)]
    assert "R-4e.repeats" in ids and "N8.pool-huge/I23-13" in ids and "I23-13.pool-5000" in ids
    assert "N22.lone-surrogate/I23-16" not in ids


def test_the_audit_3_zygote_signal_and_slot_probes_are_listed() -> None:
    """Issue 42 item 6: the probes of reliability-audit-3 on the zygote (T9-T15), SIGHUP (T44) and
    the server's connection slots (T27) are rows of the matrix, each with its expectation."""
    rows = {p.id.split(".")[0]: p for p in matrix.PROBES}
    for id in ("T9", "T10", "T11", "T12", "T13", "T14", "T15", "T27", "T44"):
        assert rows[id].run is not None and rows[id].expected and not rows[id].skip, id


def test_a_zygote_that_outlives_its_pytest_fails_its_row(tmp_path: Path) -> None:
    row = _probe("T15.zygote-exits-with-pytest")
    late = matrix.Obs(
        0, "1 passed\n[fault_matrix] the zygote was gone 7.3 s after its pytest exited"
    )
    ok, line = matrix.judge(row, late, tmp_path)
    assert not ok and "outlived its pytest" in line
    prompt = matrix.Obs(
        0, "1 passed\n[fault_matrix] the zygote was gone 0.2 s after its pytest exited"
    )
    assert matrix.judge(row, prompt, tmp_path)[0]


def test_every_audit_probe_has_a_row_and_is_counted() -> None:
    """Issue 42 item 6: every probe of reliability-audit-3, the 77 earlier and the 47 new, is
    answered by a row of the matrix (run here, or listed SKIPPED with the reason)."""
    answered = {name for p in matrix.PROBES for name in matrix.audit_ids(p.id)}
    assert len(matrix.OLD_IDS) == 77 and len(matrix.NEW_IDS) == 47
    assert [i for i in matrix.OLD_IDS + matrix.NEW_IDS if i not in answered] == []
    summary = matrix.audit_summary({"T30.cli-incomparable": "PASS", "N15.storage-full/T17": "FAIL"})
    assert summary[1].startswith("# audit probes, new 47: PASS 1, FAIL 1 ['T17']")
    assert "N15" in summary[0] and "not in this run" in summary[0]
