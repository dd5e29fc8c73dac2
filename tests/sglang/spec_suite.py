"""The speculative ``spec_pair`` cases of the live SGLang session (issue 38), run in it by
``test_sglang_live.py`` after the A/A pairs, and what they must show.

A real SGLang 0.5.23 NGRAM engine (``Drafter("ngram", num_draft_tokens=4)``, a draft chain) on the
CPU, with the test-only overlay of ``tests/sglang_overlay/`` (SGLang's kernels and verify
attention for a CPU; its scheduler, NGRAM worker, counters and HTTP layer are SGLang's own),
against its twin: the A/A pairs' baseline engine, the same config without the drafter. Both
engines are reused by every case here. Cases:

* ``test_ngram_pair[b1]``, ``[b4]``: the whole plugin path at batch 1 and 4 - the twin check
  between the live NGRAM server and its twin, the counter checks, exact equivalence, the
  steady-state windows closed by the plugin's aborts, ``step_time_dict`` concurrency - with no
  failed check and the gate passing.
* ``test_ngram_retraction``: 6 long prompts (1000 tokens) of 450 tokens each at batch 6 on
  engines admitting 4 with a 4096-token pool and ``schedule_conservativeness=0.1``: SGLang admits
  three (its estimate of what they will need fits), and three of 1000 + 366 tokens overflow the
  pool, so it retracts one (both arms) before the first finishes; the window's close then aborts
  running requests and queued ones (never admitted, and retracted ones: answered from the waiting
  queue without ``prompt_tokens``). The windows hold, counters add up, outputs are exact, and the
  gate fails the pair for the concurrency it could not reach and for nothing else.

Every ``/generate`` answer of both engines is recorded (a wrapper on each engine's client) so that
the outer test checks SGLang's counter identities on every live request itself, beside the
plugin's own checks (:func:`counter_identities`).
"""

from __future__ import annotations

import re
from typing import Any
from typing import Iterable
from typing import Mapping

from sglang_envs import group_left

#: Drafts per verify step (``Drafter("ngram", num_draft_tokens=4)``: SGLang's
#: ``--speculative-num-draft-tokens 5`` counts the root).
DRAFTS_PER_STEP = 4
#: The retraction case's shape: prompts of this many characters of the code corpus (one
#: byte-level token each), the slices taken, the tokens each makes, and the pool (the session's
#: ``max_total_tokens``). With ``schedule_conservativeness=0.1`` SGLang admits three of them at
#: once (measured: without it, two, which fit and never retract), and three overflow the pool at
#: 4096 / 3 - 1000 = 365 tokens each, 85 before the first finishes and the window closes. Slice 4
#: is left out: the tiny model's greedy continuation of it ends at once (EOS), which would close
#: the window before any retraction.
LONG_PROMPT_CHARS = 1000
LONG_SLICES = (0, 1, 2, 3, 5, 6)
LONG_TOKENS = 450
POOL_TOKENS = 4096

