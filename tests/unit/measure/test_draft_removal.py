"""Draft removal: which arms replay, the share's arithmetic, the replay checks, the measurer's
arms and engines. A small fake pool stands in for the reference server (no process, no torch):
it answers ``/generate`` with SGLang-shaped ``meta_info`` plus the reference server's
``spec_drafts``, and counts ``spec_replay_misses`` the way ``ReplayDrafter`` does."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import ArmConcurrency
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.refserver import ReferenceBackend
from pytest_specenergy.measure.checks import checked
from pytest_specenergy.measure.checks import pair_checks
from pytest_specenergy.measure.pairs import PairMeasurer
from pytest_specenergy.measure.removal import removes_drafts
from pytest_specenergy.measure.removal import replays_proposals
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.meters.base import EnergyWindow
from pytest_specenergy.metrics import removal_draft_share
from tests.fakes.engines import AbortingClient
from tests.fakes.engines import FakePool
from tests.fakes.engines import FakeServer

CORPUS = load_corpus("code")
BLOCK = Drafter("block", draft_model="tiny:dense-draft", block_size=4)
CONTROLLED = Drafter("block", draft_model="tiny:dense-draft", block_size=4, accept_p=0.8)


def _case(drafter: Drafter, engine: str = "reference") -> Case:
    return Case.of(
        engine=engine,
        model="tiny:dense",
        drafter=drafter,
        batch=2,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=9, prompts=4),
    )


def test_which_cases_replay_under_each_mode_and_meter():
    ngram = _case(Drafter("ngram"))
    assert removes_drafts("auto", _case(BLOCK), "nvml") and not removes_drafts(
        "auto", _case(BLOCK), "modeled:h200"
    )
    assert not removes_drafts("auto", ngram, "nvml")  # no draft passes to remove
    assert removes_drafts("on", ngram, "modeled:h200") and not removes_drafts(
        "off", _case(BLOCK), "nvml"
    )
    assert not removes_drafts("auto", _case(BLOCK, engine="sglang"), "nvml")
    with pytest.raises(ValueError, match="expected one of auto, on, off"):
        removes_drafts("sometimes", ngram, "nvml")
    # Controlled acceptance's oracle is charged by a board meter only.
    assert replays_proposals(CONTROLLED, "reference", "nvml")
    assert not replays_proposals(CONTROLLED, "reference", "modeled:h100")
    assert not replays_proposals(BLOCK, "reference", "nvml")


def test_draft_share_by_removal_is_per_cycle_and_never_invented():
    assert removal_draft_share([2.0, 4.0], [1.5, 3.0]) == pytest.approx(0.25)
    # board-meter noise kept as measured
    assert removal_draft_share([2.0], [2.2]) == pytest.approx(-0.1)
    assert removal_draft_share([2.0, None], [1.0, 1.0]) is None
    assert removal_draft_share([2.0, 2.0], [1.0]) is None and removal_draft_share([], []) is None


def test_replay_engines_command_lines():
    spec = EngineConfig(engine="reference", model="tiny:dense", drafter=CONTROLLED)
    verify = ReferenceBackend().command(spec.replaying("verify"), "127.0.0.1", 1)
    assert verify[verify.index("--drafter") + 1] == "replay" and "--draft-model" not in verify
    assert verify[verify.index("--num-draft-tokens") + 1] == "3"  # block 4 verifies 4: 3 drafts
    proposals = ReferenceBackend().command(spec.replaying("proposals"), "127.0.0.1", 1)
    assert "--replay-proposals" in proposals and "--draft-accept-p" not in proposals
    assert proposals[proposals.index("--drafter") + 1] == "block" and "--draft-model" in proposals
    assert spec.replaying("verify").twin() == spec.twin()  # the baseline is the same twin
    with pytest.raises(ValueError, match="no drafter"):
        EngineConfig(engine="reference", model="tiny:dense", replay="verify")


def _run(arm, outputs, ept=1.0, replay_problems=(), counter_problems=()):
    sample = RepeatSample(ept * 10, 1.0, 10, 5.0, 5, 5, 15)
    return RunResult.measured(
        arm=arm,
        engine={},
        source="modeled (h200)",
        samples=(sample,),
        outputs=tuple(map(tuple, outputs)),
        finish_reasons=("length",) * len(outputs),
        verified_per_step=4,
        concurrency={"requested": 2, "mean_running": 2.0},
        replay_problems=replay_problems,
        counter_problems=counter_problems,
    )


def test_replay_checks_fail_an_unlike_replay():
    case, outputs = _case(BLOCK), [[1, 2, 3], [4, 5, 6]]
    base, spec = _run("baseline", outputs, 2.0), _run("speculative", outputs, 1.0)
    good = PairResult(case, case.id, base, spec, removal=_run("removal", outputs, 0.75))
    assert good.draft_share == pytest.approx(0.25) and good.draft_share_method == "removal"
    assert not [c for c in pair_checks(good) if c.name == "replay-unlike"]
    missed = dataclasses.replace(
        good, removal=_run("removal", outputs, 0.75, replay_problems=("3 missed",))
    )
    other = dataclasses.replace(good, removal=_run("removal", [[1, 2, 3], [4, 5, 7]], 0.75))
    wrong = dataclasses.replace(
        good, removal=_run("removal", outputs, 0.75, counter_problems=("request 0: bad",))
    )
    for bad in (missed, other, wrong):
        assert "replay-unlike" in {c.name for c in checked(bad).failed_checks}
    unlike = dataclasses.replace(
        good, speculative=_run("speculative", outputs, replay_problems=("1 missed",))
    )
    assert "replay-unlike" in {c.name for c in checked(unlike).failed_checks}
    # nothing priced, nothing removed
    assert PairResult(case, case.id, base, spec).draft_share_method is None
    # A replay that ran below the batch describes another batch: its share is no figure for this
    # one.
    thin = _run("removal", outputs, 0.75).replaced(
        concurrency=ArmConcurrency(requested=2, mean_running=1.2)
    )
    assert "concurrency-below-batch" in {
        c.name for c in checked(dataclasses.replace(good, removal=thin)).failed_checks
    }


class RecordingClient(AbortingClient):
    """``/generate`` of the reference server in miniature: every decoding request makes 4 verify
    steps of 2 tokens; a drafter engine returns its drafts when asked; a replay engine counts
    the steps its request brought no drafts for."""

    def __init__(self, config: EngineConfig, log: list) -> None:
        self.config, self.log, self.misses, self.lock = config, log, 0, threading.Lock()

    def flush_cache(self) -> None:
        pass

    def abort(self, rid=None) -> None:
        pass

    def server_info(self) -> dict:
        state = {"spec_replay_misses": self.misses} if self.config.replay else {}
        return {"internal_states": [state]}

    def generate(self, text, sampling_params, rids, return_spec_drafts=False):
        n = sampling_params["max_new_tokens"]
        self.log.append(
            (
                self.config.replay or ("drafter" if self.config.drafter else "baseline"),
                n,
                return_spec_drafts,
                "spec_replay_drafts" in sampling_params,
            )
        )
        return [self._answer(rid, n, sampling_params, return_spec_drafts) for rid in rids]

    def _answer(self, rid, n, sampling_params, return_spec_drafts):
        meta = {
            "id": rid,
            "prompt_tokens": 10,
            "completion_tokens": n,
            "finish_reason": {"type": "length", "length": n},
        }
        if self.config.drafter is not None and n > 1:
            meta.update(
                spec_verify_ct=4, spec_num_correct_drafts=n - 5, spec_num_proposed_drafts=12
            )
            if return_spec_drafts:
                meta["spec_drafts"] = [[7, 8, 9]] * 4
            with self.lock:
                self.misses += max(0, 4 - len(sampling_params.get("spec_replay_drafts", [])))
        return {"output_ids": list(range(n)), "meta_info": meta}


class ReplayPool(FakePool):
    def __init__(self) -> None:
        super().__init__()
        self.log: list = []

    def server(self, config: EngineConfig) -> FakeServer:
        return FakeServer(config, RecordingClient(config, self.log))


class Meter:
    """Joules per decoding request's token by engine: drafting costs 1.0, verify-only 0.75,
    baseline 2.0."""

    label, min_window_s = "measured (nvml)", 0.0

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def describe(self):
        return {"kind": self.kind}

    def start(self, server):
        return server, len(server.client.log)

    def stop(self, token):
        server, since = token
        # Prefill-only requests (one token) cost nothing: a drafting arm's twin runs on the
        # baseline engine (issue 41 item 2), and where it runs must not move these shares.
        tokens = sum(entry[1] for entry in server.client.log[since:] if entry[1] > 1)
        per_token = {"verify": 0.75}.get(
            server.config.replay, 1.0 if server.config.drafter else 2.0
        )
        return EnergyWindow(joules=per_token * tokens, seconds=1.0, source=self.label)

    def close(self):
        pass


def _measure(drafter: Drafter, kind: str, mode: str = "auto", engine: str = "reference"):
    pool = ReplayPool()
    measurer = PairMeasurer(
        log_dir=None,
        startup_timeout=1.0,
        meter=kind,
        repeats=2,
        warmup=0,
        meter_factory=lambda k, s: Meter(k),
        pool=pool,
        draft_removal=mode,
    )
    case = _case(drafter, engine)
    measurer.plan([case])
    return measurer.measure(case), pool


def test_board_meter_measures_the_removal_arm_from_drafts_recorded_once():
    pair, pool = _measure(BLOCK, "nvml")
    assert [c.replay for c in pool.starts] == ["", "", "verify"]  # baseline, drafter, verify-only
    recording = [e for e in pool.log if e[2]]
    assert len(recording) == 4 and all(e[0] == "drafter" for e in recording)  # one pass of the pool
    # every replay brings drafts
    assert all(e[3] for e in pool.log if e[0] == "verify" and e[1] > 1)
    assert list(pair.order.order) == ["baseline", "speculative", "removal"] * 2
    assert pair.draft_share_method == "removal"
    assert pair.draft_share == pytest.approx(0.25)  # 0.75 J/token verify-only against 1.0 drafting
    assert "replay-unlike" not in {c.name for c in pair.checks}
    assert pair.as_dict()["removal"]["arm"] == "removal"


def test_modeled_meter_prices_the_split_and_off_never_replays():
    for kind, mode in (("modeled:h200", "auto"), ("nvml", "off")):
        pair, pool = _measure(BLOCK, kind, mode)
        assert pair.removal is None and all(not c.replay for c in pool.starts)
        assert not any(e[2] for e in pool.log)  # nothing recorded


def test_controlled_acceptance_under_a_board_meter_runs_without_its_oracle():
    pair, pool = _measure(CONTROLLED, "nvml", "off")
    # recorded on the oracle engine
    assert [c.replay for c in pool.starts] == [
        "",
        "",
        "proposals",
    ]
    measured = {e[0] for e in pool.log if not e[2]}
    assert "drafter" not in measured  # the oracle engine only recorded
    assert pair.speculative.engine.config.replay == "proposals"


def test_removal_asked_of_an_engine_that_cannot_replay_fails_with_why():
    with pytest.raises(
        RuntimeError, match="only the reference engine can.*draft-removal=auto or off"
    ):
        _measure(Drafter("ngram"), "nvml", "on", engine="sglang")
