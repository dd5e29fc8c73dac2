"""The SGLang backend: ``python -m sglang.launch_server ...`` for one engine config. Both arms are
built from the same config, with everything SGLang would resolve differently for a speculative
engine pinned in both; see docs/engines.md#the-sglang-backend."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from typing import Mapping

import pytest_specenergy.engines.sglang_args as sa
from pytest_specenergy.engines.argv import describe_pair_difference
from pytest_specenergy.engines.base import ENGINE_DRAFTERS
from pytest_specenergy.engines.base import ENGINE_DTYPES
from pytest_specenergy.engines.base import BackendDefaults
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.checkpoints import CheckpointFetchError
from pytest_specenergy.engines.checkpoints import ensure_fetched
from pytest_specenergy.engines.checkpoints import local_path
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter

#: Our drafter name -> SGLang ``speculative_algorithm``.
ALGORITHMS: dict[str, str] = {
    "ngram": "NGRAM",
    "draft_model": "STANDALONE",
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
    "nextn": "NEXTN",
    "dflash": "DFLASH",
    "dspark": "DSPARK",
}
# flashinfer runs chains and trees on Hopper and Blackwell alike, so one value fits both arms
# whatever the drafter's topk; it is also what SGLang's own EAGLE3 parity test uses.
DEFAULT_ATTENTION_BACKEND = "flashinfer"
#: What a spec engine resolves to when unset; pinning it in the baseline too keeps them equal.
DEFAULT_MAX_RUNNING_REQUESTS = 48
DEFAULT_MEM_FRACTION_STATIC = 0.80
DEFAULT_TP_SIZE = 1
#: ``--log-level`` in both arms: with ``decode_log_interval=1`` SGLang writes one INFO line per
#: decode/verify step, and the baseline runs more steps than the speculative arm.
DEFAULT_LOG_LEVEL = "warning"
#: Seconds ``/flush_cache?timeout=`` waits for the scheduler to go idle (0.5.23+).
FLUSH_CACHE_TIMEOUT_S = 30
_DTYPES = {
    d: {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(d, d)
    for d in ENGINE_DTYPES["sglang"]
}
_TREE_DRAFTERS = ("eagle", "eagle3", "nextn")
#: Architectures whose checkpoint carries its own MTP (NEXTN) layers, so SGLang fills
#: ``speculative_draft_model_path`` with the target itself (0.5.9 ``server_args.py``, 0.5.23
#: ``speculative_hook.py:1120-1150``). Any other target run as NEXTN without ``draft_model``
#: resolves to EAGLE with no draft checkpoint at all.
MTP_IN_TARGET_0_5_9 = frozenset(
    {
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "GlmMoeDsaForCausalLM",
        "BailingMoeForCausalLM",
        "BailingMoeV2ForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
    }
)
MTP_IN_TARGET_0_5_23 = MTP_IN_TARGET_0_5_9 | {
    "DeepseekV4ForCausalLM",
    "HYV3ForCausalLM",
    "HYV4ForCausalLM",
    "Qwen4ExpForConditionalGeneration",
}

# Hybrid (linear-attention / state-space) checkpoints: SGLang's hybrid_arch.py config classes.
HYBRID_MODEL_TYPES = frozenset(
    {
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_text",
        "qwen3_5_moe",
        "qwen3_5_moe_text",
        "mamba",
        "mamba2",
        "falcon_mamba",
        "falcon_h1",
        "nemotron_h",
        "nemotron_h_puzzle",
        "jamba",
        "zamba2",
        "bamba",
        "granitemoehybrid",
        "kimi_linear",
        "bailing_hybrid",
        "minicpm_sala",
        "lfm2",
        "lfm2_moe",
        "jet_nemotron",
        "intern_s2_preview",
        "zaya",
        "plamo2",
        "glm5_next",
    }
)
_HYBRID_ARCH_PREFIXES = (
    "Qwen3Next",
    "Qwen3_5",
    "Mamba",
    "FalconMamba",
    "FalconH1",
    "NemotronH",
    "Jamba",
    "Zamba",
    "Bamba",
    "GraniteMoeHybrid",
    "KimiLinear",
    "BailingHybrid",
    "Lfm2",
    "JetNemotron",
    "Plamo2",
)
_HYBRID_NAME = re.compile(
    r"qwen3[-_]?next|qwen3\.[56](?!\d)|mamba|nemotron[-_]h(?![a-z])|falcon[-_]h1|jamba|zamba"
    r"|bamba|kimi[-_]linear|lfm2",
    re.IGNORECASE,
)


class SGLangBackend(BackendDefaults):
    """Launches real SGLang servers (GPU); see the module docstring for what is pinned."""

    name = "sglang"
    # Loading a large checkpoint and capturing CUDA graphs for both phases takes minutes.
    startup_timeout_s = 1800.0
    #: Stop policy: SIGTERM to the group kills the scheduler first, so the SGLang parent logs a
    #: crash and sleeps 5 s before cleaning up; SIGTERM to the leader alone drains gracefully. So:
    #: SIGTERM the leader, wait, then the group.
    stop_signal_leader_only = True

    def drafters(self) -> tuple[str, ...]:
        """Drafter names this backend maps onto SGLang algorithms, and the A/A control."""
        return ENGINE_DRAFTERS["sglang"]

    def version(self, config: EngineConfig) -> tuple[sa.Version, str]:
        """The SGLang version the command is built for, and where that came from."""
        override = config.option("sglang_version")
        if override is not None:
            return sa.parse_version(str(override)), "engine option sglang_version"
        python = config.option("python")
        if python is not None:
            # The server runs under that interpreter, so its sglang is the one that counts.
            found = python_sglang_version(str(python))
            if found is None:
                raise EngineConfigError(
                    f"SGLang is not installed in the engine option python={python!s} (asking it "
                    "for importlib.metadata.version('sglang') failed), so its command line cannot "
                    "be built; install sglang>=0.5.9,<0.6 there, or set the engine option "
                    "sglang_version='0.5.23' on pytest.mark.model(...)"
                )
            return sa.parse_version(found), f"installed in {python}"
        installed = sa.installed_version()
        if installed is None:
            raise EngineConfigError(
                "SGLang is not installed in this Python, so its command line cannot be built; "
                f"install {sa.EXTRA_REQUIREMENT} on the GPU runner (pip install "
                "'pytest-specenergy[sglang]'), or set the engine option sglang_version='0.5.23' "
                "on pytest.mark.model(...) for a dry run"
            )
        return sa.parse_version(installed), "installed"

    def flush_cache_path(self, config: EngineConfig) -> str:
        """The ``/flush_cache`` request path: 0.5.23 waits for idle with ``?timeout=S``."""
        try:
            waits = sa.facts_for(self.version(config)[0]).flush_cache_timeout
        except EngineConfigError:
            waits = False
        return f"/flush_cache?timeout={FLUSH_CACHE_TIMEOUT_S}" if waits else "/flush_cache"

    def special_token_ids(self, config: EngineConfig) -> tuple[int, ...]:
        """Special token ids from the target's checkpoint, for leak detection: SGLang's
        ``/server_info`` has none."""
        return checkpoint_special_token_ids(config.model)

    def check(self, config: EngineConfig) -> None:
        """Refuse configs SGLang would reject, silently change, or run incorrectly."""
        version, source = self.version(config)
        if version < sa.MIN_VERSION:
            raise EngineConfigError(
                f"SGLang {sa.format_version(version)} ({source}) is older than "
                f"{sa.format_version(sa.MIN_VERSION)}, the oldest release this plugin drives; "
                "upgrade sglang"
            )
        facts = sa.facts_for(version)
        user = sa.translate_options(dict(config.options), facts)
        fields = sa.installed_server_args_fields() if source == "installed" else None
        where = f"checked against the installed sglang {sa.format_version(version)}"
        if fields is None:
            fields, where = sa.KNOWN_FIELDS, "checked against the fields of SGLang 0.5.9-0.5.23"
        sa.validate_fields(list(user), fields, where)
        _check_model_path("model", config.model)
        _dtype(config.dtype)
        if ":" in config.device:
            raise EngineConfigError(
                f"device {config.device!r}: SGLang takes a device type (cuda), not an index; "
                "choose GPUs with CUDA_VISIBLE_DEVICES (one pytest-xdist worker per GPU)"
            )
        if config.drafter is not None:
            self._check_drafter(config, config.drafter, facts, user)
            spec, base = (
                self.command(config, "127.0.0.1", 30000),
                self.command(config.twin(), "127.0.0.1", 30000),
            )
            problems = [
                line for line in describe_pair_difference(spec, base) if line.startswith("MISMATCH")
            ]
            if problems:
                raise EngineConfigError(
                    "the speculative engine and its baseline twin would differ in more than the "
                    "speculative flags: " + "; ".join(problems)
                )

    def _check_drafter(
        self, config: EngineConfig, drafter: Drafter, facts: sa.VersionFacts, user: dict[str, Any]
    ) -> None:
        version = sa.format_version(facts.version)
        if drafter.name == "none":
            return  # the A/A control: no speculative flag at all, nothing to check
        algorithm = ALGORITHMS.get(drafter.name)
        if algorithm is None:
            raise EngineConfigError(
                f"drafter {drafter.name!r} has no SGLang algorithm; expected one of "
                f"{', '.join(ALGORITHMS)}"
            )
        if algorithm not in facts.algorithms:
            since = sa.format_version(sa.ALGORITHM_SINCE[algorithm])
            raise EngineConfigError(
                f"SGLang {version} has no {algorithm} speculative algorithm (drafter "
                f"{drafter.name!r}); the first release known to have it is {since} - upgrade "
                f"sglang, or use one of {', '.join(sorted(facts.algorithms))}"
            )
        # Drafter(...) itself refuses a scheme whose checkpoint is required without one
        if drafter.draft_model:
            _check_model_path("draft model", drafter.draft_model)
        elif drafter.name == "nextn":
            _check_mtp_in_target(config.model, facts.version)
        clash = sorted(k for k in user if k in _speculative_args(drafter, facts))
        if clash:
            raise EngineConfigError(
                f"engine option(s) {', '.join(clash)} would override the drafter's own setting; "
                f"set it on Drafter({drafter.name!r}, ...) instead"
            )
        if (
            drafter.name in _TREE_DRAFTERS
            and drafter.get("topk") == 1
            and drafter.num_draft_tokens != drafter.get("num_steps")
        ):
            raise EngineConfigError(
                f"Drafter({drafter.name!r}) with topk=1 proposes one token per step, so "
                f"num_draft_tokens must equal num_steps ({drafter.get('num_steps')}), not "
                f"{drafter.num_draft_tokens}; SGLang would silently reset it"
            )
        if drafter.name != "ngram":
            return
        hybrid, why = detect_hybrid(config.model, config.option("hybrid"))
        if hybrid and not facts.ngram_commits_hybrid_state:
            raise EngineConfigError(
                f"NGRAM on the hybrid model {config.model} ({why}) needs SGLang >= 0.5.14; "
                f"{version} never commits the Mamba/GDN recurrent state after NGRAM verify (fixed "
                "by PR #26351), so outputs are corrupted while acceptance looks healthy. Upgrade "
                "sglang, or pass hybrid=False to pytest.mark.model if the model has no "
                "linear-attention or state-space layers"
            )
        backend = user.get("attention_backend", DEFAULT_ATTENTION_BACKEND)
        page = user.get("page_size")
        if drafter.get("max_bfs_breadth") > 1 and page not in (None, 1) and backend != "flashinfer":
            raise EngineConfigError(
                f"NGRAM with max_bfs_breadth={drafter.get('max_bfs_breadth')} (a draft tree) and "
                f"page_size={page} runs only on attention_backend='flashinfer', not {backend!r}; "
                "SGLang rejects it (sglang-api.md s.1.2)"
            )

    def server_args(self, config: EngineConfig) -> dict[str, Any]:
        """ServerArgs field -> value for ``config``: pinned, then speculative, then user options."""
        facts = sa.facts_for(self.version(config)[0])
        running = config.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS
        cap_field, list_field = facts.cuda_graph_max_bs_field, facts.cuda_graph_bs_field
        args: dict[str, Any] = {
            "dtype": _dtype(config.dtype),
            "tp_size": DEFAULT_TP_SIZE,
            "random_seed": config.seed,
            "attention_backend": DEFAULT_ATTENTION_BACKEND,
            "max_running_requests": running,
            "mem_fraction_static": DEFAULT_MEM_FRACTION_STATIC,
            # Capture decode graphs for every batch the engine may run, in both arms; the
            # capture list itself is pinned below, once the cap is final.
            cap_field: running,
            list_field: None,  # placeholder, so the list renders next to the cap
            "disable_radix_cache": True,
            # step_time_dict gets one entry per decode_log_interval steps (SGLang appends only at
            # the logging tick, metrics_reporter.py:933-955), so per-step concurrency needs 1; the
            # log level cuts the per-step INFO line.
            "decode_log_interval": 1,
            "log_level": DEFAULT_LOG_LEVEL,
            # Each answer's time stats (forward_entry_time, one stamp per prefill forward;
            # prefill_finished_time; request_finished_ts): the prefill-only twin replays SGLang's
            # own forwards and TBT excludes queue time (measure/prefill_groups.py, issue 41).
            "enable_metrics": True,
        }
        if facts.spec_disables_overlap or config.device == "cpu":
            # SGLang turns the overlap scheduler off for a speculative engine below 0.5.14, and on
            # CPU in 0.5.23 (speculative_hook.py:66-75, _disable_overlap_schedule_for_cpu; seen
            # live): off in both arms, so that the baseline stays the spec engine's twin.
            args["disable_overlap_schedule"] = True
        if config.device not in ("auto", ""):
            args["device"] = config.device
        if config.drafter is not None:
            args.update(_speculative_args(config.drafter, facts))
        user = sa.translate_options(dict(config.options), facts)
        if config.drafter is None:
            # Spec-only tuning (e.g. speculative_ngram_max_trie_depth) means nothing to the twin.
            user = {k: v for k, v in user.items() if not k.startswith("speculative_")}
        args.update(user)
        if args.get("disable_cuda_graph") or args.get("disable_decode_cuda_graph"):
            args.pop(cap_field, None)
            args.pop(list_field, None)
        elif list_field in user:
            # The user's list wins; SGLang (0.5.9) resets the cap to its largest entry anyway.
            if cap_field not in user and user[list_field]:
                args[cap_field] = max(int(b) for b in user[list_field])
        else:
            args[list_field] = decode_cuda_graph_batch_sizes(
                int(args[cap_field]), padding=not args.get("disable_cuda_graph_padding")
            )
        return args

    def command(self, config: EngineConfig, host: str, port: int) -> list[str]:
        """The server argv; the twin's differs only in ``--speculative-*`` flags."""
        facts = sa.facts_for(self.version(config)[0])
        python = config.option("python")
        return [
            str(sys.executable if python is None else python),
            "-m",
            "sglang.launch_server",
            "--model-path",
            local_path(config.model),
            "--host",
            host,
            "--port",
            str(port),
            *sa.render_flags(self.server_args(config), facts.negatable_fields),
        ]

    def environment(self, config: EngineConfig) -> dict[str, str]:
        """Record per-step running batch sizes so actual concurrency can be read back."""
        return {"SGLANG_RECORD_STEP_TIME": "1"}

    def twin_differences(
        self, spec_info: Mapping[str, Any], base_info: Mapping[str, Any]
    ) -> list[str]:
        """The arms' resolved settings that differ outside the speculative fields: SGLang resolves
        many itself (CUDA-graph sizes, chunked prefill, memory fraction), and the twin must match in
        all."""
        return resolved_args_difference(spec_info, base_info)

    def dry_run_notes(self, config: EngineConfig) -> list[str]:
        """What a reader of the dry-run lines should know about this version and drafter."""
        try:
            version, source = self.version(config)
        except EngineConfigError as exc:
            return [f"sglang version unknown: {exc}"]
        facts = sa.facts_for(version)
        notes = [
            f"sglang {sa.format_version(version)} ({source}); CUDA-graph cap flag "
            f"{sa.flag_for(facts.cuda_graph_max_bs_field)}"
        ]
        if version > sa.NEWEST_READ:
            notes.append(
                f"newer than {sa.format_version(sa.NEWEST_READ)}, the newest release "
                "read; its command-line facts are assumed"
            )
        if facts.spec_disables_overlap or config.device == "cpu":
            notes.append(
                "overlap scheduler off in both arms: this release (or the CPU device) "
                "turns it off for speculative engines"
            )
        if (
            config.drafter is not None
            and config.drafter.name == "ngram"
            and not facts.ngram_match_windows
        ):
            notes.append(
                "ngram min/max_match_window apply to the reference server only; "
                "SGLang >= 0.5.10 matches against a trie (speculative_ngram_max_trie_depth)"
            )
        return notes


