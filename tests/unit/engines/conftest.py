"""Fixtures of the engine supervision tests (helpers live in fake_engine.py)."""

from __future__ import annotations

import os
import signal

import pytest


@pytest.fixture
def reap_group():
    """Process groups registered here are SIGKILLed after the test, whatever it did."""
    groups: list[int] = []
    yield groups.append
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
