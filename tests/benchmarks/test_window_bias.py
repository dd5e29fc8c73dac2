"""One row of benchmarks/window_bias.py held: the plugin's decode-only saving is the decode
steps' own saving, with no prefill left in either arm (issue 21)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import window_bias  # noqa: E402  (a benchmark script, not a package)


def test_ngram_b8_row_has_no_bias_and_no_prefill_residue(tmp_path: Path) -> None:
    # Before the twin replayed the window's prefill groups this row read -8.7 points of bias
    # and a 10.6% prefill residue in the speculative arm (b8, pool 32, 32 tokens).
    # No cap declared: the reference server is set to admit exactly the batch at run time.
    cases = window_bias.make_cases(["ngram"], [8], ["code"], pool=16, max_new_tokens=16)
    (row,) = window_bias.measure_rows(cases, log_dir=tmp_path)
    assert abs(row.bias) <= 0.5, window_bias.format_rows([row])
    for arm in (row.baseline, row.speculative):
        assert abs(arm.residue) <= 0.005, window_bias.format_rows([row])
        assert arm.coverage is not None and 0.5 < arm.coverage <= 1.0
        assert arm.concurrency is not None and arm.concurrency >= 0.9 * 8, window_bias.format_rows(
            [row]
        )
    # The row measures a real saving, not two empty windows (about 9-14% here; which prompts a
    # window holds depends on timing, so the floor is well below that).
    assert row.steps_saving > 0.03, window_bias.format_rows([row])


def test_a_modeled_window_prices_its_prefill_from_its_own_steps_as_the_twin_reads_it(
    tmp_path: Path,
) -> None:
    """Under the modeled meter the plugin runs no prefill-only twin: the full window's prefill
    steps are the forwards the twin would replay. At batch 1 (the same work every run) the
    decode joules from the priced prefill equal those from a twin that really ran."""
    from pytest_specenergy.engines.pool import EnginePool
    from pytest_specenergy.measure.pairs import PairMeasurer
    from pytest_specenergy.measure.window import PRICED

    (case,) = window_bias.make_cases(["ngram"], [1], ["code"], pool=4, max_new_tokens=16)
    pool = EnginePool(tmp_path, startup_timeout_s=300)  # both measurers on the same engines
    measurers = [
        PairMeasurer(
            log_dir=tmp_path,
            startup_timeout=300,
            meter="modeled:h200",
            repeats=1,
            warmup=0,
            pool=pool,
        )
        for _ in range(2)
    ]
    measurers[1].run_twin = True
    try:
        priced, twin = (m.measure(case) for m in measurers)
    finally:
        pool.close()
    for arm in ("baseline", "speculative"):
        p, t = getattr(priced, arm).samples[0], getattr(twin, arm).samples[0]
        assert p.window.prefill.grouping == PRICED and t.window.prefill.grouping == "engine"
        assert p.window.prefill.joules == p.window.full.details["joules_by_phase"]["prefill"] > 0
        # Equal up to the order the steps' floats were summed in.
        assert (
            p.decode_joules == pytest.approx(t.decode_joules, rel=1e-12) and p.decode_joules > 0
        ), arm
        assert (
            p.decode_seconds == pytest.approx(t.decode_seconds, rel=1e-12) and p.decode_seconds > 0
        ), arm


def test_on_an_emulated_sglang_runner_the_twin_replays_its_forwards_or_the_case_fails(
    tmp_path: Path,
) -> None:
    """Issue 41 item 1: SGLang sends no prefill_forward; grouped by send time, the twin of a queued
    window missed its forwards (e6d59f0: -10.5 points of bias, 13% of the speculative arm's
    "decode" energy prefill at b16). With SGLang's forward stamps it replays them; without them the
    case fails saying why."""
    (case,) = window_bias.make_cases(["ngram"], [4], ["code"], pool=8, max_new_tokens=8)
    (stamped,) = window_bias.measure_rows(
        [case], log_dir=tmp_path / "stamped", meta="sglang", board=True
    )
    assert stamped.grouping == "engine (forward_entry_time)", window_bias.format_rows([stamped])
    assert abs(stamped.bias) <= 0.5 and "prefill-grouping-guessed" not in stamped.failed
    for arm in (stamped.baseline, stamped.speculative):
        assert abs(arm.residue) <= 0.005, window_bias.format_rows([stamped])
    (bare,) = window_bias.measure_rows(
        [case], log_dir=tmp_path / "bare", meta="sglang-bare", board=True
    )
    assert bare.grouping == "send-time" and "prefill-grouping-guessed" in bare.failed
