"""Prompt lookup: propose the continuation of the most recent earlier occurrence of the suffix.

Each request is looked up in its own tokens (prompt + generated so far). The index is updated
incrementally as tokens are committed, so a proposal costs O(window) dictionary lookups."""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Per-request n-gram index for n in ``[min_n, max_n]``: ``tables[n]`` maps an n-gram to the
    most recent start ``i`` whose continuation token ``tokens[i + n]`` already exists, so the
    current suffix never matches itself."""

    def __init__(self, tokens: Sequence[int], min_n: int, max_n: int) -> None:
        self.tokens: list[int] = []
        self.min_n = min_n
        self.max_n = max_n
        self.tables: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_n, max_n + 1)
        }
        self._indexed = 0  # length of self.tokens already indexed
        self.extend(tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append committed tokens and index the n-grams that now have a continuation."""
        self.tokens.extend(new_tokens)
        toks = self.tokens
        length = len(toks)
        for n, table in self.tables.items():
            # starts i whose continuation i + n appeared since the last update
            for i in range(max(0, self._indexed - n), length - n):
                table[tuple(toks[i : i + n])] = i
        self._indexed = length

    def propose(self, k: int) -> tuple[list[int], bool]:
        """``k`` draft tokens and whether a real match was found: the continuation of the longest
        matching suffix, past the end periodic as chaining the lookup on its own drafts would; else
        the last token, ``k`` times (SGLang counts ``k`` proposed drafts either way)."""
        toks = self.tokens
        length = len(toks)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            i = self.tables[n].get(tuple(toks[length - n :]))
            if i is None:
                continue
            period = (length - n) - i
            out: list[int] = []
            for j in range(k):
                idx = i + n + j
                while idx >= length:  # past the end: the sequence repeats with this period
                    idx -= period
                out.append(toks[idx])
            return out, True
        return [toks[-1]] * k, False
