"""Fixes from shared/reference/sglang-audit.md, checked against the real 0.5.9/0.5.14/0.5.23
parsers (capture lists, flag names, no-CLI and three-state fields)."""

from __future__ import annotations

import stat
from typing import Any

import pytest

from pytest_specenergy.engines import sglang_args as sa
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.engines.sglang import decode_cuda_graph_batch_sizes
from pytest_specenergy.engines.sglang import python_sglang_version
from pytest_specenergy.engines.sglang import resolved_args_difference
from pytest_specenergy.measure import coherence


def config(
    drafter: Drafter | None = None,
    version: str | None = "0.5.23",
    max_running_requests: int | None = 48,
    **options: Any,
) -> EngineConfig:
    opts = {"python": "/py", **options}
    if version is not None:
        opts["sglang_version"] = version
    return EngineConfig(
        engine="sglang",
        model="Qwen/Qwen3-8B",
        drafter=drafter,
        dtype="bf16",
        max_running_requests=max_running_requests,
        options=EngineConfig.freeze_options(opts),
    )


def values(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    out = []
    for item in argv[i + 1 :]:
        if item.startswith("--"):
            break
        out.append(item)
    return out


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


# --- item 1: one decode capture list, in both arms -------------------------------------------


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ("0.5.9", "--cuda-graph-bs"),
        ("0.5.13", "--cuda-graph-bs"),
        ("0.5.14", "--cuda-graph-bs-decode"),
        ("0.5.23", "--cuda-graph-bs-decode"),
    ],
)
@pytest.mark.parametrize("drafter", [Drafter("ngram"), Drafter("eagle3", draft_model="/m/e3")])
def test_decode_capture_list_is_pinned_identically_in_both_arms(version, flag, drafter):
    cfg = config(drafter, version)
    spec = SGLangBackend().command(cfg, "h", 1)
    base = SGLangBackend().command(cfg.twin(), "h", 1)
    # SGLang's speculative list at cap 48 (0.5.23 cuda_graph_hook.py:517-523).
    expected = [
        str(b)
        for b in [
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            10,
            12,
            14,
            16,
            18,
            20,
            22,
            24,
            26,
            28,
            30,
            32,
            40,
            44,
            48,
        ]
    ]
    assert values(spec, flag) == values(base, flag) == expected
    cap_flag = "--cuda-graph-max-bs" if flag == "--cuda-graph-bs" else "--cuda-graph-max-bs-decode"
    assert values(spec, cap_flag) == values(base, cap_flag) == ["48"]


def test_capture_list_from_the_cap():
    assert decode_cuda_graph_batch_sizes(1) == [1]
    assert decode_cuda_graph_batch_sizes(9) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert decode_cuda_graph_batch_sizes(64)[-8:] == [32, 40, 44, 48, 52, 56, 60, 64]
    assert decode_cuda_graph_batch_sizes(300)[-3:] == [272, 288, 300]
    assert decode_cuda_graph_batch_sizes(5, padding=False) == [1, 2, 3, 4, 5]
    with pytest.raises(EngineConfigError):
        decode_cuda_graph_batch_sizes(0)


def test_capture_list_follows_user_cap_list_and_switches():
    argv = SGLangBackend().command(config(None, cuda_graph_max_bs=10), "h", 1)
    assert values(argv, "--cuda-graph-bs-decode") == ["1", "2", "3", "4", "5", "6", "7", "8", "10"]
    argv = SGLangBackend().command(config(None, cuda_graph_bs=[1, 4, 32]), "h", 1)
    assert values(argv, "--cuda-graph-bs-decode") == ["1", "4", "32"]
    assert values(argv, "--cuda-graph-max-bs-decode") == ["32"]
    argv = SGLangBackend().command(config(None, "0.5.9", disable_cuda_graph_padding=True), "h", 1)
    assert values(argv, "--cuda-graph-bs") == [str(b) for b in range(1, 49)]
    for version in ("0.5.9", "0.5.23"):
        argv = SGLangBackend().command(config(None, version, disable_cuda_graph=True), "h", 1)
        assert not [a for a in argv if a.startswith(("--cuda-graph-bs", "--cuda-graph-max-bs"))]


# --- item 2: resolved-config comparison --------------------------------------------------------


