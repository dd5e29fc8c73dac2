"""Issue 22 items 1, 2, 5: a comparison reads the measurement order. A drafter judged against a
baseline shared from another case, or arms run blocked on one GPU, are not paired by index: each
repeat against the baseline's mean, the baseline's spread carried in, a block drift allowed for."""

from __future__ import annotations

import math
import types

import numpy as np

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import arm_repeat_values
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.gatekeeper import Gatekeeper
from pytest_specenergy.gate.gatekeeper import NeedsRepeats
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.options import SpecEnergyConfig

ENERGY = [parse_fail_expr("energy_ratio:5%")]


def _arm(values):
    return {
        "source": "s",
        "samples": [
            {"decode_joules": float(v), "decode_seconds": 1.0, "decode_tokens": 1} for v in values
        ],
    }


def record(spec, base, order=None, reference=None) -> CaseRecord:
    # A modeled source: the block drift alone, with no between-session term (a measured meter's
    # ratio against a stored run gets one: tests/unit/gate/test_session_term.py).
    data = {
        "case_id": "c",
        "source": "modeled (simulated)",
        "baseline": _arm(base),
        "speculative": _arm(spec),
        "order": order or {},
        "nodeid": "t",
        "machine_key": "k",
    }
    if reference is not None:
        data["reference"], data["reference_drafter"] = _arm(reference), {"id": "ref"}
    return CaseRecord.from_dict(data)


def test_a_shared_baseline_is_not_paired_by_index():
    base, spec = [1.0, 1.2, 0.8], [0.5, 0.6, 0.4]
    shared = record(spec, base, {"interleaved": True, "baseline_from": "test_x[code-ngram-b1]"})
    level = math.exp(np.mean(np.log(base)))
    # Index pairing would read 0.5, 0.5, 0.5: a spread the measurement never had.
    assert arm_repeat_values(shared, "energy_ratio") == [s / level for s in spec]
    assert arm_repeat_values(record(spec, base), "energy_ratio") == [0.5, 0.5, 0.5]
    stored = record([0.5] * 5, [1.0] * 5)
    row = compare_case(stored, shared, ENERGY, plan=gate_plan()).rows[0]
    assert "unpaired: current baseline shared from test_x[code-ngram-b1]" in row.method
    assert "block drift allowance 3.0%" in row.note
    # The baseline's spread is carried in: the interval is wider than the arm's own spread gives.
    low, high = row.interval
    assert high - low > 0.2


def _noisy(rng, n, ratio, sd=0.002):
    base = np.exp(sd * rng.standard_normal(n))
    return list(ratio * base * np.exp(sd * rng.standard_normal(n))), list(base)


def test_blocked_arms_allow_for_block_drift():
    rng = np.random.default_rng(0)
    stored = record(*_noisy(rng, 11, 0.5))
    spec, base = _noisy(rng, 11, 0.5 * 1.07)  # +7% seen: +4% true under 3% block drift
    interleaved = compare_case(stored, record(spec, base), ENERGY, plan=gate_plan())
    blocked = compare_case(
        stored, record(spec, base, {"interleaved": False}), ENERGY, plan=gate_plan()
    )
    assert interleaved.verdict is Verdict.REGRESSED
    assert blocked.verdict is Verdict.INCONCLUSIVE
    assert "unpaired: current blocked order (one engine at a time)" in blocked.rows[0].method
    # Beyond limit + drift it still fails.
    spec, base = _noisy(rng, 11, 0.5 * 1.12)
    assert (
        compare_case(
            stored, record(spec, base, {"interleaved": False}), ENERGY, plan=gate_plan()
        ).verdict
        is Verdict.REGRESSED
    )


def test_blocked_in_job_candidate_against_reference_allows_for_drift():
    rng = np.random.default_rng(1)
    base = list(np.exp(0.002 * rng.standard_normal(11)))
    ref = [0.5 * b for b in base]
    cand = [0.5 * 1.07 * b for b in base]
    plan = gate_plan()
    blocked = Gatekeeper(runs=None, plan=plan).judge(
        record(cand, base, {"interleaved": False}, ref), ENERGY
    )
    together = Gatekeeper(runs=None, plan=plan).judge(
        record(cand, base, {"interleaved": True}, ref), ENERGY
    )
    assert together.comparison.verdict is Verdict.REGRESSED
    assert blocked.comparison.verdict is Verdict.INCONCLUSIVE
    method = blocked.comparison.rows[0].method
    assert (
        "blocked order (one engine at a time): candidate and reference in separate blocks" in method
    )


class _OneRun:
    def __init__(self, stored):
        self.document = RunDocument(results=(stored,), machine_key="k")

    def find_any(self, key, reference):
        return "stored.json"

    def load(self, path):
        return self.document

    def list(self, key):
        return []  # no history beyond the compare run


def test_blocked_order_under_3pct_drift_holds_alpha_at_the_limit():
    """Simulated through Gatekeeper.judge: a true change at the 5% limit, the speculative
    block 3% costlier than its baseline block, 3% per-arm noise, against a stored run of 15."""
    rng = np.random.default_rng(7)
    plan, cases, regressed = gate_plan(), 120, 0
    for _ in range(cases):
        stored = record(
            list(0.6 * np.exp(0.03 * rng.standard_normal(15))),
            list(np.exp(0.03 * rng.standard_normal(15))),
            {"interleaved": False},
        )
        base = np.exp(0.03 * rng.standard_normal(plan.cap))
        spec = 0.6 * 1.05 * 1.03 * np.exp(0.03 * rng.standard_normal(plan.cap))
        gate, n = Gatekeeper(runs=_OneRun(stored), compare="stored", plan=plan), plan.start
        while isinstance(
            decision := gate.judge(
                record(list(spec[:n]), list(base[:n]), {"interleaved": False}), ENERGY
            ),
            NeedsRepeats,
        ):
            n += decision.extra
        regressed += decision.comparison.verdict is Verdict.REGRESSED
    assert regressed / cases <= 0.10  # alpha 0.05; 120 cases put 0.10 above 3 standard errors


def test_a_run_saved_to_the_history_measures_the_save_repeats():
    def measured(**kw):
        values = {
            "repeats": 3,
            "save_repeats": 15,
            "save": None,
            "autosave": False,
            "repeats_set": False,
            **kw,
        }
        return SpecEnergyConfig.measured_repeats.fget(types.SimpleNamespace(**values))

    assert measured() == 3
    assert measured(save="main") == 15
    assert measured(autosave=True) == 15
    assert measured(save="main", repeats=20) == 20
    # Repeats the user asked for are measured as asked, saved or not.
    assert measured(save="main", repeats=2, repeats_set=True) == 2