def decode_cuda_graph_batch_sizes(cap: int, padding: bool = True) -> list[int]:
    """The decode CUDA-graph capture list pinned in both arms: SGLang's finer speculative list, or
    with ``padding=False`` every size up to the cap; see docs/engines.md#the-sglang-backend."""
    if cap < 1:
        raise EngineConfigError(f"CUDA-graph batch cap must be >= 1, got {cap}")
    if not padding:
        return list(range(1, cap + 1))
    sizes = (
        list(range(1, 9))
        + list(range(10, 33, 2))
        + list(range(40, 65, 4))
        + list(range(72, 257, 8))
        + list(range(272, cap + 1, 16))
    )
    sizes = [b for b in sizes if b <= cap]
    if cap not in sizes:
        sizes.append(cap)
    return sizes


@functools.lru_cache(maxsize=16)
def python_sglang_version(python: str) -> str | None:
    """``importlib.metadata.version('sglang')`` as seen by the interpreter ``python``, or None."""
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if done.returncode == 0 and lines else None


#: ``/server_info`` keys the twin check skips, each with why it is not configuration; all else but
#: ``speculative_*`` is compared. How the list was derived from real SGLang: docs/engines.md#the-sglang-backend.
RESOLVED_IGNORED: dict[str, str] = {
    # Not ServerArgs fields: facts about this one start.
    "launch_command": "0.5.23: the argv as given, with this server's --port and the arm's own "
    "--speculative-* flags; the value every flag resolved to is compared as its own field",
    "startup_time": "0.5.23: seconds each start-up phase took (weights, KV allocation, graphs): a "
    "timing of this start, different every time",
    "internal_states": "live scheduler state per DP rank (throughput, memory use, step records; "
    "read separately for concurrency); its resolved fields repeat the top level",
    "kv_events": "0.5.23: the KV-event publisher's endpoint (a port) or None; its settings "
    "(kv_events_config) are compared",
    "kv_event_sources": "0.5.23, with grpc_port: this worker's KV-event endpoints",
    "hicache_object_layout": "0.5.23: a report of this process's hierarchical-cache storage pools, "
    "derived from enable_hierarchical_cache and the compared hicache_* fields",
    "tp_rank": "0.5.9, remote-instance weight loading only: the answering rank",
    "remote_instance_transfer_engine_session_id": "0.5.9, remote-instance weight loading only: "
    "this process's transfer-engine session",
    "remote_instance_transfer_engine_weights_info_dict": "0.5.9, remote-instance weight loading "
    "only: addresses of this process's weights",
    # ServerArgs fields that are this server's address or a per-process channel.
    "host": "the address this server listens on",
    "port": "the port this server listens on (free port per start)",
    "nccl_port": "resolved to a free port per start when unset",
    "dist_init_addr": "multi-node rendezvous address of this server's processes",
    **dict.fromkeys(
        (
            "disaggregation_bootstrap_port",
            "engine_info_bootstrap_port",
            "grpc_port",
            "encoder_bootstrap_port",
            "gated_launch_port",
            "smg_http_sidecar_port",
            "grpc_http_sidecar_port",
        ),
        "a port of this server",
    ),
    "forward_pass_metrics_ipc_name": "an IPC socket name chosen per process",
}

