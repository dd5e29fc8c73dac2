"""Markers -> cases: the closest marker of each name wins, several values form an axis;
docs/methodology.md."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import re
from dataclasses import dataclass
from typing import Any
from typing import Callable

from pytest_specenergy.cases.case import MAX_POOL
from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.case import model_short_name
from pytest_specenergy.cases.corpora import Corpus
from pytest_specenergy.cases.corpora import CorpusError
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.base import ENGINE_DRAFTERS
from pytest_specenergy.engines.base import ENGINE_DTYPES
from pytest_specenergy.engines.base import ENGINES
from pytest_specenergy.engines.checkpoints import BUILTIN_CHECKPOINTS
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import EARLY_EXIT_PREFIX
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.drafters import DrafterError

#: Built-in tiny models of the reference server (made from a seed, no files).
TINY_MODELS = (
    "tiny:dense",
    "tiny:dense-draft",
    "tiny:moe",
    "tiny:moe-draft",
    "tiny:hybrid",
    "tiny:hybrid-draft",
)

MARKERS = {
    "model": "model(name_or_path, ..., engine=None, dtype=None, device=None, seed=None, "
    "max_running_requests=None, faults=(), **engine_kwargs): target model(s) of a "
    "spec_pair case; several names form a matrix axis",
    "drafter": "drafter(*names_or_Drafter): speculative drafter(s) measured against the "
    "non-speculative twin; several form a matrix axis",
    "reference_drafter": "reference_drafter(name_or_Drafter): in-job A/B - also measure this "
    "drafter in the same repeat cycles as each candidate drafter, and gate "
    "the candidate against it (no stored baseline needed)",
    "batch": "batch(*ints): requests kept in flight (the engine's running batch); several form a "
    "matrix axis",
    "corpus": "corpus(*names_or_Corpus): prompt corpora (code, conversation, long-document, "
    "news, rm-news, jsonl:PATH); several form a matrix axis",
    "generation": "generation(max_new_tokens=64, prompts=None, ignore_eos=False, temperature=0, "
    "chat=False): how each request is generated; chat=True sends each prompt through the "
    "model's chat template (as SGLang's chat endpoint does)",
    "tolerance": "tolerance(*exprs, **limits): regression limits for this test, e.g. "
    "tolerance(energy_per_token='5%', accept_length=0.1); overrides "
    "--specenergy-compare-fail metric by metric",
}

_MODEL_KWARGS = {"engine", "dtype", "device", "seed", "max_running_requests", "faults"}


class MarkerError(ValueError):
    """A marker value that cannot form a case."""


@dataclass(frozen=True)
class CaseDefaults:
    """What a case takes from the session's options when its markers say nothing."""

    engine: str = "reference"
    device: str = "auto"
    faults: tuple[str, ...] = ()
    sglang_version: str | None = None
    #: Prompts per pool when the generation marker does not say (None: the corpus's first 96).
    pool: int | None = None
    #: The energy is modeled (no board counter): a case's default pool is sized for a CPU minute,
    #: :data:`CPU_POOL_PER_BATCH` prompts per request in flight, at least :data:`CPU_POOL_MIN`, not
    #: the paper's 96.
    modeled: bool = False
    #: ``--specenergy-size``: (prompts, max_new_tokens) of every case, over its generation marker.
    size: tuple[int, int] | None = None


#: The CPU default pool: enough prompts per request in flight to hold the steady state (the
#: concurrency check needs a few times the batch), few enough for a tiny-model case in a minute.
CPU_POOL_PER_BATCH, CPU_POOL_MIN = 3, 12


