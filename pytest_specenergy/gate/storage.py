"""Run history and committed golden baselines, on disk.

Run history (``--specenergy-save`` / ``--specenergy-compare``) lives under a storage dir,
default ``.specenergy/``, one folder per machine key::

    .specenergy/.gitignore                                   # "*": history is never committed
    .specenergy/<machine_key>/0001_main_20260509_143000.json
    .specenergy/<machine_key>/0002_auto_20260510_090112.json

The counter grows like a Django migration number; a run saved without a name is ``auto``.
Golden baselines are committed and reviewed like ``__snapshots__``: one file per test node id
under a folder (default ``specenergy_baselines/``; callers wanting per-machine goldens pass
``folder / machine_key``).

Every file carries ``schema_version`` and ``kind``. A file that is corrupted, truncated or of
a foreign schema raises :class:`StorageError` naming the file and the problem, and is never
overwritten or deleted: it may be the only copy of a baseline someone needs. Writes go
through :func:`pytest_specenergy.atomic.write_json_atomic`, so an interrupted run leaves the
earlier history intact and no half-written file behind.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Iterator
from typing import Mapping

from pytest_specenergy.atomic import create_json_exclusive
from pytest_specenergy.atomic import write_json_atomic
from pytest_specenergy.atomic import write_text_atomic
from pytest_specenergy.gate import machine

DEFAULT_STORAGE = ".specenergy"
DEFAULT_GOLDEN_FOLDER = "specenergy_baselines"
RUN_KIND = "specenergy-run"
GOLDEN_KIND = "specenergy-golden"
#: Schema versions this plugin reads, per kind (the run document's is report/json_out's).
SUPPORTED_SCHEMAS: dict[str, tuple[int, ...]] = {RUN_KIND: (1,), GOLDEN_KIND: (1,)}
GOLDEN_SCHEMA_VERSION = 1
AUTO_NAME = "auto"

_ILLEGAL_NAME = re.compile(r'[\\/:*?<>|"\x00-\x1f]')
_RUN_FILE = re.compile(r"^(?P<counter>\d{4,})_(?P<name>.+)_(?P<stamp>\d{8}_\d{6})\.json$")
_COUNTER = re.compile(r"^(\d{4,})_")


class StorageError(Exception):
    """A stored file is missing, unreadable, corrupted or of a foreign schema."""


class RunNotFound(StorageError):
    """A ``--specenergy-compare`` reference matched no saved run."""


class InvalidRunName(StorageError, argparse.ArgumentTypeError, ValueError):
    """A run name cannot be used in a file name (usable as an argparse ``type=`` error)."""


def storage_path(storage: str | Path) -> Path:
    """The directory of a storage setting; ``file://./.specenergy`` URIs are accepted."""
    text = str(storage)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        raise StorageError(f"storage {text!r}: only local directories (PATH or file://PATH) "
                           "are supported")
    if not text:
        raise StorageError("storage path is empty; expected a directory such as .specenergy")
    return Path(text)