#: Why a speculative arm's KV pool can hold fewer tokens than its twin's, and the fix.
CAPACITY_HINT = (
    "the arms' KV pools hold different numbers of tokens: for EAGLE, EAGLE3, NEXTN and "
    "STANDALONE, SGLang 0.5.23 sizes the speculative engine's pool with the draft model's layers "
    "too (pool_configurator.py:259-314), so it admits less; pin the same pool in both arms with "
    "the engine option max_total_tokens=<the smaller value> on pytest.mark.model(...)"
)
_CAPACITY_KEYS = frozenset({"max_total_num_tokens", "max_req_input_len"})
# Decode CUDA-graph capture lists: SGLang resolves a finer one for a speculative engine even
# when decode graphs are off (nothing is captured then), and the plugin pins none in that case.
_DECODE_CAPTURE_LISTS = frozenset({"cuda_graph_bs", "cuda_graph_bs_decode"})


def _decode_graphs_off(info: Any) -> bool:
    """Whether ``/server_info`` says decode CUDA graphs are disabled (any release's spelling)."""
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    return bool(
        info.get("disable_cuda_graph")
        or info.get("disable_decode_cuda_graph")
        or (isinstance(decode, dict) and decode.get("backend") == "disabled")
    )


def _without_decode_list(config: Any) -> Any:
    if not isinstance(config, dict) or not isinstance(config.get("decode"), dict):
        return config
    return {**config, "decode": {k: v for k, v in config["decode"].items() if k != "bs"}}