def test_resolved_args_difference_ignores_speculative_and_addresses():
    base = {
        "attention_backend": "flashinfer",
        "port": 1,
        "nccl_port": 5,
        "speculative_algorithm": None,
        "internal_states": [{"step_time_dict": {}}],
        "cuda_graph_config": {"decode": {"bs": [1, 2, 4, 8, 12]}},
        "only_base": 1,
    }
    spec = {
        **base,
        "port": 2,
        "nccl_port": 6,
        "speculative_algorithm": "NGRAM",
        "speculative_num_draft_tokens": 9,
        "internal_states": [{"step_time_dict": {"4": [1]}}],
    }
    assert resolved_args_difference(spec, base) == []
    spec["cuda_graph_config"] = {"decode": {"bs": [1, 2, 3, 4, 5, 6, 7, 8, 10, 12]}}
    [line] = resolved_args_difference(spec, base)
    assert line.startswith("cuda_graph_config: ") and "(speculative) vs" in line


# --- item 3: per-step log lines ----------------------------------------------------------------


def test_per_step_log_lines_are_cut_in_both_arms_but_steps_still_recorded():
    cfg = config(Drafter("ngram"))
    for arm in (cfg, cfg.twin()):
        argv = SGLangBackend().command(arm, "h", 1)
        assert values(argv, "--log-level") == ["warning"]
        # step_time_dict gets one entry per decode_log_interval steps, so 1 stays.
        assert values(argv, "--decode-log-interval") == ["1"]
    argv = SGLangBackend().command(config(None, log_level="info"), "h", 1)
    assert values(argv, "--log-level") == ["info"] and argv.count("--log-level") == 1


# --- item 4: coherence without return_prompt_token_ids ----------------------------------------


class _Client:
    """Answers like SGLang 0.5.9: no prompt_token_ids, (logprob, id, None) logprob entries."""

    def __init__(self):
        self.calls: list[dict[str, Any]] = []

    def generate(
        self,
        input_ids=None,
        *,
        text=None,
        sampling_params,
        rids=None,
        return_logprob=False,
        logprob_start_len=None,
        return_prompt_token_ids=False,
    ):
        self.calls.append(
            {
                "text": text,
                "input_ids": input_ids,
                "return_logprob": return_logprob,
                "logprob_start_len": logprob_start_len,
                "return_prompt_token_ids": return_prompt_token_ids,
            }
        )
        if text is not None:
            rows = [[100 + ord(c) for c in t] for t in text]
        else:
            rows = [list(ids) for ids in input_ids]
        out = []
        for row in rows:
            meta: dict[str, Any] = {}
            if return_logprob:
                start = logprob_start_len or 0
                meta["input_token_logprobs"] = [
                    (None if k == start else -0.5, t, None) for k, t in enumerate(row) if k >= start
                ]
            out.append({"text": "", "output_ids": [], "meta_info": meta})
        return out


def test_prompt_ids_from_input_logprobs_when_support_is_unknown():
    client = _Client()
    assert coherence.prompt_token_ids(client, ["ab", "c"]) == [[197, 198], [199]]
    assert client.calls[0]["return_prompt_token_ids"] is False
    assert client.calls[0]["return_logprob"] is True and client.calls[0]["logprob_start_len"] == 0
    result = coherence.measure_coherence(client, ["ab"], [[1, 2, 3]], [[1, 5, 6]])
    assert result.diverged == (True,)
    assert not any(call["return_prompt_token_ids"] for call in client.calls)
    with pytest.raises(coherence.CoherenceError, match="SGLang >= 0.5.13"):
        coherence.prompt_token_ids(_Client(), ["ab"], return_prompt_token_ids=True)


# --- items 5-7: flag names, no-CLI fields, three-state booleans -------------------------------


def test_elastic_ep_join_flags_have_their_real_names():
    argv = SGLangBackend().command(
        config(None, ep_join_mode="scale", ep_join_rank_offset=2), "h", 1
    )
    assert values(argv, "--elastic-ep-join-mode") == ["scale"]
    assert values(argv, "--elastic-ep-join-rank-offset") == ["2"]
    assert "--ep-join-mode" not in argv and "--ep-join-rank-offset" not in argv


@pytest.mark.parametrize(
    ("version", "field"),
    [
        ("0.5.23", "watermark_key"),
        ("0.5.23", "grpc_worker_threads"),
        ("0.5.23", "speculative_boundary_reduction"),
        ("0.5.14", "stat_loggers"),
        ("0.5.14", "custom_sigquit_handler"),
    ],
)
def test_fields_without_a_flag_are_refused(version, field):
    with pytest.raises(
        EngineConfigError,
        match=rf"{field}=.*no command-line flag in SGLang "
        rf"{version}",
    ):
        SGLangBackend().check(config(None, version, **{field: "x"}))


