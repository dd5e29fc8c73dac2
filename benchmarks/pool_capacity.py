"""The arms' KV-pool capacities on one H100 and one H200, from SGLang 0.5.23's own sizing code, before
and after the pool plan (``engines/kv_pools.py``).

An 8B target (Qwen3-8B's config.json, 16.4 GB of weights) against its twin, with NGRAM (no draft),
a Qwen3-0.6B draft model (STANDALONE, 28 draft layers) and a one-layer EAGLE3 head; each engine's
command line is the plugin's own (``SGLangBackend.command`` of the configs the residency decision
gives), and each engine's pool is what SGLang's ``KVCacheConfigurator`` computes from the two
free-memory readings it takes (``tests/sglang/sglang_worker.py``, mode ``pool-<gpu>``).

- **before**: what main at ea1ff1d did: resident when the weights fit 60% of a 0.40 share, each
  engine at ``mem_fraction_static=0.40``, the baseline started first; the pin the suite declares
  (131072 in example_suites/gpu; none in ci_gate), else SGLang's own pool.
- **after**: the plan: one capacity pinned in every arm, one fraction with which the engine that
  starts with the least memory free reaches it; blocked order (each engine alone at 0.80) where
  resident pools cannot hold the cases' 64 requests; refused with the reason where neither can.

The free-memory readings come from one memory model (``kv_pools``: per engine a CUDA context,
its weights, 0.5 GiB of buffers, its pool and SGLang's runtime reserve); SGLang's formula turns them
into tokens. Needs the 0.5.23 environment of ``dev/sglang_env.sh`` (``.sglang-envs/0.5.23``)::

    PYTHONPATH=. .venv/bin/python benchmarks/pool_capacity.py

Last output: ``benchmarks/results/pool_capacity.txt``; ``tests/sglang/test_sglang_pools.py`` asserts
the after rows equal (or refused) and the before rows as they were.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.kv_pools import CONTEXT_BYTES
from pytest_specenergy.engines.kv_pools import EXTRA_BYTES
from pytest_specenergy.engines.kv_pools import GIB
from pytest_specenergy.engines.kv_pools import MIB
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.engines.sglang_residency import decide
from pytest_specenergy.engines.sglang_residency import engine_memory
from pytest_specenergy.engines.sglang_residency import resident_config

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "sglang" / "sglang_worker.py"
PYTHON = ROOT / ".sglang-envs" / "0.5.23" / "bin" / "python"
GPUS = {"h100": 81559 * MIB, "h200": 143771 * MIB}  # nvidia-smi memory.total
RUNNING = 64  # the GPU suites' max_running_requests and largest batch
FIELDS = frozenset({"sleep_on_idle", "mem_fraction_static"})
_ATTENTION = {"head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-06, "vocab_size": 151936}
#: config.json of each checkpoint (the published ones' sizes) and its weight bytes.
CHECKPOINTS: dict[str, tuple[dict[str, Any], int]] = {
    "qwen3-8b": (
        {
            **_ATTENTION,
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_attention_heads": 32,
            "num_hidden_layers": 36,
            "num_key_value_heads": 8,
            "max_position_embeddings": 40960,
            "torch_dtype": "bfloat16",
        },
        16_380_000_000,
    ),
    "qwen3-0.6b": (
        {
            **_ATTENTION,
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_attention_heads": 16,
            "num_hidden_layers": 28,
            "num_key_value_heads": 8,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        1_500_000_000,
    ),
    "qwen3-8b-eagle3": (
        {
            **_ATTENTION,
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_attention_heads": 32,
            "num_hidden_layers": 1,
            "num_key_value_heads": 8,
            "max_position_embeddings": 40960,
            "draft_vocab_size": 32000,
            "torch_dtype": "bfloat16",
        },
        800_000_000,
    ),
}


def make_checkpoints(root: Path) -> dict[str, str]:
    """Folders holding each checkpoint's config.json and a sparse weight file of its size."""
    paths = {}
    for name, (config, size) in CHECKPOINTS.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        with open(folder / "model.safetensors", "wb") as handle:
            handle.truncate(size)  # sparse: only the size is read
        paths[name] = str(folder)
    return paths


