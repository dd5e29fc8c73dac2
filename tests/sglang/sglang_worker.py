"""The conformance worker: SGLang's own parser and validation on the plugin's command lines.

Runs with an SGLang environment's Python (made by ``dev/sglang_env.sh``), never under pytest:
``python sglang_worker.py --worker MODE < items.json > results.json``. It imports only the
standard library, sglang and (gpu-sim) the project's stand-in machinery; nothing of the plugin.
``test_sglang_conformance.py`` builds the command lines with the plugin and runs this.

Worker modes (what SGLang code runs, per release):

``parse``
    ``argparse.ArgumentParser`` + ``ServerArgs.add_cli_args(parser)`` + ``parser.parse_args(argv)``
    (exactly what ``prepare_server_args`` does), then, on releases whose ``ServerArgs`` does not
    resolve at construction (>= 0.5.14: msgspec record, lazy ``resolve_once``),
    ``ServerArgs.from_cli_args(ns)``. No patching. On 0.5.9 the dataclass ``__post_init__`` *is*
    the resolution and needs a device, so ``from_cli_args`` is left to the other two modes.
``cpu``
    ``prepare_server_args(argv)`` (parser, ``from_cli_args``; on 0.5.9 the whole
    ``__post_init__``), then ``resolve_once()`` where it exists, then ``check_server_args()``,
    the order of ``Engine._launch_subprocesses``. Adds ``--device cpu`` when absent (reported as
    ``device_added``): without it 0.5.9 raises "No accelerator ... is available". This changes
    meaning for GPU command lines (CPU resolution, e.g. attention backend -> torch_native); it is
    the truth for the live CPU arm.
``pool-h100``, ``pool-h200``
    SGLang 0.5.23's own KV-pool sizing on a simulated H100 or H200 (``--mem-fraction-static`` and
    ``--max-total-tokens`` as the argv says): the item's argv resolved and published as a scheduler
    publishes it, the target's ``ModelConfig`` and draft layers
    (``resolve_spec_aux_hidden_state_config``), then ``KVCacheConfigurator``'s
    ``_profile_available_bytes(free_at_start_gib)`` with ``get_available_gpu_memory`` answering
    ``free_after_weights_gib`` (the two free-memory readings SGLang takes, ``bootstrap.py:193-223``
    and ``kv_cache_configurator.py:2990``), ``config_from_budget`` (``DefaultPoolConfigurator``, the
    ``max_total_tokens`` cap) and ``resolve_max_num_reqs``. Nothing is allocated and no weight is
    loaded: the config folders hold ``config.json`` only. ``resolved`` holds ``tokens``,
    ``budget_bytes``, ``max_running_requests``, ``mem_fraction_static`` (SGLang's own default when the
    argv sets none: its runtime reserve is ``1 - that`` of the GPU) and ``draft_layers``.
``gpu-sim``
    the same SGLang calls on a *simulated H200*: only the device queries are answered
    (``torch.cuda.is_available``/``device_count``/``get_device_capability``/
    ``get_device_properties``/``mem_get_info``, ``torch.version.cuda``, and a fake
    ``nvidia-smi`` on PATH for memory and compute capability); SGLang's own resolution code runs
    unpatched. ``flashinfer`` is an import-only stand-in (a real H200 install has it). No kernel
    runs: this exercises argument resolution only, it is not a GPU.

Each item is ``{"id": str, "argv": [flags after "python -m sglang.launch_server"]}``; each result
is ``{"id", "ok", "stage", "error", "resolved"}`` where ``stage`` is the last stage reached
(``parse`` < ``from_cli_args`` < ``resolve`` < ``check``), ``error`` the refusal
(``"SystemExit(2): <argparse message>"`` or ``"<Type>: <message>"``), ``resolved`` every field after
resolution where it ran (else the fields in ``REPORT_FIELDS``). Each item runs in a forked child,
so resolution's environment-variable and global-context writes do not leak between items.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

REPORT_FIELDS = (
    "device",
    "tp_size",
    "dtype",
    "attention_backend",
    "decode_attention_backend",
    "prefill_attention_backend",
    "max_running_requests",
    "mem_fraction_static",
    "cuda_graph_max_bs",
    "cuda_graph_bs",
    "cuda_graph_max_bs_decode",
    "cuda_graph_bs_decode",
    "disable_cuda_graph",
    "disable_decode_cuda_graph",
    "disable_prefill_cuda_graph",
    "cuda_graph_backend_decode",
    "cuda_graph_backend_prefill",
    "cuda_graph_config",
    "disable_overlap_schedule",
    "disable_radix_cache",
    "random_seed",
    "page_size",
    "chunked_prefill_size",
    "decode_log_interval",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "speculative_ngram_min_bfs_breadth",
    "speculative_ngram_max_bfs_breadth",
    "speculative_dflash_block_size",
    "speculative_dspark_block_size",
)
WARM_MODULES = (
    "sglang.srt.configs.model_config",
    "sglang.srt.arg_groups.pipeline",
    "sglang.srt.arg_groups.validation_hook",
    "transformers",
)
GPU_SIM_STANDINS = ("flashinfer",)
STAGES = ("parse", "from_cli_args", "resolve", "check")


# ------------------------------------------------------------------------------------ worker
#: ``nvidia-smi``'s memory.total (MiB) and name of the GPUs the worker can simulate.
GPUS = {"h200": (143771, "NVIDIA H200"), "h100": (81559, "NVIDIA H100 80GB HBM3")}


def _simulate_h200(tmpdir: str, gpu: str = "h200") -> None:
    """Answer device queries as one 8-GPU node of ``gpu`` would; run before sglang is imported."""
    import importlib.machinery
    import importlib.util
    import types

    import torch

    gib = 1 << 30
    total_mib, name = GPUS[gpu]
    total = total_mib * (1 << 20)
    props = types.SimpleNamespace(
        name=name,
        major=9,
        minor=0,
        total_memory=total,
        multi_processor_count=132,
        L2_cache_size=60 * (1 << 20),
        gcnArchName="",
        uuid="GPU-0",
        warp_size=32,
    )
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 8
    torch.cuda.is_initialized = lambda: False
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: name
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.mem_get_info = lambda device=None: (total - 2 * gib, total)
    torch.version.cuda = "12.9"
    smi = os.path.join(tmpdir, "nvidia-smi")
    with open(smi, "w") as fh:
        fh.write(
            '#!/bin/sh\ncase "$*" in\n'
            f"  *memory.total*) for i in 0 1 2 3 4 5 6 7; do echo {total_mib}; done ;;\n"
            "  *compute_cap*) for i in 0 1 2 3 4 5 6 7; do echo 9.0; done ;;\n"
            '  *) echo "simulated nvidia-smi: $*" >&2; exit 1 ;;\nesac\n'
        )
    os.chmod(smi, 0o755)
    os.environ["PATH"] = tmpdir + os.pathsep + os.environ.get("PATH", "")

    # GPU-only packages a real H200 install has and SGLang imports at module level when it
    # sees CUDA: import-only stand-ins (the project's tests/sglang_standins machinery), so
    # names import and any call raises. Resolution itself calls none of them.
    import specenergy_standin

    for root in GPU_SIM_STANDINS:
        if root not in sys.modules:
            module = types.ModuleType(root, f"gpu-sim import-only stand-in for {root}")
            module.__path__ = []
            module.__spec__ = importlib.machinery.ModuleSpec(root, None, is_package=True)
            specenergy_standin.install(root, module.__dict__)
            sys.modules[root] = module
    # sgl_kernel's real wheel registers torch ops; SGLang then registers fake (meta) kernels
    # for them at import time. There are no ops here, so those registrations are skipped.
    real_register_fake = torch.library.register_fake

    def register_fake(op: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(op, str) and op.startswith("sgl_kernel::"):
            return (lambda fn: fn) if not args else args[0]
        return real_register_fake(op, *args, **kwargs)

    torch.library.register_fake = register_fake


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        pass
    if hasattr(value, "__struct_fields__"):  # msgspec record (0.5.23 nested configs)
        return {f: _jsonable(getattr(value, f)) for f in value.__struct_fields__}
    import dataclasses

    if dataclasses.is_dataclass(value):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return repr(value)


def _report(server_args: Any, resolved: bool) -> dict[str, Any]:
    """After resolution every field (what ``/server_info`` reports, for the twin check);
    before it, the ``REPORT_FIELDS`` only."""
    import dataclasses

    if resolved and hasattr(server_args, "resolved_dict"):  # >= 0.5.14
        return {str(k): _jsonable(v) for k, v in server_args.resolved_dict().items()}
    if resolved and dataclasses.is_dataclass(server_args):  # 0.5.9: resolved at construction
        return {
            f.name: _jsonable(getattr(server_args, f.name)) for f in dataclasses.fields(server_args)
        }
    data = {f: getattr(server_args, f) for f in REPORT_FIELDS if hasattr(server_args, f)}
    return {f: _jsonable(data[f]) for f in REPORT_FIELDS if f in data}


def _run_one(argv: list[str], mode: str) -> dict[str, Any]:
    import argparse

    from sglang.srt import server_args as sa_mod

    ServerArgs = sa_mod.ServerArgs
    lazy = hasattr(ServerArgs, "resolve_once")  # >= 0.5.14: construction does not resolve
    out: dict[str, Any] = {"ok": False, "stage": None, "error": None, "resolved": None}
    stderr = io.StringIO()
    try:
        if mode == "parse":
            parser = argparse.ArgumentParser(prog="sglang serve")
            ServerArgs.add_cli_args(parser)
            with contextlib.redirect_stderr(stderr):
                ns = parser.parse_args(argv)
            out["stage"] = "parse"
            if lazy:
                server_args = ServerArgs.from_cli_args(ns)
                out["stage"] = "from_cli_args"
                out["resolved"] = _report(server_args, resolved=False)
            else:
                out["resolved"] = {
                    f: _jsonable(getattr(ns, f)) for f in REPORT_FIELDS if hasattr(ns, f)
                }
        else:
            if mode == "cpu" and "--device" not in argv:
                argv = [*argv, "--device", "cpu"]
                out["device_added"] = True
            with contextlib.redirect_stderr(stderr):
                parser = argparse.ArgumentParser(prog="sglang serve")
                ServerArgs.add_cli_args(parser)
                parser.parse_args(argv)  # a separate parse, to tell parse errors apart
            out["stage"] = "parse"
            server_args = sa_mod.prepare_server_args(argv)  # 0.5.9: runs __post_init__
            out["stage"] = "from_cli_args"
            if lazy:
                server_args.resolve_once()
            out["stage"] = "resolve"
            out["resolved"] = _report(server_args, resolved=True)
            server_args.check_server_args()
            out["stage"] = "check"
        out["ok"] = True
    except SystemExit as exc:
        lines = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
        out["error"] = f"SystemExit({exc.code}): " + (lines[-1] if lines else "")
    except BaseException as exc:  # noqa: BLE001 - every refusal is a result
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out["where"] = _where(exc)
    return out


def _pool_one(item: dict[str, Any]) -> dict[str, Any]:
    """SGLang's sizing of one engine's KV pool from two free-memory readings (``pool-*`` modes)."""
    import types

    import torch
    from sglang.srt import runtime_context as rc
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache import kv_cache_configurator as kvm
    from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    out: dict[str, Any] = {"ok": False, "stage": None, "error": None, "resolved": None}
    try:
        server_args = prepare_server_args(list(item["argv"]))
        rc.publish(server_args, role="test", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
        # One process, no distributed group: the free-memory reads take no all-reduce.
        rc.get_parallel().override_permanently(world_group=types.SimpleNamespace(cpu_group=None))
        out["stage"] = "resolve"
        model_config = ModelConfig.from_server_args(server_args)
        spec = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        aux = resolve_spec_aux_hidden_state_config(
            server_args=server_args,
            model_config=model_config,
            spec_algorithm=spec,
            is_draft_worker=False,
        )
        layers = model_config.num_hidden_layers
        kvc = kvm.KVCacheConfigurator(
            device="cuda",
            gpu_id=0,
            attn_dp_size=1,
            pp_size=1,
            pp_group=None,
            model=None,
            model_config=model_config,
            server_args=server_args,
            kv_cache_dtype=torch.bfloat16,
            kv_cache_dtype_str="auto",
            model_dtype=torch.bfloat16,
            page_size=1,
            sliding_window_size=None,
            spec_algorithm=spec,
            is_draft_worker=False,
            post_capture_kv_active=False,
            spec_aux_config=aux,
            is_hybrid_swa=False,
            is_hybrid_swa_compress=False,
            use_mla_backend=False,
            layer_info=ModelLayerInfo(start_layer=0, end_layer=layers, num_effective_layers=layers),
            forward_stream=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            memory_pool_config=None,
        )
        # SGLang's second reading: free memory once the weights are loaded.
        kvm.get_available_gpu_memory = lambda *a, **k: float(item["free_after_weights_gib"])
        out["stage"] = "size"
        budget = kvc._profile_available_bytes(float(item["free_at_start_gib"]))
        config = kvc.config_from_budget(budget)
        out["resolved"] = {
            "tokens": int(config.max_total_num_tokens),
            "budget_bytes": int(budget),
            "max_running_requests": int(kvc.resolve_max_num_reqs(config.max_total_num_tokens)),
            "mem_fraction_static": float(rc.get_schedule().mem_fraction_static),
            "draft_layers": aux.eagle_draft_num_layers,
        }
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - every refusal is a result
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out["where"] = _where(exc)
    return out


def _where(exc: BaseException) -> list[str]:
    """The innermost frames of ``exc``'s traceback, as ``path:line in function``."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}" for f in frames[-6:]]


