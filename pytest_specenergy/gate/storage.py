"""Run history and committed golden baselines on disk (:class:`RunStore`, :class:`GoldenStore`):
files are validated on load, never overwritten or deleted when bad, and written atomically (layout:
docs/gate.md#run-history-and-golden-baselines)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Iterable
from typing import Iterator

from pytest_specenergy.gate.settings import DEFAULT_GOLDEN_FOLDER
from pytest_specenergy.gate.settings import DEFAULT_STORAGE
from pytest_specenergy.gate.settings import StorageError
from pytest_specenergy.gate.settings import storage_path

if TYPE_CHECKING:
    from pytest_specenergy.document import CaseRecord
    from pytest_specenergy.document import RunDocument

# The document, machine and atomic-write modules load in the functions that read or write a file,
# so a collection that never touches the history does not pay for them (issue 24, item 8).

AUTO_NAME = "auto"
#: The largest file read as a run or golden: 2.5 times a 4000-case run (100 MB, which reads in
#: about 0.5 GB). A bigger file named like a run is refused unread (audit 3, T22: a 1.5 GB file
#: took 3.1 GB of memory, an 8 GB one a MemoryError).
MAX_RUN_FILE_BYTES = 256 * 2**20
#: Bytes a run name may take: ``NNNN_<name>_YYYYmmdd_HHMMSS.json`` must fit 255 bytes.
MAX_RUN_NAME = 200

_ILLEGAL_NAME = re.compile(r'[\\/:*?<>|"\x00-\x1f]')
_RUN_FILE = re.compile(r"^(?P<counter>\d{4,})_(?P<name>.+)_(?P<stamp>\d{8}_\d{6})\.json$")
_COUNTER = re.compile(r"^(\d{4,})_")


class RunNotFound(StorageError):
    """A ``--specenergy-compare`` reference matched no saved run."""


class InvalidRunName(StorageError, argparse.ArgumentTypeError, ValueError):
    """A run name cannot be used in a file name (usable as an argparse ``type=`` error)."""


def validate_run_name(name: str) -> str:
    """Return ``name`` if it can be part of a run file name, else raise :class:`InvalidRunName`."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidRunName("run name is empty; expected a name such as main or pr-123")
    if len(name.encode()) > MAX_RUN_NAME:
        # The file name adds a counter and a time stamp; file systems allow 255 bytes.
        raise InvalidRunName(
            f"run name {name[:40]!r}... is {len(name.encode())} bytes; at most {MAX_RUN_NAME} "
            "fit in a file name"
        )
    bad = sorted(set(_ILLEGAL_NAME.findall(name)))
    if bad:
        raise InvalidRunName(
            f"run name {name!r} contains {', '.join(repr(c) for c in bad)}; names may not contain any "
            'of \\ / : * ? " < > | or control characters (try main, pr-123)'
        )
    if name != name.strip() or name in (".", "..") or name.startswith("."):
        raise InvalidRunName(
            f"run name {name!r} must not start with '.' or have surrounding "
            "spaces; expected a name such as main or pr-123"
        )
    # These would be read back as another kind of reference by RunStore.find.
    if name == "last" or name.isdigit():
        raise InvalidRunName(
            f"run name {name!r} is reserved: 'last' and bare numbers are "
            "compare references (latest run, run counter); pick another name"
        )
    return name


def ensure_storage(storage: str | Path) -> Path:
    """Create the storage dir with a ``.gitignore`` of ``*`` on first use; return its path."""
    root = storage_path(storage)
    root.mkdir(parents=True, exist_ok=True)
    ignore = root / ".gitignore"
    if not ignore.exists():
        from pytest_specenergy.atomic import write_text_atomic

        write_text_atomic(ignore, "# created by pytest-specenergy: run history is local\n*\n")
    return root