#: The cases' test module, after ``test_sglang_live.COMMON`` (``SERVER_MARK``, ``save``).
SUITE = (
    '''
import time

from pytest_specenergy import Drafter
from pytest_specenergy.cases.corpora.loader import Corpus
from pytest_specenergy.cases.corpora.loader import load_corpus
from pytest_specenergy.engines.meta_info import parse_meta_info

pytestmark = [SERVER_MARK, pytest.mark.drafter(Drafter("ngram", num_draft_tokens=4))]

_TEXT = "\\n\\n".join(load_corpus("code").prompts)
LONG = Corpus("code-long", tuple(_TEXT[i * LONG_PROMPT_CHARS:(i + 1) * LONG_PROMPT_CHARS]
                                 for i in LONG_SLICES))


def recorded(spec_pair):
    """Both engines, their clients recording every /generate answer from now on (the lists are
    emptied per case)."""
    pool = spec_pair.session.measurer.pool
    engines = {"baseline": pool.get(spec_pair.case.baseline_config()),
               "speculative": pool.get(spec_pair.case.spec_config())}
    for server in engines.values():
        client = server.client
        if not hasattr(client, "answers"):
            real = client.generate

            def generate(*args, _real=real, _client=client, **kwargs):
                answers = _real(*args, **kwargs)
                _client.answers.extend(answers)
                return answers

            client.generate = generate
        client.answers = []
    return engines


def metas(server):
    return [a["meta_info"] for a in server.client.answers]


def facts_of(pair, engines, spec_pair):
    samples = {arm: [s.as_dict() | {"window": None} for s in getattr(pair, arm).samples]
               for arm in ("baseline", "speculative")}
    windows = {arm: [s.window.full.as_dict() | {"details": None} for s in getattr(pair, arm).samples]
               for arm in ("baseline", "speculative")}
    return {"checks": [str(c) for c in pair.checks],
            "failed": [str(c) for c in pair.failed_checks],
            "source": pair.source,
            "exact": pair.equivalence.exact_fraction,
            "requests": len(pair.equivalence.requests),
            "accept_length": pair.accept_length,
            "acceptance_rate": pair.speculative.acceptance_rate,
            "counter_problems": {arm: list(getattr(pair, arm).counter_problems)
                                 for arm in ("baseline", "speculative")},
            "concurrency": {arm: getattr(pair, arm).concurrency.as_dict()
                            for arm in ("baseline", "speculative")},
            "samples": samples,
            "windows": windows,
            "spec_info": {k: engines["speculative"].server_info.get(k) for k in (
                "speculative_algorithm", "speculative_num_draft_tokens", "max_total_num_tokens",
                "speculative_ngram_max_bfs_breadth", "schedule_conservativeness")},
            "metas": {arm: metas(server) for arm, server in engines.items()},
            "pids": {arm: server.pid for arm, server in engines.items()},
            "logs": {arm: str(server.log_path) for arm, server in engines.items()},
            "starts": len(spec_pair.session.measurer.pool.starts)}


@pytest.mark.corpus("code")
@pytest.mark.generation(max_new_tokens=64, prompts=8)
@pytest.mark.batch(1, 4)
def test_ngram_pair(spec_pair):
    engines = recorded(spec_pair)
    t0 = time.perf_counter()
    r = spec_pair.measure()
    save(f"ngram_b{spec_pair.case.batch}",
         {**facts_of(r, engines, spec_pair), "measure_s": time.perf_counter() - t0})
    r.assert_equivalent()
    assert r.failed_checks == ()


@pytest.mark.corpus(LONG)
@pytest.mark.generation(max_new_tokens=LONG_TOKENS, prompts=6)
@pytest.mark.batch(6)
def test_ngram_retraction(spec_pair):
    engines = recorded(spec_pair)
    t0 = time.perf_counter()
    r = spec_pair.measure()
    facts = {**facts_of(r, engines, spec_pair), "measure_s": time.perf_counter() - t0}
    # How the plugin parsed each answer SGLang sent from its waiting queue (retracted or never
    # admitted): the parse that raised MetaInfoError before issue 37 item 4.
    facts["queued_parsed"] = {
        arm: [{"meta": m, "prompt_tokens": c.prompt_tokens, "retractions": c.retractions,
               "queued_abort": c.queued_abort}
              for m in metas(server) for c in [parse_meta_info(m)] if c.queued_abort]
        for arm, server in engines.items()}
    facts["retractions"] = {arm: None if run.retractions is None else run.retractions.as_dict()
                            for arm, run in (("baseline", r.baseline),
                                             ("speculative", r.speculative))}
    save("retraction", facts)
'''.replace("LONG_PROMPT_CHARS", str(LONG_PROMPT_CHARS))
    .replace("LONG_SLICES", repr(LONG_SLICES))
    .replace("LONG_TOKENS", str(LONG_TOKENS))
)

#: Names of the overlay's ops and verify path that an NGRAM engine calls (``fill_bonus_tokens_cpu``
#: is EAGLE's: NGRAM commits its bonus token itself).
NGRAM_CALLS = {
    "sgl_kernel.copy_all_layer_kv_cache_cpu",
    "sgl_kernel.assign_req_to_token_pool_cpu",
    "sgl_kernel.assign_extend_cache_locs_cpu",
    "sgl_kernel.speculative.reconstruct_indices_from_tree_mask",
    "sgl_kernel.verify_tree_greedy_cpu",
    "sgl_kernel.fill_accept_out_cache_loc_cpu",
    "TorchNativeAttnBackend.forward_extend[TARGET_VERIFY]",
}


