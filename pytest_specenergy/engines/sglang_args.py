"""SGLang's command-line surface across releases: versions, renamed fields, known field names, from
reading the 0.5.9, 0.5.12, 0.5.13, 0.5.14 and 0.5.23 wheels; see
docs/engines.md#sglangs-arguments-across-releases."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.metadata
import json
import math
import re
from dataclasses import dataclass
from typing import Any
from typing import Mapping

from pytest_specenergy.engines.base import EngineConfigError

Version = tuple[int, int, int]

#: The oldest release the backend drives; older ones lack the spec counters it reads.
MIN_VERSION: Version = (0, 5, 9)
#: Newest release read; later 0.5.x releases are driven with its facts.
NEWEST_READ: Version = (0, 5, 23)
#: What the ``sglang`` extra installs (pyproject.toml): the release CI drives live on CPU servers
#: and parses every command line of. Its wheels need Python 3.11-3.13 and glibc >= 2.34 (the
#: older ones a Python 3.10 or glibc < 2.34 runner would get were never parsed in CI), and its
#: torch 2.14.1 is built for CUDA 13 (NVIDIA driver >= 580).
EXTRA_REQUIREMENT = "sglang>=0.5.23,<0.6"

#: Engine options the plugin consumes itself; they never become server flags. ``resident``,
#: ``weights_gb``: whether both arms' engines may share one GPU (``engines/sglang_residency.py``).
PLUGIN_OPTIONS = frozenset({"sglang_version", "hybrid", "python", "resident", "weights_gb"})
#: Fields the backend sets from the engine config; an option may not override them.
RESERVED_FIELDS = frozenset({"model_path", "host", "port"})
#: A value that SGLang's argparse would take for a flag (``-x``, ``--x``), not a negative number.
_FLAG_LIKE = re.compile(r"^-(?!\d|\.\d)")
_LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$")

# Every ServerArgs field name found in the five wheels read (union). Used to validate engine
# options when sglang itself is not importable in the pytest process (dry runs, or a server
# launched with another interpreter through the ``python`` option).
_KNOWN_FIELDS_TEXT = """
abort_on_priority_when_disabled admin_api_key allow_auto_truncate allowed_media_domains api_key asr_max_buffer_seconds
asr_max_concurrent_sessions attention_backend attn_cp_size attn_dp_size aux_hidden_state_capture base_gpu_id
batch_notify_size bf16_gemm_backend boundary_reduction bucket_e2e_request_latency bucket_inter_token_latency
bucket_time_to_first_token c128_page_size chat_template checkpoint_engine_wait_weights_before_ready chunked_prefill_size
collect_tokens_histogram completion_template constrained_json_disable_any_whitespace constrained_json_max_whitespace_cnt
constrained_json_whitespace_pattern context_length cp_strategy cpu_offload_gb crash_dump_folder
cuda_graph_backend_decode cuda_graph_backend_prefill cuda_graph_bs cuda_graph_bs_decode cuda_graph_bs_prefill
cuda_graph_config cuda_graph_max_bs cuda_graph_max_bs_decode cuda_graph_max_bs_prefill cuda_graph_max_seq_len_prefill
cuda_graph_prefill_max_context cuda_graph_tc_compiler custom_sigquit_handler custom_weight_loader dcp_comm_backend
dcp_replicate_q_proj dcp_size debug_cuda_graph debug_tensor_dump_inject debug_tensor_dump_input_file
debug_tensor_dump_layers debug_tensor_dump_output_folder decode_attention_backend decode_log_interval
decoupled_spec_bind_endpoint decoupled_spec_connect_endpoints decoupled_spec_rank decoupled_spec_role
decrypted_config_file decrypted_draft_config_file deepep_config deepep_dispatcher_output_dtype deepep_mode
deepep_v2_mode default_chat_template_kwargs default_priority_value delete_ckpt_after_loading detokenizer_worker_num
device disable_aiter_allreduce_fusion_in_decode disable_aiter_allreduce_fusion_in_prefill disable_attn_tp_gather
disable_chunked_prefix_cache disable_cuda_graph disable_cuda_graph_padding disable_custom_all_reduce
disable_decode_cuda_graph disable_fast_image_processor disable_flashinfer_autotune
disable_flashinfer_cutlass_moe_fp4_allgather disable_hicache_numa_detect disable_hybrid_swa_memory
disable_outlines_disk_cache disable_overlap_schedule disable_piecewise_cuda_graph disable_prefill_cuda_graph
disable_priority_preemption disable_radix_cache disable_shared_experts_fusion disable_tokenizer_batch_decode
disaggregation_bootstrap_port disaggregation_decode_allocation_policy disaggregation_decode_dp
disaggregation_decode_enable_offload_kvcache disaggregation_decode_enable_radix_cache disaggregation_decode_extra_slots
disaggregation_decode_host_receive_threshold disaggregation_decode_polling_interval
disaggregation_decode_retraction_backup disaggregation_decode_tp disaggregation_enable_kv_checksum
disaggregation_ib_device disaggregation_mode disaggregation_prefill_pp disaggregation_transfer_backend dist_init_addr
dist_timeout dllm_algorithm dllm_algorithm_config dllm_fdfo download_dir dp_size ds_channel_config_path
ds_heavy_channel_num ds_heavy_channel_type ds_heavy_token_num ds_sparse_decode_threshold dsa_decode_backend
dsa_paged_mqa_logits_backend dsa_prefill_backend dsa_prefill_cp_mode dsa_topk_backend dsa_triton_union dsv4_attn_backend
dsv4_prefill_backend dtype dwdp_size dynamic_batch_tokenizer_batch_size dynamic_batch_tokenizer_batch_timeout
elastic_ep_backend elastic_ep_initial_size elastic_ep_rejoin elastic_ep_scale_timeout
enable_adaptive_dispatch_to_encoder enable_aiter_allreduce_fusion enable_amd_monokernel enable_attn_tp_input_scattered
enable_breakable_cuda_graph enable_broadcast_mm_inputs_process enable_cache_report enable_cp_decode_attn_tp
enable_cp_tp_group_sharing enable_cudagraph_gc enable_custom_logit_processor enable_decoder_swa_bounded_replay
enable_deepep_waterfill enable_deepseek_v4_fp4_indexer enable_dense_mlp_attn_tp enable_deterministic_inference
enable_double_sparsity enable_dp_attention enable_dp_attention_local_control_broadcast enable_dp_lm_head
enable_draft_weights_cpu_backup enable_dsa_cache_layer_split enable_dsa_fused_indexer
enable_dsa_prefill_context_parallel enable_dynamic_batch_tokenizer enable_dynamic_chunking enable_elastic_expert_backup
enable_encoder_swa_bounded_replay enable_eplb enable_expert_distribution_metrics enable_flashinfer_allreduce_fusion
enable_flexkv enable_forward_pass_metrics enable_fp32_lm_head enable_fused_moe_sum_all_reduce enable_fused_qk_norm_rope
enable_hierarchical_cache enable_hisparse enable_http2 enable_http_worker_reuseport enable_int8_mamba_checkpoint
enable_kv_cache_sharding enable_layernorm_sp enable_layerwise_nvtx_marker enable_lean_attention enable_linear_replayssm
enable_linear_replayssm_spec enable_linker_mla_dedup enable_lmcache enable_lora enable_lora_overlap_loading
enable_mamba_cache_stochastic_rounding enable_megamoe_for_layernorm_sp enable_memory_saver enable_metrics
enable_metrics_for_all_schedulers enable_mfu_metrics enable_mis enable_mixed_chunk enable_mm_global_cache enable_mscclpp
enable_multi_layer_eagle enable_multimodal enable_nan_detection enable_nccl_nvls enable_nsa_prefill_context_parallel
enable_nvidia_megakernel enable_p2p_check enable_page_major_kv_layout enable_paged_experts enable_pd_role_switch
enable_pdmux enable_piecewise_cuda_graph enable_precise_embedding_interpolation enable_prefill_context_parallel
enable_prefill_cp enable_prefill_delayer enable_prefix_mm_cache enable_priority_scheduling enable_profile_cuda_graph
enable_quant_communications enable_request_time_stats_logging enable_response_store enable_return_aux_hidden_states
enable_return_hidden_states enable_return_indexer_topk enable_return_routed_experts enable_scattered_sconv
enable_session_radix_cache enable_shared_experts_attn_tp enable_single_batch_overlap enable_ssl_refresh
enable_streaming_session enable_strict_thinking enable_symm_mem enable_tf32_matmul enable_tokenizer_batch_encode
enable_torch_compile enable_torch_compile_debug_mode enable_torch_symm_mem enable_tp_lm_head_all_to_all enable_trace
enable_two_batch_overlap enable_unified_cache_external_linker enable_unified_memory enable_w4a4_mxfp4_megamoe
enable_waterfill enable_watermark enable_weights_cpu_backup encoder_bootstrap_port encoder_only encoder_register_urls
encoder_transfer_backend encoder_urls enforce_disable_flashinfer_allreduce_fusion enforce_piecewise_cuda_graph
enforce_shared_experts_fusion engine_info_bootstrap_port ep_dispatch_algorithm ep_join_mode ep_join_rank_offset
ep_num_redundant_experts ep_size eplb_algorithm eplb_min_rebalancing_utilization_threshold
eplb_rebalance_layers_per_chunk eplb_rebalance_num_iterations expert_balancedness_report_mode
expert_distribution_recorder_buffer_size expert_distribution_recorder_mode experts_shared_outer_loras
export_metrics_to_file export_metrics_to_file_dir extra_metric_labels fastapi_root_path file_storage_path
flashinfer_a2a_dispatch_type flashinfer_allreduce_fusion_backend flashinfer_autotune_skip_ops
flashinfer_mla_disable_ragged flashinfer_mxfp4_moe_precision flexkv_config_file forward_hooks
forward_pass_metrics_ipc_name forward_pass_metrics_worker_id fp4_gemm_runner_backend fp8_gemm_runner_backend fuseep_mode
gated_launch_port gc_threshold gc_warning_threshold_secs generation_tokens_buckets gpu_id_step grammar_backend
grpc_http_sidecar_port grpc_mode grpc_port grpc_response_timeout_secs grpc_worker_threads hf_chat_template_name
hicache_host_memory_fraction hicache_host_memory_mode hicache_io_backend hicache_mem_layout hicache_ratio hicache_size
hicache_storage_backend hicache_storage_backend_extra_config hicache_storage_prefetch_policy
hicache_storage_prefetch_retry_max_attempts hicache_storage_prefetch_retry_poll_interval hicache_write_policy
hierarchical_sparse_attention_extra_config hisparse_config host http2_initial_connection_window_size
http2_max_concurrent_streams image_processor_backend incremental_streaming_output init_expert_location
int8_mamba_ckpt_size is_embedding json_model_override_args keep_mm_feature_on_device kt_cpuinfer
kt_max_deferred_experts_per_token kt_method kt_num_gpu_experts kt_threadpool_count kt_weight_path kv_cache_dtype
kv_canary kv_canary_real_data kv_canary_sweep_interval kv_events_config language_model_only language_only
limit_mm_data_per_request linear_attn_backend linear_attn_decode_backend linear_attn_prefill_backend
linear_attn_verify_backend linear_replayssm_cache_len lmcache_config_file load_balance_method load_format
load_publish_endpoint load_snapshot_publish_interval log_level log_level_http log_requests log_requests_format
log_requests_level log_requests_target lora_backend lora_drain_wait_threshold lora_eviction_policy lora_paths
lora_strict_loading lora_target_modules lora_use_virtual_experts mamba_backend mamba_cache_philox_rounds
mamba_full_memory_ratio mamba_max_states_per_path mamba_radix_cache_strategy mamba_scheduler_strategy mamba_ssm_dtype
mamba_track_interval max_ep_size max_loaded_loras max_lora_chunk_size max_lora_rank max_loras_per_batch
max_mamba_cache_size max_prefill_tokens max_queued_requests max_running_requests max_total_tokens
media_url_max_file_size_mb mem_fraction_static min_free_slots_delay mlx_enable_sampling mm_attention_backend
mm_enable_dp_encoder mm_feature_transport mm_global_cache_backend mm_io_worker_num mm_max_concurrent_calls
mm_per_request_timeout mm_preprocess_cache_size_mb mm_process_config mm_processor_worker_num model_checksum
model_config_parser model_impl model_loader_extra_config model_path modelexpress_config modelopt_checkpoint_restore_path
modelopt_checkpoint_save_path modelopt_export_path modelopt_quant moe_a2a_backend moe_dense_tp_size moe_dp_size
moe_runner_backend mooncake_ib_device msprobe_dump_config multi_item_scoring_delimiter nccl_port nnodes node_rank
nsa_decode_backend nsa_prefill_backend nsa_prefill_cp_mode num_continuous_decode_steps num_reserved_decode_tokens
numa_node offload_group_size offload_mode offload_num_in_group offload_prefetch_step optimistic_prefill_attempts
optimistic_prefill_retries otlp_service_name otlp_traces_endpoint page_size paged_experts_num_resident pdmux_config_path
piecewise_cuda_graph_compiler piecewise_cuda_graph_max_tokens piecewise_cuda_graph_tokens ple_offload_backend
ple_offload_dir ple_offload_embedding port pp_async_batch_depth pp_max_micro_batch_size pp_size pre_warm_nccl
preferred_sampling_params prefill_attention_backend prefill_cp_mode prefill_decode_interval
prefill_decode_interval_min_bs prefill_delayer_forward_passes_buckets prefill_delayer_max_delay_ms
prefill_delayer_max_delay_passes prefill_delayer_queue_min_ratio prefill_delayer_token_usage_low_watermark
prefill_delayer_wait_seconds_buckets prefill_kv_cache_dequant_dtype prefill_max_requests prefill_only_disable_kv_cache
priority_scheduling_preemption_threshold prompt_tokens_buckets qsa_indexer_dtype quantization quantization_param_path
quantize_and_serve radix_cache_backend radix_eviction_policy radix_eviction_policy_config random_seed reasoning_parser
record_nolora_graph remote_instance_weight_loader_backend remote_instance_weight_loader_seed_instance_ip
remote_instance_weight_loader_seed_instance_service_port remote_instance_weight_loader_send_weights_group_ports
remote_instance_weight_loader_start_seed_via_transfer_engine retraction_policy return_aux_hidden_state_layer_ids
return_hidden_states_mode return_input_ids return_output_ids revision rl_on_policy_target rl_quant_profile
sampling_backend sampling_defaults sampling_mask_max_tokens schedule_conservativeness schedule_low_priority_values_first
schedule_policy scheduler_recv_interval served_model_name shared_experts_tp_size show_time_cost sidecar sidecar_args
skip_server_warmup skip_tokenizer_init sleep_on_idle sm_group_num smg_grpc_mode smg_http_sidecar_port
soft_watchdog_timeout spec_trace_dir speculative_accept_threshold_acc speculative_accept_threshold_single
speculative_adaptive speculative_adaptive_config speculative_algorithm speculative_attention_mode
speculative_boundary_reduction speculative_dflash_block_size speculative_domino_candidate_pool_size
speculative_draft_attention_backend speculative_draft_kv_cache_dtype speculative_draft_load_format
speculative_draft_model_path speculative_draft_model_quantization speculative_draft_model_revision
speculative_draft_sink_size speculative_draft_window_size speculative_dsa_topk_backend
speculative_dspark_align_verify_tokens_to_graph_tier speculative_dspark_block_size
speculative_dspark_confidence_sts_path speculative_dspark_sps_table_path speculative_eagle_topk
speculative_enable_w4a4_mxfp4_megamoe speculative_moe_a2a_backend speculative_moe_runner_backend
speculative_ngram_branch_length speculative_ngram_capacity speculative_ngram_external_corpus_max_tokens
speculative_ngram_external_corpus_path speculative_ngram_external_sam_budget speculative_ngram_match_type
speculative_ngram_max_bfs_breadth speculative_ngram_max_match_window_size speculative_ngram_max_trie_depth
speculative_ngram_min_bfs_breadth speculative_ngram_min_match_window_size speculative_num_draft_tokens
speculative_num_steps speculative_skip_dp_mlp_sync speculative_token_map speculative_use_block_verification
speculative_use_rejection_sampling ssl_ca_certs ssl_certfile ssl_keyfile ssl_keyfile_password startup_weight_load_mode
stat_loggers stream_interval stream_output stream_response_default_include_usage strip_thinking_cache
swa_full_tokens_ratio swa_prefix_tails tbo_token_distribution_threshold tokenizer_backend
tokenizer_metrics_allowed_custom_labels tokenizer_metrics_custom_labels_header tokenizer_mode tokenizer_path
tokenizer_worker_num tool_call_parser tool_server torch_compile_max_bs torchao_config tp_size trace_modules
triton_attention_num_kv_splits triton_attention_reduce_in_fp32 triton_attention_split_tile_size trust_mm_content_hashes
trust_remote_code trust_request_chat_template unified_cache_external_linker_backend unified_cache_external_linker_config
uno_lora_path use_ray uses_mamba_radix_cache uvicorn_access_log_exclude_prefixes warmups watchdog_timeout
watermark_config watermark_context_window watermark_default_enabled watermark_enforce_all watermark_key watermark_key_b
watermark_max_probability watermark_mixing_probability weight_cache_mode weight_cache_socket weight_cache_timeout
weight_loader_disable_mmap weight_loader_drop_cache_after_load weight_loader_prefetch_checkpoints
weight_loader_prefetch_num_threads weight_version
"""
KNOWN_FIELDS: frozenset[str] = frozenset(_KNOWN_FIELDS_TEXT.split())

# Fields whose flag is not ``--`` + the field name with dashes (0.5.23 ``Arg(cli_name=...)``; the
# ep_join_* ones: fields/exec_.py:970-977, fields/parallel.py:303, checked with the real parser).
_CLI_NAME_OVERRIDES = {
    "fp8_gemm_runner_backend": "--fp8-gemm-backend",
    "fp4_gemm_runner_backend": "--fp4-gemm-backend",
    "ep_join_mode": "--elastic-ep-join-mode",
    "ep_join_rank_offset": "--elastic-ep-join-rank-offset",
}

# ServerArgs fields with no command-line flag at all (``Arg(no_cli=True)`` or plain dataclass
# fields the parser never registers), per first read release; found by comparing the fields
# with the real parser's actions. 0.5.15-0.5.22 were not read and get 0.5.14's list.
_NO_CLI_0_5_14 = frozenset({"custom_sigquit_handler", "stat_loggers"})
_NO_CLI_0_5_23 = frozenset(
    {
        "_radix_eviction_policy_explicitly_set",
        "_speculative_draft_quantization_explicitly_set",
        "_swa_full_tokens_ratio_explicitly_set",
        "aux_hidden_state_capture",
        "custom_sigquit_handler",
        "enable_cp_tp_group_sharing",
        "grpc_worker_threads",
        "speculative_boundary_reduction",
        "stat_loggers",
        "uses_mamba_radix_cache",
        "watermark_context_window",
        "watermark_default_enabled",
        "watermark_enforce_all",
        "watermark_key",
        "watermark_key_b",
        "watermark_max_probability",
        "watermark_mixing_probability",
    }
)

# Three-state booleans (argparse.BooleanOptionalAction, default None = auto or True): False
# is only reachable through ``--no-<flag>``. Same sources as above.
_NEGATABLE_0_5_14 = frozenset({"experts_shared_outer_loras", "lora_strict_loading"})
_NEGATABLE_0_5_23 = frozenset(
    {
        "dcp_replicate_q_proj",
        "dllm_fdfo",
        "enable_decoder_swa_bounded_replay",
        "enable_dsa_fused_indexer",
        "enable_fused_qk_norm_rope",
        "enable_tf32_matmul",
        "enable_tp_lm_head_all_to_all",
        "experts_shared_outer_loras",
        "lora_strict_loading",
        "mm_enable_dp_encoder",
        "ple_offload_embedding",
        "speculative_enable_w4a4_mxfp4_megamoe",
    }
)

# JSON-valued fields: a dict option (frozen by EngineConfig into sorted pairs) is sent as JSON.
_JSON_FIELDS = frozenset(
    {
        "cuda_graph_config",
        "json_model_override_args",
        "speculative_adaptive_config",
        "hicache_storage_backend_extra_config",
    }
)


@dataclass(frozen=True)
class VersionFacts:
    """What one SGLang release accepts on its command line, as far as this plugin cares."""

    version: Version
    #: ``cuda_graph_max_bs`` (<= 0.5.13) or ``cuda_graph_max_bs_decode`` (>= 0.5.14).
    cuda_graph_max_bs_field: str
    #: ``cuda_graph_bs`` (<= 0.5.13) or ``cuda_graph_bs_decode`` (>= 0.5.14).
    cuda_graph_bs_field: str
    #: 0.5.14-0.5.22 still accept ``--cuda-graph-max-bs`` as a deprecated alias; 0.5.23 rejects it.
    legacy_cuda_graph_alias: bool
    #: NGRAM match-window flags (``speculative_ngram_{min,max}_match_window_size``), gone in 0.5.10
    #: (its wheel has the trie's ``speculative_ngram_max_trie_depth`` instead, ``server_args.py:513``).
    ngram_match_windows: bool
    #: Releases before 0.5.14 turn the overlap scheduler off for NGRAM/DFLASH (0.5.9: every
    #: algorithm), so the backend turns it off in both arms to keep the pair matched.
    spec_disables_overlap: bool
    #: PR #26351 (first in 0.5.14): NGRAM commits Mamba/GDN state after verify.
    ngram_commits_hybrid_state: bool
    #: PR #23213 (0.5.12 has it, 0.5.9 not): shutdown waits until GPU memory is released.
    shutdown_waits_for_gpu: bool
    #: SGLang ``speculative_algorithm`` values this release accepts.
    algorithms: frozenset[str]
    #: ServerArgs fields this release has no command-line flag for (refused as options).
    no_cli_fields: frozenset[str] = frozenset()
    #: Three-state bool fields: ``False`` is sent as ``--no-<flag>``.
    negatable_fields: frozenset[str] = frozenset()
    #: ``/flush_cache?timeout=S`` waits for the scheduler to go idle: from 0.5.10 (its wheel, and
    #: 0.5.14 and 0.5.16-0.5.22, have ``flush_cache(timeout: float = Query(0.0, ge=0.0))``; 0.5.9 not).
    flush_cache_timeout: bool = False


#: First release known to accept each algorithm (DSPARK: the enum member and
#: ``speculative_dspark_block_size`` are in the 0.5.16 wheel; 0.5.10-0.5.11 were not read for DFLASH).
ALGORITHM_SINCE: dict[str, Version] = {
    "NGRAM": (0, 5, 9),
    "EAGLE": (0, 5, 9),
    "EAGLE3": (0, 5, 9),
    "NEXTN": (0, 5, 9),
    "STANDALONE": (0, 5, 9),
    "DFLASH": (0, 5, 12),
    "DSPARK": (0, 5, 16),
}


def parse_version(text: str) -> Version:
    """``"0.5.14.post1"`` -> ``(0, 5, 14)``; raise :class:`EngineConfigError` if unreadable."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not match:
        raise EngineConfigError(
            f"cannot read SGLang version {text!r}; expected something like '0.5.23'"
        )
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def format_version(version: Version) -> str:
    """``(0, 5, 14)`` -> ``"0.5.14"``."""
    return ".".join(str(part) for part in version)


