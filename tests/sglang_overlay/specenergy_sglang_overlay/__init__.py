"""pytest-specenergy's test-only CPU overlay for SGLang 0.5.23's speculative decoding (NGRAM).

Test infrastructure, never part of the plugin: nothing in ``pytest_specenergy`` imports it. It
lets the live tests run a real SGLang NGRAM engine on a CPU, where SGLang stops because PyPI has
no CPU build of its kernels and its ``torch_native`` attention backend has no verify path.

What it replaces, and nothing else:

* the six ``sgl_kernel`` CPU ops SGLang's NGRAM path calls, which the import-only stand-in
  (``tests/sglang_standins/``) would refuse, each a port of SGLang's own Triton kernel of the same
  contract (``kv_cache_ops.py``, ``spec_tree_ops.py``): ``copy_all_layer_kv_cache_cpu``,
  ``assign_req_to_token_pool_cpu``, ``assign_extend_cache_locs_cpu``,
  ``speculative.reconstruct_indices_from_tree_mask``, ``verify_tree_greedy_cpu``,
  ``fill_accept_out_cache_loc_cpu`` (``fill_bonus_tokens_cpu``, which the audit also ported, is
  called by the EAGLE/STANDALONE verify only: NGRAM commits its bonus token itself);
* ``TorchNativeAttnBackend.forward_extend`` for TARGET_VERIFY batches only
  (``verify_attention.py``); every other forward mode runs SGLang's own code.

Everything else is SGLang's own: the HTTP server and tokenizer manager, the scheduler (admission,
retraction, aborts, ``/flush_cache``, step records), the NGRAM worker and its corpus (SGLang's
JIT-compiled C++), the verify-and-commit logic, the per-request speculative counters in
``meta_info``, the model and every other attention path. Speed on this path means nothing (the
ops are Python); what it tests is SGLang's scheduler, speculative worker, counters and HTTP layer.

Where it loads: ``tests/sglang_overlay`` on ``PYTHONPATH`` (the live session in
``tests/sglang/test_sglang_live.py`` and ``dev/sglang_capture*.py`` put it there) makes Python run
its ``sitecustomize.py`` at start-up, which calls :func:`activate` in an SGLang server process asked
to speculate (``-m sglang.launch_server ... --speculative-algorithm ...``) and in that server's
child processes; any other process runs unmodified. :func:`activate` refuses (a clear error, the
process exits) on any SGLang but :data:`SGLANG_VERSION`, or where ``sgl_kernel`` is not the
stand-in.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

#: The one SGLang release this overlay was written against (its call sites and signatures).
SGLANG_VERSION = "0.5.23"
#: Set in an activated server's environment, so that its child processes (the scheduler,
#: the detokenizer) activate too.
ACTIVE_ENV = "SPECENERGY_SGLANG_OVERLAY_ACTIVE"
#: The stand-ins this overlay fills, beside it in the repository.
STANDINS = Path(__file__).resolve().parents[2] / "sglang_standins"
#: The module whose attention backend gains the verify path.
TORCH_NATIVE = "sglang.srt.layers.attention.torch_native_backend"
#: ``sgl_kernel`` attribute -> (overlay module, function).
OPS = {
    "copy_all_layer_kv_cache_cpu": ("kv_cache_ops", "copy_all_layer_kv_cache_cpu"),
    "assign_req_to_token_pool_cpu": ("kv_cache_ops", "assign_req_to_token_pool_cpu"),
    "assign_extend_cache_locs_cpu": ("kv_cache_ops", "assign_extend_cache_locs_cpu"),
    "speculative.reconstruct_indices_from_tree_mask": (
        "spec_tree_ops",
        "reconstruct_indices_from_tree_mask",
    ),
    "verify_tree_greedy_cpu": ("spec_tree_ops", "verify_tree_greedy_cpu"),
    "fill_accept_out_cache_loc_cpu": ("spec_tree_ops", "fill_accept_out_cache_loc_cpu"),
}


class OverlayRefused(RuntimeError):
    """The overlay will not load here (another SGLang release, or a real ``sgl_kernel``)."""


def wanted(orig_argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this process should load the overlay: an SGLang server asked to speculate, or a
    child process of one."""
    if environ.get(ACTIVE_ENV) == "1":
        return True
    argv = list(orig_argv)
    # The server itself (``python -m sglang.launch_server ...``), not a process whose argv only
    # holds its command line: the plugin's watchdog (``python -m ...watchdog -- python -m
    # sglang.launch_server ...``) runs in an interpreter without SGLang, where loading failed and
    # Python printed "Error in sitecustomize" into the engine's log.
    return argv[1:3] == ["-m", "sglang.launch_server"] and any(
        a == "--speculative-algorithm" or a.startswith("--speculative-algorithm=") for a in argv
    )


