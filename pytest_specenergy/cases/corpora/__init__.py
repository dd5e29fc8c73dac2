"""Prompt corpora: five built-ins and ``jsonl:PATH``; the built-ins and an example:
docs/methodology.md."""

from .loader import BUILTIN_CORPORA
from .loader import JSONL_PREFIX
from .loader import Corpus
from .loader import CorpusError
from .loader import load_corpus

__all__ = ["BUILTIN_CORPORA", "JSONL_PREFIX", "Corpus", "CorpusError", "load_corpus"]
