"""Skip the GPU suite, with the reason, where it cannot run: no GPU or no SGLang."""

import importlib.util

import pytest


def _gpu_missing_reason():
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (pip install 'pytest-specenergy[sglang]')"
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no driver, no library: NVML raises its own error types
        return f"no NVIDIA GPU is usable here ({exc})"
    return None if count else "NVML sees no GPU"


def pytest_collection_modifyitems(config, items):
    reason = _gpu_missing_reason()
    if reason is None or config.getoption("specenergy_dry_run"):
        return
    for item in items:
        item.add_marker(pytest.mark.skip(reason=f"GPU suite: {reason}"))
