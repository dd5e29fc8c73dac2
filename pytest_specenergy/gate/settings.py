"""The gate's defaults and the storage setting's parser, apart from :mod:`.limits` and
:mod:`.storage` (which import them from here) so that the options table can show and check them
without loading the gate (issue 24, item 8)."""

from __future__ import annotations

from pathlib import Path

#: P(REGRESSED) bound for a true change exactly at the limit, over every look of the
#: sequential plan (``gate/sequential.py``), unless ``--specenergy-alpha`` says otherwise.
DEFAULT_ALPHA = 0.05
#: Repeat cap of the sequential plan unless ``--specenergy-max-repeats`` says otherwise.
DEFAULT_CAP = 11
#: Limits when neither the command line, the ini file nor a marker names any. Energy is
#: gated on the within-session ratio (speculative over its matched baseline, per repeat).
DEFAULT_LIMITS = ("energy_ratio:5%", "accept_length:5%", "equivalence:0")
#: The run history's folder and the committed golden baselines' folder, unless told otherwise.
DEFAULT_STORAGE = ".specenergy"
DEFAULT_GOLDEN_FOLDER = "specenergy_baselines"
#: ``--specenergy-unmeasured``: what baseline cases the run did not measure do (``gate/coverage.py``).
UNMEASURED_POLICIES = ("auto", "fail", "warn")


class StorageError(Exception):
    """A stored file is missing, unreadable, corrupted or of a foreign schema."""


def storage_path(storage: str | Path) -> Path:
    """The directory of a storage setting; ``file://./.specenergy`` URIs are accepted."""
    text = str(storage)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise StorageError(
            f"storage {text!r}: only local directories (PATH or file://PATH) are supported"
        )
    if not text:
        raise StorageError("storage path is empty; expected a directory such as .specenergy")
    return Path(text)
