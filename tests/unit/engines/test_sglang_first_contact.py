"""Issue 20, items 1-6: what a first run against real SGLang 0.5.23 broke.

Every payload here was answered by a real SGLang server (tests/data/sglang/live-0.5.23/, made
by dev/sglang_capture_pair.py) or is 0.5.9's shape read from its source; each test failed on
the code before the fix (d298f01).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_specenergy.engines import sglang_args as sa
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.meta_info import MetaInfoError
from pytest_specenergy.engines.meta_info import parse_meta_info
from pytest_specenergy.engines.sglang import CAPACITY_HINT
from pytest_specenergy.engines.sglang import RESOLVED_IGNORED
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.engines.sglang import checkpoint_special_token_ids
from pytest_specenergy.engines.sglang import resolved_args_difference
from pytest_specenergy.measure.checks import _window_checks
from pytest_specenergy.measure.results import RepeatSample

DATA = Path(__file__).resolve().parents[2] / "data" / "sglang"
LIVE = DATA / "live-0.5.23"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def config(
    drafter: Drafter | None = None,
    version: str = "0.5.23",
    model: str = "org/model",
    **options: object,
) -> EngineConfig:
    return EngineConfig(
        engine="sglang",
        model=model,
        drafter=drafter,
        options=tuple(sorted({"sglang_version": version, **options}.items())),
    )


# -- 1: two live servers of one config are twins ------------------------------------------
def test_two_live_servers_of_one_config_pass_the_twin_check():
    a, b = load(LIVE / "pair_server_info_a.json"), load(LIVE / "pair_server_info_b.json")
    # What really differs between the two starts: the port and the two keys issue 20 found.
    differ = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert differ == {"port", "launch_command", "startup_time", "internal_states"}
    assert resolved_args_difference(a, b) == []


def test_a_changed_non_speculative_flag_is_still_named():
    a, b = load(LIVE / "pair_server_info_a.json"), load(LIVE / "pair_server_info_b.json")
    [line] = resolved_args_difference({**a, "chunked_prefill_size": 1024}, b)
    assert line.startswith("chunked_prefill_size: 1024 (speculative) vs")


def test_every_ignored_key_says_why_and_is_what_sglang_sends():
    a = load(LIVE / "pair_server_info_a.json")
    for key, why in RESOLVED_IGNORED.items():
        assert len(why) > 15, key
    # The non-ServerArgs keys ignored are ones a real 0.5.23 or 0.5.9 server sends; the rest
    # of the list are ServerArgs fields (ports, addresses, IPC names).
    not_fields = {k for k in RESOLVED_IGNORED if k not in sa.KNOWN_FIELDS}
    assert not_fields <= {
        "launch_command",
        "startup_time",
        "internal_states",
        "kv_events",
        "kv_event_sources",
        "hicache_object_layout",
        "tp_rank",
        "remote_instance_transfer_engine_session_id",
        "remote_instance_transfer_engine_weights_info_dict",
    }
    assert {
        "launch_command",
        "startup_time",
        "internal_states",
        "kv_events",
        "hicache_object_layout",
    } <= set(a)
    # Compared although not configuration: they must be equal in a twin.
    for kept in ("version", "frontend", "status", "max_total_num_tokens", "max_req_input_len"):
        assert kept in a and kept not in RESOLVED_IGNORED


def test_the_0_5_9_fixture_holds_only_what_0_5_9_sends():
    info = load(DATA / "server_info_0.5.9.json")
    # 0.5.9: asdict(server_args) + scheduler init info + internal_states + version.
    extra = {k for k in info if k not in sa.KNOWN_FIELDS}
    assert extra <= {
        "status",
        "max_total_num_tokens",
        "max_req_input_len",
        "internal_states",
        "version",
    }, extra


# -- 2: a request aborted while queued ----------------------------------------------------
def test_a_request_aborted_in_the_waiting_queue_counts_nothing():
    answers = load(LIVE / "generate_abort_queued.json")
    queued = [
        a["meta_info"]
        for a in answers
        if a["meta_info"]["finish_reason"].get("message") == "Abort in waiting queue"
    ]
    assert len(queued) == 2 and all("prompt_tokens" not in m for m in queued)
    for meta in queued:
        counters = parse_meta_info(meta)
        assert (counters.prompt_tokens, counters.completion_tokens) == (0, 0)
        assert counters.finish_type == "abort" and counters.spec_verify_ct is None
    running = [parse_meta_info(a["meta_info"]) for a in answers if a["meta_info"] not in queued]
    assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 for c in running)


def test_a_payload_that_really_lost_prompt_tokens_is_still_refused():
    meta = {"id": "x", "finish_reason": {"type": "length", "length": 8}, "completion_tokens": 8}
    with pytest.raises(MetaInfoError, match="lacks prompt_tokens"):
        parse_meta_info(meta)
    # An abort that made tokens but lacks prompt_tokens was retracted and answered from the queue:
    # it parses (tests/unit/engines/test_retractions.py), its prompt from the caller.
    cut = {"id": "x", "finish_reason": {"type": "abort"}, "completion_tokens": 3}
    assert parse_meta_info(cut, prompt_tokens=7).prompt_tokens == 7


# -- 4: KV capacity ------------------------------------------------------------------------
def test_a_smaller_speculative_kv_pool_fails_saying_how_to_pin_it():
    a = load(LIVE / "pair_server_info_a.json")
    spec = {**a, "max_total_num_tokens": 12000, "max_req_input_len": 11994}
    lines = resolved_args_difference(spec, a)
    assert lines[0].startswith("max_req_input_len") and lines[1].startswith("max_total_num_tokens")
    assert lines[-1] == CAPACITY_HINT and "max_total_tokens=" in CAPACITY_HINT


# -- 5: a decode time that is not positive -------------------------------------------------
def _run(arm: str, seconds: float) -> SimpleNamespace:
    sample = RepeatSample(
        decode_joules=1.0,
        decode_seconds=seconds,
        decode_tokens=10,
        tbt_ms=None,
        verify_steps=None,
        correct_drafts=None,
        proposed_drafts=None,
    )
    return SimpleNamespace(arm=arm, samples=(sample,))


def test_a_negative_decode_time_fails_the_pair():
    [check] = _window_checks(_run("baseline", 2.0), _run("speculative", -0.54))
    assert check.name == "decode-time-not-positive" and check.severity == "fail"
    assert "speculative arm" in check.message and "-0.54" in check.message
    assert _window_checks(_run("baseline", 2.0), _run("speculative", 1.5)) == []


# -- 6: smaller ----------------------------------------------------------------------------
def test_the_client_sends_flush_with_timeout_on_0_5_23(tmp_path):
    server = ServerProcess(config(), SGLangBackend(), tmp_path)
    assert server.client.flush_path == "/flush_cache?timeout=30"
    old = ServerProcess(config(version="0.5.9"), SGLangBackend(), tmp_path)
    assert old.client.flush_path == "/flush_cache"


def _checkpoint(tmp_path: Path, arch: str) -> str:
    tmp_path.mkdir(parents=True)
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": [arch], "model_type": "llama"})
    )
    return str(tmp_path)


def test_nextn_without_draft_model_needs_mtp_layers_in_the_target(tmp_path):
    llama = _checkpoint(tmp_path / "llama", "LlamaForCausalLM")
    with pytest.raises(EngineConfigError, match="LlamaForCausalLM.*pass draft_model="):
        SGLangBackend().check(config(Drafter("nextn"), model=llama))
    deepseek = _checkpoint(tmp_path / "ds", "DeepseekV3ForCausalLM")
    SGLangBackend().check(config(Drafter("nextn"), model=deepseek))
    qwen4 = _checkpoint(tmp_path / "q4", "Qwen4ExpForConditionalGeneration")
    SGLangBackend().check(config(Drafter("nextn"), model=qwen4))
    with pytest.raises(EngineConfigError, match="does not know"):  # 0.5.9 has no Qwen4-Exp MTP
        SGLangBackend().check(config(Drafter("nextn"), version="0.5.9", model=qwen4))
    with pytest.raises(EngineConfigError, match="no config.json"):
        SGLangBackend().check(config(Drafter("nextn"), model="org/not-cached-anywhere"))


def test_special_token_ids_come_from_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": [1, 7], "pad_token_id": 2})
    )
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "added_tokens_decoder": {
                    "5": {"content": "<|im_end|>", "special": True},
                    "9": {"content": "x", "special": False},
                }
            }
        )
    )
    assert checkpoint_special_token_ids(str(tmp_path)) == (0, 1, 2, 5, 7)
    # /server_info of a real SGLang server has none; the engine's ids come from the checkpoint.
    live = load(LIVE / "pair_server_info_a.json")
    assert "special_token_ids" not in live
    server = ServerProcess(config(model=str(tmp_path)), SGLangBackend(), tmp_path / "logs")
    server.server_info = live
    assert server.special_token_ids == (0, 1, 2, 5, 7)


def test_the_a_a_control_runs_the_twins_command_line():
    aa = config(Drafter("none"))
    SGLangBackend().check(aa)
    spec = SGLangBackend().command(aa, "127.0.0.1", 1)
    assert spec == SGLangBackend().command(aa.twin(), "127.0.0.1", 1)
    assert aa != aa.twin()  # a second engine process, not the baseline's


def test_the_a_a_control_is_identified_as_a_non_speculative_server():
    from pytest_specenergy.engines.identity import config_mismatches

    live = load(LIVE / "pair_server_info_a.json")  # speculative_algorithm None
    aa = config(Drafter("none"), model=live["model_path"])
    assert config_mismatches(aa, live) == []
    ngram = config(Drafter("ngram"), model=live["model_path"])
    assert config_mismatches(ngram, live) == ["drafter 'ngram' expected, server runs none"]
    assert "A/A control" in config_mismatches(aa, {**live, "speculative_algorithm": "NGRAM"})[0]
