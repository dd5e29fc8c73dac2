"""``generation(chat=True)``: each corpus prompt as one user message through the model's chat
template, rendered to token ids here, in the plugin.

Why here and as ids: SGLang's chat endpoint renders ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)`` with the checkpoint's own tokenizer, but only behind
the OpenAI API, whose answers lack the ``meta_info`` counters the measurement reads, and
``/generate`` has no chat mode. So the plugin makes that same call once per prompt and sends the
ids to ``/generate`` (``input_ids``): both engines, both arms, get identical ids. Sending the
rendered *text* instead would let each engine tokenise it again, adding a second BOS wherever the
tokenizer adds one and the template already has one. The tokenizer (transformers) loads once per
process and model, only for chat cases; the reference server is never imported."""

from __future__ import annotations

import functools
from typing import Any

from pytest_specenergy.engines.checkpoints import ensure_fetched


class ChatTemplateError(ValueError):
    """The model's chat template cannot be applied (no tokenizer, no template)."""


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ChatTemplateError(
            "generation(chat=True) renders the model's chat template with its tokenizer, which "
            "needs transformers: pip install 'pytest-specenergy[reference]'"
        ) from None
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(
            f"generation(chat=True): cannot load the tokenizer of {path} ({exc})"
        ) from None


def chat_template_ids(tokenizer: Any, prompt: str) -> tuple[int, ...]:
    """``prompt`` as one user message, rendered with the assistant's turn opened: what SGLang's
    ``/v1/chat/completions`` sends its scheduler for that message."""
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return tuple(int(t) for t in ids)


@functools.lru_cache(maxsize=64)
def chat_prompts(model: str, prompts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """Every prompt of a pool rendered by ``model``'s chat template (memoised: both arms and every
    repeat share one rendering)."""
    tokenizer = _tokenizer(ensure_fetched(model))
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"generation(chat=True): model {model} has no chat template in its tokenizer "
            "configuration; use chat=False (prompts sent as raw text) or a chat model"
        )
    return tuple(chat_template_ids(tokenizer, prompt) for prompt in prompts)
