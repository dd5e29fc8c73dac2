"""The reference server's name lists: drafters, compute dtypes, devices.

Torch-free and import-free: the plugin checks markers against them at every collection, and
importing :mod:`.records` (the engine's config and result classes) for three tuples would cost every
``pytest`` start (issue 24, item 8)."""

DRAFTERS = ("none", "ngram", "draft_model", "block", "replay")
DTYPES = ("auto", "float64", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
#: ``--draft-model early-exit:K``: the target's own first K layers and head as the draft
#: (:mod:`.early_exit`).
EARLY_EXIT_PREFIX = "early-exit:"