def worker(mode: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import logging
    import tempfile

    logging.disable(logging.WARNING)
    if mode == "gpu-sim":
        _simulate_h200(tempfile.mkdtemp(prefix="sglang-gpu-sim-"))
    elif mode.startswith("pool-"):
        _simulate_h200(tempfile.mkdtemp(prefix="sglang-gpu-sim-"), mode.removeprefix("pool-"))
    elif mode == "cpu":
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    import importlib

    import sglang.srt.server_args  # noqa: F401 - import once, fork per item

    for name in WARM_MODULES:  # what resolution imports lazily; once here, not per child
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - absent on this release
            pass

    results = []
    for item in items:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read_fd)
            before = set(sys.modules)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    if mode.startswith("pool-"):
                        res = _pool_one(item)
                    else:
                        res = _run_one(list(item["argv"]), mode)
            except BaseException as exc:  # noqa: BLE001
                res = {"ok": False, "stage": None, "error": f"worker: {exc!r}", "resolved": None}
            res["_imported"] = sorted(set(sys.modules) - before)
            with os.fdopen(write_fd, "w") as fh:
                fh.write(json.dumps(res))
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as fh:
            data = fh.read()
        _, status = os.waitpid(pid, 0)
        res = (
            json.loads(data)
            if data
            else {
                "ok": False,
                "stage": None,
                "resolved": None,
                "error": f"worker child died (wait status {status})",
            }
        )
        res["id"] = item["id"]
        # Import in the parent what resolution imported lazily, so later children start warm
        # (module imports only; no resolution state crosses to the next item).
        for name in res.pop("_imported", ()):
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:  # noqa: BLE001
                    pass
        results.append(res)
    return results


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--worker":
        sys.exit("usage: python sglang_worker.py --worker parse|cpu|gpu-sim|pool-h100|pool-h200")
    items = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # sglang prints; keep stdout for the JSON answer
    results = worker(sys.argv[2], items)
    real_stdout.write(json.dumps(results))
    sys.exit(0)
