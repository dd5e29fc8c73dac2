"""Load prompt corpora: five built-ins or a JSONL file; why order and digest matter:
docs/methodology.md."""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable
from typing import Iterator

#: Names of the corpora shipped inside the package, in the order the paper reports them.
BUILTIN_CORPORA: tuple[str, ...] = ("code", "conversation", "long-document", "news", "rm-news")

#: Prefix that marks a spec as a path to a user-supplied JSONL file.
JSONL_PREFIX = "jsonl:"

# Field names tried, in order, for a JSONL line's prompt (``text``: many exported prompt dumps use
# it).
_PROMPT_FIELDS: tuple[str, ...] = ("prompt", "text")


class CorpusError(ValueError):
    """A corpus spec, file or line is invalid; the message says what was wrong and what is expected."""


def _digest(prompts: Iterable[str]) -> str:
    """The sha256 hex digest of ``prompts``, in order, each length-prefixed (no separator character
    reserved)."""
    h = hashlib.sha256()
    for prompt in prompts:
        data = prompt.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class Corpus:
    """An immutable, ordered set of prompts with a content digest (empty: computed; wrong:
    rejected)."""

    name: str
    prompts: tuple[str, ...]
    source: str = "built-in"
    digest: str = ""

    def __post_init__(self) -> None:
        prompts = tuple(self.prompts)
        object.__setattr__(self, "prompts", prompts)
        if not prompts:
            raise CorpusError(
                f"corpus {self.name!r} from {self.source} is empty; a corpus needs at least one "
                "prompt"
            )
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str) or not prompt.strip():
                raise CorpusError(
                    f"corpus {self.name!r}: prompt {index} is {prompt!r}; "
                    "every prompt must be a non-empty string"
                )
        actual = _digest(prompts)
        if not self.digest:
            object.__setattr__(self, "digest", actual)
        elif self.digest != actual:
            raise CorpusError(
                f"corpus {self.name!r}: digest {self.digest!r} does not match its prompts "
                f"(expected {actual!r}); pass digest='' to have it computed"
            )

    def __len__(self) -> int:
        """Number of distinct prompt slots (not counting cycling in :meth:`take`)."""
        return len(self.prompts)

    def take(self, n: int) -> tuple[str, ...]:
        """The first ``n`` prompts, cycling if needed (repeated prompts share KV-prefix and n-gram
        history)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise CorpusError(f"take(n) needs a non-negative integer n, got {n!r}")
        return tuple(self.prompts[i % len(self.prompts)] for i in range(n))


def _iter_prompts(lines: Iterable[str], where: str) -> Iterator[str]:
    """The prompt of every non-blank JSONL line; the first bad one raises CorpusError naming
    ``where`` and the line."""
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(
                f"{where}, line {lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                'expected one object per line, e.g. {"prompt": "..."}'
            ) from None
        if not isinstance(record, dict):
            raise CorpusError(
                f"{where}, line {lineno}: expected a JSON object with a 'prompt' or 'text' "
                f"field, got a JSON {type(record).__name__}"
            )
        for field_name in _PROMPT_FIELDS:
            value = record.get(field_name)
            if isinstance(value, str) and value.strip():
                try:
                    value.encode("utf-8")
                # a lone surrogate escape (\ud800): no text at all
                except UnicodeEncodeError as exc:
                    raise CorpusError(
                        f"{where}, line {lineno}: the {field_name!r} field holds "
                        f"{value[exc.start]!r} at character {exc.start}, a lone UTF-16 surrogate "
                        "that is not text; write the character itself, or its escaped surrogate "
                        "pair"
                    ) from None
                yield value
                break
        else:
            found = ", ".join(sorted(map(str, record))) or "no fields"
            raise CorpusError(
                f"{where}, line {lineno}: no non-empty string 'prompt' or 'text' field "
                f'(found: {found}); each line needs e.g. {{"prompt": "..."}}'
            )


@functools.lru_cache(maxsize=None)
def _load_builtin(name: str) -> Corpus:
    """Load a packaged corpus once per process; packaged data cannot change while running."""
    resource = resources.files(__package__).joinpath("data", f"{name}.jsonl")
    where = f"built-in corpus {name!r} (data/{name}.jsonl)"
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        # Only reachable from a broken install, e.g. a wheel built without package data.
        raise CorpusError(
            f"{where} is missing from the installed package; reinstall pytest_specenergy "
            "with its package data (pytest_specenergy/cases/corpora/data/*.jsonl)"
        ) from None
    return Corpus(name=name, prompts=_builtin_prompts(text, where), source="built-in")


def _builtin_prompts(text: str, where: str) -> tuple[str, ...]:
    """The prompts of a packaged corpus: its lines parsed as one JSON array (every collection loads
    the corpora it names; one parse is a few times cheaper than one per line), else line by line,
    for a message naming the line."""
    with contextlib.suppress(ValueError, TypeError, KeyError):
        records = json.loads(
            "[" + ",".join(line for line in text.splitlines() if line.strip()) + "]"
        )
        prompts = tuple(record["prompt"] for record in records)
        if all(isinstance(p, str) and p.strip() for p in prompts):
            return prompts
    return tuple(_iter_prompts(text.splitlines(), where))


@functools.lru_cache(maxsize=64)
def _load_jsonl_cached(path: str, mtime_ns: int, size: int) -> Corpus:
    """Parse a JSONL corpus; keyed on mtime and size so an edited file is re-read."""
    where = f"corpus file {path}"
    try:
        # a BOM is tolerated: some editors add one
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    prompts = tuple(_iter_prompts(lines, where))
    if not prompts:
        raise CorpusError(
            f"{where} contains no prompts (only blank lines or empty); "
            'add one JSON object per line, e.g. {"prompt": "..."}'
        )
    return Corpus(name=Path(path).stem, prompts=prompts, source=path)


def _load_jsonl(raw_path: str) -> Corpus:
    if not raw_path.strip():
        raise CorpusError(
            f"empty path in {JSONL_PREFIX!r} spec; write {JSONL_PREFIX}PATH/TO/prompts.jsonl"
        )
    path = Path(os.path.expanduser(raw_path.strip())).resolve()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise CorpusError(
            f"corpus file {path} does not exist (from spec {JSONL_PREFIX}{raw_path}); give a path "
            "to an existing JSONL file, relative to the current directory or absolute"
        ) from None
    if not path.is_file():
        raise CorpusError(f"corpus path {path} is not a regular file; expected a JSONL file")
    return _load_jsonl_cached(str(path), stat.st_mtime_ns, stat.st_size)


def load_corpus(spec: str | Corpus) -> Corpus:
    """The corpus named by ``spec``: a built-in name, ``jsonl:PATH`` or a :class:`Corpus` (returned
    as is), cached."""
    if isinstance(spec, Corpus):
        return spec
    if not isinstance(spec, str):
        raise CorpusError(
            f"corpus spec must be a str or Corpus, got {type(spec).__name__}; "
            f"use one of {', '.join(BUILTIN_CORPORA)} or {JSONL_PREFIX}PATH"
        )
    if spec.startswith(JSONL_PREFIX):
        return _load_jsonl(spec[len(JSONL_PREFIX) :])
    if spec in BUILTIN_CORPORA:
        return _load_builtin(spec)
    valid = ", ".join(BUILTIN_CORPORA)
    message = (
        f"unknown corpus {spec!r}; valid built-in corpora are: {valid}, or "
        f"{JSONL_PREFIX}PATH for a JSONL file"
    )
    if close := difflib.get_close_matches(spec.lower(), BUILTIN_CORPORA, n=1):
        message += f" (did you mean {close[0]!r}?)"
    elif spec.endswith((".jsonl", ".json")) or os.sep in spec:
        # The commonest mistake is passing a bare path; point at the prefix it lacks.
        message += f" (to load the file, write {JSONL_PREFIX}{spec})"
    raise CorpusError(message)
