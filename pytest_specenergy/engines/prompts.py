"""A request's prompt as the engines take it: text (the engine tokenises it) or token ids (sent as
they are, e.g. a chat-templated prompt)."""

from __future__ import annotations

from typing import Sequence
from typing import Union

#: Text, or the token ids of an already tokenised prompt.
Prompt = Union[str, tuple[int, ...]]


def generate_input(prompts: Sequence[Prompt]) -> dict[str, list]:
    """``/generate``'s prompt field for a batch: ``{"text": [...]}`` or ``{"input_ids": [...]}``
    (SGLang takes one kind per call); a batch mixing both is a bug in the caller."""
    texts = [p for p in prompts if isinstance(p, str)]
    if len(texts) == len(prompts):
        return {"text": list(texts)}
    if texts:
        raise ValueError("a /generate batch mixes text prompts and token-id prompts")
    return {"input_ids": [list(p) for p in prompts]}