def validate_run_name(name: str) -> str:
    """Return ``name`` if it can be part of a run file name, else raise :class:`InvalidRunName`."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidRunName("run name is empty; expected a name such as main or pr-123")
    bad = sorted(set(_ILLEGAL_NAME.findall(name)))
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise InvalidRunName(f"run name {name!r} contains {shown}; names may not contain any "
                             "of \\ / : * ? \" < > | or control characters (try main, pr-123)")
    if name != name.strip() or name in (".", "..") or name.startswith("."):
        raise InvalidRunName(f"run name {name!r} must not start with '.' or have surrounding "
                             "spaces; expected a name such as main or pr-123")
    # These would be read back as another kind of reference by find_run.
    if name == "last" or name.isdigit():
        raise InvalidRunName(f"run name {name!r} is reserved: 'last' and bare numbers are "
                             "compare references (latest run, run counter); pick another name")
    return name


def ensure_storage(storage: str | Path) -> Path:
    """Create the storage dir with a ``.gitignore`` of ``*`` on first use; return its path."""
    root = storage_path(storage)
    root.mkdir(parents=True, exist_ok=True)
    ignore = root / ".gitignore"
    if not ignore.exists():
        write_text_atomic(ignore, "# created by pytest-specenergy: run history is local\n*\n")
    return root


# -- validation -------------------------------------------------------------------------
def _read_json(path: Path, kind: str) -> dict[str, Any]:
    """Load ``path`` and check its kind and schema; never modifies the file."""
    untouched = "the file was left untouched"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StorageError(f"{path}: no such file") from None
    except OSError as exc:
        raise StorageError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StorageError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); it is "
                           f"corrupted or not a specenergy file; {untouched}") from None
    except json.JSONDecodeError as exc:
        problem = "is empty" if not raw.strip() else (
            f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
        raise StorageError(f"{path}: {problem} - truncated or corrupted; {untouched}; restore "
                           "it from version control or delete it yourself") from None
    if not isinstance(data, dict):
        raise StorageError(f"{path}: top level is a JSON {type(data).__name__}, expected an "
                           f"object with 'kind': {kind!r}; {untouched}")
    found_kind, version = data.get("kind"), data.get("schema_version")
    if found_kind is None or version is None:
        missing = [k for k in ("kind", "schema_version") if data.get(k) is None]
        raise StorageError(f"{path}: lacks {' and '.join(map(repr, missing))}, so it is not a "
                           f"specenergy {kind} file (foreign schema); {untouched}")
    if found_kind != kind:
        raise StorageError(f"{path}: is a {found_kind!r} file, expected {kind!r}; {untouched}")
    supported = SUPPORTED_SCHEMAS[kind]
    if isinstance(version, bool) or not isinstance(version, int) or version not in supported:
        raise StorageError(f"{path}: schema_version {version!r} is not supported (this plugin "
                           f"reads {', '.join(map(str, supported))}); upgrade pytest-specenergy "
                           f"or re-create the file; {untouched}")
    return data


# -- run history ------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredRun:
    """A run file in the history, as parsed from its name."""

    path: Path
    counter: int
    name: str
    timestamp: str


def machine_keys(storage: str | Path) -> list[str]:
    """Machine keys that have a history folder under ``storage``."""
    root = storage_path(storage)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def list_runs(storage: str | Path, machine_key: str) -> list[StoredRun]:
    """Saved runs of one machine key, oldest (lowest counter) first."""
    folder = storage_path(storage) / machine_key
    if not folder.is_dir():
        return []
    runs = []
    for path in folder.iterdir():
        match = _RUN_FILE.match(path.name)
        if match and path.is_file():
            runs.append(StoredRun(path, int(match["counter"]), match["name"], match["stamp"]))
    return sorted(runs, key=lambda r: (r.counter, r.timestamp, r.path.name))


def _next_counter(folder: Path) -> int:
    # Every NNNN_ file counts, corrupt ones included, so a new run never reuses the number
    # (and never the path) of a file we refused to read.
    numbers = [int(m.group(1)) for p in folder.iterdir() if (m := _COUNTER.match(p.name))]
    return max(numbers, default=0) + 1


def save_run(document: Mapping[str, Any], storage: str | Path = DEFAULT_STORAGE,
             name: str | None = None, *, machine_key: str | None = None,
             now: dt.datetime | None = None, interrupted: bool = False) -> Path:
    """Save a run document as ``<storage>/<machine_key>/<NNNN>_<name>_<stamp>.json``.

    The key is ``machine_key``, else the document's ``machine_key``, else one computed from
    its ``machine_info``. The file gets ``kind``, ``name`` and ``machine_key``, and
    ``interrupted: true`` for a session that did not finish (Ctrl-C, SIGTERM, ``-x``):
    :func:`find_run` never picks such a run as a baseline. The file is created exclusively
    and atomically: it never replaces an existing file, even when many processes save under
    one name in the same second; each takes the next free counter.
    """
    run_name = AUTO_NAME if name is None else validate_run_name(name)
    if document.get("kind", RUN_KIND) != RUN_KIND:
        raise StorageError(f"cannot save a {document.get('kind')!r} document as a run; "
                           f"expected a run document (kind {RUN_KIND!r})")
    key = machine_key or document.get("machine_key") or machine.machine_key(
        document.get("machine_info") or {})
    if machine.slugify(key) != key:
        raise StorageError(f"machine key {key!r} is not path-safe; expected something like "
                           f"{machine.slugify(key)!r} (see machine.machine_key)")
    folder = ensure_storage(storage) / key
    folder.mkdir(parents=True, exist_ok=True)
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y%m%d_%H%M%S")
    saved = {"schema_version": 1, **document, "kind": RUN_KIND, "name": run_name,
             "machine_key": key}
    if interrupted:
        saved["interrupted"] = True

    def candidates() -> Iterator[Path]:  # read under the lock: the counter is current
        counter = _next_counter(folder)
        while True:  # a name taken meanwhile (a saver without the lock): the next number
            yield folder / f"{counter:04d}_{run_name}_{stamp}.json"
            counter += 1

    # The lock keeps counters unique across names too (0005_main vs 0005_auto).
    return create_json_exclusive(candidates(), saved, lock=folder / ".lock")


def load_run(path: str | Path) -> dict[str, Any]:
    """Load and validate a saved run; raises :class:`StorageError` naming the file.

    Besides the kind and schema, every record must be an object, each arm an object, and
    every figure the gate reads a number (or null): a hand-edited ``"NaN?"`` is named here,
    with the file and the record, rather than crashing the comparison.
    """
    file = Path(path)
    data = _read_json(file, RUN_KIND)
    if not isinstance(data.get("results"), list):
        raise StorageError(f"{file}: 'results' is missing or not a list; the run is "
                           "incomplete or corrupted; the file was left untouched")
    for index, record in enumerate(data["results"]):
        problem = _record_problem(record)
        if problem:
            case = record.get("case_id") if isinstance(record, dict) else None
            where = f"results[{index}]" + (f" ({case})" if isinstance(case, str) else "")
            raise StorageError(f"{file}: {where}: {problem}; the file is corrupted or not "
                               "written by pytest-specenergy; the file was left untouched")
    return data


#: Figures the gate reads as numbers: a record's, and each arm sample's.
_RECORD_NUMBERS = ("energy_saving", "speedup", "accept_length", "acceptance_rate",
                   "energy_per_token", "tbt_ms")
_SAMPLE_NUMBERS = ("decode_joules", "decode_seconds", "decode_tokens", "energy_per_token",
                   "tbt_ms", "verify_steps", "correct_drafts", "proposed_drafts", "loops")


def _record_problem(record: Any) -> str | None:
    """Why ``record`` cannot be compared (a part not an object, a figure not a number)."""
    parts: list[tuple[str, Any, tuple[str, ...]]] = [
        ("record", record, _RECORD_NUMBERS),
        ("equivalence", (record.get("equivalence") if isinstance(record, dict) else None),
         ("exact_fraction",))]
    for arm in ("baseline", "speculative"):
        part = record.get(arm) if isinstance(record, dict) else None
        samples = part.get("samples") if isinstance(part, dict) else None
        parts.append((arm, part, ()))
        parts.append((f"{arm}.samples", samples, ()))
        if isinstance(samples, list):
            parts += [(f"{arm}.samples[{i}]", one, _SAMPLE_NUMBERS) for i, one in enumerate(samples)]
    for where, value, numbers in parts:
        kind = list if where.endswith(".samples") else dict
        if value is None and where != "record":
            continue
        if not isinstance(value, kind):
            return f"{where} is {value!r:.60}, expected a JSON {'array' if kind is list else 'object'}"
        for key in numbers:
            number = value.get(key)
            if number is not None and (isinstance(number, bool) or not isinstance(
                    number, (int, float)) or not math.isfinite(number)):
                return f"{where}: {key!r} is {number!r:.60}, expected a finite number or null"
    return None


def is_interrupted(document: Mapping[str, Any]) -> bool:
    """True for a run saved by a session that did not finish: never a baseline.

    :func:`find_run` skips such runs for ``last``, ``NAME`` and ``NNNN``; one loaded by an
    explicit PATH still reaches the caller, whose comparison must refuse it.
    """
    return document.get("interrupted") is True


def _interrupted_file(path: Path) -> bool:
    """Whether a run file says it was interrupted; an unreadable one says nothing (so that
    :func:`load_run` reports it, instead of an older run silently standing in for it)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and is_interrupted(data)


