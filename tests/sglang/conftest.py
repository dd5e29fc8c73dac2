"""Hooks and fixtures of the real-SGLang tests (helpers in ``sglang_envs.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sglang_envs

SKIP_REASON = sglang_envs.SKIP_REASON


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``sglang`` marker (``-m "not sglang"`` leaves this folder out)."""
    config.addinivalue_line("markers", "sglang: runs real SGLang code (tests/sglang/)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``sglang``; skip them (with the reason) only when asked to."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.sglang)
            if os.environ.get("SPECENERGY_SKIP_SGLANG") == "1":
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def tiny_models() -> tuple[str, str]:
    """A 2-layer random Llama target and a 1-layer draft, made once (``sglang_envs``)."""
    return sglang_envs.tiny_models()