def build_cases(test: str, closest: Callable[[str], Any], config: CaseDefaults) -> list[Case]:
    """Expand a test's markers (``closest``: name -> closest pytest Mark or None) into cases, in a
    stable order."""
    models = _models(test, closest("model"), config)
    drafters = [
        _drafter(test, "drafter", value)
        for value in _values(
            test, "drafter", closest("drafter"), "drafter names or Drafter(...) objects"
        )
    ]
    batches = _batches(test, closest("batch"))
    corpora = _corpora(test, closest("corpus"))
    pool = config.pool
    if pool is None and config.modeled:  # one pool for every batch point of the test
        pool = max(CPU_POOL_MIN, CPU_POOL_PER_BATCH * max(batches))
    generation = _generation(test, closest("generation"), pool)
    if generation.chat:
        _check_chat(test, [name for name, _ in models])
    if config.size is not None:  # a sweep's size beats the marker (and the pool option)
        generation = dataclasses.replace(
            generation, prompts=config.size[0], max_new_tokens=config.size[1]
        )
    reference = _reference(test, closest("reference_drafter"))
    cases: list[Case] = []
    # Everything but the batch and the corpus is checked and built once per (model, drafter): a
    # 500-case matrix of 10 drafters builds 10 engine configs, not 500 (issue 24, item 8).
    specs: dict[tuple[int, int], EngineConfig] = {}
    model_ids = [model_short_name(model) for model, _ in models]
    for (m, (model, opts)), corpus, (d, drafter), batch in itertools.product(
        enumerate(models), corpora, enumerate(drafters), batches
    ):
        if (m, d) not in specs:
            specs[m, d] = _spec(test, model, opts, drafter, reference)
        cases.append(
            Case(
                specs[m, d],
                batch,
                corpus,
                generation,
                reference,
                model_id=model_ids[m],
                model_in_id=len(models) > 1,
            )
        )
    ids = [c.id for c in cases]
    duplicates = sorted(i for i, n in collections.Counter(ids).items() if n > 1)
    if duplicates:
        raise MarkerError(
            f"{test}: the matrix has several cases with id {duplicates[0]!r}; give each Drafter a "
            f"distinct id= (for example Drafter('ngram', num_draft_tokens=4, id='ngram-4'))"
        )
    return cases


def _spec(
    test: str, model: str, opts: dict[str, Any], drafter: Drafter, reference: Drafter | None
) -> EngineConfig:
    """The speculative engine of one (model, drafter) pair, checked."""
    engine = opts["engine"]
    _check_drafter(test, "drafter", drafter, engine)
    for marker, declared in (("drafter", drafter), ("reference_drafter", reference)):
        if (
            declared is not None
            and engine != "reference"
            and dict(declared.settings).get("accept_p") is not None
        ):
            raise MarkerError(
                f"{test}: marker {marker} value {declared!r}: accept_p (controlled acceptance) is "
                f"a reference-server calibration knob; the {engine} engine has no such setting"
            )
    if reference is not None:
        _check_drafter(test, "reference_drafter", reference, engine)
        if reference == drafter:
            raise MarkerError(
                f"{test}: marker reference_drafter {reference!r} is the candidate drafter itself; "
                f"name the drafter the candidate replaces (e.g. the old draft checkpoint)"
            )
        if (reference.name == "none") != (drafter.name == "none"):
            # The gate compares the two arms' acceptance too; an arm that drafts nothing has
            # none, so such a case could only ever end incomparable, after being measured.
            raise MarkerError(
                f"{test}: marker reference_drafter {reference!r} against drafter {drafter!r}: "
                f"one drafts and the other does not, so their acceptance cannot be compared; "
                f"the case's own baseline arm already is the reference without speculation "
                f"(energy_ratio), so name a drafting reference (e.g. the drafter the candidate "
                f"replaces), or Drafter('none') in both for an A/A control"
            )
    return EngineConfig(
        engine=engine,
        model=model,
        drafter=drafter,
        options=opts["engine_options"],
        **{k: v for k, v in opts.items() if k not in ("engine", "engine_options")},
    )


def _check_drafter(test: str, marker: str, drafter: Drafter, engine: str) -> None:
    if drafter.name not in ENGINE_DRAFTERS[engine]:
        raise MarkerError(
            f"{test}: marker {marker} value {drafter!r} is not implemented by the {engine} "
            f"engine; expected one of {', '.join(ENGINE_DRAFTERS[engine])}"
        )
    if drafter.draft_model:
        _check_model_path(test, marker, drafter.draft_model, engine)


def _values(test: str, name: str, mark: Any, expected: str) -> tuple[Any, ...]:
    if mark is None:
        raise MarkerError(f"{test}: spec_pair needs a @pytest.mark.{name}(...) marker ({expected})")
    if not mark.args:
        raise MarkerError(f"{test}: marker {name}() has no values; expected {expected}")
    return tuple(mark.args)


