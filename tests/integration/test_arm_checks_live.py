"""The checks that compare the two arms, on two live reference engines (not one payload twice).

A speculative engine that admits fewer requests than the baseline's (SGLang sizes an EAGLE
engine's KV pool with the draft's layers, so it can hold fewer) runs its arm at a lower
concurrency: the per-token figures of the two arms then describe different workloads, and the
pair must fail ``concurrency-differs`` with both arms' figures in the message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.measure.pairs import PairMeasurer

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _pair(tmp_path: Path, spec_cap: int | None):
    """One b4 n-gram pair measured on live engines; ``spec_cap``: what the speculative engine
    really admits while the measurer believes it set the batch."""
    case = Case.of(engine="reference", model="tiny:dense", drafter=Drafter("ngram"), batch=4,
                   corpus=load_corpus("code"), generation=Generation(max_new_tokens=24, prompts=12))
    pool = EnginePool(tmp_path, startup_timeout_s=300)
    measurer = PairMeasurer(log_dir=tmp_path, startup_timeout=300, meter="modeled:h200", repeats=1,
                            warmup=0, pool=pool)
    try:
        if spec_cap is not None:
            spec = pool.get(case.spec_config())
            spec.client.set_internal_state(max_running_requests=spec_cap)
            spec.admission_cap = case.batch  # the measurer leaves a cap it believes set alone
        return measurer.measure(case)
    finally:
        pool.close()


def test_arms_run_at_different_concurrency_fail_concurrency_differs(tmp_path: Path) -> None:
    pair = _pair(tmp_path, spec_cap=2)
    base, spec = (run.concurrency.get("mean_running") for run in (pair.baseline, pair.speculative))
    assert base > 3.5 and spec <= 2.0, (base, spec)  # the engines really ran so
    [differs] = [c for c in pair.failed_checks if c.name == "concurrency-differs"]
    assert f"{base:.2f}" in differs.message and f"{spec:.2f}" in differs.message, differs.message


def test_arms_at_the_same_concurrency_do_not(tmp_path: Path) -> None:
    pair = _pair(tmp_path, spec_cap=None)
    assert "concurrency-differs" not in {c.name for c in pair.checks}, pair.describe()