def find_run(storage: str | Path, machine_key: str, ref: str) -> Path:
    """Resolve a compare reference: ``last``, a run ``NAME`` (its latest save), a counter
    ``NNNN``, or a ``PATH`` to a run file. Raises :class:`RunNotFound` with what exists."""
    text = str(ref).strip()
    if not text:
        raise RunNotFound("empty compare reference; expected last, NAME, NNNN or PATH")
    if text.endswith(".json") or "/" in text or "\\" in text:
        if Path(text).is_file():
            return Path(text)
        raise RunNotFound(f"compare reference {text!r} looks like a path, but no such file "
                          "exists; expected last, NAME, NNNN or an existing PATH")
    runs = list_runs(storage, machine_key)
    folder = storage_path(storage) / machine_key
    if not runs:
        others = [k for k in machine_keys(storage) if k != machine_key]
        hint = f" (runs exist for: {', '.join(others)})" if others else ""
        raise RunNotFound(f"no saved runs for machine key {machine_key!r} in {folder}{hint}; "
                          "save one first with --specenergy-save=NAME")
    if text == "last":
        matches, what = runs, "run"
    elif text.isdigit():
        matches, what = [r for r in runs if r.counter == int(text)], f"run {text!r}"
    else:
        matches, what = [r for r in runs if r.name == text], f"run {text!r}"
    skipped = []
    for run in reversed(matches):
        if not _interrupted_file(run.path):
            return run.path
        skipped.append(run)
    available = ", ".join(f"{r.counter:04d} ({r.name})" for r in runs[-10:])
    if skipped:
        raise RunNotFound(
            f"no finished {what} for machine key {machine_key!r} in {folder}: "
            f"{', '.join(r.path.name for r in skipped[:5])} "
            f"{'was' if len(skipped) == 1 else 'were'} saved by an interrupted session and "
            "never serve as a baseline; available: "
            f"{available}; expected last, NAME, NNNN or PATH")
    raise RunNotFound(f"no run {text!r} for machine key {machine_key!r} in {folder}; "
                      f"available: {available}; expected last, NAME, NNNN or PATH")