def drafters(paths: dict[str, str]) -> dict[str, Drafter]:
    """The three drafters of the rows."""
    return {
        "ngram": Drafter("ngram", num_draft_tokens=8),
        "draft_model": Drafter("draft_model", draft_model=paths["qwen3-0.6b"], num_draft_tokens=4),
        "eagle3": Drafter(
            "eagle3", draft_model=paths["qwen3-8b-eagle3"], num_steps=3, num_draft_tokens=3
        ),
    }


def _config(target: str, drafter: Drafter | None, pin: int | None) -> EngineConfig:
    options: dict[str, Any] = {"sglang_version": "0.5.23", "attention_backend": "flashinfer"}
    if pin:
        options["max_total_tokens"] = pin
    return EngineConfig(
        engine="sglang",
        model=target,
        drafter=drafter,
        dtype="bfloat16",
        max_running_requests=RUNNING,
        options=EngineConfig.freeze_options(options),
    )


def _flags(config: EngineConfig) -> list[str]:
    return SGLangBackend().command(config, "127.0.0.1", 30000)[3:]


@dataclass(frozen=True)
class Row:
    """One GPU x drafter x pin x before/after: the engines' argv and free-memory readings (or why
    the case is refused), to be sized by SGLang."""

    when: str
    gpu: str
    drafter: str
    pin: int | None
    order: str
    engines: tuple[dict[str, Any], ...]
    refused: str | None = None
    planned: int | None = None


def after_row(paths: dict[str, str], gpu: str, name: str, pin: int | None) -> Row:
    """The plan's decision and each engine's readings in the worst start order."""
    spec = _config(paths["qwen3-8b"], drafters(paths)[name], pin)
    residency = decide([spec.twin(), spec], 2, GPUS[gpu], FIELDS)
    order = "resident" if residency.resident else "blocked"
    if residency.refused:
        return Row("after", gpu, name, pin, order, (), residency.refused)
    plan = residency.pools
    engines = []
    for arm, config in (("baseline", spec.twin()), ("speculative", spec)):
        sizing = next(e for e in plan.engines if e.label == config.label())
        engines.append(
            {
                "arm": arm,
                "argv": _flags(resident_config(config, residency)),
                "free_at_start_gib": sizing.free_at_start / GIB,
                "free_after_weights_gib": sizing.free_after_weights / GIB,
            }
        )
    return Row("after", gpu, name, pin, order, tuple(engines), planned=plan.tokens)


def before_first(paths: dict[str, str], gpu: str, name: str, pin: int | None) -> Row:
    """main at ea1ff1d: resident at 0.40 each (the 8B weights fit 60% of a 0.40 share on both
    GPUs), the baseline started first on an empty GPU; the speculative engine's readings need the
    baseline's pool, so they are filled in by :func:`before_second`."""
    spec = _config(paths["qwen3-8b"], drafters(paths)[name], pin)
    options = {"mem_fraction_static": 0.40, "sleep_on_idle": True}
    base = EngineConfig.freeze_options({**dict(spec.twin().options), **options})
    free = GPUS[gpu] - CONTEXT_BYTES
    weights = engine_memory(spec.twin(), GPUS[gpu])[0]
    engine = {
        "arm": "baseline",
        "argv": _flags(replace(spec.twin(), options=base)),
        "free_at_start_gib": free / GIB,
        "free_after_weights_gib": (free - weights.weights_bytes - EXTRA_BYTES) / GIB,
    }
    return Row("before", gpu, name, pin, "resident", (engine,))


