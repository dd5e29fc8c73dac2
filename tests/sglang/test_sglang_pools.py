"""The arms' KV pools, sized by SGLang 0.5.23's own code (``KVCacheConfigurator`` and
``DefaultPoolConfigurator`` in ``sglang_worker.py`` mode ``pool-<gpu>``) from the free-memory
readings of an H100 and an H200, for an 8B target against its twin with NGRAM, a draft model and an
EAGLE3 head (``benchmarks/pool_capacity.py`` builds the rows; its printed table is
``benchmarks/results/pool_capacity.txt``).

After the plan (``engines/kv_pools.py``) every row's arms hold equal capacities - the pinned one -
or the case is refused up front with the reason. Before it (main at ea1ff1d: 0.40 each, resident)
the rows the audit found unequal are unequal here too, by SGLang's own arithmetic.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from sglang_envs import ENV_ROOT
from sglang_envs import NEWEST
from sglang_envs import run_worker

from pytest_specenergy.engines.kv_pools import GIB
from pytest_specenergy.engines.kv_pools import runtime_reserve_bytes

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "pool_capacity", ROOT / "benchmarks" / "pool_capacity.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _benchmark()


@pytest.fixture(scope="module")
def rows(bench):
    # A fixed folder beside the environments: the worker's answers are cached by the items, paths
    # included (a pytest temp folder moves every session, under xdist its parent too, and the
    # worker's 80 s of SGLang imports ran again in every run).
    root = ENV_ROOT / "pool-capacity-checkpoints"
    paths = bench.make_checkpoints(root)
    return bench.all_rows(paths, lambda gpu, batch: run_worker(NEWEST, f"pool-{gpu}", batch))


def test_after_the_plan_every_row_holds_equal_pinned_pools_or_is_refused(bench, rows):
    after = [(row, answers) for row, answers in rows if row.when == "after"]
    assert len(after) == 12
    for row, answers in after:
        if row.refused:
            assert "max_total_tokens" in row.refused or "blocked" in row.refused, row
            continue
        got = bench.capacities(row, answers)
        assert got == {"baseline": row.planned, "speculative": row.planned}, (row, got)
        if row.pin:
            assert row.planned == row.pin


def test_the_h100_runs_the_gpu_suites_blocked_and_the_h200_resident(bench, rows):
    orders = {(r.gpu, r.drafter, r.pin): r.order for r, _ in rows if r.when == "after"}
    assert {v for (gpu, _, _), v in orders.items() if gpu == "h100"} == {"blocked"}
    assert {v for (gpu, _, _), v in orders.items() if gpu == "h200"} == {"resident"}


def test_before_the_plan_resident_pools_were_unequal_by_sglangs_own_arithmetic(bench, rows):
    before = {
        (r.gpu, r.drafter, r.pin): bench.capacities(r, a) for r, a in rows if r.when == "before"
    }
    # H200, no pin (ci_gate): every speculative engine got less than its twin.
    for name in ("ngram", "draft_model", "eagle3"):
        got = before[("h200", name, None)]
        assert isinstance(got["speculative"], int) and got["speculative"] < got["baseline"]
    # H200, 131072 pinned (example_suites/gpu): the draft-model engine still falls short.
    got = before[("h200", "draft_model", 131072)]
    assert got["baseline"] == 131072 and got["speculative"] < 131072
    # H100: SGLang refuses to start the second engine at all.
    assert all(
        str(v["speculative"]).startswith("refused: ValueError: Loaded weights leave no GPU memory")
        for (gpu, _, _), v in before.items()
        if gpu == "h100"
    )


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_plans_runtime_reserve_covers_sglangs_own(bench, tiny_models, gpu):
    """SGLang's default mem_fraction_static leaves (1 - it) of the GPU for activations and graphs;
    the plan reserves at least as much per engine."""
    root = Path(bench.make_checkpoints(Path(tiny_models[0]).parent / "pool-shapes")["qwen3-8b"])
    item = {
        "id": "default",
        "argv": ["--model-path", str(root), "--max-running-requests", "64"],
        "free_at_start_gib": 70.0,
        "free_after_weights_gib": 50.0,
    }
    got = run_worker(NEWEST, f"pool-{gpu}", [item])["default"]
    assert got["ok"], got
    total = bench.GPUS[gpu]
    sglang_reserve = (1 - got["resolved"]["mem_fraction_static"]) * total
    assert runtime_reserve_bytes(total, running=64) >= sglang_reserve
    assert runtime_reserve_bytes(total, running=64) - sglang_reserve < 1 * GIB
