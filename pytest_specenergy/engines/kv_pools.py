"""Equal KV pools for the arms of a case: the token capacity every arm's engine is pinned to
(``max_total_tokens``), the ``mem_fraction_static`` that lets each reach it on one GPU, and the
check of the arms' live capacities before the first window.

SGLang 0.5.23 sizes an engine's pool from the memory free when *that* engine starts
(``distributed/bootstrap.py:193-223`` measures it; ``mem_cache/kv_cache_configurator.py:2990-3060``
``_profile_available_bytes``): budget = free after its weights - free at its start x (1 -
``mem_fraction_static``), tokens = budget // bytes per token (``pool_configurator.py``
``DefaultPoolConfigurator``, whose per-token bytes for EAGLE/EAGLE3/NEXTN/STANDALONE add the draft's
layers), and ``max_total_tokens`` only caps (``_apply_token_constraints``). So two engines started
one after the other at one fraction get unequal pools. The plan here pins one capacity C in every
arm and picks the one fraction with which the engine that starts with the least memory free still
reaches C: every arm then holds exactly C. ``tests/sglang/test_sglang_pools.py`` checks the plan's
figures with SGLang's own sizing functions; :func:`capacity_problems` checks the live engines."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import Sequence

GIB = 1024**3
MIB = 1024**2
#: Taken by an engine process before SGLang measures its free memory (CUDA context, NCCL and
#: cuBLAS workspaces): about 0.5 GiB on Hopper; planned at 1 GiB.
CONTEXT_BYTES = 1 * GIB
#: Taken between that measurement and the pool's sizing besides the weights (sampler, buffers);
#: planned at 0.5 GiB.
EXTRA_BYTES = GIB // 2
#: Capacities are pinned in whole multiples of this (a readable pin, any page size divides it).
TOKEN_STEP = 1024
#: A request's tokens in the pool when the case says nothing finer: prompt and output of the
#: suites' corpora (prompts under 1,500 tokens, 512 new tokens).
REQUEST_TOKENS = 2048
#: SGLang's own decode CUDA-graph cap when the config names none (``engines/sglang.py``).
DEFAULT_RUNNING = 48


class PoolPlanError(ValueError):
    """The arms cannot hold equal KV pools on this GPU; the message says why and what to change."""


@dataclass(frozen=True)
class EngineMemory:
    """What one engine takes of the GPU: its ``label``, weights, KV bytes per token (draft layers
    included) and runtime reserve after its pool (activations, CUDA graphs: SGLang's own estimate,
    :func:`runtime_reserve_bytes`)."""

    label: str
    weights_bytes: int
    cell_bytes: int
    reserve_bytes: int

    def footprint(self, tokens: int) -> int:
        """Bytes the engine holds once started with a pool of ``tokens``."""
        return (
            CONTEXT_BYTES
            + self.weights_bytes
            + EXTRA_BYTES
            + tokens * self.cell_bytes
            + (self.reserve_bytes)
        )


@dataclass(frozen=True)
class EngineSizing:
    """SGLang's sizing of one engine as the plan predicts it: free memory at its start (after its
    own context) and after its weights, in bytes, and the pool it gets."""

    label: str
    free_at_start: int
    free_after_weights: int
    tokens: int


@dataclass(frozen=True)
class PoolPlan:
    """One capacity for every arm: ``tokens`` (pinned as ``max_total_tokens``), the
    ``mem_fraction`` that lets each engine reach it, and each engine's predicted sizing in the
    worst start order."""

    tokens: int
    mem_fraction: float
    resident: bool
    engines: tuple[EngineSizing, ...]
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the run document's ``order.residency.pools``)."""
        return {
            "max_total_tokens": self.tokens,
            "mem_fraction_static": self.mem_fraction,
            "resident": self.resident,
            "reason": self.reason,
            "engines": [
                {
                    "label": e.label,
                    "free_at_start_gib": round(e.free_at_start / GIB, 2),
                    "free_after_weights_gib": round(e.free_after_weights / GIB, 2),
                    "tokens": e.tokens,
                }
                for e in self.engines
            ],
        }


def kv_cell_bytes(
    target: Mapping[str, Any] | None, draft: Mapping[str, Any] | None = None, dtype_bytes: int = 2
) -> int | None:
    """KV bytes per token of an engine, from its checkpoints' ``config.json``: key and value heads
    x head size x layers x ``dtype_bytes``, plus, for a draft-model engine (``draft``), the
    target's per-layer bytes x the draft's layers, as ``DefaultPoolConfigurator`` counts them
    (``pool_configurator.py:258-314``); None when a config lacks the sizes."""
    shape = _attention_shape(target)
    if shape is None:
        return None
    layers, heads, head_dim = shape
    per_layer = heads * 2 * head_dim * dtype_bytes
    cell = per_layer * layers
    if draft is not None:
        extra = _draft_layers(draft)
        if extra is None:
            return None
        cell += per_layer * extra
    return cell