def installed_version() -> str | None:
    """The version of the ``sglang`` distribution installed here, or None."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def facts_for(version: Version) -> VersionFacts:
    """The command-line facts of ``version`` (the closest read release for unread ones)."""
    renamed = version >= (0, 5, 14)
    newest = version >= (0, 5, 23)
    return VersionFacts(
        version=version,
        cuda_graph_max_bs_field="cuda_graph_max_bs_decode" if renamed else "cuda_graph_max_bs",
        cuda_graph_bs_field="cuda_graph_bs_decode" if renamed else "cuda_graph_bs",
        legacy_cuda_graph_alias=renamed and not newest,
        ngram_match_windows=version < (0, 5, 10),
        spec_disables_overlap=not renamed,
        ngram_commits_hybrid_state=renamed,
        shutdown_waits_for_gpu=version >= (0, 5, 12),
        algorithms=frozenset(a for a, since in ALGORITHM_SINCE.items() if version >= since),
        no_cli_fields=_NO_CLI_0_5_23 if newest else _NO_CLI_0_5_14 if renamed else frozenset(),
        negatable_fields=_NEGATABLE_0_5_23
        if newest
        else _NEGATABLE_0_5_14
        if renamed
        else frozenset(),
        flush_cache_timeout=version >= (0, 5, 10),
    )


# Old name -> new name, and the first read release that only knows the new one.
_RENAMES: tuple[tuple[str, str, Version], ...] = (
    ("cuda_graph_max_bs", "cuda_graph_max_bs_decode", (0, 5, 14)),
    ("cuda_graph_bs", "cuda_graph_bs_decode", (0, 5, 14)),
    ("mamba_scheduler_strategy", "mamba_radix_cache_strategy", (0, 5, 14)),
    ("speculative_ngram_branch_length", "speculative_ngram_max_trie_depth", (0, 5, 10)),
)
# Fields that exist on one side of a boundary only, with no spelling on the other side.
_NEW_ONLY: dict[str, Version] = {
    **dict.fromkeys(
        (
            "cuda_graph_max_bs_prefill",
            "cuda_graph_bs_prefill",
            "disable_decode_cuda_graph",
            "disable_prefill_cuda_graph",
            "cuda_graph_backend_decode",
            "cuda_graph_backend_prefill",
        ),
        (0, 5, 14),
    ),
    "speculative_dflash_block_size": (0, 5, 12),
    "speculative_dspark_block_size": (0, 5, 16),
}
_REMOVED: dict[str, tuple[Version, str]] = dict.fromkeys(
    ("speculative_ngram_min_match_window_size", "speculative_ngram_max_match_window_size"),
    (
        (0, 5, 10),
        "NGRAM matches against a trie since 0.5.10; tune speculative_ngram_max_trie_depth",
    ),
)


def is_fraction(value: Any) -> bool:
    """Whether ``value`` is a share of GPU memory SGLang can take: a finite number in (0, 1)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value < 1
    )


