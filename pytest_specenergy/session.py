"""The session object behind the ``specenergy`` fixture: pool, meters, pairs and records.

Each case is measured once and cached. The baseline arm of one (engine config, batch,
corpus, generation) is measured once and shared by every drafter tested against it; when
it is first needed, every planned case of that baseline engine is measured in one go, so the
baseline engine starts once even when only one engine may run at a time (one GPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_specenergy.cases.case import Case
from pytest_specenergy.measure.coherence import measure_coherence
from pytest_specenergy.options import SpecEnergyConfig
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.gate.machine import machine_info
from pytest_specenergy.gate.machine import machine_key
from pytest_specenergy.measure.arm import ArmMeasurer
from pytest_specenergy.meters import make_meter
from pytest_specenergy.meters import meter_kind_for
from pytest_specenergy.meters.base import Meter
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult


class SpecEnergySession:
    """Session-wide state: what the ``specenergy`` fixture returns."""

    def __init__(self, config: SpecEnergyConfig, hook: Any = None) -> None:
        self.config = config
        self.hook = hook
        self.planned: list[Case] = []
        self.pool = EnginePool(config.log_dir, config.startup_timeout)
        self._meters: dict[str, Meter] = {}
        self._baselines: dict[tuple[Any, ...], RunResult] = {}
        self._pairs: dict[Case, PairResult] = {}
        #: One JSON-ready record per test that measured a pair (``PairResult.as_dict()`` plus
        #: ``nodeid`` and the gate's verdict), in test order; under xdist the controller
        #: receives the workers' records here.
        self.records: list[dict[str, Any]] = []
        #: machine key -> machine description, for every key this run measured on.
        self.machines: dict[str, dict[str, Any]] = {}
        #: Run files written to the history this session.
        self.saved: list[Any] = []
        #: spec_pair tests skipped because xdist ran without --specenergy-xdist=per-gpu.
        self.xdist_skipped = 0

    def plan(self, cases: list[Case]) -> None:
        """Record the collected cases; one GPU runs one engine at a time."""
        self.planned = cases
        if any(c.engine == "sglang" or c.device.startswith("cuda") for c in cases):
            self.pool.max_live = 1

    def meter_for(self, server: ServerProcess) -> Meter:
        """The meter for an engine, built once per kind (a conftest hook may supply it)."""
        device = str(server.server_info.get("device") or server.config.device)
        kind = meter_kind_for(self.config.meter, server.config.engine, device)
        if kind not in self._meters:
            meter = None
            if self.hook is not None:
                meter = self.hook.pytest_specenergy_make_meter(kind=kind, engine=server)
            self._meters[kind] = meter or make_meter(kind)
        return self._meters[kind]

    def _measure_arm(self, config: EngineConfig, case: Case, arm: str, repeats: int | None = None,
                     warmup: int | None = None) -> tuple[RunResult, ServerProcess]:
        server = self.pool.get(config)
        meter = self.meter_for(server)
        if warmup is None:
            warmup = self.config.warmup
        if warmup is None:  # auto: only a measured window needs the engine warm
            warmup = 0 if meter.kind.startswith("modeled:") else 1
        measurer = ArmMeasurer(server, meter, case, repeats or self.config.repeats, warmup)
        return measurer.measure(arm), server

    def baseline(self, case: Case) -> RunResult:
        """The shared baseline arm for ``case``."""
        key = case.baseline_key()
        if key not in self._baselines:
            siblings = [c for c in self.planned if c.baseline_config() == case.baseline_config()]
            for other in [case] + siblings:
                other_key = other.baseline_key()
                if other_key not in self._baselines:
                    self._baselines[other_key] = self._measure_arm(
                        other.baseline_config(), other, "baseline")[0]
        return self._baselines[key]

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
            pair = PairResult(case, case.id, baseline, speculative, coherence)
            self._pairs[case] = pair
            if self.hook is not None:
                self.hook.pytest_specenergy_pair_measured(pair=pair)
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

    def machine_key_for(self, pair: PairResult) -> str:
        """The machine key of the run a pair was measured in (meter + engine + GPUs)."""
        engine = pair.speculative.engine
        name, version = str(engine.get("engine")), str(engine.get("version"))
        version = version.removeprefix(f"{name}-")  # the reference server says "reference-0.1.0"
        meter = next((m.describe() for m in self._meters.values() if m.label == pair.source), None)
        info = machine_info(meter or {"kind": pair.source, "label": pair.source},
                            engine={"name": name, "version": version})
        key = machine_key(info)
        self.machines.setdefault(key, info)
        return key

    def describe_meters(self) -> dict[str, dict[str, Any]]:
        """Each meter used this session, described."""
        return {kind: meter.describe() for kind, meter in self._meters.items()}

    def close(self) -> None:
        """Stop every engine and release meters."""
        self.pool.close()
        for meter in self._meters.values():
            meter.close()


def _extend(run: RunResult, more: RunResult) -> RunResult:
    """``run`` with the samples of ``more`` appended (same arm, same engine)."""
    return dataclasses.replace(
        run,
        samples=run.samples + more.samples,
        outputs_stable=run.outputs_stable and more.outputs_stable and run.outputs == more.outputs,
        counter_problems=tuple(dict.fromkeys(run.counter_problems + more.counter_problems)),
    )
