"""Issue 22 item 1: both arms' SGLang engines resident on one GPU when they fit - an equal
``--mem-fraction-static`` share each and ``--sleep-on-idle`` on both - decided from the weights
(marker or checkpoint files) against the GPU's memory; blocked, with the reason, otherwise."""

from __future__ import annotations

import os
from typing import Any

import pytest

from pytest_specenergy.engines.argv import describe_pair_difference
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.engines.sglang_residency import GIB
from pytest_specenergy.engines.sglang_residency import decide
from pytest_specenergy.engines.sglang_residency import resident_config
from pytest_specenergy.engines.sglang_residency import share
from pytest_specenergy.engines.sglang_residency import weights_bytes

H200 = 141 * GIB
FIELDS = frozenset({"sleep_on_idle", "mem_fraction_static"})


def model_dir(tmp_path, name: str, gib: float) -> str:
    folder = tmp_path / name
    folder.mkdir()
    with open(folder / "model-00001-of-00001.safetensors", "wb") as handle:
        handle.truncate(int(gib * GIB))  # sparse: the size is what counts
    (folder / "config.json").write_text("{}")
    return str(folder)


def config(model: str, drafter: Drafter | None = None, **options: Any) -> EngineConfig:
    return EngineConfig(
        engine="sglang",
        model=model,
        drafter=drafter,
        dtype="bf16",
        device="cuda",
        max_running_requests=16,
        options=EngineConfig.freeze_options(
            {"sglang_version": "0.5.23", "python": "/py", **options}
        ),
    )


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


def test_the_share_is_equal_and_the_total_stays_the_single_engine_default():
    assert share(2) == 0.40 and share(3) == 0.26
    assert share(2) * 2 <= 0.80 and share(3) * 3 <= 0.80


def test_an_8b_model_and_its_twin_fit_an_h200_and_run_resident(tmp_path):
    target = model_dir(tmp_path, "qwen3-8b", 16.4)
    arms = [config(target), config(target, Drafter("ngram"))]
    decision = decide(arms, 2, H200, FIELDS)
    assert decision.resident and decision.engines == 2 and decision.mem_fraction == 0.40
    assert "16.4 GiB (checkpoint files) fit" in decision.reason
    record = decision.as_dict()
    assert record["mem_fraction_static"] == 0.40 and record["sleep_on_idle"] is True
    assert record["gpu_memory_gib"] == 141.0 and record["weights_gib"] == 16.4


def test_the_draft_model_counts_on_the_speculative_engine(tmp_path):
    target, draft = model_dir(tmp_path, "t", 30.0), model_dir(tmp_path, "d", 4.0)
    spec = config(target, Drafter("draft_model", draft_model=draft))
    assert weights_bytes(spec)[0] == 34 * GIB
    # 0.6 x 0.40 x 141 GiB = 33.8 GiB: the target alone fits, with its draft model it does not.
    assert decide([config(target)], 2, H200, FIELDS).resident
    decision = decide([config(target), spec], 2, H200, FIELDS)
    assert not decision.resident and decision.engines == 1
    assert "weights 34.0 GiB" in decision.reason and decision.reason.endswith("blocked order")


def test_a_third_engine_for_in_job_ab_takes_a_smaller_share(tmp_path):
    target = model_dir(tmp_path, "t", 16.4)
    arms = [
        config(target),
        config(target, Drafter("ngram")),
        config(target, Drafter("ngram", num_draft_tokens=4)),
    ]
    decision = decide(arms, 3, H200, FIELDS)
    assert decision.resident and decision.mem_fraction == 0.26
    assert not decide(arms, 3, 80 * GIB, FIELDS).resident  # 0.6 x 0.26 x 80 = 12.5 GiB < 16.4


def test_what_is_not_known_is_not_guessed():
    hub = [config("Qwen/Qwen3-8B"), config("Qwen/Qwen3-8B", Drafter("ngram"))]
    unknown_size = decide(hub, 2, H200, FIELDS)
    assert not unknown_size.resident and "declare weights_gb=" in unknown_size.reason
    declared = [
        config("Qwen/Qwen3-8B", weights_gb=16.4),
        config("Qwen/Qwen3-8B", Drafter("ngram"), weights_gb=16.4),
    ]
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


def test_resident_argv_splits_the_memory_equally_and_sleeps_on_idle(tmp_path):
    target = model_dir(tmp_path, "t", 16.4)
    spec = config(target, Drafter("ngram"))
    decision = decide([spec.twin(), spec], 2, H200, FIELDS)
    backend = SGLangBackend()
    resident_spec = resident_config(spec, decision)
    resident_base = resident_config(spec.twin(), decision)
    assert resident_base == resident_config(spec, decision).twin()  # the same share on the twin
    spec_argv = backend.command(resident_spec, "127.0.0.1", 30001)
    base_argv = backend.command(resident_base, "127.0.0.1", 30002)
    for argv in (spec_argv, base_argv):
        at = argv.index("--mem-fraction-static")
        assert argv[at + 1] == "0.4" and "--sleep-on-idle" in argv
        # the plugin's own options
        assert not any(a.startswith(("--resident", "--weights")) for a in argv)
    lines = describe_pair_difference(spec_argv, base_argv)
    assert lines and all(line.startswith("speculative: --speculative-") for line in lines)
    # The engine description the run document records carries the share.
    assert resident_spec.as_dict()["options"]["mem_fraction_static"] == 0.40
    # Blocked: the configs are left as they are (SGLang's single-engine 0.80, no sleep).
    blocked = decide([spec], 2, None, FIELDS)
    assert resident_config(spec, blocked) is spec
    assert "--sleep-on-idle" not in backend.command(spec, "127.0.0.1", 30001)
    assert os.path.isdir(target)