def check_version(installed: str) -> None:
    """Refuse any SGLang but :data:`SGLANG_VERSION`: the ops and the verify path follow its call
    sites and signatures, which other releases change."""
    if installed != SGLANG_VERSION:
        raise OverlayRefused(
            f"the specenergy SGLang CPU overlay (tests/sglang_overlay/) was written against "
            f"SGLang {SGLANG_VERSION} and refuses SGLang {installed}: port and re-test its ops "
            f"(tests/sglang/test_sglang_overlay.py) against that release's kernels first"
        )


def _record(event: str, name: str) -> None:
    """One line in the stand-ins' call log (``$SPECENERGY_STANDIN_LOG``), if it is set, with the
    process group: a server's processes share its group, so a test can tell which engine wrote."""
    from specenergy_standin import record

    record(event, name, pgid=os.getpgid(0))


def _traced(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, logging its first call in this process (the live test asserts each op ran;
    one line, not one per call: they run on every decode step)."""
    called = []

    @functools.wraps(function)
    def traced(*args: Any, **kwargs: Any) -> Any:
        if not called:
            called.append(True)
            _record("overlay-call", name)
        return function(*args, **kwargs)

    return traced


def _standin_sgl_kernel() -> Any:
    """The import-only ``sgl_kernel`` stand-in of this checkout, imported; refuses a real one."""
    if str(STANDINS) not in sys.path:
        sys.path.insert(0, str(STANDINS))
    import sgl_kernel

    where = Path(getattr(sgl_kernel, "__file__", "") or "").resolve()
    if where.parent.parent.name != "sglang_standins":
        raise OverlayRefused(
            f"sgl_kernel at {where} is not pytest-specenergy's stand-in: the overlay replaces "
            "stand-in names only and never a real kernel build"
        )
    return sgl_kernel


def install_ops(sgl_kernel: Any) -> None:
    """Put the ops on the ``sgl_kernel`` stand-in (and ``sgl_kernel.speculative``), before SGLang
    imports them by name."""
    import importlib

    for attribute, (module_name, function_name) in OPS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        function = _traced(f"sgl_kernel.{attribute}", getattr(module, function_name))
        owner = sgl_kernel
        *parents, leaf = attribute.split(".")
        for parent in parents:
            owner = importlib.import_module(f"{owner.__name__}.{parent}")
        setattr(owner, leaf, function)


def patch_torch_native(module: Any) -> None:
    """Give ``module.TorchNativeAttnBackend`` the TARGET_VERIFY path; other modes are untouched."""
    from .verify_attention import forward_target_verify

    backend_class = module.TorchNativeAttnBackend
    original = backend_class.forward_extend
    trace = _traced("TorchNativeAttnBackend.forward_extend[TARGET_VERIFY]", forward_target_verify)

    @functools.wraps(original)
    def forward_extend(
        self: Any,
        q: Any,
        k: Any,
        v: Any,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> Any:
        if not forward_batch.forward_mode.is_target_verify():
            return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        write_loc = module.KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc)
        return trace(self, q, k, v, layer, forward_batch, save_kv_cache, write_loc)

    backend_class.forward_extend = forward_extend


def activate() -> None:
    """Load the overlay into this process (see the module docstring); raises
    :class:`OverlayRefused` where it must not load."""
    check_version(importlib.metadata.version("sglang"))
    install_ops(_standin_sgl_kernel())
    from .import_hook import after_import

    after_import(TORCH_NATIVE, patch_torch_native)
    os.environ[ACTIVE_ENV] = "1"
    _record("overlay-activated", f"sglang {SGLANG_VERSION}")