def _flag_like(name: str, value: Any) -> list[str]:
    """The items of ``value`` the command line would read as another flag. :func:`render_flags`
    writes ``str()`` of every item of a list, whatever its type: a ``Path("--host")`` is as much a
    flag as the string (audit 3, T36); a JSON field's non-string value is written as JSON."""
    if name in _JSON_FIELDS and not isinstance(value, str):
        return []
    values = value if isinstance(value, (list, tuple)) else (value,)
    return [
        str(v)
        for v in values
        if v is not None and not isinstance(v, bool) and _FLAG_LIKE.match(str(v))
    ]


def translate_options(options: Mapping[str, Any], facts: VersionFacts) -> dict[str, Any]:
    """User ServerArgs options spelled for ``facts.version``: a renamed field is sent under the name
    this release knows, so a marker written for 0.5.13 keeps working on 0.5.23 (where
    ``--cuda-graph-max-bs`` is an argparse error); ``disable_cuda_graph`` becomes the two per-phase
    switches from 0.5.14 on, which lack its flag."""
    out: dict[str, Any] = {}
    version = facts.version
    for name, value in options.items():
        if name in PLUGIN_OPTIONS:
            continue
        if name in RESERVED_FIELDS:
            raise EngineConfigError(
                f"engine option {name}= is set by the plugin from the model marker; remove it"
            )
        target = name
        for old, new, since in _RENAMES:
            if name in (old, new):
                target = new if version >= since else old
        if name in _NEW_ONLY and version < _NEW_ONLY[name]:
            raise EngineConfigError(
                f"engine option {name}= needs SGLang >= {format_version(_NEW_ONLY[name])}; this "
                f"run uses {format_version(version)}"
            )
        if name in facts.no_cli_fields:
            raise EngineConfigError(
                f"engine option {name}= is a ServerArgs field with no command-line flag in SGLang "
                f"{format_version(version)} (SGLang sets or resolves it itself; the watermark_* "
                "ones come from watermark_config), so launch_server would reject "
                f"--{name.replace('_', '-')}; remove it"
            )
        if name in _REMOVED and version >= _REMOVED[name][0]:
            since, advice = _REMOVED[name]
            raise EngineConfigError(
                f"engine option {name}= was removed in SGLang {format_version(since)} (this run "
                f"uses {format_version(version)}): {advice}"
            )
        if name == "dist_init_addr" and not _LOOPBACK.match(str(value)):
            # The engines listen on loopback only: another address opens the rendezvous beyond it.
            raise EngineConfigError(
                f"engine option dist_init_addr={value!r} is not a loopback address; the plugin's "
                "engines listen on loopback only (e.g. 127.0.0.1:5000)"
            )
        if name == "mem_fraction_static" and not is_fraction(value):
            # NaN compares false with every bound: it reached SGLang as --mem-fraction-static nan.
            raise EngineConfigError(
                f"engine option mem_fraction_static={value!r}: expected a number between 0 and 1 "
                "(SGLang's share of the GPU's memory for weights and KV cache, e.g. 0.4)"
            )
        flags = _flag_like(name, value)
        if flags:
            # argparse takes the last of a repeated flag: values "--host", "0.0.0.0" would move the
            # engine off loopback.
            raise EngineConfigError(
                f"engine option {name}={value!r} holds {flags[0]!r}, which the command line would "
                "read as another flag; give each option its own keyword argument"
            )
        if name == "disable_cuda_graph" and version >= (0, 5, 14):
            if value:
                out["disable_decode_cuda_graph"] = out["disable_prefill_cuda_graph"] = True
            continue
        if target in out and out[target] != value:
            raise EngineConfigError(
                f"engine options set {target} twice with different values (old and new name): "
                f"{out[target]!r} vs {value!r}; keep one"
            )
        out[target] = value
    return out