def counter_identities(meta: Mapping[str, Any], max_new_tokens: int) -> list[str]:
    """What SGLang's per-request speculative counters must satisfy, checked here on every live
    answer independently of the plugin; empty when they hold. ``hist[k]`` counts the verify steps
    that accepted k drafts:

    * ``sum(hist) == spec_verify_ct`` and ``sum(k * hist[k]) == spec_num_correct_drafts``;
    * ``spec_num_proposed_drafts == spec_verify_ct * drafts per step`` (SGLang books the static
      config's width, ``tokenizer_manager.py``);
    * the tokens committed: the prefill's first token (one more per retraction, whose re-prefill
      makes one), then per verify step its accepted drafts plus the bonus token,
      ``1 + num_retractions + spec_verify_ct + spec_num_correct_drafts``; SGLang cuts a
      finished request's output at ``max_new_tokens`` or its stop token (so up to a step's drafts
      fewer), an aborted one's not (it may exceed ``max_new_tokens``).
    """
    rid = meta.get("id")
    verify, correct = meta.get("spec_verify_ct"), meta.get("spec_num_correct_drafts")
    proposed, hist = meta.get("spec_num_proposed_drafts"), meta.get("spec_correct_drafts_histogram")
    completion = meta.get("completion_tokens")
    if verify is None:  # finished in its prefill, or answered from the queue: no spec keys
        return []
    problems = []
    if hist is None or correct is None or proposed is None:
        return [f"{rid}: spec_verify_ct without the other counters: {dict(meta)}"]
    if sum(hist) != verify:
        problems.append(f"{rid}: histogram {hist} sums to {sum(hist)}, spec_verify_ct {verify}")
    if sum(k * n for k, n in enumerate(hist)) != correct:
        problems.append(f"{rid}: histogram {hist} weighs {correct} correct drafts wrong")
    if proposed != verify * DRAFTS_PER_STEP:
        problems.append(f"{rid}: {proposed} proposed drafts != {verify} steps x {DRAFTS_PER_STEP}")
    # each prefill (the first, and a retracted request's again on re-admission) makes one token
    committed = 1 + int(meta.get("num_retractions") or 0) + verify + correct
    finish = (meta.get("finish_reason") or {}).get("type")
    if finish == "abort":
        if committed != completion:
            problems.append(f"{rid}: {completion} tokens but {committed} committed (abort)")
    elif not 0 <= committed - completion <= DRAFTS_PER_STEP:
        problems.append(f"{rid}: {completion} tokens, {committed} committed ({finish})")
    elif finish == "length" and completion != max_new_tokens:
        problems.append(f"{rid}: a length finish at {completion} of {max_new_tokens} tokens")
    return problems


def steps_match_counters(window: Mapping[str, Any], sample: Mapping[str, Any], arm: str) -> str:
    """``step_time_dict`` (rows per step, read around the window) against the window's counters:
    every decode step runs each running request once, so the rows it ran add up to the
    requests' verify steps (speculative) or their decode tokens (baseline, one a step). The
    sample's counters are the window prompts'; the fillers that held the batch after them ran
    the rest of the rows (``work_share``: the prompts' share). Returns a problem, or ''."""
    steps = (window.get("concurrency") or {}).get("steps_by_running") or {}
    rows = sum(int(r) * n for r, n in steps.items())
    expected = sample["verify_steps"] if arm == "speculative" else sample["decode_tokens"]
    if sample.get("work_share"):
        expected = round(expected / sample["work_share"])
    if rows != expected:
        return f"{arm}: step_time_dict ran {rows} request-steps, counters say {expected} ({steps})"
    return ""


def _names(checks: Iterable[str]) -> list[str]:
    return [c.split(":")[0] for c in checks]


def check_ngram(got: dict[str, Any], outcomes: dict[str, str], text: str) -> None:
    """What the NGRAM cases must show (``got``: the facts they saved)."""
    for batch in (1, 4):
        facts = got[f"ngram_b{batch}"]
        assert outcomes.get("test_ngram_pair") == "passed", text[-6000:]
        assert facts["failed"] == [] and facts["exact"] == 1.0, facts["checks"]
        assert facts["spec_info"]["speculative_algorithm"] == "NGRAM", facts["spec_info"]
        assert facts["counter_problems"] == {"baseline": [], "speculative": []}
        # NGRAM accepted drafts (the tiny model loops, and the trie learns the loop): a live
        # acceptance, not the stand-in's zero
        assert facts["accept_length"] > 1.5 and 0 < facts["acceptance_rate"] <= 1, facts
        _counters_and_steps(facts, max_new_tokens=64, steps_exact=True)
        spec = facts["concurrency"]["speculative"]
        assert spec["max_running"] == batch and spec["mean_running"] <= batch, spec
        # the steady windows were closed by the plugin's aborts at batch 4 (batch 1 runs the pool)
        if batch == 4:
            aborted = [w["aborted"][0] for w in facts["windows"]["speculative"]]
            assert all(a >= 1 for a in aborted), facts["windows"]["speculative"]
    # batch 1 and 4 ran on the same two engines: no start of their own after the first case
    assert got["ngram_b1"]["starts"] == got["ngram_b4"]["starts"]
    # The NGRAM engine stopped cleanly at the session's end, by SGLang's graceful drain.
    assert not group_left(got["ngram_b1"]["pids"]["speculative"], settle_s=15.0)
    body = open(got["ngram_b1"]["logs"]["speculative"], errors="replace").read()
    assert "Traceback" not in body and "Draining requests and shutting down" in body, body[-3000:]
    # the overlay loaded where it was wanted and was never tried anywhere else (the watchdog)
    assert "Error in sitecustomize" not in body, body[:3000]


