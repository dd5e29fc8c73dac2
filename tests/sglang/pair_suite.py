"""The ``spec_pair`` cases of the live SGLang session (issue 20), run first in it by
``test_sglang_live.py``, and what they must show.

Engines are shared between the session's cases, on the real server (``--device cpu
--attention-backend torch_native --dtype float32``, the import-only stand-ins of
``tests/sglang_standins/``, a tiny random Llama). These pairs are **A/A**: ``Drafter("none")``
- the baseline's own non-speculative config in a second engine process, the way a user declares
a control pair; SGLang speculates on this CPU only with the test-only overlay of
``tests/sglang_overlay/``, and the speculative pairs are ``spec_suite.py``'s. Cases:

* ``test_aa_pair``: the A/A pair (and an in-job reference arm, a third engine of the same
  config, so the gate judges it) must pass the twin check between two live servers, every
  validity check and the gate; two repeats, no engine restarted between them.
* ``test_changed_flag_fails_the_twin_check``: the same pair with ``chunked_prefill_size``
  changed in the baseline's engine (a fault a user cannot declare: the twin is derived) must
  fail ``twin-differs`` naming that flag; a short workload (the check reads the engines'
  resolved settings, not the windows).
* ``test_batch_above_admission``: batch 6 on engines that admit 4, so queued requests are
  aborted at every window's close: the window holds (no crash on SGLang's waiting-queue abort
  answer), counters add up, and the gate fails the pair for ``concurrency-below-batch`` only.
* ``test_last_refill_at_the_close``: a refill sent 0 ms after the close's ``abort_all`` - the
  interleaving where SGLang drops the abort - is cut by the per-rid retries; the scheduler is
  idle right after (plain ``/flush_cache`` answers 200). A control with one ``abort_all``
  (the old close) shows the request running on to ``max_new_tokens``.
* ``test_flush_waits_for_idle``: ``/flush_cache?timeout=`` (what the client sends on 0.5.23)
  succeeds while a request runs; the plain path is refused with 400 then.
* after the session: every engine's process group is gone, and their logs show SGLang's
  graceful SIGTERM drain.
"""

from __future__ import annotations

import re

from sglang_envs import group_left