def before_second(row: Row, paths: dict[str, str], baseline_tokens: int) -> Row:
    """The speculative engine, started while the baseline holds its context, weights, buffers,
    pool and runtime reserve."""
    spec = _config(paths["qwen3-8b"], drafters(paths)[row.drafter], row.pin)
    gpu = GPUS[row.gpu]
    base = engine_memory(spec.twin(), gpu)[0]
    memory = engine_memory(spec, gpu)[0]
    held = base.footprint(baseline_tokens)
    free = gpu - held - CONTEXT_BYTES
    options = EngineConfig.freeze_options(
        {**dict(spec.options), "mem_fraction_static": 0.40, "sleep_on_idle": True}
    )
    engine = {
        "arm": "speculative",
        "argv": _flags(replace(spec, options=options)),
        "free_at_start_gib": free / GIB,
        "free_after_weights_gib": (free - memory.weights_bytes - EXTRA_BYTES) / GIB,
    }
    return Row(row.when, row.gpu, row.drafter, row.pin, row.order, (*row.engines, engine))


def items(rows: list[Row], gpu: str, arm: str) -> list[dict[str, Any]]:
    """Worker items for the ``arm`` engine of ``gpu``'s rows."""
    return [
        {"id": f"{r.when}-{r.drafter}-{r.pin}-{arm}", **{k: v for k, v in e.items() if k != "arm"}}
        for r in rows
        if r.gpu == gpu
        for e in r.engines
        if e["arm"] == arm
    ]


def sized(python: Path, gpu: str, batch: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """SGLang's sizing of ``batch`` on ``gpu`` (a subprocess in the 0.5.23 environment)."""
    if not batch:
        return {}
    done = subprocess.run(
        [str(python), str(WORKER), "--worker", f"pool-{gpu}"],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        check=True,
    )
    return {r["id"]: r for r in json.loads(done.stdout)}


def all_rows(paths: dict[str, str], size: Any) -> list[tuple[Row, dict[str, Any]]]:
    """Every row with SGLang's answers: ``size(gpu, items)`` runs the worker (cached in tests)."""
    pins = (131072, None)  # example_suites/gpu pins 131072; ci_gate pinned none
    out = []
    for gpu in GPUS:
        after = [after_row(paths, gpu, name, pin) for name in drafters(paths) for pin in pins]
        first = [before_first(paths, gpu, name, pin) for name in drafters(paths) for pin in pins]
        answers = size(gpu, items(after, gpu, "baseline") + items(after, gpu, "speculative"))
        base = size(gpu, items(first, gpu, "baseline"))
        before = []
        for row in first:
            got = base[f"before-{row.drafter}-{row.pin}-baseline"]
            before.append(before_second(row, paths, got["resolved"]["tokens"]))
        answers.update(base)
        answers.update(size(gpu, items(before, gpu, "speculative")))
        for row in before + after:
            out.append((row, answers))
    return out


def capacities(row: Row, answers: dict[str, Any]) -> dict[str, Any]:
    """Arm -> SGLang's tokens (or its refusal)."""
    result = {}
    for engine in row.engines:
        got = answers[f"{row.when}-{row.drafter}-{row.pin}-{engine['arm']}"]
        result[engine["arm"]] = (
            got["resolved"]["tokens"] if got["ok"] else f"refused: {got['error'][:60]}"
        )
    return result


def table(rows: list[tuple[Row, dict[str, Any]]]) -> list[str]:
    """The printed table."""
    lines = [
        f"{'when':<7} {'gpu':<5} {'drafter':<12} {'pin':>7} {'order':<9} {'baseline':>9} "
        f"{'speculative':>11}  verdict"
    ]
    for row, answers in rows:
        if row.refused:
            verdict = "refused up front: " + row.refused
            base = spec = "-"
        else:
            got = capacities(row, answers)
            base, spec = got.get("baseline", "-"), got.get("speculative", "-")
            verdict = "equal" if base == spec and isinstance(base, int) else "UNEQUAL"
        lines.append(
            f"{row.when:<7} {row.gpu:<5} {row.drafter:<12} {row.pin or '-':>7} {row.order:<9} "
            f"{base!s:>9} {spec!s:>11}  {verdict}"
        )
    return lines


def main() -> int:
    if not PYTHON.exists():
        print(
            f"pool_capacity: {PYTHON} is missing; build it with dev/sglang_envs.sh", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="pool-capacity-") as tmp:
        paths = make_checkpoints(Path(tmp))
        rows = all_rows(paths, lambda gpu, batch: sized(PYTHON, gpu, batch))
        print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
