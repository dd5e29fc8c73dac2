"""Both arms' SGLang engines on one GPU: resident when they fit with equal KV pools that hold the
cases' requests - one planned capacity pinned as ``max_total_tokens`` in every arm, the
``mem_fraction_static`` that lets the engine starting with the least memory free reach it, and
``--sleep-on-idle`` - else blocked, still with equal pools; refused when no order can give the arms
equal pools. The plan's numbers against SGLang's own sizing code: tests/sglang/test_sglang_pools.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_specenergy.engines.argv import describe_pair_difference
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.kv_pools import capacity_problems
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.engines.sglang_residency import GIB
from pytest_specenergy.engines.sglang_residency import decide
from pytest_specenergy.engines.sglang_residency import engine_memory
from pytest_specenergy.engines.sglang_residency import resident_config
from pytest_specenergy.engines.sglang_residency import share
from pytest_specenergy.engines.sglang_residency import weights_bytes

H200 = 143771 * 1024**2  # nvidia-smi memory.total, MiB
H100 = 81559 * 1024**2
FIELDS = frozenset({"sleep_on_idle", "mem_fraction_static"})
#: Qwen3-8B's and Qwen3-0.6B's attention sizes (their config.json).
QWEN3_8B = {
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 4096,
}
QWEN3_06B = {
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 1024,
}


def model_dir(tmp_path, name: str, gib: float, shape: dict | None = None) -> str:
    folder = tmp_path / name
    folder.mkdir()
    with open(folder / "model-00001-of-00001.safetensors", "wb") as handle:
        handle.truncate(int(gib * GIB))  # sparse: the size is what counts
    (folder / "config.json").write_text(json.dumps(QWEN3_8B if shape is None else shape))
    return str(folder)


def config(model: str, drafter: Drafter | None = None, running: int = 16, **options: Any):
    return EngineConfig(
        engine="sglang",
        model=model,
        drafter=drafter,
        dtype="bf16",
        device="cuda",
        max_running_requests=running,
        options=EngineConfig.freeze_options(
            {"sglang_version": "0.5.23", "python": "/py", **options}
        ),
    )


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


def test_the_share_for_engines_of_unknown_size_stays_within_the_single_engine_default():
    assert share(2) == 0.40 and share(3) == 0.26


def test_an_8b_model_and_its_twin_run_resident_on_an_h200_with_one_pinned_pool(tmp_path):
    target = model_dir(tmp_path, "qwen3-8b", 15.26)
    arms = [config(target), config(target, Drafter("ngram"))]
    decision = decide(arms, 2, H200, FIELDS)
    assert decision.resident and decision.engines == 2
    plan = decision.pools
    assert plan.tokens % 1024 == 0 and plan.tokens >= 16 * 2048
    assert decision.mem_fraction == plan.mem_fraction == 0.80
    # Every engine, in the worst start order, reaches the pinned pool.
    assert {e.tokens for e in plan.engines} == {plan.tokens}
    record = decision.as_dict()
    assert record["pools"]["max_total_tokens"] == plan.tokens and record["sleep_on_idle"] is True


def test_the_draft_model_counts_its_weights_and_kv_layers(tmp_path):
    target = model_dir(tmp_path, "t", 15.26)
    draft = model_dir(tmp_path, "d", 1.4, QWEN3_06B)
    spec = config(target, Drafter("draft_model", draft_model=draft))
    memory, _ = engine_memory(spec, H200)
    twin, _ = engine_memory(spec.twin(), H200)
    assert weights_bytes(spec)[0] == int(15.26 * GIB) + int(1.4 * GIB)
    # 36 + 28 layers of 8 heads x 2 x 128 x 2 bytes (pool_configurator.py:258-314)
    assert (twin.cell_bytes, memory.cell_bytes) == (36 * 4096, 64 * 4096)


def test_an_h100_cannot_hold_both_arms_pools_for_64_requests_and_runs_blocked(tmp_path):
    target = model_dir(tmp_path, "t", 15.26)
    draft = model_dir(tmp_path, "d", 1.4, QWEN3_06B)
    spec = config(target, Drafter("draft_model", draft_model=draft), running=64)
    decision = decide([spec.twin(), spec], 2, H100, FIELDS)
    assert not decision.resident and decision.reason.endswith("blocked order")
    assert "fewer than the 131072 the cases' requests need" in decision.reason
    # Blocked: each engine alone at the backend's 0.80 still gets one pinned pool.
    assert decision.pools is not None and not decision.pools.resident
    assert decision.pools.mem_fraction == 0.80 and decision.pools.tokens >= 131072


def test_a_users_pin_is_checked_and_kept(tmp_path):
    target = model_dir(tmp_path, "t", 15.26)
    spec = config(target, Drafter("ngram"), running=64, max_total_tokens=131072)
    on_h200 = decide([spec.twin(), spec], 2, H200, FIELDS)
    assert on_h200.resident and on_h200.pools.tokens == 131072
    assert resident_config(spec, on_h200).option("max_total_tokens") == 131072
    on_h100 = decide([spec.twin(), spec], 2, H100, FIELDS)
    assert not on_h100.resident and "max_total_tokens=131072" in on_h100.reason
    huge = config(target, Drafter("ngram"), max_total_tokens=10**7)
    refused = decide([huge.twin(), huge], 2, H100, FIELDS)
    assert refused.refused and "at most" in refused.refused
    with pytest.raises(EngineConfigError, match="max_total_tokens=10000000"):
        resident_config(huge, refused)


def test_a_third_engine_for_in_job_ab(tmp_path):
    target = model_dir(tmp_path, "t", 15.26)
    arms = [
        config(target),
        config(target, Drafter("ngram")),
        config(target, Drafter("ngram", num_draft_tokens=4)),
    ]
    decision = decide(arms, 3, H200, FIELDS)
    assert decision.resident and decision.engines == 3
    assert {e.tokens for e in decision.pools.engines} == {decision.pools.tokens}
    assert not decide(arms, 3, H100, FIELDS).resident


def test_what_is_not_known_is_not_guessed(tmp_path):
    hub = [config("Qwen/Qwen3-8B"), config("Qwen/Qwen3-8B", Drafter("ngram"))]
    unknown_size = decide(hub, 2, H200, FIELDS)
    assert not unknown_size.resident and "declare weights_gb=" in unknown_size.reason
    assert unknown_size.pools is None  # nothing to plan from: the live check decides
    declared = [
        config("Qwen/Qwen3-8B", weights_gb=15.26),
        config("Qwen/Qwen3-8B", Drafter("ngram"), weights_gb=15.26),
    ]
    no_shape = decide(declared, 2, H200, FIELDS)
    assert not no_shape.resident and "no readable config.json" in no_shape.reason
    cached = tmp_path / "hf" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text(json.dumps(QWEN3_8B))
    assert decide(declared, 2, H200, FIELDS).resident
    assert "no NVML" in decide(declared, 2, None, FIELDS).reason
    no_sleep = decide(declared, 2, H200, frozenset({"mem_fraction_static"}))
    assert not no_sleep.resident and "--sleep-on-idle" in no_sleep.reason
    with pytest.raises(ValueError, match="weights_gb"):
        weights_bytes(config("Qwen/Qwen3-8B", weights_gb="16"))


def test_the_marker_forces_either_way_and_a_users_fraction_is_kept(tmp_path):
    target = model_dir(tmp_path, "t", 2.0)
    forced = decide(
        [config(target, resident=False), config(target, Drafter("ngram"), resident=False)],
        2,
        H200,
        FIELDS,
    )
    assert not forced.resident and "resident=False" in forced.reason
    assert forced.pools is not None  # blocked, with one pinned pool
    vouched = decide(
        [
            config("Qwen/Qwen3-8B", resident=True),
            config("Qwen/Qwen3-8B", Drafter("ngram"), resident=True),
        ],
        2,
        None,
        FIELDS,
    )
    assert vouched.resident and vouched.mem_fraction == 0.40
    own = decide(
        [
            config(target, mem_fraction_static=0.3),
            config(target, Drafter("ngram"), mem_fraction_static=0.3),
        ],
        2,
        H200,
        FIELDS,
    )
    assert own.resident and own.mem_fraction == 0.3
    too_much = decide([config(target, mem_fraction_static=0.5)], 2, H200, FIELDS)
    assert not too_much.resident and "1.00 of the GPU's memory" in too_much.reason


def test_resident_argv_pins_one_pool_and_one_fraction_and_sleeps_on_idle(tmp_path):
    target = model_dir(tmp_path, "t", 15.26)
    spec = config(target, Drafter("ngram"))
    decision = decide([spec.twin(), spec], 2, H200, FIELDS)
    backend = SGLangBackend()
    resident_spec = resident_config(spec, decision)
    resident_base = resident_config(spec.twin(), decision)
    assert resident_base == resident_spec.twin()  # the same options on the twin
    spec_argv = backend.command(resident_spec, "127.0.0.1", 30001)
    base_argv = backend.command(resident_base, "127.0.0.1", 30002)
    for argv in (spec_argv, base_argv):
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.8" and "--sleep-on-idle" in argv
        assert argv[argv.index("--max-total-tokens") + 1] == str(decision.pools.tokens)
        assert not any(a.startswith(("--resident", "--weights")) for a in argv)
    lines = describe_pair_difference(spec_argv, base_argv)
    assert lines and all(line.startswith("speculative: --speculative-") for line in lines)
    assert resident_spec.as_dict()["options"]["max_total_tokens"] == decision.pools.tokens
    # Nothing known: the configs are left as they are.
    blocked = decide([spec], 2, None, FIELDS)
    assert resident_config(spec, blocked) is spec


def test_capacities_are_compared_before_the_first_window():
    equal = {
        "baseline": {"max_total_num_tokens": 65536},
        "speculative": {"max_total_num_tokens": 65536},
    }
    assert capacity_problems(equal) == [] and capacity_problems(equal, planned=65536) == []
    unequal = {
        "baseline": {"max_total_num_tokens": 131072},
        "speculative": {"max_total_num_tokens": 61234},
    }
    [line] = capacity_problems(unequal)
    assert "differ before the first window (baseline 131072, speculative 61234 tokens)" in line
    assert "pin max_total_tokens=60416" in line
    short = capacity_problems(equal, planned=131072)
    assert len(short) == 1 and "pinned every arm to 131072" in short[0]
    missing = capacity_problems({"baseline": {}, "speculative": {"max_total_num_tokens": 1}})
    assert "reports no max_total_num_tokens" in missing[0]