def _counters_and_steps(facts: dict[str, Any], max_new_tokens: int, steps_exact: bool) -> list:
    spec_metas = facts["metas"]["speculative"]
    with_spec = [m for m in spec_metas if m.get("spec_verify_ct") is not None]
    assert with_spec, "no live answer carried speculative counters"
    problems = [p for m in spec_metas for p in counter_identities(m, max_new_tokens)]
    assert problems == [], problems[:10]
    # the twin never reports speculative counters
    assert all(m.get("spec_verify_ct") is None for m in facts["metas"]["baseline"])
    mismatches = [
        steps_match_counters(window, sample, arm)
        for arm in ("baseline", "speculative")
        for window, sample in zip(facts["windows"][arm], facts["samples"][arm])
    ]
    if steps_exact:
        assert not any(mismatches), mismatches
    return [m for m in mismatches if m]


def check_retraction(got: dict[str, Any], outcomes: dict[str, str], text: str) -> None:
    """What the retraction case must show."""
    facts = got["retraction"]
    assert outcomes.get("test_ngram_retraction") == "failed", text[-6000:]  # concurrency only
    names = _names(facts["failed"])
    assert "concurrency-below-batch" in names, facts["checks"]
    # A request SGLang retracted and then answered from its waiting queue carries output but no
    # speculative counters (SGLang drops them); it made the whole window's counters None and the
    # pair failed ``missing-counters`` (issue 38's report). Fixed (issue 37): such a request
    # voids no counter and commits no token. The retractions are counted per arm and judged.
    assert "missing-counters" not in names, facts["checks"]
    assert all(s["verify_steps"] is not None for s in facts["samples"]["speculative"]), facts
    allowed = {"concurrency-below-batch", "concurrency-differs", "retractions-differ"}
    assert set(names) <= allowed, facts["checks"]
    assert all(facts["retractions"][arm]["total"] >= 1 for arm in facts["retractions"]), facts
    assert facts["exact"] == 1.0 and facts["counter_problems"]["speculative"] == [], facts
    assert facts["spec_info"]["max_total_num_tokens"] == POOL_TOKENS, facts["spec_info"]
    # A retraction throws work away that no counter shows (the retracted request's decode steps,
    # its output up to the last 50-token mark SGLang sent), and a re-admitted request's next
    # token comes from a prefill, not a decode step: step records and counters part here (kept
    # in the facts, not asserted).
    got["retraction_step_mismatch"] = _counters_and_steps(
        facts, max_new_tokens=LONG_TOKENS, steps_exact=False
    )
    # SGLang retracted in both engines (its own log line)
    for arm, log in facts["logs"].items():
        body = open(log, errors="replace").read()
        assert re.search(
            r"KV cache pool is full\. Retract requests\. #retracted_reqs: [1-9]", body
        ), (
            arm,
            body[-3000:],
        )
    # Every window ran its 6 prompts whole (plan/window.py: fillers, the same 6 prompts again,
    # held the batch after them); the close aborted the fillers still running or queued.
    for arm in ("baseline", "speculative"):
        for window in facts["windows"][arm]:
            assert window["prompts"] == 6 and window["requests"] >= 6, window
    queued = {arm: facts["queued_parsed"][arm] for arm in ("baseline", "speculative")}
    # A retracted request answered from the queue keeps its output: it parses, its prompt unknown
    # to SGLang's answer, one retraction at least (a filler now: a window prompt runs whole).
    retracted = [q for arm in queued for q in queued[arm] if q["meta"]["completion_tokens"] > 0]
    for q in retracted:
        assert "prompt_tokens" not in q["meta"] or q["meta"]["prompt_tokens"] is None, q
        assert q["retractions"] >= 1 and q["queued_abort"], q
