"""The GPU check's one JSON of first-day facts (``benchmarks/sglang_gpu_check_facts.py``), built
here from what a runner's run would give: the doctor's findings, the plan, and run documents whose
engines carry the live 0.5.23 ``/server_info`` captured in tests/data."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LIVE = ROOT / "tests" / "data" / "sglang" / "live-0.5.23"


@pytest.fixture(scope="module")
def facts():
    spec = importlib.util.spec_from_file_location(
        "sglang_gpu_check_facts", ROOT / "benchmarks" / "sglang_gpu_check_facts.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["sglang_gpu_check_facts"] = module
    spec.loader.exec_module(module)
    return module


def _arm(info: dict, tokens: int, seconds=(6.2, 6.0), retracted: int | None = None) -> dict:
    info = {**copy.deepcopy(info), "max_total_num_tokens": tokens}
    arm = {
        "engine": {"server_info": info},
        "samples": [
            {"decode_seconds": s, "window": {"contamination": {"status": "clean"}}} for s in seconds
        ],
    }
    if retracted is not None:
        arm["retractions"] = {
            "requests": 16,
            "retracted": retracted,
            "total": retracted,
            "unknown": 0,
        }
    return arm


def _document(spec_tokens: int, checks=(), retracted=None) -> dict:
    info = json.loads((LIVE / "pair_server_info_a.json").read_text())
    return {
        "results": [
            {
                "case_id": "code-ngram-b1",
                "checks": list(checks),
                "baseline": _arm(info, 131072, retracted=0 if retracted is not None else None),
                "speculative": _arm(info, spec_tokens, retracted=retracted),
            }
        ]
    }


def by_name(items: list[dict]) -> dict[str, dict]:
    return {item["fact"]: item for item in items}


def test_a_clean_run_holds_every_fact(facts):
    got = by_name(facts.run_facts("resident", _document(131072, retracted=0)))
    assert got["resident code-ngram-b1: the arms' KV pools are equal"]["held"] is True
    assert got["resident code-ngram-b1: the twin check held"]["held"] is True
    assert got["resident code-ngram-b1: no request was retracted"]["held"] is True
    assert got["resident code-ngram-b1: every window timed a positive decode"]["held"] is True
    assert got["resident code-ngram-b1: windows free of other GPU processes (resident)"]["held"]
    start = got["resident code-ngram-b1: engine start-up phases"]
    assert start["held"] is True and start["detail"]["baseline"]  # 0.5.23's startup_time


def test_unequal_pools_a_tripped_twin_check_and_retractions_fail(facts):
    twin = {"name": "twin-differs", "severity": "fail"}
    got = by_name(facts.run_facts("blocked", _document(61234, [twin], retracted=2)))
    pools = got["blocked code-ngram-b1: the arms' KV pools are equal"]
    assert pools["held"] is False and pools["detail"] == {"baseline": 131072, "speculative": 61234}
    assert got["blocked code-ngram-b1: the twin check held"]["held"] is False
    assert got["blocked code-ngram-b1: no request was retracted"]["held"] is False
    assert got["blocked code-ngram-b1: no validity check failed"]["detail"] == [
        "twin-differs (fail)"
    ]


def test_what_the_document_does_not_carry_is_unknown_not_held(facts):
    got = by_name(facts.run_facts("blocked", _document(131072)))
    assert got["blocked code-ngram-b1: no request was retracted"]["held"] is None
    assert (
        by_name(facts.run_facts("blocked", None))["blocked: the run wrote its document"]["held"]
        is False
    )


def test_doctor_and_plan_facts_and_the_summary(facts):
    doctor = facts.doctor_facts(
        [{"name": "torch", "status": "FAIL", "detail": "sees no CUDA", "fix": "x"}]
    )
    assert doctor[0]["held"] is False and "torch: sees no CUDA" in doctor[0]["detail"]
    plan = facts.plan_facts(["total: 3.0 GPU minutes at the first look, 6.5 if every"], 7.5, 6.5)
    assert plan[0]["held"] is True
    summary = facts.summary(doctor + plan + facts.run_facts("blocked", _document(131072)))
    assert summary["failed"] == [doctor[0]["fact"]] and summary["held"] >= 5
    assert "blocked code-ngram-b1: no request was retracted" in summary["unknown"]
