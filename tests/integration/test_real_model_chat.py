"""The built-in real model through the plugin, against the real reference server: chat-templated
prompts (``generation(chat=True)``) are answered and end at the model's EOS; raw text makes the
instruct model stop at once; ``ignore_eos=True`` runs every answer to ``max_new_tokens``.

Cost: 75-125 s on the loaded 2-core machine (37-71 s as a plain pytest run: two engine starts
of smollm2-135m at 5-20 s each, three cases of 2 prompts x 12 tokens at batch 1 at 1-7 s an arm,
transformers imported again in the in-process run for the chat tokenizer). Needs the model in the
cache (``dev/setup.sh --test`` fetches it); skipped where it is not."""

from __future__ import annotations

import json

import pytest

from pytest_specenergy.refserver.catalog import is_ready

pytestmark = pytest.mark.skipif(
    not is_ready("smollm2-135m"), reason="smollm2-135m is not cached: run dev/setup.sh --test"
)

PROMPTS = """\
{"prompt": "What is the capital of France? Answer in one short sentence."}
{"prompt": "Write a Python function that returns the square of a number."}
"""

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [pytest.mark.model("smollm2-135m"), pytest.mark.corpus("jsonl:prompts.jsonl"),
              pytest.mark.drafter(Drafter("ngram", num_draft_tokens=4)), pytest.mark.batch(1)]

@pytest.mark.generation(chat=True, max_new_tokens=12, prompts=2)
def test_chat(spec_pair):
    spec_pair.measure().assert_equivalent()

@pytest.mark.generation(chat=True, max_new_tokens=12, prompts=2, ignore_eos=True)
def test_chat_ignore_eos(spec_pair):
    spec_pair.measure().assert_equivalent()

@pytest.mark.generation(max_new_tokens=12, prompts=2)
def test_raw(spec_pair):
    spec_pair.measure().assert_equivalent()
"""


def test_chat_prompts_are_answered_and_end_at_eos(pytester: pytest.Pytester, run_suite):
    pytester.makefile(".jsonl", prompts=PROMPTS)
    # A name no other test module of the suite has: an in-process pytester run imports it.
    pytester.makepyfile(test_real_model_chat_suite=SUITE)
    out = pytester.path / "run.json"
    result = run_suite(f"--specenergy-json={out}", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_chat[[]prompts-chat-ngram-k4-b1[]] PASSED*",
            "*test_raw[[]prompts-ngram-k4-b1[]] PASSED*",  # raw text: no chat in the id
        ]
    )
    results = {
        r["nodeid"].split("::")[1].split("[")[0]: r for r in json.loads(out.read_text())["results"]
    }
    chat, no_eos, raw = results["test_chat"], results["test_chat_ignore_eos"], results["test_raw"]
    assert chat["case"]["generation"]["chat"] is True
    assert "chat" not in raw["case"]["generation"]
    for arm in ("baseline", "speculative"):
        # the capital of France is answered in a sentence and ends at <|im_end|>, the model's EOS
        assert chat[arm]["finish_reasons"][0] == "stop"
        assert no_eos[arm]["finish_reasons"] == ["length", "length"]
    # as raw text the same question gets an answer that stops at once
    assert raw["baseline"]["finish_reasons"][0] == "stop"
    assert raw["equivalence"]["min_common_prefix"] < chat["equivalence"]["min_common_prefix"]
    assert chat["checks"] == [] and no_eos["checks"] == []