@functools.lru_cache(maxsize=1)
def installed_server_args_fields() -> frozenset[str] | None:
    """Field names of the importable ``sglang.srt.server_args.ServerArgs``, or None: importing it
    can fail without CUDA or with a broken install, and then the known-field list is used instead."""
    try:
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - any import failure means "not available here"
        return None
    if dataclasses.is_dataclass(ServerArgs):
        return frozenset(f.name for f in dataclasses.fields(ServerArgs))
    struct_fields = getattr(ServerArgs, "__struct_fields__", None)  # msgspec (>= 0.5.14)
    if struct_fields:
        return frozenset(struct_fields)
    names = {name for klass in ServerArgs.__mro__ for name in getattr(klass, "__annotations__", {})}
    return frozenset(names) or None


def validate_fields(names: list[str], fields: frozenset[str], where: str) -> None:
    """Raise :class:`EngineConfigError` naming options that are not ServerArgs fields."""
    unknown = sorted(n for n in names if n not in fields)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(fields), n=2)
        hints.append(name + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    raise EngineConfigError(
        f"unknown SGLang engine option(s): {'; '.join(hints)}. Engine options of "
        f"pytest.mark.model(...) must be ServerArgs field names ({where}), or one of the plugin's "
        f"own: {', '.join(sorted(PLUGIN_OPTIONS))}"
    )


def flag_for(field: str) -> str:
    """``attention_backend`` -> ``--attention-backend``."""
    return _CLI_NAME_OVERRIDES.get(field, "--" + field.replace("_", "-"))


def render_flags(args: Mapping[str, Any], negatable: frozenset[str] = frozenset()) -> list[str]:
    """Field -> value as argv, in the mapping's order: ``True`` is a bare flag; ``False`` is
    ``--no-<flag>`` for the three-state fields in ``negatable``
    (:attr:`VersionFacts.negatable_fields`), else omitted (store-true flags default to False), as is
    ``None``; sequences become several values, dicts become JSON."""
    argv: list[str] = []
    for field, value in args.items():
        flag = flag_for(field)
        if value is False and field in negatable:
            argv.append("--no-" + flag[2:])
        elif value is None or value is False:
            continue
        elif value is True:
            argv.append(flag)
        elif field in _JSON_FIELDS and not isinstance(value, str):
            argv += [flag, json.dumps(_as_json(value), sort_keys=True)]
        elif isinstance(value, (list, tuple)):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def _as_json(value: Any) -> Any:
    # EngineConfig.freeze_options turns dicts into sorted (key, value) pairs; undo that.
    if isinstance(value, tuple) and all(
        isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) for item in value
    ):
        return {k: _as_json(v) for k, v in value}
    return [_as_json(v) for v in value] if isinstance(value, (list, tuple)) else value
