"""pytest-specenergy's import-only stand-in for ``sgl_kernel`` (not SGLang's kernel code).

Why: PyPI has no CPU build of SGLang's kernels. ``sglang-kernel`` ships only sm90/sm100 CUDA
objects linking ``libtorch_cuda.so``/``libcudart``, and there is no sdist. SGLang's CPU engine
still imports names from it at module import time (0.5.23
``sglang/kernels/ops/kvcache/cache_move.py``: ``from sgl_kernel import
copy_all_layer_kv_cache_cpu``), and the parser path imports ``sgl_kernel.scalar_type`` etc. on
some releases. The baseline (non-speculative) CPU server calls none of them: without the real
package, ``torch.ops.sgl_kernel`` has no ops, SGLang's AMX probe fails and it runs the
``torch_native`` attention backend and plain torch layers.

Every name and every submodule (``sgl_kernel.kvcacheio``, ``sgl_kernel.flash_attn``, ...) imports;
any call raises :class:`specenergy_standin.StandInCalled`. This module registers no
``torch.ops.sgl_kernel`` operators, so SGLang's ``hasattr(torch.ops.sgl_kernel, ...)`` feature
probes still see the kernels as missing. A speculative CPU arm calls kernels: the live NGRAM
engine gets six of them from the test-only overlay (``tests/sglang_overlay/``), which puts them on
this stand-in in that engine's processes only.

See ``tests/sglang_standins/specenergy_standin.py`` for the contract and the call log
(``$SPECENERGY_STANDIN_LOG``).
"""

from specenergy_standin import install as _install

_install(__name__, globals())