#: The cases' test module, after ``test_sglang_live.COMMON`` (``SERVER_MARK``, ``save``).
SUITE = '''
import dataclasses
import threading
import time

from pytest_specenergy import Drafter
from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.engines.client import EngineHTTPError
from pytest_specenergy.engines.client import abort_until_answered

pytestmark = [
    SERVER_MARK,
    pytest.mark.corpus("code"),
    # Every request makes exactly max_new_tokens, so a batch-4 window runs in lock-step groups
    # of 4 and the engine's queue (the 4 requests beyond the batch) empties as each group is
    # admitted: the next group's refills must reach the engine before the running group
    # ends. A tiny CPU model decodes a step in about 2 ms, so at 48 tokens a group lasted
    # ~100 ms, and a loaded CI host delivered two refills 100-200 ms late (steps at 2 and 1
    # rows, concurrency-below-batch on the A/A pair, in both the window and its re-run). 128
    # tokens give each refill ~2.7x that slack; 12 prompts (3 groups) keep the window's
    # tokens at 2x the old 16 x 48.
    pytest.mark.generation(max_new_tokens=128, prompts=12),
    pytest.mark.drafter(Drafter("none")),
]


def engines(spec_pair):
    pool = spec_pair.session.measurer.pool
    return {"starts": len(pool.starts),
            "groups": sorted({s.pid for s in pool._live.values() if s.pid}),
            "logs": sorted({str(s.log_path) for s in pool._live.values()})}


def steps(window):
    """A window's decode steps by rows running: where a loaded host shows."""
    return (window.get("concurrency") or {}).get("steps_by_running")


def facts_of(pair):
    return {"checks": [str(c) for c in pair.failed_checks],
            "source": pair.baseline.source,
            "concurrency": {arm: {k: getattr(getattr(pair, arm).concurrency, k)
                                  for k in ("mean_running", "min_running", "max_running",
                                            "max_running_requests", "rerun_means")}
                            for arm in ("baseline", "speculative")},
            "windows": [s.window.full.as_dict()
                        | {"details": None, "concurrency": steps(s.window.full.as_dict())}
                        for s in pair.baseline.samples + pair.speculative.samples],
            "samples": [s.as_dict() | {"window": None}
                        for s in pair.baseline.samples + pair.speculative.samples],
            "order": pair.order.as_dict()}


@pytest.mark.reference_drafter(Drafter("none", id="none-ref"))
@pytest.mark.batch(4)
def test_aa_pair(spec_pair):
    t0 = time.perf_counter()
    r = spec_pair.measure()
    save("aa", {**facts_of(r), "measure_s": time.perf_counter() - t0, **engines(spec_pair),
                "reference_checks": [str(c) for c in r.failed_checks]})
    r.assert_equivalent()
    assert r.failed_checks == ()


@pytest.mark.generation(max_new_tokens=32, prompts=4)
@pytest.mark.batch(4)
def test_changed_flag_fails_the_twin_check(spec_pair):
    @dataclasses.dataclass(frozen=True)
    class Skewed(Case):
        """The A/A case with one non-speculative flag changed in the baseline's engine."""

        def baseline_config(self):
            twin = super().baseline_config()
            options = dict(twin.options, chunked_prefill_size=1024)
            return dataclasses.replace(twin, options=tuple(sorted(options.items())))

    case = spec_pair.case
    skewed = Skewed(**{f.name: getattr(case, f.name) for f in dataclasses.fields(case)})
    t0 = time.perf_counter()
    pair = spec_pair.session.measurer.measure(skewed)
    save("skewed", {"checks": [str(c) for c in pair.failed_checks],
                    "measure_s": time.perf_counter() - t0, **engines(spec_pair)})
    [twin] = [c for c in pair.failed_checks if c.name == "twin-differs"]
    assert "chunked_prefill_size: " in twin.message and "1024 (baseline)" in twin.message
    assert twin.severity == "fail"


@pytest.mark.batch(6)
def test_batch_above_admission(spec_pair):
    t0 = time.perf_counter()
    r = spec_pair.measure()
    save("queued", {**facts_of(r), "measure_s": time.perf_counter() - t0, **engines(spec_pair)})


class RefillAtClose(EngineClient):
    """The real client, with the worst interleaving made certain: the window's last refill is
    sent the moment the close's abort_all has gone out (0 ms), so that abort cannot see it."""

    def __init__(self, base_url, rid, tokens, box):
        super().__init__(base_url, timeout_s=120)
        self.rid, self.tokens, self.box, self.sent = rid, tokens, box, None

    def abort(self, rid=None):
        super().abort(rid)
        if rid is None and self.sent is None:
            self.sent = threading.Thread(target=self._refill)
            self.sent.start()

    def _refill(self):
        started = time.perf_counter()
        [answer] = self.generate(text=["def fibonacci(n):"], rids=[self.rid], sampling_params={
            "max_new_tokens": self.tokens, "temperature": 0.0, "ignore_eos": True})
        meta = answer["meta_info"]
        self.box[self.rid] = {"finish": meta["finish_reason"]["type"], "seconds": time.perf_counter() - started,
                              "completion_tokens": meta["completion_tokens"]}


def idle(client):
    """Whether the scheduler is idle now: plain /flush_cache (timeout 0) is refused otherwise."""
    try:
        client._request("POST", "/flush_cache")
        return True
    except EngineHTTPError as exc:
        return str(exc)


@pytest.mark.batch(4)
def test_last_refill_at_the_close(spec_pair):
    server = spec_pair.session.measurer.pool.get(spec_pair.case.baseline_config())
    trials = []
    for i in range(3):
        box = {}
        rid = f"close-new-{i}"
        client = RefillAtClose(server.client.base_url, rid, 400, box)
        t0 = time.perf_counter()
        rounds = abort_until_answered(client, lambda: set() if rid in box else {rid})
        client.sent.join(120)
        trials.append({**box[rid], "rounds": rounds, "close_s": time.perf_counter() - t0,
                       "idle_after": idle(server.client)})
    box = {}
    control = RefillAtClose(server.client.base_url, "close-old", 48, box)
    control.abort()  # the old close: one abort_all, nothing after it
    control.sent.join(120)
    save("close", {"new": trials, "old_one_shot": box["close-old"]})
    assert all(t["finish"] == "abort" and t["idle_after"] is True for t in trials), trials


@pytest.mark.batch(4)
def test_flush_waits_for_idle(spec_pair):
    server = spec_pair.session.measurer.pool.get(spec_pair.case.baseline_config())
    box = {}
    thread = threading.Thread(target=lambda: box.update(answer=server.client.generate(
        text=["def fibonacci(n):"], rids=["flush-busy"],
        sampling_params={"max_new_tokens": 2000, "temperature": 0.0, "ignore_eos": True})))
    thread.start()
    time.sleep(1.0)
    busy = idle(server.client)  # the plain path refuses while the request runs
    flushed = {}

    def flush():
        t0 = time.perf_counter()
        server.client.flush_cache()  # ?timeout=30: waits for idle instead
        flushed["waited_s"] = time.perf_counter() - t0

    flusher = threading.Thread(target=flush)
    flusher.start()
    time.sleep(0.5)
    server.client.abort("flush-busy")  # the engine goes idle; the waiting flush then succeeds
    flusher.join(60)
    thread.join(60)
    save("flush", {"path": server.client.flush_path, "plain_while_busy": busy, **flushed,
                   "answer": box["answer"][0]["meta_info"]["finish_reason"], **engines(spec_pair)})
    assert server.client.flush_path == "/flush_cache?timeout=30"
    assert busy is not True and "400" in busy, busy
    assert flushed["waited_s"] >= 0.4, flushed
'''