# -- golden baselines ------------------------------------------------------------------
@dataclass(frozen=True)
class Golden:
    """A committed baseline of one test node."""

    path: Path
    nodeid: str
    record: dict[str, Any]
    run_info: dict[str, Any]


def _safe_component(text: str) -> str:
    safe = _ILLEGAL_NAME.sub("_", text).rstrip(" .") or "_"
    if safe in (".", ".."):
        safe = "_"
    if len(safe) > 150:
        # Long parametrize ids: keep a readable prefix, stay unique with a digest.
        safe = f"{safe[:130]}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return safe


def golden_path(folder: str | Path, nodeid: str) -> Path:
    """Where the golden of ``nodeid`` lives: ``tests/x/test_a.py::T::t[id]`` becomes
    ``<folder>/tests/x/test_a/T.t[id].json``."""
    if not nodeid or not nodeid.strip():
        raise StorageError("empty node id; expected a pytest node id such as "
                           "tests/test_energy.py::test_x[code-ngram-b4]")
    module, sep, rest = nodeid.partition("::")
    if not sep:
        module, rest = "", nodeid
    module = module[:-3] if module.endswith(".py") else module
    parts = [_safe_component(p) for p in module.replace("\\", "/").split("/") if p]
    return Path(folder).joinpath(*parts, _safe_component(rest.replace("::", ".")) + ".json")


