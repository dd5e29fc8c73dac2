"""Skip this suite, with the reason, where it cannot run: no GPU or no SGLang."""

import pytest

from pytest_specenergy import gpu_path_unavailable


def pytest_collection_modifyitems(config, items):
    reason = gpu_path_unavailable()
    if reason is None or config.getoption("specenergy_dry_run"):
        return
    for item in items:
        item.add_marker(pytest.mark.skip(reason=f"GPU suite: {reason}"))