def resolved_args_difference(spec_info: Any, base_info: Any) -> list[str]:
    """One line per key both ``/server_info`` report with different values, except
    ``speculative_*``, :data:`RESOLVED_IGNORED` and, when both arms have decode CUDA graphs off, the
    never-captured decode list; a KV-capacity difference adds :data:`CAPACITY_HINT`, which says how
    to pin it."""
    lines = []
    capacity = False
    graphless = _decode_graphs_off(spec_info) and _decode_graphs_off(base_info)
    for key in sorted(set(spec_info) & set(base_info)):
        if (
            key.startswith("speculative_")
            or key in RESOLVED_IGNORED
            or (graphless and key in _DECODE_CAPTURE_LISTS)
        ):
            continue
        spec_value, base_value = spec_info[key], base_info[key]
        if graphless and key == "cuda_graph_config":
            spec_value, base_value = (
                _without_decode_list(spec_value),
                _without_decode_list(base_value),
            )
        if spec_value != base_value:
            lines.append(
                f"{key}: {spec_info[key]!r} (speculative) vs {base_info[key]!r} (baseline)"
            )
            capacity = capacity or key in _CAPACITY_KEYS
    if capacity:
        lines.append(CAPACITY_HINT)
    return lines


def _speculative_args(drafter: Drafter, facts: sa.VersionFacts) -> dict[str, Any]:
    """The ``speculative_*`` fields for ``drafter``; SGLang counts the verified root token."""
    if drafter.name == "none":
        return {}  # the A/A control runs the twin's own command line in a second process
    proposed = drafter.num_draft_tokens
    args: dict[str, Any] = {"speculative_algorithm": ALGORITHMS[drafter.name]}
    if drafter.draft_model:
        args["speculative_draft_model_path"] = local_path(drafter.draft_model)
    if drafter.name == "ngram":
        # SGLang forces topk := max_bfs_breadth for NGRAM, so breadth is the knob, not topk.
        args["speculative_num_draft_tokens"] = proposed + 1
        args["speculative_ngram_min_bfs_breadth"] = 1
        args["speculative_ngram_max_bfs_breadth"] = drafter.get("max_bfs_breadth")
        if facts.ngram_match_windows:
            args["speculative_ngram_min_match_window_size"] = drafter.get("min_match_window")
            args["speculative_ngram_max_match_window_size"] = drafter.get("max_match_window")
    elif drafter.name in (*_TREE_DRAFTERS, "draft_model"):
        # Steps, topk and draft tokens go together: SGLang auto-picks all three if one is unset.
        # A draft model proposes a chain: one token per step.
        tree = drafter.name in _TREE_DRAFTERS
        args["speculative_num_steps"] = drafter.get("num_steps") if tree else proposed
        args["speculative_eagle_topk"] = drafter.get("topk") if tree else 1
        args["speculative_num_draft_tokens"] = proposed + 1
    elif drafter.name == "dflash":
        args["speculative_num_draft_tokens"] = proposed + 1  # the verify block
    elif drafter.name == "dspark":
        # gamma = proposed; SGLang derives num_draft_tokens = gamma + 1 and checks the checkpoint.
        args["speculative_dspark_block_size"] = proposed
    return args


