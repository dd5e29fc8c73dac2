"""Helpers shared by the test folders."""

from __future__ import annotations

import importlib.util
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
