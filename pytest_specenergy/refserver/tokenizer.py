"""Tokenizers: the built-in byte-level one with fixed merges (padded for ``random:*`` models), or a
checkpoint's own.

Design: its section of ``docs/reference-server.md#tokenizers``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
BYTE_OFFSET = 3  # byte b has id BYTE_OFFSET + b
SPECIAL_TOKENS: dict[int, str] = {PAD_ID: "<pad>", BOS_ID: "<bos>", EOS_ID: "<eos>"}

# A fixed, hand-written list: the ids of the tokenizer must never depend on a training run, a file
# or the machine, because the tiny models' embedding rows are tied to these ids by seed. Appending
# is safe (new pieces get new ids at the end); reordering or removing would change every model.
_MERGE_LINES = (
    " the| of| and| to| in| a| is| that| for| it| as| with| was| on| be| by| this| are| at| from",
    " or| an| not| which| have| has| but| were| can| def| return| if| else| self| import| class",
    " None| True| False| print| for i| in range| value| data| test| assert| int| str| list| dict",
    " code| energy| token| model| batch| draft| GPU| per| time| from the| of the| in the| to the",
    "th|he|in|er|an|re|on|at|en|nd|ti|es|or|te|of|ed|is|it|al|ar|st|to|nt|ng|se|ha|as|ou|io|le|ve",
    "co|me|de|hi|ri|ro|ic|ne|ea|ra|ce|li|ch|ll|be|ma|si|om|ur|ing|ion|tion|ent|and|the|ter|for",
    "ate|her|his|ere|ers|con|res|ver|all|ons|nce|men|ith|ted|ess|ect|pro|ati|est|ive|int|per",
    "ould|ment|ther|with|ight|ally|ation|  |    |        |()|):|(self|, |. |: | = | == | + | - "
    "|->|'s",
    " ch| tsch| da| la| il| en| ei| dal| cun| per| ina| in| ils| las| sco| ha| èn| è| ü| ö| "
    "ä|ün|ai|au|ia|ie|ua",
    '\n\n|\n    |\n        |"""',
)
DEFAULT_MERGES: tuple[str, ...] = tuple(piece for line in _MERGE_LINES for piece in line.split("|"))


class TokenizerLike(Protocol):
    """What the engine and the server need from any tokenizer."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int

    def encode(self, text: str) -> list[int]:
        """Turn text into token ids (no special tokens added)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn token ids back into text."""


class ByteTokenizer:
    """Byte-level tokenizer: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, byte ``b`` = ``3 + b``,
    then one id per merge.

    Greedy longest match over the merge pieces (as UTF-8 bytes), else single bytes:
    ``decode(encode(s)) == s``."""

    def __init__(self, merges: Sequence[str] = DEFAULT_MERGES) -> None:
        # Single bytes already have ids; duplicates would make encode() ambiguous (the first one
        # counts).
        pieces = list(
            dict.fromkeys(
                raw for raw in (piece.encode("utf-8") for piece in merges) if len(raw) >= 2
            )
        )
        self._piece_to_id: dict[bytes, int] = {
            p: BYTE_OFFSET + 256 + i for i, p in enumerate(pieces)
        }
        self._id_to_bytes: list[bytes] = (
            [b""] * BYTE_OFFSET + [bytes([b]) for b in range(256)] + pieces
        )
        self._max_piece = max((len(p) for p in pieces), default=1)
        self.vocab_size: int = len(self._id_to_bytes)
        self.eos_token_ids: tuple[int, ...] = (EOS_ID,)
        self.pad_token_id: int = PAD_ID

    def encode(self, text: str) -> list[int]:
        """Encode ``text`` (greedy longest match; never adds special tokens)."""
        data = text.encode("utf-8")
        ids: list[int] = []
        i, n = 0, len(data)
        lookup = self._piece_to_id
        while i < n:
            for length in range(min(self._max_piece, n - i), 1, -1):
                tid = lookup.get(data[i : i + length])
                if tid is not None:
                    ids.append(tid)
                    i += length
                    break
            else:
                ids.append(BYTE_OFFSET + data[i])
                i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decode ids to text; invalid UTF-8 (a model may emit half a character) becomes U+FFFD."""
        out = bytearray()
        for tid in ids:
            tid = int(tid)
            if not 0 <= tid < self.vocab_size:
                raise ValueError(f"token id {tid} is outside the vocabulary [0, {self.vocab_size})")
            if tid in SPECIAL_TOKENS:
                if not skip_special_tokens:
                    out += SPECIAL_TOKENS[tid].encode("ascii")
                continue
            out += self._id_to_bytes[tid]
        return out.decode("utf-8", errors="replace")


UNUSED_TOKEN_TEXT = (
    "<|unused_{}|>"  # decoded text of a model id the byte tokenizer has no bytes for
)


class PaddedByteTokenizer(ByteTokenizer):
    """The byte tokenizer over a model with a larger vocabulary (a ``random:*`` model): encoding is
    unchanged, and model ids past the byte tokenizer's decode to ``<|unused_ID|>`` (never skipped:
    the model did generate a token)."""

    def __init__(self, vocab_size: int, merges: Sequence[str] = DEFAULT_MERGES) -> None:
        super().__init__(merges)
        self.byte_vocab_size: int = self.vocab_size
        if vocab_size < self.byte_vocab_size:
            raise ValueError(
                f"vocab_size {vocab_size} is smaller than the byte tokenizer's "
                f"{self.byte_vocab_size}"
            )
        self.vocab_size = vocab_size

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decode like :class:`ByteTokenizer`; ids past its vocabulary become placeholders."""
        parts: list[str] = []
        run: list[int] = []  # byte-tokenizer ids decoded together, so multi-byte characters join
        for tid in ids:
            tid = int(tid)
            if self.byte_vocab_size <= tid < self.vocab_size:
                parts += [super().decode(run, skip_special_tokens), UNUSED_TOKEN_TEXT.format(tid)]
                run = []
            else:
                run.append(tid)  # out-of-vocabulary ids fail in ByteTokenizer.decode, as there
        parts.append(super().decode(run, skip_special_tokens))
        return "".join(parts)


class HFTokenizer:
    """Adapter around ``transformers.AutoTokenizer`` for a local checkpoint directory."""

    def __init__(self, path: str | Path, extra_eos_ids: Sequence[int] = ()) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path))
        own = [] if self._tok.eos_token_id is None else [self._tok.eos_token_id]
        eos = list(dict.fromkeys(int(tid) for tid in [*own, *extra_eos_ids]))
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        pad = self._tok.pad_token_id
        self.pad_token_id: int = int(pad) if pad is not None else (eos[0] if eos else 0)
        self.vocab_size: int = len(self._tok)

    def encode(self, text: str) -> list[int]:
        """Encode like SGLang's tokenizer manager does (the tokenizer's default special tokens)."""
        return list(self._tok.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decode with the checkpoint's own tokenizer."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))


def load_tokenizer(
    model: str, extra_eos_ids: Sequence[int] = (), vocab_size: int | None = None
) -> TokenizerLike:
    """The tokenizer for a model: built-in for ``tiny:*`` and ``random:*`` (padded to
    ``vocab_size``), else its own."""
    if model.startswith("tiny:"):
        return ByteTokenizer()
    if model.startswith("random:"):
        return PaddedByteTokenizer(
            vocab_size if vocab_size is not None else ByteTokenizer().vocab_size
        )
    return HFTokenizer(model, extra_eos_ids)