def _check_mtp_in_target(model: str, version: sa.Version) -> None:
    """Refuse NEXTN without ``draft_model`` unless the target's architecture carries MTP layers."""
    known = MTP_IN_TARGET_0_5_23 if version >= (0, 5, 23) else MTP_IN_TARGET_0_5_9
    archs = [str(a) for a in (_read_model_config(model) or {}).get("architectures") or []]
    if archs and archs[0] in known:
        return
    found = (
        f"its config.json names architecture {archs[0]}"
        if archs
        else "no config.json naming its architecture was found"
    )
    raise EngineConfigError(
        f"Drafter('nextn') without draft_model= on {model}: {found}, which SGLang "
        f"{sa.format_version(version)} does not know to carry MTP layers (it fills the draft path "
        f"only for {', '.join(sorted(known))}), so the engine would resolve to EAGLE with no "
        "draft checkpoint; pass draft_model= (the MTP/EAGLE head), or use a checkpoint whose "
        "architecture has its own MTP layers"
    )


def _dtype(dtype: str) -> str:
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise EngineConfigError(
            f"dtype {dtype!r} is not an SGLang dtype; expected one of {', '.join(sorted(_DTYPES))}"
        ) from None


def _check_model_path(what: str, model: str) -> None:
    try:  # a built-in checkpoint (smollm2-135m): fetched now, SGLang gets its directory
        model = ensure_fetched(model)
    except CheckpointFetchError as exc:
        raise EngineConfigError(f"{what}: {exc}") from None
    if model.startswith("tiny:"):
        raise EngineConfigError(
            f"{what} {model!r} is a built-in tiny model of the reference server; SGLang needs a "
            "checkpoint directory or a Hugging Face hub id"
        )
    # "org/name" is a hub id; only explicit paths can be checked here.
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        raise EngineConfigError(f"{what} path {model} does not exist on this machine")


