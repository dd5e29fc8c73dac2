"""The suite a drafter pull request is gated by: 6 cases (eagle3 and ngram at batch 1, 16 and 64
on the code corpus) of an 8B target.

On a pull request (``SPECENERGY_AB=1``) each candidate drafter is measured against its reference
- the drafter as main has it - in the same repeat cycles (in-job A/B): machine, session offset and
drift cancel, and no stored baseline is needed. The nightly run on main measures the candidates
alone and saves the run to the history, whose step detection fails the nightly on a jump.

Each case keeps its identity through ``Drafter(id=...)``, so a swapped EAGLE3 checkpoint or a
retuned n-gram drafter is compared with the same case. What both arms need is pinned: one KV pool
(``max_total_tokens``; SGLang sizes an EAGLE3 engine's pool with the head's layer too) and the
weights (``weights_gb``: the engines stay resident on an H200 only when their size is known).
``specenergy plan example_suites/ci_gate`` prints its modeled GPU minutes.

Energy is gated on ``energy_ratio`` (J/token over the baseline of the same repeat cycle), never on
absolute ``energy_per_token``: in-job both read the same, but against a stored run absolute J/token
keeps each session's offset (the GPU's temperature and clocks), which failed 1.8% of unchanged
cases and 31.8% of cases inside the limit (issue 40); the gate now judges such a limit only with a
between-session term estimated from the stored history (``gate/session_term.py``).
"""

import os

import pytest

from pytest_specenergy import Drafter

MODEL = os.environ.get("SPECENERGY_MODEL", "Qwen/Qwen3-8B")
#: The pull request's EAGLE3 head, and main's (the reference of the in-job A/B).
EAGLE3 = os.environ.get("SPECENERGY_EAGLE3", "Tengyunw/qwen3_8b_eagle3")
EAGLE3_MAIN = os.environ.get("SPECENERGY_EAGLE3_MAIN", EAGLE3)
IN_JOB_AB = os.environ.get("SPECENERGY_AB") == "1"

pytestmark = [
    pytest.mark.model(
        MODEL,
        engine="sglang",
        dtype="bfloat16",
        max_running_requests=64,
        attention_backend="flashinfer",
        # One KV pool in every arm; it fits an H200 with both arms resident and an H100 blocked
        # (benchmarks/results/pool_capacity.txt, sized by SGLang's own code).
        max_total_tokens=131072,
        # Qwen3-8B's 16.4 GB of weights with the 0.8 GB EAGLE3 head: the heaviest engine.
        weights_gb=16.2,
    ),
    pytest.mark.corpus("code"),
    # A pool of 3x the largest batch: at batch 64 a 96-prompt pool cannot hold the steady state
    # (benchmarks/results/block_crossover_*.txt: the concurrency check failed there, passed at 192).
    pytest.mark.generation(max_new_tokens=512, prompts=192),
]


def _reference(drafter: Drafter) -> list:
    """The in-job A/B reference marker on a pull request, none on the nightly."""
    return [pytest.mark.reference_drafter(drafter)] if IN_JOB_AB else []


@pytest.mark.drafter(
    Drafter("eagle3", draft_model=EAGLE3, num_steps=3, num_draft_tokens=3, id="eagle3")
)
@pytest.mark.batch(1, 16, 64)
@pytest.mark.tolerance(energy_ratio="5%", accept_length="5%", equivalence=0)
def test_eagle3(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent(min_common_prefix=64)


for _mark in _reference(
    Drafter("eagle3", draft_model=EAGLE3_MAIN, num_steps=3, num_draft_tokens=3, id="eagle3-main")
):
    test_eagle3 = _mark(test_eagle3)


@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=8, id="ngram"))
@pytest.mark.batch(1, 16, 64)
@pytest.mark.tolerance(energy_ratio="5%", accept_length="5%", equivalence=0)
def test_ngram(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent(min_common_prefix=64)


for _mark in _reference(Drafter("ngram", num_draft_tokens=8, id="ngram-main")):
    test_ngram = _mark(test_ngram)
