"""From a :class:`Case` to a :class:`PairResult`: engines, meters, shared baselines, repeats.

Each case is measured once and cached. The baseline arm of one (engine config, batch,
corpus, generation) is measured once and shared by every drafter tested against it; when
it is first needed, every planned case of that baseline engine is measured in one go, so the
baseline engine starts once even when only one engine may run at a time (one GPU).

The measurer takes plain values; it knows nothing of pytest, the gate or the session.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from typing import Callable

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.measure.arm import ArmMeasurer
from pytest_specenergy.measure.coherence import measure_coherence
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.meters import make_meter
from pytest_specenergy.meters import meter_kind_for
from pytest_specenergy.meters.base import Meter

#: Builds the meter of a kind for an engine, or returns None for the built-in one
#: (the session passes the ``pytest_specenergy_make_meter`` hook here).
MeterFactory = Callable[[str, ServerProcess], "Meter | None"]


class PairMeasurer:
    """Measures pairs on pooled engines; one instance per session (or per xdist worker)."""

    def __init__(self, *, log_dir: Path, startup_timeout: float, meter: str, repeats: int,
                 warmup: int | None, meter_factory: MeterFactory | None = None,
                 pool: EnginePool | None = None) -> None:
        self.pool = pool or EnginePool(log_dir, startup_timeout)
        self.meter_choice = meter
        self.repeats = repeats
        self.warmup = warmup  # None: auto
        self.meter_factory = meter_factory
        self.planned: list[Case] = []
        self.meters: dict[str, Meter] = {}
        self._baselines: dict[tuple[Any, ...], RunResult] = {}
        self._pairs: dict[Case, PairResult] = {}
        #: Baseline keys whose measurement failed while measuring a sibling's (retried once).
        self._sibling_failed: set[tuple[Any, ...]] = set()

    def plan(self, cases: list[Case]) -> None:
        """Record the collected cases; one GPU runs one engine at a time."""
        self.planned = cases
        if any(c.engine == "sglang" or c.device.startswith("cuda") for c in cases):
            self.pool.max_live = 1

    def meter_for(self, server: ServerProcess) -> Meter:
        """The meter for an engine, built once per kind (a conftest hook may supply it)."""
        device = str(server.server_info.get("device") or server.config.device)
        kind = meter_kind_for(self.meter_choice, server.config.engine, device)
        if kind not in self.meters:
            meter = self.meter_factory(kind, server) if self.meter_factory else None
            self.meters[kind] = meter or make_meter(kind)
        return self.meters[kind]

    def _measure_arm(self, config: EngineConfig, case: Case, arm: str, repeats: int | None = None,
                     warmup: int | None = None) -> tuple[RunResult, ServerProcess]:
        server = self.pool.get(config)
        meter = self.meter_for(server)
        if warmup is None:
            warmup = self.warmup
        if warmup is None:  # auto: only a measured window needs the engine warm
            warmup = 0 if meter.kind.startswith("modeled:") else 1
        measurer = ArmMeasurer(server, meter, case, repeats or self.repeats, warmup)
        return measurer.measure(arm), server

    def baseline(self, case: Case) -> RunResult:
        """The shared baseline arm for ``case``."""
        key = case.baseline_key()
        if key not in self._baselines:
            self._baselines[key] = self._measure_arm(case.baseline_config(), case, "baseline")[0]
            # While the baseline engine runs, measure its other planned workloads too, so it
            # starts once on a one-engine GPU. A sibling that fails here is not this case's
            # failure: it is left unmeasured and retried, once, by the case that needs it.
            for other in self.planned:
                other_key = other.baseline_key()
                if other.baseline_config() != case.baseline_config() or other_key in self._baselines \
                        or other_key in self._sibling_failed:
                    continue
                try:
                    self._baselines[other_key] = self._measure_arm(
                        other.baseline_config(), other, "baseline")[0]
                except Exception:  # noqa: BLE001 - reported when the sibling itself runs
                    self._sibling_failed.add(other_key)
        return self._baselines[key]

    def measured(self, case: Case) -> bool:
        """Whether ``case`` has been measured this session."""
        return case in self._pairs

    def measure(self, case: Case) -> PairResult:
        """The pair for ``case``, measured once per session."""
        if case not in self._pairs:
            baseline = self.baseline(case)
            speculative, server = self._measure_arm(case.spec_config(), case, "speculative")
            # Scoring is a prefill (max_new_tokens=0) on the engine already running; it never
            # speculates, so the speculative engine scores as its twin would.
            prompts = case.corpus.take(case.generation.prompt_count(case.batch))
            coherence = measure_coherence(server.client, prompts, baseline.outputs, speculative.outputs,
                                          server.server_info.get("special_token_ids", ()))
            self._pairs[case] = PairResult(case, case.id, baseline, speculative, coherence)
        return self._pairs[case]

    def add_repeats(self, case: Case, extra: int) -> PairResult:
        """Measure ``extra`` more repeats of both arms (an INCONCLUSIVE verdict asks for them)."""
        pair = self.measure(case)
        more_base = self._measure_arm(case.baseline_config(), case, "baseline", extra, 0)[0]
        more_spec = self._measure_arm(case.spec_config(), case, "speculative", extra, 0)[0]
        baseline = _extend(pair.baseline, more_base)
        self._baselines[case.baseline_key()] = baseline
        pair = dataclasses.replace(pair, baseline=baseline, speculative=_extend(pair.speculative, more_spec))
        self._pairs[case] = pair
        return pair

    def meter_description(self, label: str) -> dict[str, Any] | None:
        """The description of the meter whose label is ``label``, if one was used."""
        for meter in self.meters.values():
            description = meter.describe()
            # One modeled meter prices several engines, each under its own label.
            if label == meter.label or label in description.get("labels", ()):
                return {**description, "label": label}
        return None

    def describe_meters(self) -> dict[str, dict[str, Any]]:
        """Each meter used this session, described."""
        return {kind: meter.describe() for kind, meter in self.meters.items()}

    def close(self) -> None:
        """Stop every engine and release meters."""
        self.pool.close()
        for meter in self.meters.values():
            meter.close()


def _extend(run: RunResult, more: RunResult) -> RunResult:
    """``run`` with the samples of ``more`` appended (same arm, same engine)."""
    return dataclasses.replace(
        run,
        samples=run.samples + more.samples,
        outputs_stable=run.outputs_stable and more.outputs_stable and run.outputs == more.outputs,
        counter_problems=tuple(dict.fromkeys(run.counter_problems + more.counter_problems)),
    )
