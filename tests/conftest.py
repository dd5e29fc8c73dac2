"""Helpers shared by the test folders."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any
from typing import Callable

import numpy  # noqa: F401
import pytest

import pytest_specenergy.engines.zygote  # noqa: F401

# pytester's in-process runs drop every module a run imported; the plugin imports numpy only
# when a case is compared, and numpy cannot be imported twice in one process. Importing it
# here, before any pytester run, keeps it loaded across runs. The engine zygote likewise: kept
# loaded, its one process (torch and transformers imported) serves every run of the worker.

#: Test folders by how long their tests take, slowest first (per-test times of 2026-12-05 on 2
#: cores: the end-to-end folder 290 s in all, up to 56 s a test; refserver 81 s; benchmarks and
#: unit/engines 37 s each; ...); the rest is seconds in all. Equal ranks keep collection order.
SLOW_FIRST = (("tests/integration/",), ("tests/refserver/",), ("tests/benchmarks/", "tests/unit/engines/"),
              ("tests/unit/report/",))


def _slowness(item: pytest.Item) -> int:
    return next((rank for rank, group in enumerate(SLOW_FIRST) if item.nodeid.startswith(group)), len(SLOW_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, every worker starts on the slowest tests: xdist's work stealing hands each
    worker a contiguous share of the collection and steals from a queue's end, so a minute-long
    test left late in one share ran alone while the other worker idled (13 s of a 250 s run;
    4 s after). The slowest first, dealt round-robin into one share per worker, leave the many
    short tests for the end, where stealing evens the workers out. A run holding tests/sglang/
    keeps collection order, the one its two live tests have run side by side in since they
    exist: with them first, that folder took as long (99-106 s here; 201 s and 193 s in two CI
    runs on a slow host, either order)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1 and not any(item.nodeid.startswith("tests/sglang/") for item in items):
        ordered = sorted(items, key=_slowness)
        items[:] = [item for share in range(workers) for item in ordered[share::workers]]


def fast_options(repeats: int = 1) -> list[str]:
    """The options of a quick pytester session: few repeats, no warm-up, a pool of 4 prompts
    where a suite names none (a batch above 2 needs more, its generation marker says so), no
    cache folder."""
    return [f"--specenergy-repeats={repeats}", "--specenergy-warmup=0", "--specenergy-pool=4",
            "-p", "no:cacheprovider"]


@pytest.fixture
def run_suite(pytester: pytest.Pytester) -> Callable[..., Any]:
    """``run_suite(*args, repeats=1)``: run the pytester suite quickly with extra options."""
    def run(*args: str, repeats: int = 1) -> Any:
        return pytester.runpytest(*fast_options(repeats), *args)

    return run


@pytest.fixture(scope="session")
def sglang_gpu_check() -> Any:
    """``benchmarks/sglang_gpu_check.py`` loaded as a module (benchmarks/ is no package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sglang_gpu_check.py"
    spec = importlib.util.spec_from_file_location("sglang_gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