def _models(test: str, mark: Any, config: CaseDefaults) -> list[tuple[str, dict[str, Any]]]:
    names = _values(test, "model", mark, "a model name or checkpoint path")
    kwargs = dict(mark.kwargs)
    engine = kwargs.get("engine") or config.engine
    if engine not in ENGINES:
        raise MarkerError(
            f"{test}: marker model(engine={engine!r}): expected one of {', '.join(ENGINES)}"
        )
    values = {
        "dtype": kwargs.get("dtype", "auto"),
        "device": kwargs.get("device", config.device),
        "seed": kwargs.get("seed", 0),
        "max_running_requests": kwargs.get("max_running_requests"),
    }
    dtypes = ENGINE_DTYPES[engine]
    for key, ok, expected in (  # in this order: the first check a value fails names it
        ("dtype", lambda v: isinstance(v, str), "expected a string"),
        ("dtype", lambda v: v in dtypes, f"the {engine} engine takes one of {', '.join(dtypes)}"),
        ("device", lambda v: isinstance(v, str), "expected a string"),
        (
            "device",
            lambda v: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v),
            "expected auto, cpu, cuda or cuda:N",
        ),
        ("seed", _integer, "expected an integer"),
        (
            "max_running_requests",
            lambda v: v is None or (_integer(v) and v >= 1),
            "expected a positive integer",
        ),
    ):
        if not ok(values[key]):
            raise MarkerError(f"{test}: marker model({key}={values[key]!r}): {expected}")
    faults = kwargs.get("faults", ())
    if isinstance(faults, str):
        faults = (faults,)
    if engine == "reference":
        faults = tuple(dict.fromkeys((*faults, *config.faults)))
    extra = {k: v for k, v in kwargs.items() if k not in _MODEL_KWARGS}
    if engine == "sglang" and config.sglang_version and "sglang_version" not in extra:
        extra["sglang_version"] = config.sglang_version
    if extra and engine == "reference":
        raise MarkerError(
            f"{test}: marker model got engine option(s) {', '.join(sorted(extra))} that the "
            f"reference engine does not take; expected only {', '.join(sorted(_MODEL_KWARGS))}"
        )
    opts = {
        "engine": engine,
        **values,
        "faults": tuple(faults),
        "engine_options": EngineConfig.freeze_options(extra),
    }
    models = []
    for name in names:
        if not isinstance(name, (str, os.PathLike)) or not str(name):
            raise MarkerError(f"{test}: marker model value {name!r}: expected a model name or path")
        name = str(name)
        _check_model_path(test, "model", name, engine)
        models.append((name, opts))
    return models


def _check_chat(test: str, models: list[str]) -> None:
    """Built-in tiny and random models have a byte tokenizer and no chat template."""
    for name in models:
        if name.startswith(("tiny:", "random:")):
            raise MarkerError(
                f"{test}: marker generation(chat=True) with model {name!r}: built-in tiny and "
                "random models have no chat template; use a chat model (such as smollm2-135m) "
                "or chat=False"
            )


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_model_path(test: str, marker: str, name: str, engine: str) -> None:
    if name in BUILTIN_CHECKPOINTS:
        return  # a real checkpoint fetched into the model cache before its engine starts
    if marker != "model" and name.startswith(EARLY_EXIT_PREFIX):
        if engine != "reference":
            raise MarkerError(
                f"{test}: marker {marker} value {name!r}: the early-exit self-draft is the "
                f"reference server's; the {engine} engine needs a draft checkpoint"
            )
        return  # the server checks K against the target's layer count as it starts
    # random:SHAPE[:key=N,...]: seeded random weights the reference server builds itself (no
    # files); it checks the shape and overrides as it starts, in milliseconds, before any load.
    if name.startswith(("tiny:", "random:")):
        tiny = name.startswith("tiny:")
        if tiny and name not in TINY_MODELS:
            raise MarkerError(
                f"{test}: marker {marker} value {name!r} is not a built-in tiny "
                f"model; expected one of {', '.join(TINY_MODELS)} or a checkpoint path"
            )
        if engine != "reference":
            raise MarkerError(
                f"{test}: marker {marker} value {name!r}: {'tiny' if tiny else 'random:'} models "
                f"run only on the reference engine, not {engine}"
            )
        return
    # The engine process inherits pytest's working directory and resolves a relative path there,
    # so the check does too (not against the rootdir, which a run from a subfolder differs from).
    path = os.path.abspath(os.path.expanduser(name))
    if os.path.isdir(path):
        return
    hub_id = not name.startswith(("/", ".", "~")) and name.count("/") == 1
    if engine == "sglang" and hub_id:
        return  # a hub id: SGLang resolves it from its own cache on the runner
    relative = (
        "" if os.path.isabs(os.path.expanduser(name)) else " (relative to the working directory)"
    )
    raise MarkerError(
        f"{test}: marker {marker} value {name!r}: no such model directory "
        f"({path}{relative}); expected an existing checkpoint directory, a built-in checkpoint "
        f"({', '.join(BUILTIN_CHECKPOINTS)})"
        + (
            f", random:SHAPE or one of {', '.join(TINY_MODELS)}"
            if engine == "reference"
            else " or a hub id such as Qwen/Qwen3-8B"
        )
    )


