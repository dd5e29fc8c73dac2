"""Convert a LLaMA-architecture GGUF into a plain float32 transformers checkpoint, and verify it.

transformers 5.x reads a GGUF (with the ``gguf`` package; ``accelerate`` for its loader) and
dequantizes it, but refuses to ``save_pretrained`` a model it loaded that way (the quantization
config stays attached). So the conversion builds a fresh ``LlamaForCausalLM`` from the GGUF's
config without that entry, loads the dequantized state dict into it, and saves that: the float32
weights are exactly the dequantized ones, so the saved model computes what the GGUF-loaded one
does. :func:`verify_checkpoint` proves it on every conversion: the saved checkpoint, loaded back
the way the engine loads it, must give the GGUF model's logits and greedy tokens on a chat prompt.

Needs torch, transformers, gguf and accelerate (the ``reference`` extra)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: The prompt the verification runs: a chat-templated request (what the model is used for).
VERIFY_MESSAGES = ({"role": "user", "content": "Write a Python function that adds two numbers."},)
#: Greedy tokens compared between the GGUF model and the saved checkpoint.
VERIFY_TOKENS = 8


class ConversionError(RuntimeError):
    """The GGUF could not be converted, or the converted checkpoint does not match it."""


@dataclass(frozen=True)
class Verification:
    """What :func:`verify_checkpoint` compared and found (recorded in the manifest)."""

    prompt_tokens: int
    greedy_tokens: tuple[int, ...]
    max_logit_diff: float

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "greedy_tokens": list(self.greedy_tokens),
            "max_logit_diff": self.max_logit_diff,
        }


def _missing_packages() -> list[str]:
    import importlib.util

    return [
        m for m in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None
    ]


def load_gguf(gguf: Path) -> tuple[Any, Any]:
    """The GGUF's tokenizer and its dequantized float32 model (eval mode)."""
    missing = _missing_packages()
    if missing:
        raise ConversionError(
            f"converting the GGUF needs {', '.join(missing)}: pip install "
            "'pytest-specenergy[reference]' (it has transformers, gguf and accelerate)"
        )
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    return tokenizer, model


def rebuild(gguf_model: Any) -> Any:
    """A plain model of the GGUF model's class and config (the quantization entry removed) holding
    its dequantized weights."""
    config = gguf_model.config.__class__.from_dict(
        {k: v for k, v in gguf_model.config.to_dict().items() if k != "quantization_config"}
    )
    config.dtype = torch.float32
    model = gguf_model.__class__(config)
    state = gguf_model.state_dict()
    result = model.load_state_dict(state, strict=False)
    # A tied head is not a key of its own in a saved state dict: only real gaps are errors.
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in result.missing_keys if k not in tied and k != "lm_head.weight"]
    if missing or result.unexpected_keys:
        raise ConversionError(
            f"the GGUF's dequantized weights do not fit {type(model).__name__}: missing "
            f"{missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    model.tie_weights()
    model.generation_config = gguf_model.generation_config
    model.eval()
    return model


def write_checkpoint(gguf: Path, out: Path) -> tuple[Any, Any]:
    """Convert ``gguf`` into the (empty or new) directory ``out``; returns the GGUF's tokenizer and
    model for :func:`verify_checkpoint`."""
    tokenizer, gguf_model = load_gguf(gguf)
    model = rebuild(gguf_model)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    del model
    _compatible_configs(out)
    return tokenizer, gguf_model


def _compatible_configs(out: Path) -> None:
    """Make the saved configs readable by transformers 4.x too (SGLang's): 5.x writes the RoPE base
    only inside ``rope_parameters`` (4.x would silently take its default 10000) and names the
    tokenizer class ``TokenizersBackend`` (4.x has no such class)."""
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    tok_path = out / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    for key in ("is_local", "local_files_only"):  # where this machine loaded it from, not a setting
        tok.pop(key, None)
    tok["tokenizer_class"] = "PreTrainedTokenizerFast"  # tokenizer.json, in every version
    tok_path.write_text(json.dumps(tok, indent=2) + "\n")


@torch.inference_mode()
def verify_checkpoint(out: Path, tokenizer: Any, gguf_model: Any) -> Verification:
    """Load ``out`` as the engine does and compare it with the GGUF model on a chat prompt: the
    same prompt token ids from both tokenizers, logits within float rounding, and the same
    :data:`VERIFY_TOKENS` greedy tokens. Raises :class:`ConversionError` naming the difference."""
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    saved_tok = AutoTokenizer.from_pretrained(str(out))
    messages = [dict(m) for m in VERIFY_MESSAGES]
    ids = _chat_ids(tokenizer, messages)
    saved_ids = _chat_ids(saved_tok, messages)
    if ids != saved_ids:
        raise ConversionError(
            f"the saved tokenizer renders the chat prompt as {saved_ids[:12]}..., the GGUF's as "
            f"{ids[:12]}...: the chat template or vocabulary did not survive the conversion"
        )
    saved = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="sdpa"
    )
    saved.eval()
    prompt = torch.tensor([ids])
    diff = float((gguf_model(prompt).logits - saved(prompt).logits).abs().max())
    if not diff <= 1e-4:
        raise ConversionError(
            f"the saved checkpoint's logits differ from the GGUF model's by up to {diff:.3g} "
            "(expected float rounding only, <= 1e-4): the weights were not converted faithfully"
        )
    greedy = _greedy(gguf_model, ids)
    if _greedy(saved, ids) != greedy:
        raise ConversionError(
            "the saved checkpoint's greedy continuation differs from the GGUF model's: the "
            "weights were not converted faithfully"
        )
    return Verification(len(ids), tuple(greedy), diff)


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return [int(t) for t in ids]


def _greedy(model: Any, ids: list[int]) -> list[int]:
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=VERIFY_TOKENS, do_sample=False, min_new_tokens=1
    )
    return [int(t) for t in out[0, len(ids) :]]


def file_digests(out: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file in ``out`` (the manifest records them)."""
    digests = {}
    for path in sorted(p for p in out.iterdir() if p.is_file()):
        h = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda handle=handle: handle.read(1 << 20), b""):
                h.update(chunk)
        digests[path.name] = {"sha256": h.hexdigest(), "bytes": path.stat().st_size}
    return digests


def convert(gguf: Path, out: Path) -> dict[str, Any]:
    """Convert and verify; returns the manifest's conversion record (not written here)."""
    tokenizer, gguf_model = write_checkpoint(gguf, out)
    verification = verify_checkpoint(out, tokenizer, gguf_model)
    config = json.loads((out / "config.json").read_text())
    return {
        "architecture": (config.get("architectures") or ["?"])[0],
        "dtype": "float32",
        "verification": verification.as_dict(),
        "files": file_digests(out),
    }
