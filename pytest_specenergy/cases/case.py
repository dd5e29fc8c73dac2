"""Cases: one resolved measurement per test item; its engines, pool and baseline arm:
docs/methodology.md."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from pytest_specenergy.cases.chat import chat_prompts
from pytest_specenergy.cases.corpora import Corpus
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.prompts import Prompt

#: Prompts per pool when a case does not say (``generation(prompts=N)`` overrides).
DEFAULT_PROMPT_POOL = 96


#: The largest prompt pool a case may ask for, by option or marker: a pool holds its prompts'
#: requests in memory (audit 3, N8/T28: ``generation(prompts=10**23)`` grew to a MemoryError).
MAX_POOL = 4096


@dataclass(frozen=True)
class Generation:
    """How each request is generated; ``prompts``: the pool measured per repeat
    (docs/methodology.md)."""

    max_new_tokens: int = 64
    prompts: int | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    #: Each corpus prompt is sent as one user message through the model's chat template, as
    #: SGLang's chat endpoint renders it (:mod:`pytest_specenergy.cases.chat`): an instruct
    #: model answers instead of stopping at once.
    chat: bool = False

    def pool_size(self, corpus_size: int) -> int:
        """The prompt pool's size for a corpus of ``corpus_size`` prompts, the same at every batch
        (a pool too small for its batch never reaches a steady state, and the concurrency check says
        so)."""
        return self.prompts if self.prompts is not None else min(DEFAULT_PROMPT_POOL, corpus_size)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description; ``chat`` only when set, so a run stored before it existed
        still compares with one that does not use it (the gate compares these dicts whole)."""
        data = dataclasses.asdict(self)
        if not self.chat:
            del data["chat"]
        return data


@dataclass(frozen=True)
class Case:
    """One point of the matrix: a speculative engine (``spec``; its twin the baseline) x batch x
    corpus x generation."""

    spec: EngineConfig
    batch: int
    corpus: Corpus = field(compare=False)
    generation: Generation = Generation()
    #: In-job A/B: a reference drafter measured in the candidate's repeat cycles, interleaved with
    #: the shared baseline.
    reference: Drafter | None = None
    model_id: str = ""
    #: Prefix ids with the model (set when a test's matrix has several models).
    model_in_id: bool = field(default=False, compare=False)
    # The corpus compares by name and digest: two loads of the same file are the same case.
    corpus_key: tuple[str, str] = field(default=("", ""), repr=False)

    def __post_init__(self) -> None:
        if self.spec.drafter is None:
            raise ValueError("a case measures a drafter: its engine config has none")
        object.__setattr__(self, "corpus_key", (self.corpus.name, self.corpus.digest))
        if not self.model_id:
            object.__setattr__(self, "model_id", model_short_name(self.model))

    @classmethod
    def of(
        cls,
        *,
        batch: int,
        corpus: Corpus,
        generation: Generation = Generation(),
        reference: Drafter | None = None,
        model_in_id: bool = False,
        engine_options: tuple[tuple[str, Any], ...] = (),
        **engine: Any,
    ) -> Case:
        """A case from its workload and its engine's settings (EngineConfig's fields; its options as
        engine_options)."""
        return cls(
            EngineConfig(options=engine_options, **engine),
            batch,
            corpus,
            generation,
            reference,
            model_in_id=model_in_id,
        )

    # What the rest of the plugin reads of the engine, by the names the markers use.
    @property
    def engine(self) -> str:
        """The engine's name (``reference`` or ``sglang``)."""
        return self.spec.engine

    @property
    def model(self) -> str:
        """The target model."""
        return self.spec.model

    @property
    def drafter(self) -> Drafter:
        """The candidate drafter."""
        return self.spec.drafter  # type: ignore[return-value]

    @property
    def device(self) -> str:
        """The reference server's device (``auto``, ``cpu``, ``cuda``)."""
        return self.spec.device

    @property
    def id(self) -> str:
        """The readable id: ``code-ngram-b4``, ``dense-code-ngram-b4`` (several models),
        ``code-a-vs-b-b4`` (A/B), ``conversation-chat-ngram-b4`` (chat template applied)."""
        versus = f"-vs-{self.reference.id}" if self.reference is not None else ""
        # chat changes every prompt the engine sees: a case id without it would compare unlike
        # workloads with a stored run
        chat = "-chat" if self.generation.chat else ""
        base = f"{self.corpus.name}{chat}-{self.drafter.id}{versus}-b{self.batch}"
        return f"{self.model_id}-{base}" if self.model_in_id else base

    def pool(self) -> tuple[Prompt, ...]:
        """The prompt pool: the corpus's first :meth:`Generation.pool_size` prompts; with
        ``generation(chat=True)`` each one's chat-templated token ids (the model's tokenizer
        loads once per process)."""
        texts = self.corpus.take(self.generation.pool_size(len(self.corpus.prompts)))
        return chat_prompts(self.model, texts) if self.generation.chat else texts

    def spec_config(self) -> EngineConfig:
        """The speculative engine."""
        return self.spec

    def baseline_config(self) -> EngineConfig:
        """The non-speculative twin, derived from the speculative config."""
        return self.spec.twin()

    def reference_config(self) -> EngineConfig | None:
        """The in-job A/B reference drafter's engine (the speculative config with that drafter), or
        None."""
        return (
            None
            if self.reference is None
            else dataclasses.replace(self.spec, drafter=self.reference)
        )

    def baseline_key(self) -> tuple[Any, ...]:
        """What the baseline arm depends on: everything but the drafter."""
        return (self.baseline_config(), self.batch, self.corpus_key, self.generation)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description of the case."""
        spec, corpus = self.spec, self.corpus
        return {
            "id": self.id,
            "engine": spec.engine,
            "model": spec.model,
            "drafter": self.drafter.as_dict(),
            "reference": self.reference.as_dict() if self.reference is not None else None,
            "batch": self.batch,
            "corpus": {
                "name": corpus.name,
                "source": corpus.source,
                "digest": corpus.digest,
                "size": len(corpus.prompts),
            },
            "generation": self.generation.as_dict(),
            "engine_options": dict(spec.options),
            "dtype": spec.dtype,
            "seed": spec.seed,
            "faults": list(spec.faults),
        }


def model_short_name(model: str) -> str:
    """A short, id-safe model name: ``Qwen/Qwen3-8B`` -> ``Qwen3-8B``, ``tiny:dense`` -> ``dense``."""
    base = model.rstrip("/").split("/")[-1].split(":")[-1]
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", base) or "model"
