"""How a suite's cases share one GPU: the residency decision the measurer acts on and the planner
prices, from the cases alone."""

from __future__ import annotations

from typing import Callable

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.sglang_residency import Residency
from pytest_specenergy.engines.sglang_residency import decide


def engine_configs(case: Case) -> list[EngineConfig]:
    """Every engine ``case`` starts: its baseline, its drafter's and (in-job A/B) its reference's."""
    reference = case.reference_config()
    return [case.baseline_config(), case.spec_config(), *([reference] if reference else [])]


def on_gpu(case: Case) -> bool:
    """Whether ``case``'s engines run on a GPU (an SGLang engine not on the CPU, or a CUDA one)."""
    return (case.engine == "sglang" and case.device != "cpu") or case.device.startswith("cuda")


def gpu_residency(
    cases: list[Case],
    gpu_memory: Callable[[], int | None],
    server_fields: Callable[[], frozenset[str] | None],
) -> Residency | None:
    """How the GPU's engines run for ``cases`` (None: no GPU case): a case's SGLang engines all
    resident, interleaved, when they fit, else one at a time, blocked."""
    gpu = [c for c in cases if on_gpu(c)]
    if not gpu:
        return None
    # One case's engines at once; the cases sharing a baseline run in as many cycles of their
    # own as the GPU needs (PairMeasurer._group), each with the baseline.
    engines = max(3 if c.reference is not None else 2 for c in gpu)
    if any(c.engine != "sglang" for c in gpu):
        return Residency(False, 1, None, "a non-SGLang engine on the GPU (no memory split)")
    configs = [config for c in gpu for config in engine_configs(c)]
    return decide(configs, engines, gpu_memory(), server_fields())