def detect_hybrid(model: str, option: Any = None) -> tuple[bool, str]:
    """Whether ``model`` has linear-attention / state-space layers, and how that was decided: the
    option ``hybrid=``, else the checkpoint's ``config.json`` (local or in the Hugging Face cache),
    else its name."""
    if option is not None:
        return bool(option), f"engine option hybrid={bool(option)}"
    config = _read_model_config(model)
    if config is not None:
        types = {str(config.get("model_type", ""))}
        text = config.get("text_config")
        if isinstance(text, dict):
            types.add(str(text.get("model_type", "")))
        hit = sorted(types & HYBRID_MODEL_TYPES)
        if hit:
            return True, f"config.json model_type {hit[0]}"
        for arch in [str(a) for a in config.get("architectures") or []]:
            if arch.startswith(_HYBRID_ARCH_PREFIXES):
                return True, f"config.json architecture {arch}"
        return False, "config.json names no hybrid architecture"
    if _HYBRID_NAME.search(model):
        return True, "its name matches a hybrid family (no config.json found to confirm)"
    return False, "no config.json found and the name matches no hybrid family"


def checkpoint_special_token_ids(model: str) -> tuple[int, ...]:
    """Special token ids a checkpoint (local or in the Hugging Face cache) declares:
    ``bos/eos/pad_token_id`` of its configs and the tokenizer's added tokens marked ``special``;
    empty when none can be read."""
    ids: set[int] = set()

    def add(value: Any) -> None:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                ids.add(item)

    for name in ("config.json", "generation_config.json"):
        data = _read_model_config(model, name) or {}
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            add(data.get(key))
    for token in (_read_model_config(model, "tokenizer.json") or {}).get("added_tokens") or []:
        if isinstance(token, dict) and token.get("special"):
            add(token.get("id"))
    decoder = (_read_model_config(model, "tokenizer_config.json") or {}).get("added_tokens_decoder")
    for key, token in (decoder or {}).items():
        if isinstance(token, dict) and token.get("special") and str(key).isdigit():
            add(int(key))
    return tuple(sorted(ids))


def read_model_config(model: str, name: str = "config.json") -> dict[str, Any] | None:
    """A checkpoint's JSON file ``name`` (local or in the Hugging Face cache), or None."""
    return _read_model_config(model, name)


def _read_model_config(model: str, name: str = "config.json") -> dict[str, Any] | None:
    model = local_path(model)
    candidates = [Path(model).expanduser() / name]
    if "/" in model and not model.startswith(("/", ".", "~")):
        hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
        )
        snapshots = Path(hub) / ("models--" + model.replace("/", "--")) / "snapshots"
        if snapshots.is_dir():
            candidates += sorted(
                snapshots.glob(f"*/{name}"), key=lambda p: p.stat().st_mtime, reverse=True
            )
    for path in candidates:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                return data
    return None
