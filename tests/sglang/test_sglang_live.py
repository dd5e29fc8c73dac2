"""The plugin against real SGLang 0.5.23 CPU servers: one pytester session, run once.

The session (``--specenergy-engine=sglang``) runs on the real server (``--device cpu
--attention-backend torch_native --dtype float32``, the import-only stand-ins for torchvision
and sgl_kernel, a 4096-token KV pool and ``schedule_conservativeness=0.1`` in every engine, so
that SGLang admits optimistically and a full pool retracts). It holds three test modules, and
engines are shared between them:

* first, the ``spec_pair`` cases of ``pair_suite.py`` (A/A pairs through the whole plugin,
  the twin check between two live servers, a batch above admission, the close's abort race,
  the flush that waits for idle; that module says what each must show);
* then the speculative cases of ``spec_suite.py``: a real SGLang NGRAM engine against its twin
  (the pairs' baseline engine: the same config, so the pool starts it once) at batch 1 and 4,
  and a retraction; SGLang runs speculative decoding on this CPU with the test-only overlay of
  ``tests/sglang_overlay/`` (its ``sitecustomize`` loads into the NGRAM server only: this
  session puts that folder on ``PYTHONPATH``); that module says what each must show;
* last, the baseline half below, on the pairs' baseline engine.

* baseline half (asserted): the plugin's launcher (``EnginePool``/``ServerProcess``: argv,
  ``SGLANG_RECORD_STEP_TIME``, health wait, identity), client, a measured baseline repeat
  (``ArmMeasurer``: ``/flush_cache`` before each window, batched ``/generate``, the steady-state
  window that ends with ``/abort_request``, ``meta_info`` counters, ``step_time_dict`` step
  records), the twin check (``resolved_args_difference``) between the live baseline's
  ``/server_info`` and SGLang's own CPU resolution of the speculative arm's argv, an aborted
  non-streaming ``/generate`` (by rid and ``abort_all``), and shutdown (no process left).

Energy is not measured here (no GPU, and SGLang has no work trace for the modeled meter): the
suite's meter is a wall-clock stand-in, labelled as such. The stand-ins and the overlay log every
import, call and activation: no server may call a stand-in; the overlay must load into the NGRAM
engine's processes only, and every op of its NGRAM path must have run there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pair_suite
import pytest
import spec_suite
from sglang_envs import ENV_ROOT
from sglang_envs import NEWEST
from sglang_envs import REPO
from sglang_envs import run_worker
from sglang_envs import serve_on_cpu
from sglang_envs import sglang_python

from pytest_specenergy.engines.sglang import resolved_args_difference

#: The test-only SGLang CPU overlay (tests/sglang_overlay/README.md).
OVERLAY = REPO / "tests" / "sglang_overlay"

#: Long enough that decode outweighs prefill several times over (about 5 s of decode against
#: 1 s of prefill-only window here): decode time is the full window minus the prefill-only
#: window, and at 16 tokens a loaded 2-core CI machine (the pair suite's servers then ran beside
#: this one) once timed the prefill-only window longer than the full one.
MAX_NEW_TOKENS = 64

CONFTEST = '''
from pytest_specenergy.meters.base import EnergyWindow
import time


class WallClockStandInMeter:
    """Hand-written stand-in for NVML, which cannot exist on this CPU-only machine: it times
    each window and reports 1 J per second, labelled so nobody reads it as energy."""

    kind = "nvml"
    label = "wall-clock stand-in (not energy: no GPU)"
    min_window_s = 0.0

    def describe(self):
        return {"kind": self.kind, "label": self.label}

    def start(self, engine):
        return time.perf_counter()

    def stop(self, token):
        seconds = time.perf_counter() - token
        return EnergyWindow(joules=seconds, seconds=seconds, source=self.label)

    def close(self):
        pass


def pytest_specenergy_make_meter(kind, engine):
    return WallClockStandInMeter()
'''

#: What both test modules of the session start with: the served model's marker and ``save``,
#: which keeps a fact in ``$SPECENERGY_LIVE_FACTS`` for the outer test.
COMMON = """
import json
import os

import pytest

FACTS = os.environ["SPECENERGY_LIVE_FACTS"]
SERVER_MARK = pytest.mark.model(MODEL, dtype="float32", device="cpu", python=PYTHON, sglang_version="0.5.23",
                                attention_backend="torch_native", sleep_on_idle=True,
                                max_total_tokens=POOL_TOKENS, schedule_conservativeness=0.1,
                                max_running_requests=4)


def save(name, value):
    facts = json.load(open(FACTS)) if os.path.exists(FACTS) else {}
    facts[name] = value
    json.dump(facts, open(FACTS, "w"), indent=1, default=repr)