#: The session's options for these cases (the live halves need none of their own).
OPTIONS = (
    "--specenergy-repeats=2",
    "--specenergy-max-repeats=2",
    # One warm-up run per arm (a batch of 4, ~0.5 s): without it the session's first windows
    # also paid the engines' and the client's first requests, and in quiet runs the baseline
    # (the first arm measured) was the one whose window ran again.
    "--specenergy-warmup=1",
    # The A/A control drafts nothing: no accept-length limit. The stand-in's energy on 2 shared
    # cores with several SGLang CPU engines alive: with each scheduler on both cores' OpenMP
    # threads, one of two identical engines read 10.7x and 11.8x the other in both repeats of
    # two full runs, and the gate rightly called that a regression; with one thread each
    # (serve_on_cpu) they read within 2x, still far from a GPU's noise. So the energy limit
    # here only shows the gate judging live SGLang end to end; its statistics are tested on
    # the reference server.
    "--specenergy-compare-fail=energy_ratio:2000%",
    "--specenergy-compare-fail=equivalence:0",
)


def check_pair(outcomes: dict[str, str], got: dict, document: dict, text: str) -> None:
    """What the cases must show: ``outcomes`` by test name, ``got`` the facts they saved,
    ``document`` the session's JSON, ``text`` its terminal output."""
    assert outcomes.get("test_aa_pair") == "passed", text[-6000:]

    # A/A: twin check, every check and the gate held, over two repeats on the same engines.
    aa = got["aa"]
    assert aa["checks"] == [] and aa["source"].startswith("wall-clock stand-in"), aa
    assert all(s["decode_seconds"] > 0 and s["decode_tokens"] > 0 for s in aa["samples"])
    verdicts = {
        r["nodeid"].split("::")[-1].split("[")[0]: r.get("verdict") for r in document["results"]
    }
    assert verdicts["test_aa_pair"] in ("passed", "inconclusive"), verdicts
    # baseline + A/A arm + reference arm: three engines, none restarted between the repeats.
    assert aa["starts"] == 3 and len(aa["order"]["order"]) >= 6, aa

    # A changed non-speculative flag fails twin-differs, naming it.
    assert outcomes["test_changed_flag_fails_the_twin_check"] == "passed", text[-6000:]
    [twin] = [c for c in got["skewed"]["checks"] if c.startswith("twin-differs")]
    assert re.search(
        r"fields: chunked_prefill_size: \d+ \(speculative\) vs 1024 \(baseline\); "
        r"cuda_graph_config: ",
        twin,
    ), twin
    # ...and nothing else: SGLang derives the prefill graph sizes from chunked_prefill_size.
    assert twin.count(" (baseline)") == 2, twin

    # Batch above admission: windows hold, queued requests were cut, counters add up, and the
    # gate fails the pair for the concurrency it could not reach - and for nothing else.
    queued = got["queued"]
    names = [c.split(":")[0] for c in queued["checks"]]
    assert names.count("concurrency-below-batch") == 2, queued
    # On a loaded host one arm's windows may also run thinner than the other's even after a
    # re-run (baseline 3.2 vs 3.9 with a busy loop beside tests/sglang): that is concurrency
    # too, and still nothing else may fail.
    assert set(names) <= {"concurrency-below-batch", "concurrency-differs"}, queued
    assert all(
        "admits at most 4" in c for c in queued["checks"] if c.startswith("concurrency-below")
    )
    for window, sample in zip(queued["windows"], queued["samples"]):
        # The window's 12 prompts run whole; fillers (the next prompts) hold the batch behind
        # them, and the close cuts those still running or queued.
        assert window["prompts"] == 12 and window["requests"] >= 12, window
        assert window["aborted"][0] >= 2, window
        # Whether a request is still queued at the close (aborted unprefilled) depends on timing.
        # The queued answer's parse is held by tests/unit/engines/test_sglang_first_contact.py on
        # a live capture.
        assert window["prefilled"][0] <= window["requests"], window
        # Every prefilled request's first token is prefill's; the rest is decode, of which the
        # window prompts' part is counted (the fillers' share of the rows is weighed out).
        decode = window["tokens_per_loop"] - window["prefilled"][0]
        assert 0 < sample["decode_tokens"] <= decode, (sample, window)
    assert outcomes["test_batch_above_admission"] == "failed"

    # The last refill, sent 0 ms after the close's abort_all, is cut; the engine is idle after.
    close = got["close"]
    assert outcomes["test_last_refill_at_the_close"] == "passed", close
    assert all(t["completion_tokens"] < 400 for t in close["new"]), close
    assert close["old_one_shot"]["finish"] == "length", close  # the race is real

    # Flush waits for idle on 0.5.23.
    assert outcomes["test_flush_waits_for_idle"] == "passed", got.get("flush")

    # Clean stop: every engine group is gone, each stopped by SGLang's graceful drain.
    groups = set(aa["groups"]) | set(got["skewed"]["groups"]) | set(queued["groups"])
    assert not [g for g in groups if group_left(g, settle_s=15.0)]
    for log in set(aa["logs"]) | set(got["skewed"]["logs"]):
        body = open(log, errors="replace").read()
        assert "Traceback" not in body, log
        # The session's end drains each server (SIGTERM to it alone), as stop() does: SIGTERM
        # to the whole group killed the scheduler mid-drain and SGLang logged it as a crash.
        assert "Draining requests and shutting down" in body, log
        assert "crashed with exit code" not in body and "SIGQUIT received" not in body, body[-3000:]