def load_golden(folder: str | Path, nodeid: str) -> Golden | None:
    """The golden of ``nodeid``, or None when none exists; a bad file raises StorageError."""
    path = golden_path(folder, nodeid)
    if not path.exists():
        return None
    data = _read_json(path, GOLDEN_KIND)
    if data.get("nodeid") != nodeid:
        raise StorageError(f"{path}: holds the baseline of {data.get('nodeid')!r}, not "
                           f"{nodeid!r} (two node ids map to one file name); the file was "
                           "left untouched")
    if not isinstance(data.get("record"), dict):
        raise StorageError(f"{path}: 'record' is missing or not an object; the baseline is "
                           "corrupted; the file was left untouched")
    return Golden(path, nodeid, data["record"], dict(data.get("run_info") or {}))


def write_golden(folder: str | Path, nodeid: str, record: Mapping[str, Any],
                 run_info: Mapping[str, Any] | None = None) -> Path:
    """Atomically write the golden of ``nodeid``; an existing unreadable file is refused."""
    path = golden_path(folder, nodeid)
    if path.exists():
        load_golden(folder, nodeid)  # raises on a corrupt/foreign file: never overwrite it
    write_json_atomic(path, {"schema_version": GOLDEN_SCHEMA_VERSION, "kind": GOLDEN_KIND,
                             "nodeid": nodeid, "run_info": dict(run_info or {}),
                             "record": dict(record)})
    return path


GOLDEN_MODES = ("check", "update", "regen-all", "new-only")


@dataclass(frozen=True)
class GoldenUpdate:
    """What :func:`update_golden` did: ``action`` is created, updated, regenerated, kept or
    unchanged; ``fails`` says whether the test must fail because of it (pytest-regressions:
    a created or force-updated baseline fails the test so a human reviews it)."""

    action: str
    written: bool
    fails: bool
    path: Path
    message: str


def update_golden(folder: str | Path, nodeid: str, record: Mapping[str, Any], *, mode: str,
                  mismatched: bool, run_info: Mapping[str, Any] | None = None) -> GoldenUpdate:
    """Apply snapshot-style update semantics to one golden.

    ``check`` (default run): a missing golden is created and the test fails. ``update``:
    also rewrites mismatching goldens, failing those tests. ``regen-all``: rewrites every
    golden and passes. ``new-only``: writes missing goldens only, and passes. ``mismatched``
    is the caller's verdict (the gate regressed or improved against the golden).
    """
    if mode not in GOLDEN_MODES:
        raise ValueError(f"unknown golden mode {mode!r}; expected one of {', '.join(GOLDEN_MODES)}")
    existing = load_golden(folder, nodeid)  # a corrupt golden raises here, before any write
    path = golden_path(folder, nodeid)
    if existing is None:
        write_golden(folder, nodeid, record, run_info)
        fails = mode in ("check", "update")
        return GoldenUpdate("created", True, fails, path,
                            f"no baseline for {nodeid}: created {path}"
                            + ("; review and commit it, then rerun" if fails else ""))
    if mode == "regen-all":
        write_golden(folder, nodeid, record, run_info)
        return GoldenUpdate("regenerated", True, False, path, f"regenerated {path}")
    if mismatched and mode == "update":
        write_golden(folder, nodeid, record, run_info)
        return GoldenUpdate("updated", True, True, path,
                            f"baseline of {nodeid} differed: rewrote {path}; review and commit "
                            "it, then rerun")
    if mismatched:
        return GoldenUpdate("kept", False, False, path, f"baseline {path} kept (differs)")
    return GoldenUpdate("unchanged", False, False, path, f"baseline {path} unchanged")


def unused_goldens(folder: str | Path, used_nodeids: Iterable[str]) -> list[Path]:
    """Golden files under ``folder`` that belong to none of ``used_nodeids``."""
    root = Path(folder)
    if not root.is_dir():
        return []
    used = {golden_path(root, n) for n in used_nodeids}
    return sorted(p for p in root.rglob("*.json")
                  if p.is_file() and not p.name.startswith(".") and p not in used)