def _drafter(test: str, marker: str, value: Any) -> Drafter:
    """One value of a drafter or reference_drafter marker: a Drafter, or a drafter name."""
    if isinstance(value, Drafter):
        return value
    if not isinstance(value, str):
        raise MarkerError(
            f"{test}: marker {marker} value {value!r}: expected a drafter name or a Drafter(...) "
            "object"
        )
    try:
        return Drafter(value)
    except DrafterError as exc:
        raise MarkerError(f"{test}: marker {marker} value {value!r}: {exc}") from None


def _reference(test: str, mark: Any) -> Drafter | None:
    """The in-job A/B reference drafter: one value, like a drafter marker's."""
    if mark is None:
        return None
    if len(mark.args) != 1 or mark.kwargs:
        raise MarkerError(
            f"{test}: marker reference_drafter takes exactly one drafter name or "
            f"Drafter(...) object, got args={mark.args!r} kwargs={mark.kwargs!r}"
        )
    return _drafter(test, "reference_drafter", mark.args[0])


def _batches(test: str, mark: Any) -> list[int]:
    values = _values(test, "batch", mark, "positive integers such as batch(1, 4, 16)")
    for value in values:
        if not _integer(value) or value < 1:
            raise MarkerError(
                f"{test}: marker batch value {value!r}: expected a positive "
                f"integer such as batch(1, 4, 16)"
            )
    return list(values)


def _corpora(test: str, mark: Any) -> list[Corpus]:
    values = _values(test, "corpus", mark, "corpus names such as corpus('code') or jsonl:PATH")
    corpora = []
    for value in values:
        try:
            corpora.append(load_corpus(value))
        except (CorpusError, TypeError) as exc:
            raise MarkerError(f"{test}: marker corpus value {value!r}: {exc}") from None
    return corpora


def _generation(test: str, mark: Any, pool: int | None = None) -> Generation:
    if mark is None:
        return Generation(prompts=pool)
    if mark.args:
        raise MarkerError(
            f"{test}: marker generation takes keywords only "
            f"(max_new_tokens=, prompts=, ignore_eos=, temperature=, chat=), got {mark.args!r}"
        )
    kwargs = dict(mark.kwargs)
    unknown = sorted(
        set(kwargs) - {"max_new_tokens", "prompts", "ignore_eos", "temperature", "chat"}
    )
    if unknown:
        raise MarkerError(
            f"{test}: marker generation got unknown keyword(s) {', '.join(unknown)}; "
            f"expected max_new_tokens=, prompts=, ignore_eos=, temperature=, chat="
        )
    for key in ("max_new_tokens", "prompts"):
        value = kwargs.get(key)
        if value is not None and (not _integer(value) or value < 1):
            raise MarkerError(
                f"{test}: marker generation({key}={value!r}): expected a positive integer"
            )
    prompts = kwargs.get("prompts")
    if prompts is not None and prompts > MAX_POOL:
        # Bounded as --specenergy-pool is: a pool holds its prompts' requests in memory.
        shown = repr(prompts) if len(repr(prompts)) <= 24 else f"{repr(prompts)[:20]}..."
        raise MarkerError(
            f"{test}: marker generation(prompts={shown}): expected a prompt count from 1 to "
            f"{MAX_POOL} (as --specenergy-pool); a larger pool repeats a corpus no better"
        )
    for key in ("ignore_eos", "chat"):
        if not isinstance(kwargs.get(key, False), bool):
            raise MarkerError(
                f"{test}: marker generation({key}={kwargs[key]!r}): expected True or False"
            )
    temperature = kwargs.get("temperature", 0)
    if temperature != 0:
        raise MarkerError(
            f"{test}: marker generation(temperature={temperature!r}): only greedy decoding "
            "(temperature=0) is measured, because equivalence with the baseline is checked token "
            "for token"
        )
    return Generation(
        max_new_tokens=kwargs.get("max_new_tokens", 64),
        prompts=kwargs.get("prompts", pool),
        ignore_eos=kwargs.get("ignore_eos", False),
        temperature=0.0,
        chat=kwargs.get("chat", False),
    )
