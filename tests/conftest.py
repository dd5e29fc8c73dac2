"""Helpers shared by the test folders."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator

import numpy  # noqa: F401
import pytest

import pytest_specenergy.engines.zygote  # noqa: F401
from pytest_specenergy.refserver.catalog import CACHE_ENV
from pytest_specenergy.refserver.catalog import cache_root

# pytester's in-process runs drop every module a run imported; the plugin imports numpy only
# when a case is compared, and numpy cannot be imported twice in one process. Importing it
# here, before any pytester run, keeps it loaded across runs. The engine zygote likewise: kept
# loaded, its one process (torch and transformers imported) serves every run of the worker.
# transformers' model machinery too, by a session fixture (:func:`_transformers_loaded`).

#: Tests by how long they take, slowest first: the live SGLang test (about 240 s), then
#: folders (per-test times of 2026-12-06 on 2 cores: the end-to-end folder about 560 s in all, up
#: to 70 s a test; refserver 120 s; benchmarks and unit/engines about 40 s each; ...); the rest is
#: seconds in all. Equal ranks keep collection order.
SLOW_FIRST = (
    ("tests/sglang/test_sglang_live.py::test_plugin_against_live_sglang_cpu_servers",),
    ("tests/integration/", "tests/packaging/"),
    ("tests/refserver/",),
    ("tests/benchmarks/", "tests/unit/engines/"),
    ("tests/unit/report/",),
)


def _slowness(item: pytest.Item) -> int:
    return next(
        (rank for rank, group in enumerate(SLOW_FIRST) if item.nodeid.startswith(group)),
        len(SLOW_FIRST),
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, every worker starts on the slowest tests. xdist's work stealing hands each
    worker a contiguous share of the collection, steals from a queue's end, and never takes a
    worker's last two (the running test and the next): a minute-long test left late in one share ran
    alone while the other worker idled (13 s of a 250 s run; 4 s after), and the live SGLang tests
    (two then), last in collection order, ran one after the other whenever one worker reached the
    first before the other stole (tests/sglang/ 134 s against 99-106 s side by side). The slowest
    first, dealt round-robin into one share per worker, start side by side and leave the many short
    tests for the end, where stealing evens the workers out."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        # A module that sets ``ONE_WORKER = True`` shares one costly session among its tests
        # (tests/integration/test_real_model_faults.py): its tests are dealt as one unit, so one
        # worker runs that session, not each worker that got one of them.
        units: dict[Any, list[pytest.Item]] = {}
        for item in sorted(items, key=_slowness):
            module = getattr(item, "module", None)
            together = module is not None and getattr(module, "ONE_WORKER", False)
            units.setdefault(module.__name__ if together else id(item), []).append(item)
        ordered = list(units.values())
        items[:] = [
            item for share in range(workers) for unit in ordered[share::workers] for item in unit
        ]


def fast_options(repeats: int = 1) -> list[str]:
    """The options of a quick pytester session: few repeats, no warm-up, a pool of 4 prompts
    where a suite names none (a batch above 2 needs more, its generation marker says so), no
    cache folder."""
    return [
        f"--specenergy-repeats={repeats}",
        "--specenergy-warmup=0",
        "--specenergy-pool=4",
        "-p",
        "no:cacheprovider",
    ]


@pytest.fixture
def run_suite(pytester: pytest.Pytester) -> Callable[..., Any]:
    """``run_suite(*args, repeats=1)``: run the pytester suite quickly with extra options."""

    def run(*args: str, repeats: int = 1) -> Any:
        return pytester.runpytest(*fast_options(repeats), *args)

    return run


@pytest.fixture(scope="session")
def _sglang_gpu_check_module() -> Any:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sglang_gpu_check.py"
    spec = importlib.util.spec_from_file_location("sglang_gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def sglang_gpu_check(
    _sglang_gpu_check_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """``benchmarks/sglang_gpu_check.py`` loaded as a module (benchmarks/ is no package), run from
    the test's own folder: the runbook writes its facts JSON to the current folder unless told,
    and a test must leave the checkout as it found it."""
    monkeypatch.chdir(tmp_path)
    return _sglang_gpu_check_module


@pytest.fixture(autouse=True)
def _outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees the environment of a developer's machine: ``CI`` unset. The gate's
    coverage policy (``--specenergy-unmeasured=auto``) fails under CI and warns elsewhere; a test
    that needs CI sets it itself, so this suite behaves alike on a laptop and on a CI runner."""
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture(autouse=True, scope="session")
def _transformers_loaded() -> None:
    """transformers' model machinery, imported before any pytester run of the process. It imports
    torch.distributed's modules lazily (a chat case loading its tokenizer in a run), and importing
    those again, after the run dropped them, registers their torch operator libraries twice, which
    torch refuses: every later test of the worker that imported transformers failed (46 tests,
    when the chat test ran before them). A fixture, not a module import: the xdist controller,
    which runs no test, does not pay its 4 s."""
    try:
        import transformers.modeling_utils  # noqa: F401
        import transformers.utils.type_validators  # noqa: F401
    except ImportError:  # a checkout without the reference extra: nothing imports them
        pass


@pytest.fixture(autouse=True, scope="session")
def _one_model_cache() -> Iterator[None]:
    """Every run of the session, pytester's included, finds the built-in real checkpoints in the
    user's model cache (``dev/setup.sh --test`` fills it). pytester moves ``HOME`` to each test's
    own folder, so a run's default cache (``~/.cache/...``) was empty there: each real-model
    session converted smollm2-135m from its GGUF again (about 29 s of CPU a session), into a
    folder thrown away after the test. Tests of the cache's own location set the variable
    themselves."""
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(cache_root()))
    yield
    patch.undo()
