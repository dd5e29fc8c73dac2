"""A suite's GPU time before it runs (``plan/``): each case priced by the modeled meter's roofline,
engine starts by the order the run takes, and a budget that refuses, naming the costliest cases
and what to change."""

from __future__ import annotations

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.meters.prediction import price
from pytest_specenergy.meters.roofline import PRESETS
from pytest_specenergy.meters.shapes import forward_cost
from pytest_specenergy.meters.shapes import get_shape
from pytest_specenergy.plan.budget import plan_lines
from pytest_specenergy.plan.budget import plan_suite
from pytest_specenergy.plan.cost import SGLANG_START_S
from pytest_specenergy.plan.cost import PlanError
from pytest_specenergy.plan.cost import model_shape
from pytest_specenergy.plan.cost import price_case
from pytest_specenergy.plan.cost import schedule

CODE = load_corpus("code")


def case(drafter: Drafter, batch: int, tokens: int = 512, prompts: int = 192, **kw) -> Case:
    return Case.of(
        engine="sglang",
        model="Qwen/Qwen3-8B",
        drafter=drafter,
        batch=batch,
        corpus=CODE,
        generation=Generation(max_new_tokens=tokens, prompts=prompts),
        max_running_requests=64,
        engine_options=(("sglang_version", "0.5.23"),),
        **kw,
    )


NGRAM = Drafter("ngram", num_draft_tokens=8)


def test_the_shape_comes_from_the_name_or_a_config_and_unknown_is_refused(tmp_path):
    assert model_shape("Qwen/Qwen3-8B").name == "Qwen3-8B"
    assert model_shape("/models/qwen3-0.6b").name == "Qwen3-0.6B"
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,'
        ' "num_attention_heads": 4, "vocab_size": 512}'
    )
    assert model_shape(str(tmp_path)).layers == 2
    with pytest.raises(PlanError, match="cannot be priced"):
        model_shape("org/unknown-model")


def test_a_window_is_priced_as_the_modeled_meter_prices_its_decode_steps():
    cost = price_case(
        case(NGRAM, 1), "h200", repeats=3, cap=3, warmup=1, new_engines=2, baseline_shared=False
    )
    shape, gpu = get_shape("qwen3-8b"), PRESETS["h200"]
    prompt = round(sum(map(len, CODE.take(192))) / 192 / 4)
    decode = price(forward_cost(shape, 1, 1, prompt + 256), shape, gpu).seconds
    # The baseline's window: 8 requests (batch 1) x 512 tokens, one per step.
    assert cost.repeat_s > 8 * 512 * decode
    assert cost.start_s == 2 * SGLANG_START_S
    assert cost.first_look_s == pytest.approx(
        cost.start_s + cost.warmup_s + cost.complete_s + 3 * cost.repeat_s
    )


def test_batch_1_costs_a_bounded_window_not_the_whole_pool():
    small = price_case(
        case(NGRAM, 1), "h200", repeats=3, cap=3, warmup=0, new_engines=0, baseline_shared=True
    )
    # 8 requests x 512 tokens at about 6-7 ms per step: well under a minute per arm.
    assert small.repeat_s < 60


def test_shared_baselines_and_blocked_restarts_are_counted():
    cases = [case(NGRAM, 1), case(Drafter("ngram", num_draft_tokens=4), 1), case(NGRAM, 16)]
    # Resident: the baseline's engine starts once, but each drafter measures the baseline arm in
    # its own cycles, paired (old: the second drafter shared the first's repeats, unpaired).
    assert schedule(cases, blocked=False) == [(2, False), (1, False), (0, False)]
    # Blocked: the second drafter reuses the baseline measured for the first (no restart), the
    # third case restarts its baseline and its drafter's engine.
    assert schedule(cases, blocked=True) == [(2, False), (1, True), (2, False)]


def test_the_suite_plan_prints_per_case_and_total_and_the_save_repeats_count():
    items = [(f"t.py::test[{c.id}]", c) for c in (case(NGRAM, 1), case(NGRAM, 64))]
    pr = plan_suite(items, "h200", repeats=3, cap=11, warmup=1, gated=True)
    nightly = plan_suite(items, "h200", repeats=15, cap=15, warmup=1, gated=False)
    assert nightly.first_look_min > pr.first_look_min and pr.worst_min > pr.first_look_min
    lines = pr.lines()
    assert lines[0].startswith("specenergy plan: modeled GPU minutes on h200")
    assert any(line.startswith("test[code-ngram-b64]") for line in lines)
    assert lines[-1].startswith("total: ") and "(2 cases)" in lines[-1]


def test_the_budget_refuses_naming_the_costliest_cases_and_what_to_change():
    items = [(f"t.py::test[{c.id}]", c) for c in (case(NGRAM, 1), case(NGRAM, 16), case(NGRAM, 64))]
    plan = plan_suite(items, "h200", repeats=3, cap=11, warmup=1, gated=True)
    assert plan.over_budget(plan.worst_min + 1) is None
    why = plan.over_budget(1.0)
    assert why.startswith(f"the suite's modeled GPU time is {plan.worst_min:.1f} minutes")
    assert "--specenergy-budget=1" in why and "the costliest cases: t.py::test[" in why
    assert any(word in why for word in ("Repeats dominate", "windows dominate", "starts dominate"))


def test_plan_lines_without_gpu_cases_or_with_an_unpriceable_one():
    reference = Case.of(engine="reference", model="tiny:dense", drafter=NGRAM, batch=1, corpus=CODE)
    lines, refusal = plan_lines(
        [("t::a", reference)], "h200", repeats=3, cap=11, warmup=1, gated=False, budget=10
    )
    assert "no GPU case" in lines[0] and refusal is None
    unknown = Case.of(
        engine="sglang",
        model="org/unknown",
        drafter=NGRAM,
        batch=1,
        corpus=CODE,
        engine_options=(("sglang_version", "0.5.23"),),
    )
    lines, refusal = plan_lines(
        [("t::b", unknown)], "h200", repeats=3, cap=11, warmup=1, gated=False, budget=10
    )
    assert "cannot be priced" in refusal  # fail closed: a budget nobody can check refuses


def test_a_draft_model_drafter_pays_its_draft_passes():
    draft = Drafter("draft_model", draft_model="/models/Qwen3-0.6B", num_draft_tokens=4)
    costs = {
        name: price_case(
            case(d, 16), "h200", repeats=3, cap=3, warmup=0, new_engines=0, baseline_shared=True
        ).repeat_s
        for name, d in (("ngram", Drafter("ngram", num_draft_tokens=4)), ("draft", draft))
    }
    assert costs["draft"] > costs["ngram"]  # 4 Qwen3-0.6B passes per verify step
