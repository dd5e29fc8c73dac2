"""Whether the GPU path (SGLang engines measured by NVML) can run here, and if not, why.

GPU suites skip themselves with this reason on machines without a GPU or SGLang, so one
suite file serves CI runners of both kinds.
"""

from __future__ import annotations

import importlib.util


def nvml_gpu_count() -> int:
    """How many GPUs NVML sees; raises whatever NVML raises when it cannot start."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def gpu_path_unavailable() -> str | None:
    """None when SGLang is importable and NVML sees a GPU; else the reason, ready to show."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (pip install 'pytest-specenergy[sglang]')"
    try:
        count = nvml_gpu_count()
    except Exception as exc:  # no library or no driver: NVML raises its own error types
        return f"no NVIDIA GPU is usable here ({exc})"
    return None if count else "NVML sees no GPU"
