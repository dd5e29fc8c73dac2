"""Prompt corpora for speculative-decoding energy measurements.

Five corpora are built in, mirroring the text classes the paper measures (acceptance, and
hence energy saved, depends strongly on the text): ``code``, ``conversation``,
``long-document``, ``news`` (English) and ``rm-news`` (Romansh, Rumantsch Grischun). All
built-in prompts were written for this project and ship as ``data/<name>.jsonl``; users can
bring their own with ``jsonl:PATH``.

Example::

    corpus = load_corpus("code")
    batch = corpus.take(64)   # cycles if the corpus has fewer than 64 prompts
    corpus.digest             # store with a baseline to detect a changed corpus
"""

from __future__ import annotations

from .loader import BUILTIN_CORPORA
from .loader import JSONL_PREFIX
from .loader import Corpus
from .loader import CorpusError
from .loader import load_corpus

__all__ = ["BUILTIN_CORPORA", "JSONL_PREFIX", "Corpus", "CorpusError", "load_corpus"]
