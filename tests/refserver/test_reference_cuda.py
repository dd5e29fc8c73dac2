"""The same engine on a GPU (skipped without CUDA): equivalence, faults and an HTTP round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model", ("tiny:dense", "tiny:moe", "tiny:hybrid"))
def test_cuda_speculative_equals_baseline(engine_for, make_requests, model):
    base = engine_for(model=model, device="cuda")
    assert base.target.device.type == "cuda" and base.target.dtype == torch.float64
    for batch in (1, 8):
        want = base.generate(make_requests(base, batch, 32))
        for drafter in ("ngram", "draft_model"):
            engine = engine_for(model=model, device="cuda", drafter=drafter, num_draft_tokens=4)
            got = engine.generate(make_requests(engine, batch, 32))
            assert [r.output_ids for r in got] == [r.output_ids for r in want], (
                model,
                drafter,
                batch,
            )
    # the same tokens as on the CPU in float64 (the CPU's default is float32): the weights and
    # the float64 arithmetic agree
    cpu = engine_for(model=model, device="cpu", dtype="float64")
    assert [r.output_ids for r in cpu.generate(make_requests(cpu, 2, 16))] == [
        r.output_ids for r in base.generate(make_requests(base, 2, 16))
    ]
    steps = base.trace.read(0)[1]
    assert steps and all(s.wall_s > 0 for s in steps)


def test_cuda_bfloat16_runs(engine_for, make_requests):
    engine = engine_for(model="tiny:dense", device="cuda", dtype="bfloat16", drafter="draft_model")
    results = engine.generate(make_requests(engine, 4, 16))
    assert all(r.completion_tokens == 16 for r in results)


def test_cuda_skip_state_rollback_breaks_hybrid(engine_for, make_requests):
    good = engine_for(model="tiny:hybrid", device="cuda", drafter="ngram")
    bad = engine_for(
        model="tiny:hybrid", device="cuda", drafter="ngram", faults=("skip-state-rollback",)
    )
    reqs = make_requests(good, 4, 24)
    assert [r.output_ids for r in good.generate(reqs)] != [r.output_ids for r in bad.generate(reqs)]


def test_cuda_server_round_trip():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "pytest_specenergy.refserver",
        "--device",
        "cuda",
        "--port",
        "0",
        "--drafter",
        "ngram",
    ]
    proc = subprocess.Popen(
        cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    try:
        url = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and url is None:
            line = proc.stderr.readline()
            if "reference server ready on " in line:
                url = line.split("ready on ", 1)[1].strip()
            elif not line and proc.poll() is not None:
                break
        assert url, "server did not start"
        body = json.dumps(
            {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": {"max_new_tokens": 8}}
        ).encode()
        with urllib.request.urlopen(
            urllib.request.Request(url + "/generate", data=body), timeout=120
        ) as resp:
            answer = json.loads(resp.read())
        assert len(answer) == 2 and all(a["meta_info"]["completion_tokens"] >= 1 for a in answer)
        with urllib.request.urlopen(url + "/server_info", timeout=30) as resp:
            assert json.loads(resp.read())["device"].startswith("cuda")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("model", ("tiny:dense", "tiny:hybrid"))
def test_cuda_joins_and_block_drafter_are_exact(engine_for, make_requests, model):
    from pytest_specenergy.refserver.records import GenerationRequest
    from pytest_specenergy.refserver.records import SamplingParams

    base = engine_for(model=model, device="cuda")
    reqs = [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=6 + (5 * i) % 15, ignore_eos=True)
        )
        for i, r in enumerate(make_requests(base, 6, 1))
    ]
    want = [r.output_ids for r in base.generate(reqs)]
    for kw in (
        {"drafter": "draft_model"},
        {"drafter": "block", "block_size": 4},
        {"drafter": "ngram"},
    ):
        engine = engine_for(model=model, device="cuda", max_running_requests=3, **kw)
        assert [r.output_ids for r in engine.generate(reqs)] == want, (model, kw)