"""

#: The two halves' test module, after :data:`COMMON`.
LIVE_SUITE = '''
import threading
import time

from sglang_envs import group_left  # in-process session: this folder is on sys.path

from pytest_specenergy import Drafter
from pytest_specenergy.measure.arm import ArmMeasurer

pytestmark = [
    SERVER_MARK,
    pytest.mark.corpus("code"),
    pytest.mark.generation(max_new_tokens=MAX_NEW_TOKENS, prompts=8),
    pytest.mark.drafter(Drafter("ngram", num_draft_tokens=4)),
    pytest.mark.batch(4),
]


def aborted_generate(client, rid, abort_all):
    """A long non-streaming /generate, cut after 2 s by /abort_request; returns its answer."""
    box = {}

    def call():
        try:
            box["answer"] = client.generate(
                text=["def fibonacci(n):"], rids=[rid],
                sampling_params={"max_new_tokens": 3000, "temperature": 0.0, "ignore_eos": True})
        except Exception as exc:
            box["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=call)
    start = time.perf_counter()
    thread.start()
    time.sleep(2.0)
    client.abort(None if abort_all else rid)
    thread.join(60)
    return {"seconds": time.perf_counter() - start, "alive": thread.is_alive(), **box}


def test_baseline_half(spec_pair):
    # spec_pair gives the case and the session; .measure() (both arms) cannot run on CPU.
    case, pairs = spec_pair.case, spec_pair.session.measurer
    server = pairs.pool.get(case.baseline_config())  # the pairs' baseline engine, started for them
    save("starts_before", len(pairs.pool.starts))
    save("argv", server.argv)
    save("env_record_step_time", server.env.get("SGLANG_RECORD_STEP_TIME"))
    save("identity", server.identity)
    save("spec_argv", server.backend.command(case.spec_config(), "127.0.0.1", 30000))
    before = server.client.server_info()
    t0 = time.perf_counter()
    run = ArmMeasurer(server, pairs.meter_for(server), case, 1, 0).measure("baseline")
    save("measure_s", time.perf_counter() - t0)
    after = server.client.server_info()
    save("server_info", {k: v for k, v in after.items() if k != "internal_states"})
    save("step_time_keys_after", sorted(after["internal_states"][0].get("step_time_dict", {})))
    save("run", {"concurrency": run.concurrency.as_dict(), "counter_problems": list(run.counter_problems),
                 "outputs": [len(o) for o in run.outputs], "finish": list(run.finish_reasons),
                 "stable": run.outputs_stable, "source": run.source,
                 "samples": [s.as_dict() for s in run.samples]})
    t0 = time.perf_counter()
    save("abort_rid", aborted_generate(server.client, "specenergy-abort-1", abort_all=False))
    save("abort_all", aborted_generate(server.client, "specenergy-abort-2", abort_all=True))
    save("abort_s", time.perf_counter() - t0)
    server.client.flush_cache()  # idle again after the aborts
    pgid = server.pid
    t0 = time.perf_counter()
    server.stop()
    save("stop_s", time.perf_counter() - t0)
    save("group_left", group_left(pgid, settle_s=10.0))

'''


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_plugin_against_live_sglang_cpu_servers(
    pytester: pytest.Pytester, tiny_models, monkeypatch, tmp_path
):
    python = sglang_python(NEWEST)
    model = tiny_models[0]
    facts = tmp_path / "facts.json"
    standin_log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("SPECENERGY_LIVE_FACTS", str(facts))
    serve_on_cpu(monkeypatch)
    monkeypatch.setenv("SPECENERGY_STANDIN_LOG", str(standin_log))
    # The overlay's sitecustomize is then imported by every server, and loads into the NGRAM
    # one only. SGLang JIT-compiles its NGRAM corpus (C++) at the engine's start, into its cache
    # (under $HOME, which pytester moves to a fresh folder): kept beside the environments, the
    # build is reused by every later run (about 40 s of CPU otherwise).
    monkeypatch.setenv("PYTHONPATH", str(OVERLAY))
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(ENV_ROOT / "jit-cache"))
    pytester.makeconftest(CONFTEST)
    # Modules run in name order: the A/A pairs, the NGRAM cases (their twin is the pairs'
    # baseline engine), then the baseline half, which stops that engine.
    common = (
        COMMON.replace("MODEL", repr(model))
        .replace("PYTHON", repr(str(python)))
        .replace("POOL_TOKENS", str(spec_suite.POOL_TOKENS))
    )
    pytester.makepyfile(
        test_1_pairs=common + pair_suite.SUITE,
        test_2_ngram=common + spec_suite.SUITE,
        test_3_baseline=common + LIVE_SUITE.replace("MAX_NEW_TOKENS", str(MAX_NEW_TOKENS)),
    )
    report = tmp_path / "run.json"
    t0 = time.perf_counter()
    result = pytester.runpytest(
        "--specenergy-engine=sglang",
        "--specenergy-startup-timeout=300",
        *pair_suite.OPTIONS,
        "-p",
        "no:cacheprovider",
        "-rA",
        f"--specenergy-json={report}",
        f"--specenergy-log-dir={tmp_path / 'logs'}",
    )
    total_s = time.perf_counter() - t0
    got = json.loads(facts.read_text()) if facts.exists() else {}
    outcomes = {
        r.nodeid.split("::")[-1].split("[")[0]: r.outcome
        for r in result.reprec.getreports("pytest_runtest_logreport")
        if r.when == "call"
    }
    summary = json.dumps(
        {"total_s": round(total_s, 1), "outcomes": outcomes, **got}, indent=1, default=repr
    )
    (REPO / ".sglang-envs").mkdir(exist_ok=True)
    (REPO / ".sglang-envs" / "live-facts.json").write_text(summary)  # for the CI log / report
    text = result.stdout.str()
    pair_suite.check_pair(outcomes, got, json.loads(report.read_text()), text)
    spec_suite.check_ngram(got, outcomes, text)
    spec_suite.check_retraction(got, outcomes, text)
    assert outcomes.get("test_baseline_half") == "passed", text[-6000:] + summary[:4000]
    # the batches above admission (A/A and NGRAM) fail for concurrency, as they must
    result.assert_outcomes(passed=7, failed=2)
    # The NGRAM cases start one engine (their twin is the pairs' baseline); the baseline half's
    # case shares both.
    assert got["flush"]["starts"] == 4 and got["ngram_b1"]["starts"] == 5, summary[:3000]
    assert got["starts_before"] == 5, summary[:3000]

    # Launcher: the plugin's argv, on CPU, with step records on.
    argv = got["argv"]
    assert argv[:3] == [str(python), "-m", "sglang.launch_server"]
    assert "--device" in argv and argv[argv.index("--device") + 1] == "cpu"
    assert got["env_record_step_time"] == "1" and got["identity"]
    info = got["server_info"]
    assert info["version"] == NEWEST and info["device"] == "cpu"
    assert info["attention_backend"] == "torch_native" and info["speculative_algorithm"] is None

    # Counters and step records of a measured baseline repeat.
    run = got["run"]
    assert run["counter_problems"] == [] and run["stable"]
    assert run["outputs"] == [MAX_NEW_TOKENS] * len(run["outputs"]) and len(run["outputs"]) == 8
    [sample] = run["samples"]
    assert sample["verify_steps"] is None and sample["proposed_drafts"] is None  # baseline
    assert sample["decode_tokens"] > 0 and sample["decode_seconds"] > 0, sample["window"]
    concurrency = run["concurrency"]
    assert concurrency["steps"] and concurrency["mean_running"] is not None, concurrency
    assert 1 <= concurrency["mean_running"] <= 4
    assert got["step_time_keys_after"], "step_time_dict stayed empty with SGLANG_RECORD_STEP_TIME=1"

    # Abort: a non-streaming /generate answers (no HTTP error) as aborted, with partial tokens.
    for key in ("abort_rid", "abort_all"):
        aborted = got[key]
        assert not aborted["alive"] and "error" not in aborted, aborted
        [answer] = aborted["answer"]
        meta = answer["meta_info"]
        assert meta["finish_reason"]["type"] == "abort", meta
        assert 0 < meta["completion_tokens"] < 3000, meta

    # Shutdown: nothing of the server's process group is still running.
    assert got["group_left"] == [], got["group_left"]

    # Twin check: the live baseline's resolved settings against SGLang's own CPU resolution
    # of the speculative arm's argv. The live server wrote its resolved args to /server_info;
    # the worker resolves the speculative argv with the same SGLang code, on the same device.
    # /server_info redacts secrets ("<redacted>"); those keys are left out of both sides.
    live = {k: v for k, v in info.items() if v != "<redacted>"}
    # The live server's free port becomes the speculative argv's: the port is not compared
    # (RESOLVED_IGNORED), and with it fixed the worker's answer is cached like the conformance
    # lines' (an SGLang import and resolution, 12 s of CPU, each run otherwise).
    baseline_argv = argv[3:]
    baseline_argv[baseline_argv.index("--port") + 1] = "30000"
    resolved = run_worker(
        NEWEST,
        "cpu",
        [{"id": "spec", "argv": got["spec_argv"][3:]}, {"id": "baseline", "argv": baseline_argv}],
    )
    assert resolved["spec"]["ok"] and resolved["baseline"]["ok"], resolved
    # The worker's resolution is what the live server resolved (so the conformance worker
    # speaks for real servers), and the speculative arm resolves as the baseline's twin
    # (this found the CPU overlap-scheduler difference, now pinned in both arms).
    assert resolved_args_difference(resolved["baseline"]["resolved"], live) == []
    assert resolved_args_difference(resolved["spec"]["resolved"], live) == [], summary[:3000]

    # Stand-ins and overlay: imported by every server, no stand-in ever called; the overlay
    # loaded into the NGRAM engine's processes (its process group) and nowhere else, and every op
    # of its NGRAM path ran there.
    events = _events(standin_log)
    assert [e for e in events if e["event"] == "import"], "the stand-ins were not on the path"
    assert [e for e in events if e["event"] == "call"] == [], "a server called a stand-in"
    ngram_group = got["ngram_b1"]["pids"]["speculative"]
    loaded = {e["pgid"] for e in events if e["event"] == "overlay-activated"}
    assert loaded == {ngram_group}, (loaded, ngram_group)
    called = {e["name"] for e in events if e["event"] == "overlay-call"}
    assert called == spec_suite.NGRAM_CALLS, called
    assert {e["pgid"] for e in events if e["event"] == "overlay-call"} == {ngram_group}
