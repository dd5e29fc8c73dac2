"""The SGLang backend's command lines, pair matching and refusals, per SGLang release.

No SGLang runs here: the golden command lines below are written from the ServerArgs fields of
each release (shared/reference/sglang-api.md s.1, s.5), and ``sglang_version=`` stands in for
the installed version.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_specenergy.engines import sglang_args as sa
from pytest_specenergy.engines.argv import describe_pair_difference
from pytest_specenergy.engines.base import BackendDefaults
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.dry_run import dry_run_lines
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.engines.sglang import detect_hybrid

VERSIONS = ("0.5.9", "0.5.13", "0.5.14", "0.5.23")
DRAFTERS = {
    "ngram": Drafter("ngram"),
    "eagle": Drafter("eagle", draft_model="/models/eagle"),
    "eagle3": Drafter("eagle3", draft_model="/models/eagle3"),
    "nextn": Drafter("nextn"),
    "draft_model": Drafter("draft_model", draft_model="/models/qwen3-0.6b"),
    "dflash": Drafter("dflash", draft_model="/models/dflash"),
    "dspark": Drafter("dspark", draft_model="/models/dspark"),
}
PREFIX = [
    "/py",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "Qwen/Qwen3-8B",
    "--host",
    "127.0.0.1",
    "--port",
    "30000",
]
COMMON_OLD = (
    "--dtype bfloat16 --tp-size 1 --random-seed 0 --attention-backend flashinfer "
    "--max-running-requests 16 --mem-fraction-static 0.8 --cuda-graph-max-bs 16 "
    "--cuda-graph-bs 1 2 3 4 5 6 7 8 10 12 14 16 "
    "--disable-radix-cache --decode-log-interval 1 --log-level warning --enable-metrics "
    "--disable-overlap-schedule"
)
COMMON_NEW = (
    "--dtype bfloat16 --tp-size 1 --random-seed 0 --attention-backend flashinfer "
    "--max-running-requests 16 --mem-fraction-static 0.8 --cuda-graph-max-bs-decode 16 "
    "--cuda-graph-bs-decode 1 2 3 4 5 6 7 8 10 12 14 16 "
    "--disable-radix-cache --decode-log-interval 1 --log-level warning --enable-metrics"
)
COMMON = {"0.5.9": COMMON_OLD, "0.5.13": COMMON_OLD, "0.5.14": COMMON_NEW, "0.5.23": COMMON_NEW}
NGRAM = (
    "--speculative-algorithm NGRAM --speculative-num-draft-tokens 9 "
    "--speculative-ngram-min-bfs-breadth 1 --speculative-ngram-max-bfs-breadth 1"
)
SPEC = {
    ("ngram", "0.5.9"): NGRAM + " --speculative-ngram-min-match-window-size 1 "
    "--speculative-ngram-max-match-window-size 4",
    ("ngram", "new"): NGRAM,
    ("eagle", "all"): "--speculative-algorithm EAGLE --speculative-draft-model-path /models/eagle "
    "--speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4",
    ("eagle3", "all"): "--speculative-algorithm EAGLE3 --speculative-draft-model-path "
    "/models/eagle3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4",
    ("nextn", "all"): "--speculative-algorithm NEXTN --speculative-num-steps 3 "
    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
    ("draft_model", "all"): "--speculative-algorithm STANDALONE --speculative-draft-model-path "
    "/models/qwen3-0.6b --speculative-num-steps 4 "
    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 5",
    ("dflash", "all"): "--speculative-algorithm DFLASH --speculative-draft-model-path "
    "/models/dflash --speculative-num-draft-tokens 16",
    ("dspark", "all"): "--speculative-algorithm DSPARK --speculative-draft-model-path "
    "/models/dspark --speculative-dspark-block-size 6",
}
SUPPORTED = {"dflash": ("0.5.13", "0.5.14", "0.5.23"), "dspark": ("0.5.23",)}  # of VERSIONS


def config(
    drafter: Drafter | None = None,
    version: str = "0.5.23",
    model: str = "Qwen/Qwen3-8B",
    max_running_requests: int | None = 16,
    **options: Any,
) -> EngineConfig:
    return EngineConfig(
        engine="sglang",
        model=model,
        drafter=drafter,
        dtype="bf16",
        max_running_requests=max_running_requests,
        options=EngineConfig.freeze_options(
            {"sglang_version": version, "python": "/py", **options}
        ),
    )


def golden_spec(name: str, version: str) -> str:
    if name == "ngram":
        return SPEC[("ngram", "0.5.9" if version == "0.5.9" else "new")]
    return SPEC[(name, "all")]


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path, monkeypatch):
    # Hybrid detection reads the Hugging Face cache; keep this machine's cache out of it.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_golden_command_lines(name, version):
    if version not in SUPPORTED.get(name, VERSIONS):
        pytest.skip(f"{name} does not exist in {version} (refusal tested below)")
    backend = SGLangBackend()
    spec = backend.command(config(DRAFTERS[name], version), "127.0.0.1", 30000)
    base = backend.command(config(None, version), "127.0.0.1", 30000)
    assert spec == PREFIX + COMMON[version].split() + golden_spec(name, version).split()
    assert base == PREFIX + COMMON[version].split()
    # The twin is derived from the speculative config, never written separately.
    assert backend.command(config(DRAFTERS[name], version).twin(), "127.0.0.1", 30000) == base


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_twin_differs_only_in_speculative_flags(name, version):
    if version not in SUPPORTED.get(name, VERSIONS):
        pytest.skip(f"{name} does not exist in {version}")
    backend = SGLangBackend()
    cfg = config(DRAFTERS[name], version, attention_backend="fa3", page_size=1)
    lines = describe_pair_difference(
        backend.command(cfg, "127.0.0.1", 30001), backend.command(cfg.twin(), "127.0.0.1", 30002)
    )
    assert lines and all(line.startswith("speculative: --speculative-") for line in lines)


def test_pair_difference_flags_a_mismatch():
    spec = [
        "python",
        "-m",
        "sglang.launch_server",
        "--attention-backend",
        "flashinfer",
        "--speculative-algorithm",
        "NGRAM",
        "--disable-overlap-schedule",
        "--port",
        "1",
    ]
    base = ["python", "-m", "sglang.launch_server", "--attention-backend", "fa3", "--port", "2"]
    assert describe_pair_difference(spec, base) == [
        "MISMATCH: --attention-backend flashinfer (speculative) vs fa3 (baseline)",
        "speculative: --speculative-algorithm NGRAM (speculative arm only)",
        "MISMATCH: --disable-overlap-schedule (speculative arm only)",
    ]
    assert describe_pair_difference(["a", "--x", "1"], ["b", "--x", "1"]) == [
        "MISMATCH: program a (speculative) vs b (baseline)"
    ]


def test_check_refuses_a_pair_that_would_differ(monkeypatch):
    backend = SGLangBackend()
    original = SGLangBackend.server_args

    def broken(self, cfg):
        args = original(self, cfg)
        if cfg.drafter is not None:
            args["attention_backend"] = "fa3"  # what SGLang's own default would do for NGRAM
        return args

    monkeypatch.setattr(SGLangBackend, "server_args", broken)
    with pytest.raises(EngineConfigError, match="MISMATCH: --attention-backend"):
        backend.check(config(DRAFTERS["ngram"]))


def test_pinned_defaults_are_the_same_in_both_arms_when_unset():
    args = SGLangBackend().server_args(config(DRAFTERS["ngram"], max_running_requests=None))
    base = SGLangBackend().server_args(config(None, max_running_requests=None))
    for key in (
        "max_running_requests",
        "cuda_graph_max_bs_decode",
        "attention_backend",
        "mem_fraction_static",
        "random_seed",
        "dtype",
        "tp_size",
        "disable_radix_cache",
        "decode_log_interval",
    ):
        assert args[key] == base[key], key
    assert args["max_running_requests"] == 48


def test_environment_records_step_times():
    assert SGLangBackend().environment(config(DRAFTERS["ngram"])) == {
        "SGLANG_RECORD_STEP_TIME": "1"
    }


@pytest.mark.parametrize(
    ("version", "option", "expected"),
    [
        ("0.5.23", {"cuda_graph_max_bs": 8}, ["--cuda-graph-max-bs-decode", "8"]),
        ("0.5.14", {"cuda_graph_max_bs": 8}, ["--cuda-graph-max-bs-decode", "8"]),
        ("0.5.13", {"cuda_graph_max_bs_decode": 8}, ["--cuda-graph-max-bs", "8"]),
        ("0.5.23", {"cuda_graph_bs": [1, 2, 4]}, ["--cuda-graph-bs-decode", "1", "2", "4"]),
        (
            "0.5.9",
            {"speculative_ngram_max_trie_depth": 12},
            ["--speculative-ngram-branch-length", "12"],
        ),
        (
            "0.5.23",
            {"speculative_ngram_branch_length": 12},
            ["--speculative-ngram-max-trie-depth", "12"],
        ),
        (
            "0.5.13",
            {"mamba_radix_cache_strategy": "no_buffer"},
            ["--mamba-scheduler-strategy", "no_buffer"],
        ),
    ],
)
def test_renamed_options_are_spelled_for_the_version(version, option, expected):
    argv = SGLangBackend().command(config(DRAFTERS["ngram"], version, **option), "h", 1)
    text = " ".join(argv)
    assert " ".join(expected) in text
    assert argv.count(expected[0]) == 1
    if sa.parse_version(version) >= (0, 5, 14) and "cuda_graph_max_bs" in option:
        assert "--cuda-graph-max-bs" not in argv  # an argparse error on 0.5.23


def test_disable_cuda_graph_per_version():
    new = SGLangBackend().command(config(None, "0.5.23", disable_cuda_graph=True), "h", 1)
    assert "--disable-decode-cuda-graph" in new and "--disable-prefill-cuda-graph" in new
    assert "--disable-cuda-graph" not in new and "--cuda-graph-max-bs-decode" not in new
    old = SGLangBackend().command(config(None, "0.5.13", disable_cuda_graph=True), "h", 1)
    assert "--disable-cuda-graph" in old and "--cuda-graph-max-bs" not in old


@pytest.mark.parametrize(
    ("version", "option", "message"),
    [
        ("0.5.13", {"cuda_graph_max_bs_prefill": 4}, "needs SGLang >= 0.5.14"),
        ("0.5.23", {"speculative_ngram_max_match_window_size": 4}, "removed in SGLang 0.5.10"),
        ("0.5.23", {"port": 1}, "set by the plugin"),
        # A list value that smuggles in a second --host: SGLang takes the last, off loopback.
        (
            "0.5.23",
            {"cuda_graph_bs": [1, "--host", "0.0.0.0"]},
            "holds '--host', which the command line would read",
        ),
        ("0.5.23", {"tokenizer_path": "-x"}, "holds '-x'"),
        ("0.5.23", {"dist_init_addr": "0.0.0.0:5000"}, "is not a loopback address"),
        ("0.5.23", {"cuda_graph_max_bs": 8, "cuda_graph_max_bs_decode": 16}, "twice"),
    ],
)
def test_options_impossible_for_the_version_are_refused(version, option, message):
    with pytest.raises(EngineConfigError, match=message):
        SGLangBackend().check(config(None, version, **option))


def test_user_options_override_pins_in_both_arms():
    cfg = config(DRAFTERS["eagle3"], attention_backend="fa3", mem_fraction_static=0.7)
    for arm in (cfg, cfg.twin()):
        argv = SGLangBackend().command(arm, "h", 1)
        assert argv.count("--attention-backend") == 1
        assert argv[argv.index("--attention-backend") + 1] == "fa3"
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.7"


def test_speculative_options_stay_out_of_the_twin_and_dicts_become_json():
    cfg = config(
        DRAFTERS["ngram"],
        speculative_ngram_max_trie_depth=12,
        cuda_graph_config={"decode": {"backend": "full", "max_bs": 16}},
    )
    spec = SGLangBackend().command(cfg, "h", 1)
    base = SGLangBackend().command(cfg.twin(), "h", 1)
    assert "--speculative-ngram-max-trie-depth" in spec
    assert "--speculative-ngram-max-trie-depth" not in base
    value = base[base.index("--cuda-graph-config") + 1]
    assert json.loads(value) == {"decode": {"backend": "full", "max_bs": 16}}


def test_unknown_option_is_refused_with_a_suggestion():
    with pytest.raises(
        EngineConfigError, match=r"atention_backend \(did you mean attention_backend"
    ):
        SGLangBackend().check(config(None, atention_backend="fa3"))
    SGLangBackend().check(config(None, enable_deterministic_inference=True))  # a real field


def test_unknown_option_checked_against_installed_sglang():
    fields = pytest.importorskip("sglang.srt.server_args") and sa.installed_server_args_fields()
    if fields is None or sa.installed_version() is None:
        pytest.skip("sglang's ServerArgs is not importable here")
    cfg = EngineConfig(
        "sglang", "Qwen/Qwen3-8B", options=EngineConfig.freeze_options({"not_a_server_arg": 1})
    )
    with pytest.raises(EngineConfigError, match="installed sglang"):
        SGLangBackend().check(cfg)


def test_option_overriding_the_drafter_is_refused():
    with pytest.raises(EngineConfigError, match="set it on Drafter"):
        SGLangBackend().check(config(DRAFTERS["ngram"], speculative_num_draft_tokens=4))


def test_ngram_on_hybrid_is_refused_below_0_5_14_and_accepted_from_it():
    with pytest.raises(EngineConfigError, match="needs SGLang >= 0.5.14") as info:
        SGLangBackend().check(config(DRAFTERS["ngram"], "0.5.13", hybrid=True))
    assert (
        "0.5.14" in str(info.value) and "#26351" in str(info.value) and "Mamba" in str(info.value)
    )
    SGLangBackend().check(config(DRAFTERS["ngram"], "0.5.14", hybrid=True))
    # Only NGRAM lacked the state commit; EAGLE workers always had it.
    # (Qwen/Qwen3-8B has no MTP layers of its own: NEXTN needs its head as draft_model.)
    SGLangBackend().check(
        config(Drafter("nextn", draft_model="org/mtp-head"), "0.5.13", hybrid=True)
    )


@pytest.mark.parametrize(
    ("model_type", "arch", "hybrid"),
    [
        ("qwen3_next", "Qwen3NextForCausalLM", True),
        ("nemotron_h", "NemotronHForCausalLM", True),
        ("something", "Qwen3_5MoeForConditionalGeneration", True),
        ("qwen3", "Qwen3ForCausalLM", False),
    ],
)
def test_hybrid_detected_from_a_local_checkpoint(tmp_path, model_type, arch, hybrid):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": model_type, "architectures": [arch]})
    )
    cfg = config(DRAFTERS["ngram"], "0.5.9", model=str(tmp_path))
    if hybrid:
        with pytest.raises(EngineConfigError, match="hybrid model"):
            SGLangBackend().check(cfg)
    else:
        SGLangBackend().check(cfg)


def test_hybrid_detected_from_hf_cache_and_name(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--plain-7b" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "mamba2"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert detect_hybrid("acme/plain-7b")[0] is True
    assert detect_hybrid("Qwen/Qwen3-Next-80B-A3B-Instruct")[0] is True
    assert detect_hybrid("Qwen/Qwen3.5-27B")[0] is True
    assert detect_hybrid("Qwen/Qwen3-8B")[0] is False
    assert detect_hybrid("Qwen/Qwen3-Next-80B-A3B-Instruct", option=False) == (
        False,
        "engine option hybrid=False",
    )
    SGLangBackend().check(
        config(DRAFTERS["ngram"], "0.5.13", model="Qwen/Qwen3-Next-80B-A3B-Instruct", hybrid=False)
    )


@pytest.mark.parametrize(
    ("name", "version"), [("dflash", "0.5.9"), ("dspark", "0.5.15"), ("dspark", "0.5.13")]
)
def test_algorithm_missing_from_the_version_is_refused(tmp_path, name, version):
    drafter = Drafter(name, draft_model=str(tmp_path))
    with pytest.raises(EngineConfigError, match=f"SGLang {version} has no {name.upper()}"):
        SGLangBackend().check(config(drafter, version))
    SGLangBackend().check(config(drafter, "0.5.23"))


def test_missing_draft_model_is_refused(tmp_path):
    with pytest.raises(EngineConfigError, match="model path .* does not exist"):
        SGLangBackend().check(config(None, model=str(tmp_path / "no-such-checkpoint")))
    with pytest.raises(EngineConfigError, match="does not exist"):
        SGLangBackend().check(config(Drafter("eagle3", draft_model=str(tmp_path / "nope"))))
    with pytest.raises(EngineConfigError, match="built-in tiny model"):
        SGLangBackend().check(config(Drafter("draft_model", draft_model="tiny:dense-draft")))
    SGLangBackend().check(config(Drafter("eagle3", draft_model=str(tmp_path))))


def test_chain_eagle_with_mismatched_draft_tokens_is_refused(tmp_path):
    bad = Drafter("eagle3", draft_model=str(tmp_path), num_steps=3, num_draft_tokens=5)
    with pytest.raises(EngineConfigError, match="must equal num_steps"):
        SGLangBackend().check(config(bad))


def test_ngram_tree_with_pages_needs_flashinfer():
    tree = Drafter("ngram", max_bfs_breadth=4)
    with pytest.raises(EngineConfigError, match="flashinfer"):
        SGLangBackend().check(config(tree, page_size=16, attention_backend="fa3"))
    SGLangBackend().check(config(tree, page_size=16))


def test_bad_versions_and_dtypes_are_refused(monkeypatch):
    with pytest.raises(EngineConfigError, match="older than 0.5.9"):
        SGLangBackend().check(config(None, "0.5.8"))
    with pytest.raises(EngineConfigError, match="cannot read SGLang version"):
        SGLangBackend().check(config(None, "latest"))
    with pytest.raises(EngineConfigError, match="CUDA_VISIBLE_DEVICES"):
        SGLangBackend().check(
            EngineConfig(
                "sglang", "Qwen/Qwen3-8B", device="cuda:1", options=(("sglang_version", "0.5.23"),)
            )
        )
    with pytest.raises(EngineConfigError, match="not an SGLang dtype"):
        SGLangBackend().check(
            EngineConfig(
                "sglang", "Qwen/Qwen3-8B", dtype="int3", options=(("sglang_version", "0.5.23"),)
            )
        )
    monkeypatch.setattr(sa, "installed_version", lambda: None)
    with pytest.raises(EngineConfigError, match="sglang_version='0.5.23'"):
        SGLangBackend().check(EngineConfig("sglang", "Qwen/Qwen3-8B"))


def test_versions_parse():
    assert sa.parse_version("0.5.14.post1") == (0, 5, 14)
    assert sa.parse_version("0.5.10rc0") == (0, 5, 10)
    assert sa.facts_for((0, 5, 13)).cuda_graph_max_bs_field == "cuda_graph_max_bs"
    assert sa.facts_for((0, 5, 22)).legacy_cuda_graph_alias is True
    assert sa.facts_for((0, 5, 23)).legacy_cuda_graph_alias is False


def test_dry_run_lines_for_sglang():
    lines = dry_run_lines(config(DRAFTERS["ngram"], "0.5.23"), SGLangBackend())
    assert lines[0] == "# sglang:Qwen/Qwen3-8B[ngram] on the sglang engine"
    assert any(
        line.startswith("speculative: SGLANG_RECORD_STEP_TIME=1 /py -m sglang.launch_server")
        for line in lines
    )
    assert any(line.startswith("baseline: ") for line in lines)
    assert all("MISMATCH" not in line and "REFUSED" not in line for line in lines)
    refused = dry_run_lines(config(DRAFTERS["ngram"], "0.5.13", hybrid=True), SGLangBackend())
    assert any(line.startswith("# REFUSED: NGRAM on the hybrid model") for line in refused)


class _StubBackend(BackendDefaults):
    """Any backend with the EngineBackend methods (the reference server's has the same shape)."""

    name = "stub"
    startup_timeout_s = 1.0

    def drafters(self):
        return ("ngram",)

    def check(self, config):
        pass

    def command(self, config, host, port):
        argv = ["python", "-m", "stub", "--model", config.model, "--port", str(port)]
        if config.drafter is None:
            return argv + ["--drafter", "none"]
        return argv + [
            "--drafter",
            config.drafter.name,
            "--num-draft-tokens",
            str(config.drafter.num_draft_tokens),
        ]

    def environment(self, config):
        return {}


def test_dry_run_lines_take_any_backend():
    cfg = EngineConfig("stub", "tiny:dense", drafter=Drafter("ngram", num_draft_tokens=4))
    lines = dry_run_lines(cfg, _StubBackend())
    assert (
        "speculative: python -m stub --model tiny:dense --port 30000 --drafter ngram "
        "--num-draft-tokens 4" in lines
    )
    assert "# differs: speculative: --drafter ngram (speculative) vs none (baseline)" in lines
    assert dry_run_lines(cfg.twin(), _StubBackend())[-1].startswith("baseline: python -m stub")


def test_twin_check_ignores_the_decode_capture_list_when_decode_graphs_are_off():
    # SGLang 0.5.23 resolves a finer decode list for a spec engine even with decode graphs
    # disabled (tests/sglang conformance, simulated H200); nothing is captured, so a graphs-off
    # pair is still a twin. With graphs on, the same difference is a real one.
    from pytest_specenergy.engines.sglang import resolved_args_difference

    def info(bs, backend):
        return {
            "cuda_graph_config": {
                "decode": {"backend": backend, "max_bs": 48, "bs": bs},
                "prefill": {"backend": backend},
            }
        }

    spec_list, base_list = [1, 2, 3, 4, 6, 8], [1, 2, 4, 8]
    assert resolved_args_difference(info(spec_list, "disabled"), info(base_list, "disabled")) == []
    [line] = resolved_args_difference(info(spec_list, "full"), info(base_list, "full"))
    assert line.startswith("cuda_graph_config:")
    old = {"disable_cuda_graph": True, "cuda_graph_bs": spec_list}
    assert resolved_args_difference(old, dict(old, cuda_graph_bs=base_list)) == []
    assert resolved_args_difference(
        dict(old, disable_cuda_graph=False),
        dict(old, disable_cuda_graph=False, cuda_graph_bs=base_list),
    )
    # One arm with graphs off is not excused (the CUDA-graph check names that case too).
    assert resolved_args_difference(info(spec_list, "disabled"), info(base_list, "full"))


# --- payloads captured from a live SGLang 0.5.23 CPU server (tests/data/sglang/live-0.5.23) ---


def _live(name: str) -> Any:
    from pathlib import Path

    return json.loads(
        (Path(__file__).resolve().parents[2] / "data" / "sglang" / "live-0.5.23" / name).read_text()
    )


def test_captured_generate_batch_parses_as_a_baseline_window():
    from pytest_specenergy.engines.meta_info import parse_meta_info

    request = _live("generate_text_batch.request.json")
    answers = _live("generate_text_batch.json")
    assert len(answers) == len(request["text"])  # a list, in input order
    for rid, answer in zip(request["rid"], answers):
        counters = parse_meta_info(answer["meta_info"])
        assert counters.rid == rid and counters.completion_tokens == 32 == len(answer["output_ids"])
        assert (counters.finish_type, counters.finish_detail) == ("length", 32)
        assert counters.spec_verify_ct is None and counters.correct_drafts_histogram is None
        assert counters.retractions == 0 and counters.problems() == []
    prefill = [parse_meta_info(a["meta_info"]) for a in _live("generate_prefill_batch.json")]
    assert [c.completion_tokens for c in prefill] == [1, 1, 1, 1]


def test_captured_server_info_step_records_and_resolved_args():
    from pytest_specenergy.engines.meta_info import concurrency_between
    from pytest_specenergy.engines.meta_info import parse_concurrency
    from pytest_specenergy.engines.sglang import resolved_args_difference

    before, after = _live("server_info_before.json"), _live("server_info_after.json")
    # 4 prompts x 32 tokens at batch 4: the first token comes from prefill, 31 decode steps.
    assert concurrency_between(before, after)["steps_by_running"] == {4: 31}
    assert parse_concurrency(after)["max_running_requests"] == 8
    assert parse_concurrency(_live("no_step_time/server_info_after.json"))["steps"] is None
    # The twin check on a real payload: itself is a twin; another port is still one; a real
    # resolved difference (the decode capture list, graphs on) is named.
    assert after["version"] == "0.5.23" and after["device"] == "cpu"
    assert resolved_args_difference(after, dict(after, port=1, nccl_port=2)) == []
    config = after["cuda_graph_config"]
    finer = dict(
        after, cuda_graph_config={**config, "decode": {**config["decode"], "bs": [1, 2, 3]}}
    )
    graphs_on = config["decode"]["backend"] != "disabled" and not after.get(
        "disable_decode_cuda_graph"
    )
    assert bool(resolved_args_difference(finer, after)) == graphs_on


def test_a_live_speculative_answer_adds_exactly_sglangs_six_spec_keys():
    # generate_spec_0.5.23.json is captured from a live SGLang 0.5.23 NGRAM engine
    # (dev/sglang_capture_spec.py): beside the keys every live answer has, SGLang sends these six
    # per request, and no per-step statistics (no speculative_decoding_stats, verify_lengths or
    # accept_lengths in 0.5.23). The hand-made server_info_0.5.23.json uses only real keys.
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "data" / "sglang"
    real_meta = set(_live("generate_text_batch.json")[0]["meta_info"])
    spec = json.loads((data / "generate_spec_0.5.23.json").read_text())[0]["meta_info"]
    assert set(spec) - real_meta == {
        "spec_verify_ct",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_correct_drafts_histogram",
        "spec_accept_length",
        "spec_accept_rate",
    }
    assert real_meta <= set(spec)
    real_info = _live("server_info_after.json")
    hand_info = json.loads((data / "server_info_0.5.23.json").read_text())
    assert set(hand_info) - set(real_info) == set()
    assert set(hand_info["internal_states"][0]) - set(real_info["internal_states"][0]) - set(
        real_info
    ) <= {"avg_spec_accept_length"}
    # ...and the live speculative engine's internal state does report it
    spec_info = _live("spec/server_info_spec_after.json")
    assert spec_info["internal_states"][0]["avg_spec_accept_length"] > 1


def test_overlap_scheduler_off_in_both_arms_on_cpu():
    import dataclasses

    # SGLang 0.5.23 disables the overlap scheduler for a speculative engine on CPU
    # (_disable_overlap_schedule_for_cpu) but not for its baseline: the live CPU twin check
    # (tests/sglang/test_sglang_live.py) found disable_overlap_schedule True vs False.
    for drafter in (None, Drafter("ngram")):
        cpu_config = dataclasses.replace(config(drafter, "0.5.23"), device="cpu")
        cpu = SGLangBackend().command(cpu_config, "h", 1)
        assert "--disable-overlap-schedule" in cpu
    gpu = SGLangBackend().command(config(Drafter("ngram"), "0.5.23"), "h", 1)
    assert "--disable-overlap-schedule" not in gpu


def test_the_engines_name_lists_are_what_the_backends_implement():
    """The markers check drafters and dtypes against engines/base.py's lists at collection; each
    backend must implement exactly those."""
    from pytest_specenergy.engines import sglang
    from pytest_specenergy.engines.base import ENGINE_DRAFTERS
    from pytest_specenergy.engines.base import ENGINE_DTYPES
    from pytest_specenergy.engines.refserver import ReferenceBackend

    assert set(ENGINE_DRAFTERS["sglang"]) == {*sglang.ALGORITHMS, "none"}
    assert set(ENGINE_DTYPES["sglang"]) == set(sglang._DTYPES)
    assert SGLangBackend().drafters() == ENGINE_DRAFTERS["sglang"]
    assert ReferenceBackend().drafters() == ENGINE_DRAFTERS["reference"]