def test_three_state_false_becomes_no_flag():
    argv = SGLangBackend().command(
        config(None, enable_fused_qk_norm_rope=False, enable_tf32_matmul=True, dllm_fdfo=False),
        "h",
        1,
    )
    assert "--no-enable-fused-qk-norm-rope" in argv
    assert "--enable-tf32-matmul" in argv and "--no-dllm-fdfo" in argv
    old = SGLangBackend().command(
        config(None, "0.5.14", lora_strict_loading=False, enable_fused_qk_norm_rope=False), "h", 1
    )
    assert "--no-lora-strict-loading" in old
    # A plain store-true flag in 0.5.14: False is its default, nothing to send.
    assert not [a for a in old if "fused-qk-norm-rope" in a]
    assert "--no-disable-radix-cache" not in SGLangBackend().command(config(None), "h", 1)
    assert sa.render_flags({"enable_tf32_matmul": False}) == []


# --- item 8 ------------------------------------------------------------------------------------


def test_version_detected_in_the_configured_python(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 0.5.14.post2\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    python_sglang_version.cache_clear()
    cfg = config(None, version=None, python=str(fake))
    version, source = SGLangBackend().version(cfg)
    assert version == (0, 5, 14) and str(fake) in source
    assert "--cuda-graph-max-bs-decode" in SGLangBackend().command(cfg, "h", 1)
    broken = tmp_path / "nopython"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(EngineConfigError, match="not installed in the engine option python="):
        SGLangBackend().version(config(None, version=None, python=str(broken)))


def test_dflash_block_size_allowed_from_0_5_12():
    argv = SGLangBackend().command(config(None, "0.5.12", speculative_dflash_block_size=8), "h", 1)
    assert "--speculative-dflash-block-size" not in argv  # spec-only: stays out of a baseline
    dflash = Drafter("dflash", draft_model="/m/df")
    argv = SGLangBackend().command(
        config(dflash, "0.5.12", speculative_dflash_block_size=8), "h", 1
    )
    assert values(argv, "--speculative-dflash-block-size") == ["8"]
    with pytest.raises(EngineConfigError, match="needs SGLang >= 0.5.12"):
        SGLangBackend().command(config(dflash, "0.5.9", speculative_dflash_block_size=8), "h", 1)


def test_stop_policy_and_flush_path():
    backend = SGLangBackend()
    assert backend.stop_signal_leader_only is True
    assert backend.flush_cache_path(config(None, "0.5.23")) == "/flush_cache?timeout=30"
    assert backend.flush_cache_path(config(None, "0.5.9")) == "/flush_cache"


@pytest.mark.parametrize(
    ("version", "windows", "timeout", "dspark"),
    [
        # sglang-audit-3 s.2, from the wheels: 0.5.10.post1 has the trie flags and no match-window
        # flags (its parser rejects them), and flush_cache(timeout=...) as 0.5.14 and 0.5.16-0.5.22
        # do; the DSPARK member and speculative_dspark_block_size exist from 0.5.16.
        ("0.5.9", True, False, False),
        ("0.5.10", False, True, False),
        ("0.5.14", False, True, False),
        ("0.5.16", False, True, True),
        ("0.5.21", False, True, True),
        ("0.5.23", False, True, True),
    ],
)
def test_release_facts_read_from_the_wheels(version, windows, timeout, dspark):
    facts = sa.facts_for(sa.parse_version(version))
    assert facts.ngram_match_windows is windows
    assert facts.flush_cache_timeout is timeout
    assert ("DSPARK" in facts.algorithms) is dspark
    path = SGLangBackend().flush_cache_path(config(None, version))
    assert path == ("/flush_cache?timeout=30" if timeout else "/flush_cache")
    argv = SGLangBackend().command(config(Drafter("ngram"), version), "h", 1)
    assert ("--speculative-ngram-max-match-window-size" in argv) is windows


def test_the_extra_requires_the_release_ci_drives():
    """pyproject's sglang extra is EXTRA_REQUIREMENT: what a runner installs is what CI parses."""
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert project["project"]["optional-dependencies"]["sglang"] == [sa.EXTRA_REQUIREMENT]
    assert sa.parse_version(sa.EXTRA_REQUIREMENT.split(">=")[1]) == sa.NEWEST_READ
