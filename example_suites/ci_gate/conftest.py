"""Where this GPU suite cannot run (no GPU or no SGLang): skipped with the reason on a
developer's machine, failed in CI (``CI`` set), where a gate that measured nothing must not pass."""

import os

import pytest

from pytest_specenergy import gpu_path_unavailable


def pytest_collection_modifyitems(config, items):
    reason = gpu_path_unavailable()
    # A dry run and a plan start nothing: they need neither.
    if (
        reason is None
        or config.getoption("specenergy_dry_run")
        or config.getoption("specenergy_plan")
    ):
        return
    if os.environ.get("CI"):
        raise pytest.UsageError(f"GPU suite in CI without its GPU path: {reason}")
    for item in items:
        item.add_marker(pytest.mark.skip(reason=f"GPU suite: {reason}"))
