"""The quickstart's shape on real models: SGLang engines measured with NVML.

Point SPECENERGY_MODEL / SPECENERGY_EAGLE3 at local checkpoints (or hub ids cached on the
runner), then run ``pytest example_suites/gpu``. Skipped with a clear reason where there is no
GPU or no SGLang. SPECENERGY_MAX_TOTAL_TOKENS (default 131072) pins one KV pool in both arms:
SGLang 0.5.23 sizes an EAGLE3 engine's pool with the draft head's layers too, and the twin
check fails a pair whose pools differ; it fits an H200 with both arms resident and an H100 one
engine at a time (benchmarks/results/pool_capacity.txt). SPECENERGY_WEIGHTS_GB (16.2) is the
heaviest engine's weights. ``specenergy plan example_suites/gpu`` prints its GPU minutes.
"""

import os

import pytest

from pytest_specenergy import Drafter

MODEL = os.environ.get("SPECENERGY_MODEL", "Qwen/Qwen3-8B")
EAGLE3 = os.environ.get("SPECENERGY_EAGLE3", "Tengyunw/qwen3_8b_eagle3")
MAX_TOTAL_TOKENS = int(os.environ.get("SPECENERGY_MAX_TOTAL_TOKENS", "131072"))

pytestmark = [
    pytest.mark.model(
        MODEL,
        engine="sglang",
        dtype="bfloat16",
        max_running_requests=64,
        attention_backend="flashinfer",
        max_total_tokens=MAX_TOTAL_TOKENS,
        # Qwen3-8B's 16.4 GB of weights with the 0.8 GB EAGLE3 head, the heaviest engine: with its
        # size known the plan can keep both arms resident where they fit (engines/kv_pools.py).
        weights_gb=float(os.environ.get("SPECENERGY_WEIGHTS_GB", "16.2")),
    ),
    pytest.mark.corpus("code", "conversation"),
    # A pool of 3x the largest batch: at batch 64 a 96-prompt pool cannot hold the steady state.
    pytest.mark.generation(max_new_tokens=512, prompts=192),
]


@pytest.mark.drafter(
    Drafter("eagle3", draft_model=EAGLE3, num_steps=3, num_draft_tokens=3, id="eagle3"),
    Drafter("ngram", num_draft_tokens=8),
)
@pytest.mark.batch(1, 16, 64)
def test_drafter_pays_for_itself(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent(min_common_prefix=64)
    r.assert_acceptance(at_least=2.0)
    r.assert_saves_energy()