def _attention_shape(config: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    if not isinstance(config, Mapping):
        return None
    text = config.get("text_config")
    config = text if isinstance(text, Mapping) and "num_hidden_layers" in text else config
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(
            config.get("head_dim")
            or int(config["hidden_size"]) // int(config["num_attention_heads"])
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return (layers, heads, head_dim) if min(layers, heads, head_dim) > 0 else None


def _draft_layers(config: Mapping[str, Any]) -> int | None:
    """The draft's KV layers as SGLang counts them: ``num_nextn_predict_layers``, else its
    ``num_hidden_layers`` (``spec_aux_hidden_state.py`` ``_resolve_eagle_aux_hidden_state``)."""
    for key in ("num_nextn_predict_layers", "num_hidden_layers"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def runtime_reserve_bytes(
    gpu_bytes: int, chunked_prefill: int | None = None, running: int = DEFAULT_RUNNING, tp: int = 1
) -> int:
    """SGLang 0.5.23's estimate of an engine's activations and CUDA graphs, which its default
    ``mem_fraction_static`` leaves free (``arg_groups/memory_hook.py`` ``handle_gpu_memory_settings``
    and ``reserve_for_graph_mb``): 512 MiB + 1.5 MiB per chunked-prefill token + 2 MiB per decode
    graph batch + 128 MiB per TP rank, at least 10 GiB on a GPU over 60 GiB; plus 1 GiB for the
    prefill graphs it also counts. ``chunked_prefill``: SGLang's per-GPU default when None."""
    gpu_mib = gpu_bytes / MIB
    if chunked_prefill is None:
        chunked_prefill = 2048 if gpu_mib < 20480 else 4096 if gpu_mib < 61440 else 8192
        chunked_prefill = 16384 if gpu_mib >= 163840 else chunked_prefill
    mib = 512 + 1.5 * max(chunked_prefill, 2048) + tp * 128 + 2 * running
    if gpu_mib > 61440:
        mib = max(mib, 10240)
    return int((mib + 1024) * MIB)


def plan_pools(
    gpu_bytes: int,
    engines: Sequence[EngineMemory],
    *,
    live: int,
    tokens: int | None = None,
    need_tokens: int = 0,
    fraction: float | None = None,
) -> PoolPlan:
    """The capacity every engine of ``engines`` is pinned to when ``live`` of them share the GPU (2
    or 3 resident; 1 blocked), and the ``mem_fraction_static`` that lets each reach it; raises
    :class:`PoolPlanError` naming the largest capacity that fits, or the engine that cannot reach
    it. ``tokens``: the user's pin (checked, never raised); ``need_tokens``: the least the cases'
    requests need (a smaller pool retracts them); ``fraction``: the fraction to keep (blocked
    order keeps the backend's), else the one chosen here. The plan assumes the worst start order:
    each engine starting while the ``live - 1`` largest others hold their memory."""
    if not engines:
        raise ValueError("no engines to plan")
    live = max(1, min(live, len(engines)))
    fit = _largest_fit(gpu_bytes, engines, live)
    cap = fit if tokens is None else min(tokens, fit)
    if fraction is None:
        cap, fraction = _with_fraction(gpu_bytes, engines, live, cap)
    else:
        cap = min(cap, _reachable(gpu_bytes, engines, live, cap, fraction))
    cap = cap // TOKEN_STEP * TOKEN_STEP if tokens is None else cap
    where = f"{live} engines resident" if live > 1 else "one engine at a time"
    if cap <= 0 or (tokens is not None and cap < tokens):
        raise PoolPlanError(
            f"with {where} on a {gpu_bytes / GIB:.0f} GiB GPU, the arms' KV pools cannot be "
            + (f"pinned to max_total_tokens={tokens}: " if tokens is not None else "equal: ")
            + f"at most {max(cap, 0)} tokens fit every engine ({_describe(engines)}); "
            + (
                f"pin max_total_tokens={cap // TOKEN_STEP * TOKEN_STEP} or less"
                if cap > 0
                else "the weights leave no room for a pool"
            )
            + (", or run blocked (resident=False)" if live > 1 else ", or use a larger GPU")
        )
    if cap < need_tokens:
        raise PoolPlanError(
            f"with {where} on a {gpu_bytes / GIB:.0f} GiB GPU, {cap} tokens fit every engine's KV "
            f"pool, fewer than the {need_tokens} the cases' requests need (SGLang would retract "
            f"them inside the windows); "
            + ("run blocked (resident=False)" if live > 1 else "lower the batch or max_new_tokens")
        )
    sizing = tuple(_sizing(gpu_bytes, engines, live, cap, fraction, e) for e in engines)
    return PoolPlan(
        cap,
        fraction,
        live > 1,
        sizing,
        f"every arm pinned to {cap} tokens at mem_fraction_static={fraction:.2f} ({where})",
    )


def _others(engines: Sequence[EngineMemory], engine: EngineMemory, live: int, tokens: int) -> int:
    """Bytes the ``live - 1`` largest other engines hold: the worst start order for ``engine``."""
    rest = sorted((e.footprint(tokens) for e in engines if e is not engine), reverse=True)
    return sum(rest[: live - 1])


def _largest_fit(gpu_bytes: int, engines: Sequence[EngineMemory], live: int) -> int:
    """The largest capacity with which every group of ``live`` engines fits the GPU together."""
    best = None
    for group in itertools.combinations(engines, live):
        fixed = sum(e.footprint(0) for e in group)
        cells = sum(e.cell_bytes for e in group)
        room = (gpu_bytes - fixed) // cells
        best = room if best is None else min(best, room)
    return int(best or 0)


def _free_at_start(
    gpu_bytes: int, engines: Sequence[EngineMemory], live: int, tokens: int, engine: EngineMemory
) -> int:
    return gpu_bytes - _others(engines, engine, live, tokens) - CONTEXT_BYTES


def _reachable(
    gpu_bytes: int, engines: Sequence[EngineMemory], live: int, tokens: int, fraction: float
) -> int:
    """The largest capacity SGLang's formula gives every engine at ``fraction`` (each starting with
    the least memory free it can find)."""
    reach = tokens
    for engine in engines:
        free = _free_at_start(gpu_bytes, engines, live, tokens, engine)
        budget = fraction * free - engine.weights_bytes - EXTRA_BYTES
        reach = min(reach, int(budget // engine.cell_bytes))
    return reach


def _with_fraction(
    gpu_bytes: int, engines: Sequence[EngineMemory], live: int, tokens: int
) -> tuple[int, float]:
    """The fraction (in hundredths) that leaves the tightest engine its runtime reserve, and the
    capacity SGLang's formula then gives every engine: iterated, since a smaller pool leaves the
    other engines more memory."""
    fraction = 0.0
    for _ in range(8):
        tightest = min(
            1.0 - e.reserve_bytes / _free_at_start(gpu_bytes, engines, live, tokens, e)
            for e in engines
        )
        fraction = math.floor(tightest * 100 + 1e-9) / 100
        reach = _reachable(gpu_bytes, engines, live, tokens, fraction)
        if reach >= tokens:
            break
        tokens = max(reach, 0)
    return tokens, fraction


def _sizing(
    gpu_bytes: int,
    engines: Sequence[EngineMemory],
    live: int,
    tokens: int,
    fraction: float,
    engine: EngineMemory,
) -> EngineSizing:
    free = _free_at_start(gpu_bytes, engines, live, tokens, engine)
    after = free - engine.weights_bytes - EXTRA_BYTES
    budget = after - free * (1 - fraction)
    return EngineSizing(engine.label, free, after, min(tokens, int(budget // engine.cell_bytes)))


def _describe(engines: Iterable[EngineMemory]) -> str:
    return "; ".join(
        f"{e.label}: {e.weights_bytes / GIB:.1f} GiB weights, {e.cell_bytes // 1024} KiB per token"
        for e in engines
    )


def capacity_problems(
    infos: Mapping[str, Mapping[str, Any]], planned: int | None = None
) -> list[str]:
    """Before the first window: one line per problem with the arms' KV pools, from each live
    engine's ``/server_info`` (arm name -> info), empty when every arm holds the same capacity (and
    the planned one, when given). The case is refused with these lines: a window measured on
    unequal pools is thrown away by the twin check after the fact."""
    capacities: dict[str, Any] = {
        arm: info.get("max_total_num_tokens") for arm, info in infos.items()
    }
    unknown = sorted(arm for arm, value in capacities.items() if not isinstance(value, int))
    if unknown:
        return [
            f"/server_info of the {', '.join(unknown)} engine reports no max_total_num_tokens: the "
            "arms' KV pools cannot be compared before measuring"
        ]
    shown = ", ".join(f"{arm} {value}" for arm, value in capacities.items())
    problems = []
    if len(set(capacities.values())) > 1:
        smallest = min(capacities.values())
        problems.append(
            f"the arms' KV pools differ before the first window ({shown} tokens): SGLang sized "
            "each engine from the memory free at its own start, and max_total_tokens only caps; "
            f"pin max_total_tokens={smallest // TOKEN_STEP * TOKEN_STEP or smallest} on "
            "pytest.mark.model(...), or run blocked (resident=False)"
        )
    if planned is not None and any(v != planned for v in capacities.values()):
        problems.append(
            f"the plan pinned every arm to {planned} tokens and the engines hold {shown}: an "
            "engine found less memory free at its start than planned (another process on the "
            "GPU, or larger activations); free the GPU or pin a smaller max_total_tokens"
        )
    return problems
