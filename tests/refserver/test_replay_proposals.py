"""--replay-proposals: recorded drafts verified while the drafter's own passes still run, no oracle."""

from __future__ import annotations

import pytest

from pytest_specenergy.refserver.__main__ import build_parser
from pytest_specenergy.refserver.__main__ import main
from pytest_specenergy.refserver.drafters import ReplayDrafter
from pytest_specenergy.refserver.oracle import ReplayedProposals
from pytest_specenergy.refserver.records import EngineConfig
from pytest_specenergy.refserver.records import GenerationRequest
from pytest_specenergy.refserver.records import SamplingParams

SHAPES = {
    "block": {"drafter": "block", "block_size": 8},
    "chain": {"drafter": "draft_model", "num_draft_tokens": 4},
}


def _reqs(engine, make_requests, drafts=None, record=True, n=5):
    out = []
    for i, r in enumerate(make_requests(engine, n, 1)):
        sp = SamplingParams(
            max_new_tokens=10 + 5 * i,
            ignore_eos=i != 2,
            replay_drafts=drafts[i] if drafts else None,
        )
        out.append(GenerationRequest(r.input_ids, sp, rid=f"r{i}", return_spec_drafts=record))
    return out


def _work(steps):
    """What ran, step by step: phase, model, rows, query tokens, contexts and the charged cost."""
    return [
        (
            s.phase,
            s.model,
            s.rids,
            s.query_tokens,
            s.context_lens,
            s.weight_bytes,
            s.kv_bytes,
            s.flops,
        )
        for s in steps
    ]


def _misses(engine):
    return engine.server_info()["internal_states"][0]["spec_replay_misses"]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_replay_repeats_a_controlled_run_without_its_oracle(engine_for, make_requests, shape):
    plain = engine_for(model="tiny:dense")
    controlled = engine_for(
        model="tiny:dense", draft_accept_p=0.8, max_running_requests=3, **SHAPES[shape]
    )
    replay = engine_for(
        model="tiny:dense", replay_proposals=True, max_running_requests=3, **SHAPES[shape]
    )
    start = len(controlled.trace)
    recorded = controlled.generate(_reqs(controlled, make_requests))
    recorded_steps = controlled.trace.read(start)[1]
    before = _misses(replay)
    start = len(replay.trace)
    again = replay.generate(
        _reqs(replay, make_requests, drafts=[r.spec_drafts for r in recorded], record=False)
    )
    replay_steps = replay.trace.read(start)[1]

    baseline = plain.generate(_reqs(plain, make_requests, record=False))
    assert (
        [r.output_ids for r in again]
        == [r.output_ids for r in recorded]
        == [r.output_ids for r in baseline]
    )
    for a, b in zip(recorded, again):
        assert a.spec == b.spec  # same verify steps, same accepted counts per step
    assert sum(r.spec.num_correct_drafts for r in again) > 0  # P = 0.8 accepts drafts: a real test
    assert _misses(replay) == before
    # the same passes, draft passes and the draft model's prefill included, at the same cost
    assert _work(replay_steps) == _work(recorded_steps)
    assert any(s.phase == "draft" for s in replay_steps)
    assert {(s.phase, s.model) for s in replay_steps} >= {("prefill", "draft"), ("draft", "draft")}
    # the controlled run needed an (untraced) oracle over the target; the replay builds none
    assert controlled._oracle is not None  # the target's own runner, built for the oracle
    assert replay._oracle is None
    drafter = replay.scheduler.drafter
    assert isinstance(drafter, ReplayedProposals) and isinstance(drafter.oracle, ReplayDrafter)
    info = replay.server_info()
    assert (
        info["speculative_replay_proposals"] is True and info["speculative_draft_accept_p"] is None
    )
    assert info["speculative_algorithm"] == controlled.server_info()["speculative_algorithm"]


def test_withheld_drafts_are_misses_and_output_stays_exact(engine_for, make_requests):
    plain = engine_for(model="tiny:dense")
    controlled = engine_for(model="tiny:dense", draft_accept_p=0.8, **SHAPES["block"])
    replay = engine_for(model="tiny:dense", replay_proposals=True, **SHAPES["block"])
    recorded = controlled.generate(_reqs(controlled, make_requests, n=3))
    drafts = [r.spec_drafts for r in recorded]
    drafts[1] = ()  # request r1 brings nothing: every one of its steps is filler
    before = _misses(replay)
    start = len(replay.trace)
    got = replay.generate(_reqs(replay, make_requests, drafts=drafts, record=False, n=3))
    steps = replay.trace.read(start)[1]
    assert [r.output_ids for r in got] == [
        r.output_ids for r in plain.generate(_reqs(plain, make_requests, n=3))
    ]
    assert _misses(replay) - before == got[1].spec.verify_ct > 0
    assert got[0].spec == recorded[0].spec and got[2].spec == recorded[2].spec
    assert any(s.phase == "draft" and "r1" in s.rids for s in steps)  # its draft passes still ran


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"drafter": "ngram"}, "draft_model or block"),
        ({"drafter": "replay"}, "no draft passes"),
        ({"drafter": "none"}, "draft_model or block"),
        ({"drafter": "block", "draft_accept_p": 0.5}, "mutually exclusive"),
    ],
)
def test_replay_proposals_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(replay_proposals=True, **kwargs)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--drafter", "ngram"], "not 'ngram'"),
        (["--drafter", "block", "--draft-accept-p", "0.5"], "mutually exclusive"),
    ],
)
def test_cli_misuse_exits_2_with_one_clear_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["--port", "0", "--replay-proposals", *argv])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: replay_proposals" in last and message in last


def test_help_documents_the_flag():
    text = build_parser().format_help()
    assert "--replay-proposals" in text and "spec_replay_drafts" in text
