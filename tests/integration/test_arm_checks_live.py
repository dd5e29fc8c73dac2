"""The checks that compare the two arms, on two live reference engines (not one payload twice).

A speculative engine that admits fewer requests than the baseline's (SGLang sizes an EAGLE
engine's KV pool with the draft's layers, so it can hold fewer) runs its arm at a lower
concurrency: the per-token figures of the two arms then describe different workloads, and the
pair must fail ``concurrency-differs`` with both arms' figures in the message.

A window the host disturbed (its ramp-up slowed, so it ran far below its own peak for a while)
is run again (up to ``WINDOW_RERUNS`` times) and the one nearest the batch kept; when every run
is disturbed the best is kept all the same, and the check that fails says the windows were run
again.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.measure.arm import WINDOW_RERUNS
from pytest_specenergy.measure.pairs import PairMeasurer

pytest.importorskip("torch")
pytest.importorskip("transformers")


class SlowRampClient(EngineClient):
    """The real client, with the ramp-up of the windows numbered in ``windows`` (counted by
    flushes: each full window starts with one) slowed the way a loaded host slows it: the
    window's first request and the next one its thread takes run alone, from prefill to last
    token, while every other request of the first ``width`` is held until they have finished.
    The hold is counted in requests (so in the engine's steps), not in seconds, so the window
    falls as far below its peak on a slow host as on a fast one: a 0.3 s lag left a CI window at
    3.72 of 4, barely under the 3.8 line. The first thread is never held (so it can never wait
    on itself), whatever position its second request takes."""

    ALONE = 2  # requests run alone by the window's first thread before the others are sent

    def __init__(self, base_url: str, windows: set[int], width: int) -> None:
        super().__init__(base_url, timeout_s=120)
        self.windows, self.width = windows, width
        self.window = self.sent = 0
        self.lock = threading.Lock()
        self._new_ramp()

    def _new_ramp(self) -> None:
        self.first_thread: int | None = None
        self.alone_done = 0
        self.released = threading.Event()

    def flush_cache(self) -> None:
        super().flush_cache()
        with self.lock:
            self.window, self.sent = self.window + 1, 0
            self._new_ramp()

    def generate(self, *args, **kwargs):
        me = threading.get_ident()
        with self.lock:
            position, slowed, released = self.sent, self.window in self.windows, self.released
            self.sent += 1
            if slowed and position == 0:
                self.first_thread = me
            alone = slowed and me == self.first_thread
        if slowed and not alone and position < self.width:
            released.wait(timeout=120)
        try:
            return super().generate(*args, **kwargs)
        finally:
            if alone:
                with self.lock:
                    self.alone_done += 1
                    if self.alone_done >= self.ALONE:
                        released.set()


def _pair(tmp_path: Path, spec_cap: int | None = None, slow_windows: set[int] = frozenset()):
    """One b4 n-gram pair measured on live engines; ``spec_cap``: what the speculative engine
    really admits while the measurer believes it set the batch; ``slow_windows``: the
    speculative engine's windows whose ramp-up is slowed (:class:`SlowRampClient`)."""
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=load_corpus("code"),
        generation=Generation(max_new_tokens=24, prompts=12),
    )
    pool = EnginePool(tmp_path, startup_timeout_s=300)
    measurer = PairMeasurer(
        log_dir=tmp_path, startup_timeout=300, meter="modeled:h200", repeats=1, warmup=0, pool=pool
    )
    try:
        spec = pool.get(case.spec_config())
        if spec_cap is not None:
            spec.client.set_internal_state(max_running_requests=spec_cap)
            spec.admission_cap = case.batch  # the measurer leaves a cap it believes set alone
        if slow_windows:
            spec.client = SlowRampClient(spec.client.base_url, set(slow_windows), 2 * case.batch)
        return measurer.measure(case)
    finally:
        pool.close()


def test_arms_run_at_different_concurrency_fail_concurrency_differs(tmp_path: Path) -> None:
    pair = _pair(tmp_path, spec_cap=2)
    base, spec = (run.concurrency.mean_running for run in (pair.baseline, pair.speculative))
    assert base > 3.5 and spec <= 2.0, (base, spec)  # the engines really ran so
    [differs] = [c for c in pair.failed_checks if c.name == "concurrency-differs"]
    assert f"{base:.2f}" in differs.message and f"{spec:.2f}" in differs.message, differs.message


def test_arms_at_the_same_concurrency_do_not(tmp_path: Path) -> None:
    pair = _pair(tmp_path, spec_cap=None)
    assert "concurrency-differs" not in {c.name for c in pair.checks}, pair.describe()


def test_a_window_the_host_disturbed_is_run_again_and_the_new_one_kept(tmp_path: Path) -> None:
    pair = _pair(tmp_path, slow_windows={1})
    spec = pair.speculative.concurrency
    dropped = spec.rerun_means[0]  # the slowed window (a loaded host may disturb its rerun too)
    assert dropped < 0.95 * 4, spec  # the slowed ramp-up really left the window below its peak
    assert spec.window_means[0] > dropped + 0.3, spec  # the window kept is one run again
    # The baseline's windows are not slowed, but a loaded host can still disturb one (CI builds
    # the SGLang environments beside these tests: 3.73 of 4 once). Then the same rule holds.
    base = pair.baseline.concurrency
    for dropped in base.rerun_means:
        assert dropped < 0.95 * 4 and base.window_means[0] >= 0.95 * 4, base
    assert not {"concurrency-differs", "concurrency-below-batch"} & {c.name for c in pair.checks}, (
        pair.describe()
    )


def test_a_window_disturbed_again_is_kept_and_the_check_says_it_was_run_again(
    tmp_path: Path,
) -> None:
    pair = _pair(tmp_path, slow_windows={1, 2, 3})
    spec = pair.speculative.concurrency
    assert len(spec.rerun_means) == WINDOW_RERUNS and spec.window_means[0] < 0.95 * 4, spec
    [differs] = [c for c in pair.failed_checks if c.name == "concurrency-differs"]
    # A loaded host may disturb a baseline window too (CI: baseline arm's 3.78 once); the message
    # then names both.
    said = differs.message.partition("windows run again after falling below their peak: ")[2]
    assert (
        said.startswith(("speculative arm's ", "baseline arm's ")) and "speculative arm's " in said
    ), differs.message
    assert f"{spec.rerun_means[0]:.2f}" in differs.message, differs.message
