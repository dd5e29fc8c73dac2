"""pytest-specenergy's import-only stand-in for ``torchvision`` (not torchvision's code).

Why: SGLang imports torchvision at config-import time (0.5.23
``sglang/srt/multimodal/internvl_utils.py``), but the torchvision wheels on PyPI are CUDA
builds: next to the CPU build of torch 2.13 they fail with ``operator torchvision::nms does not
exist`` (their ``_C.so`` needs ``libc10_cuda.so``). The conformance and live tests run text-only
models, which never call torchvision, so this stand-in lets every name import
(``torchvision.transforms.InterpolationMode``, ``torchvision.transforms.functional``, ...) and
raises :class:`specenergy_standin.StandInCalled` on any call.

``__version__`` is ``0.0.0+specenergy.standin``: transformers finds the module (its probe is
``importlib.util.find_spec``), finds no distribution metadata and falls back to
``torchvision.__version__``, which must parse as a version. ``0.0.0`` makes every "torchvision
>= X" check answer no, so transformers keeps its non-torchvision code paths.

See ``tests/sglang_standins/specenergy_standin.py`` for the contract and the call log
(``$SPECENERGY_STANDIN_LOG``).
"""

from specenergy_standin import install as _install

__version__ = "0.0.0+specenergy.standin"

_install(__name__, globals())
