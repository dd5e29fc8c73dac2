"""Shared fixtures for the reference-engine tests.

Engines are cached per configuration for the whole session: building one costs about a second, and
the engine API is re-entrant between calls (every ``generate`` starts from empty caches).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the package may not be installed in the test environment
    sys.path.insert(0, str(ROOT))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pytest_specenergy.refserver.engine import ReferenceEngine  # noqa: E402
from pytest_specenergy.refserver.records import EngineConfig  # noqa: E402
from pytest_specenergy.refserver.records import GenerationRequest  # noqa: E402
from pytest_specenergy.refserver.records import SamplingParams  # noqa: E402

# Varied prompts: English, code, Romansh, a repetitive one (n-gram matches) and a tiny one.
PROMPTS: tuple[str, ...] = (
    "The energy of the GPU per token is",
    "def forward(self, x):\n    return self.proj(x)\n\ndef",
    "Allegra! Co vai? Jau sun da Cuira e discur rumantsch.",
    "a b c a b c a b c a b",
    "hi",
    "In the beginning of the batch, the draft model",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    "Summarise: speculative decoding saves energy when",
)

_ENGINES: dict[EngineConfig, ReferenceEngine] = {}


@pytest.fixture(scope="session")
def engine_for() -> Callable[..., ReferenceEngine]:
    """``engine_for(model=..., drafter=..., num_draft_tokens=..., ...)`` -> a cached engine."""

    def make(**kwargs: object) -> ReferenceEngine:
        config = EngineConfig(**kwargs)  # type: ignore[arg-type]
        if config not in _ENGINES:
            _ENGINES[config] = ReferenceEngine(config)
        return _ENGINES[config]

    return make


def _make_requests(
    engine: ReferenceEngine,
    batch: int,
    max_new_tokens: int = 32,
    ignore_eos: bool = True,
    prompts: Sequence[str] = PROMPTS,
) -> list[GenerationRequest]:
    """``batch`` requests cycling through ``prompts`` (suffixed so no two rows are identical)."""
    tok = engine.tokenizer
    out = []
    for i in range(batch):
        text = prompts[i % len(prompts)] + ("" if i < len(prompts) else f" {i}")
        out.append(
            GenerationRequest(
                input_ids=tuple(tok.encode(text)),
                sampling=SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos),
            )
        )
    return out


@pytest.fixture(scope="session")
def make_requests() -> Callable[..., list[GenerationRequest]]:
    """``make_requests(engine, batch, max_new_tokens=32, ignore_eos=True, prompts=PROMPTS)``."""
    return _make_requests


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Run these tests on one intra-op thread, restoring the setting afterwards.

    Tiny models gain little from a second thread, and on a shared 2-core machine OpenMP
    spin-waiting makes two threads up to 10x slower whenever another process is busy.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