# -- validation -------------------------------------------------------------------------
def _read_json(path: Path, kind: str) -> dict[str, Any]:
    """Load ``path`` and check its kind and schema; never modifies the file."""
    from pytest_specenergy.document import SUPPORTED_SCHEMAS

    untouched = "the file was left untouched"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise StorageError(f"{path}: no such file") from None
    except OSError as exc:
        raise StorageError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if size > MAX_RUN_FILE_BYTES:
        raise StorageError(
            f"{path}: is {size} bytes; a specenergy {kind} file holds at most "
            f"{MAX_RUN_FILE_BYTES // 2**20} MiB, so it is not read (not a run, or a corrupted "
            f"one); {untouched}"
        )
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StorageError(f"{path}: no such file") from None
    except OSError as exc:
        raise StorageError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StorageError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); it is "
            f"corrupted or not a specenergy file; {untouched}"
        ) from None
    except json.JSONDecodeError as exc:
        problem = (
            "is empty"
            if not raw.strip()
            else (f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
        )
        raise StorageError(
            f"{path}: {problem} - truncated or corrupted; {untouched}; restore "
            "it from version control or delete it yourself"
        ) from None
    if not isinstance(data, dict):
        raise StorageError(
            f"{path}: top level is a JSON {type(data).__name__}, expected an "
            f"object with 'kind': {kind!r}; {untouched}"
        )
    found_kind, version = data.get("kind"), data.get("schema_version")
    if found_kind is None or version is None:
        missing = [k for k in ("kind", "schema_version") if data.get(k) is None]
        raise StorageError(
            f"{path}: lacks {' and '.join(map(repr, missing))}, so it is not a "
            f"specenergy {kind} file (foreign schema); {untouched}"
        )
    if found_kind != kind:
        raise StorageError(f"{path}: is a {found_kind!r} file, expected {kind!r}; {untouched}")
    supported = SUPPORTED_SCHEMAS[kind]
    if isinstance(version, bool) or not isinstance(version, int) or version not in supported:
        raise StorageError(
            f"{path}: schema_version {version!r} is not supported (this plugin "
            f"reads {', '.join(map(str, supported))}); upgrade pytest-specenergy "
            f"or re-create the file; {untouched}"
        )
    return data


def load_run(path: str | Path) -> RunDocument:
    """Load and check a saved or ``--specenergy-json`` run file; a :class:`StorageError` names file,
    record, field."""
    from pytest_specenergy.document import RUN_KIND
    from pytest_specenergy.document import DocumentError
    from pytest_specenergy.document import RunDocument

    file = Path(path)
    data = _read_json(file, RUN_KIND)
    try:
        return RunDocument.from_dict(data, str(file))
    except DocumentError as exc:
        raise StorageError(
            f"{exc}; the file is corrupted or not written by pytest-specenergy; "
            "the file was left untouched"
        ) from None


# -- run history ------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredRun:
    """A run file in the history, as parsed from its name."""

    path: Path
    counter: int
    name: str
    timestamp: str


class RunStore:
    """The run history under one folder: a subfolder per machine key, files
    ``NNNN_<name>_<stamp>.json``."""

    def __init__(self, root: str | Path = DEFAULT_STORAGE) -> None:
        self.root = storage_path(root)

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r})"

    def machine_keys(self) -> list[str]:
        """Machine keys with saved runs (a folder with no run file, such as ``logs/``, is not one)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and self.list(p.name)
        )

    def list(self, machine_key: str) -> list[StoredRun]:
        """Saved runs of one machine key, oldest (lowest counter) first."""
        folder = self.root / machine_key
        if not folder.is_dir():
            return []
        found = ((path, _RUN_FILE.match(path.name)) for path in folder.iterdir())
        runs = [
            StoredRun(path, int(m["counter"]), m["name"], m["stamp"])
            for path, m in found
            if m and path.is_file()
        ]
        return sorted(runs, key=lambda r: (r.counter, r.timestamp, r.path.name))

    def save(
        self, document: RunDocument, name: str | None = None, *, now: dt.datetime | None = None
    ) -> Path:
        """Save ``document`` as ``<root>/<machine_key>/<NNNN>_<name>_<stamp>.json``, exclusively and
        atomically."""
        import pytest_specenergy.gate.machine as machine
        from pytest_specenergy.atomic import create_json_exclusive
        from pytest_specenergy.document import RUN_KIND

        run_name = AUTO_NAME if name is None else validate_run_name(name)
        if document.kind != RUN_KIND:
            raise StorageError(
                f"cannot save a {document.kind!r} document as a run; "
                f"expected a run document (kind {RUN_KIND!r})"
            )
        key = document.machine_key or machine.machine_key(document.machine_info)
        if machine.slugify(key) != key:
            raise StorageError(
                f"machine key {key!r} is not path-safe; expected something like "
                f"{machine.slugify(key)!r} (see machine.machine_key)"
            )
        folder = ensure_storage(self.root) / key
        folder.mkdir(parents=True, exist_ok=True)
        stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y%m%d_%H%M%S")
        saved = dataclasses.replace(document, name=run_name, machine_key=key).as_dict()

        def candidates() -> Iterator[Path]:  # read under the lock: the counter is current
            counter = _next_counter(folder)
            while True:  # a name taken meanwhile (a saver without the lock): the next number
                yield folder / f"{counter:04d}_{run_name}_{stamp}.json"
                counter += 1

        # The lock keeps counters unique across names too (0005_main vs 0005_auto).
        return create_json_exclusive(candidates(), saved, lock=folder / ".lock")

    #: Load and validate a run file.
    load = staticmethod(load_run)

    def find(self, machine_key: str, ref: str) -> Path:
        """Resolve a compare reference: ``last``, a run ``NAME`` (its latest save), a counter
        ``NNNN``, or a ``PATH`` to a run file; raises :class:`RunNotFound` with what exists."""
        text = str(ref).strip()
        if not text:
            raise RunNotFound("empty compare reference; expected last, NAME, NNNN or PATH")
        if text.endswith(".json") or "/" in text or "\\" in text:
            if Path(text).is_file():
                return Path(text)
            raise RunNotFound(
                f"compare reference {text!r} looks like a path, but no such file "
                "exists; expected last, NAME, NNNN or an existing PATH"
            )
        runs = self.list(machine_key)
        folder = self.root / machine_key
        if not runs:
            others = [k for k in self.machine_keys() if k != machine_key]
            hint = f" (runs exist for: {', '.join(others)})" if others else ""
            raise RunNotFound(
                f"no saved runs for machine key {machine_key!r} in {folder}{hint}; "
                "save one first with --specenergy-save=NAME"
            )
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
                f"never serve as a baseline; available: {available}; expected last, NAME, NNNN or "
                "PATH"
            )
        raise RunNotFound(
            f"no run {text!r} for machine key {machine_key!r} in {folder}; "
            f"available: {available}; expected last, NAME, NNNN or PATH"
        )

    def find_any(self, machine_key: str, ref: str) -> Path:
        """:meth:`find` on ``machine_key``, else the same reference stored under another key
        (which the comparison then reports as INCOMPARABLE instead of silently missing)."""
        try:
            return self.find(machine_key, ref)
        except RunNotFound:
            for other in (key for key in self.machine_keys() if key != machine_key):
                with contextlib.suppress(RunNotFound):
                    return self.find(other, ref)
            raise


def stored_run_problem(path: str | Path, store: RunStore | None = None) -> str | None:
    """Why writing ``path`` would overwrite a stored run, or None: it is (or would be) a run file
    of ``store``'s history, or an existing file named like a saved run (``NNNN_<name>_<stamp>.json``,
    of some other history). An output must never replace a run the history holds (audit 3, T29,
    T47)."""
    target = Path(path)
    try:
        resolved = target.resolve()
    except OSError:
        return None
    if not _RUN_FILE.match(resolved.name):
        return None
    if store is not None and resolved.parent.parent == store.root.resolve():
        return f"{path} is a run in the history {store.root}"
    if resolved.is_file():
        return f"{path} is named like a stored run (NNNN_<name>_<stamp>.json) and exists"
    return None


def _golden_kind() -> str:
    from pytest_specenergy.document import GOLDEN_KIND

    return GOLDEN_KIND


def _next_counter(folder: Path) -> int:
    # Every NNNN_ file counts, corrupt ones too: a new run never reuses a refused file's number.
    numbers = [int(m.group(1)) for p in folder.iterdir() if (m := _COUNTER.match(p.name))]
    return max(numbers, default=0) + 1


def _interrupted_file(path: Path) -> bool:
    """Whether a run file says it was interrupted; an unreadable one says nothing (so that
    :func:`load_run` reports it, instead of an older run silently standing in for it)."""
    try:
        if path.stat().st_size > MAX_RUN_FILE_BYTES:
            return False  # never read whole here: load_run refuses it by its size
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("interrupted") is True


# -- golden baselines ------------------------------------------------------------------
@dataclass(frozen=True)
class Golden:
    """A committed baseline of one test node."""

    path: Path
    nodeid: str
    record: CaseRecord
    run_info: dict[str, Any]


def _safe_component(text: str) -> str:
    # a trailing dot is stripped: never "." or ".."
    safe = _ILLEGAL_NAME.sub("_", text).rstrip(" .") or "_"
    if len(safe) > 150:
        # Long parametrize ids: keep a readable prefix, stay unique with a digest.
        safe = f"{safe[:130]}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return safe


GOLDEN_MODES = ("check", "update", "regen-all", "new-only")


@dataclass(frozen=True)
class GoldenUpdate:
    """What :meth:`GoldenStore.update` decided (created, updated, regenerated, kept, unchanged),
    whether it is rewritten, and whether the test fails for it (as in pytest-regressions: a
    created or force-updated baseline fails so a human reviews it)."""

    action: str
    written: bool
    fails: bool
    path: Path
    message: str


class GoldenStore:
    """Committed golden baselines (reviewed like ``__snapshots__``): one file per test node id under
    ``<root>/<machine_key>/``; writes are queued for :meth:`flush` at session end, as syrupy does."""

    def __init__(self, root: str | Path = DEFAULT_GOLDEN_FOLDER) -> None:
        self.root = Path(root)
        self.used: set[tuple[str, str]] = set()
        self._queue: dict[Path, dict[str, Any]] = {}

    def path(self, machine_key: str, nodeid: str) -> Path:
        """Where the golden of ``nodeid`` lives: ``tests/x/test_a.py::T::t[id]`` becomes
        ``<root>/<machine_key>/tests/x/test_a/T.t[id].json``."""
        if not nodeid or not nodeid.strip():
            raise StorageError(
                "empty node id; expected a pytest node id such as "
                "tests/test_energy.py::test_x[code-ngram-b4]"
            )
        module, sep, rest = nodeid.partition("::")
        if not sep:
            module, rest = "", nodeid
        module = module[:-3] if module.endswith(".py") else module
        parts = [_safe_component(p) for p in module.replace("\\", "/").split("/") if p]
        return self.root.joinpath(
            machine_key, *parts, _safe_component(rest.replace("::", ".")) + ".json"
        )

    def load(self, machine_key: str, nodeid: str) -> Golden | None:
        """The golden of ``nodeid``, or None when none exists; a bad file raises StorageError."""
        from pytest_specenergy.document import GOLDEN_KIND
        from pytest_specenergy.document import CaseRecord
        from pytest_specenergy.document import DocumentError

        path = self.path(machine_key, nodeid)
        if not path.exists():
            return None
        data = _read_json(path, GOLDEN_KIND)
        if data.get("nodeid") != nodeid:
            raise StorageError(
                f"{path}: holds the baseline of {data.get('nodeid')!r}, not {nodeid!r} (two node "
                "ids map to one file name); the file was left untouched"
            )
        if not isinstance(data.get("record"), dict):
            raise StorageError(
                f"{path}: 'record' is missing or not an object; the baseline is "
                "corrupted; the file was left untouched"
            )
        try:
            record = CaseRecord.from_dict(data["record"], f"{path}: record")
        except DocumentError as exc:
            raise StorageError(
                f"{exc}; the baseline is corrupted; the file was left untouched"
            ) from None
        return Golden(path, nodeid, record, dict(data.get("run_info") or {}))

    def update(
        self,
        machine_key: str,
        nodeid: str,
        record: CaseRecord,
        *,
        mode: str,
        mismatched: bool,
        run_info: dict[str, Any] | None = None,
    ) -> GoldenUpdate:
        """Decide snapshot-style what happens to one golden and queue the write (the modes:
        docs/gate.md)."""
        if mode not in GOLDEN_MODES:
            raise ValueError(
                f"unknown golden mode {mode!r}; expected one of {', '.join(GOLDEN_MODES)}"
            )
        self.used.add((machine_key, nodeid))
        existing = self.load(machine_key, nodeid)  # a corrupt golden raises here, before any write
        path = self.path(machine_key, nodeid)
        if existing is None:
            fails = mode in ("check", "update")
            update = GoldenUpdate(
                "created",
                True,
                fails,
                path,
                f"no baseline for {nodeid}: created {path}"
                + ("; review and commit it, then rerun" if fails else ""),
            )
        elif mode == "regen-all":
            update = GoldenUpdate("regenerated", True, False, path, f"regenerated {path}")
        elif mismatched and mode == "update":
            update = GoldenUpdate(
                "updated",
                True,
                True,
                path,
                f"baseline of {nodeid} differed: rewrote {path}; review and commit it, then rerun",
            )
        else:
            what = "kept (differs)" if mismatched else "unchanged"
            return GoldenUpdate(what.split()[0], False, False, path, f"baseline {path} {what}")
        from pytest_specenergy.document import GOLDEN_KIND
        from pytest_specenergy.document import SCHEMA_VERSION

        self._queue[path] = {
            "schema_version": SCHEMA_VERSION,
            "kind": GOLDEN_KIND,
            "nodeid": nodeid,
            "run_info": dict(run_info or {}),
            "record": record.as_dict(),
        }
        return update

    def flush(self) -> tuple[list[Path], list[str]]:
        """Write every queued golden; returns (written paths, why each other one was not)."""
        from pytest_specenergy.atomic import write_json_atomic

        written, failed = [], []
        for path, data in self._queue.items():
            try:
                write_json_atomic(path, data)
                written.append(path)
            except OSError as exc:
                failed.append(f"{path}: cannot be written ({exc.strerror or exc})")
        self._queue.clear()
        return written, failed

    def nodeid_of(self, path: Path) -> str:
        """The node id a golden file holds (its path where the file cannot be read: it is still
        a baseline the session did not use)."""
        try:
            nodeid = _read_json(path, _golden_kind()).get("nodeid")
        except StorageError:
            return str(path)
        return nodeid if isinstance(nodeid, str) and nodeid else str(path)

    def unused(self, machine_keys: Iterable[str]) -> list[Path]:
        """Golden files of ``machine_keys`` that no test used this session."""
        unused: list[Path] = []
        for key in sorted(set(machine_keys)):
            folder = self.root / key
            if not folder.is_dir():
                continue
            used = {self.path(k, n) for k, n in self.used if k == key}
            unused += sorted(
                p
                for p in folder.rglob("*.json")
                if p.is_file() and not p.name.startswith(".") and p not in used
            )
        return unused
