"""Atomic file writes: a crash mid-write never leaves a half-written file; why and how:
docs/report.md."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Iterator

#: ``link()`` errors that mean "this file system has no hard links", not a failed write.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (threads may be
    creating files: the ``os.umask`` round trip would briefly affect them)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _file_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777  # replacing a file keeps the mode it was given
    except OSError:
        return 0o666 & ~current_umask()


def _write_temp(path: Path, text: str) -> str:
    """A fully written, fsynced temporary file beside ``path`` with ``path``'s future mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _file_mode(path))
        _write_synced(fd, text)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _write_synced(fd: int, text: str) -> None:
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _unlink(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    tmp = _write_temp(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Atomically write ``data`` as indented JSON."""
    write_text_atomic(path, _json(data))


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"


@contextlib.contextmanager
def locked(path: Path | None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed); no-op for None or without
    ``fcntl``."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        fcntl = None  # type: ignore[assignment]
    if path is None or fcntl is None:
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        # explicitly: a process forked meanwhile shares the descriptor and would keep the lock
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def create_json_exclusive(candidates: Iterable[Path], data: Any, lock: Path | None = None) -> Path:
    """Publish ``data`` as indented JSON under the first of ``candidates`` that does not exist yet
    (never replacing a file, even against concurrent writers: a temporary file hard-linked into
    place); returns the path used."""
    text = _json(data)  # serialised once, before any file
    tmp: str | None = None
    try:
        with locked(lock):
            for path in candidates:
                if tmp is None:
                    tmp = _write_temp(path, text)
                if _publish(tmp, path, text):
                    return path
        raise FileExistsError("every candidate file name is taken")
    finally:
        if tmp is not None:
            _unlink(tmp)


def _publish(tmp: str, path: Path, text: str) -> bool:
    """Give the complete file ``tmp`` the name ``path`` unless it exists (then False)."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
    # No hard links on this file system (some network, FUSE and FAT ones).
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    _write_synced(fd, text)
    return True


def unwritable(folder: Path) -> str | None:
    """Why a file cannot be created in ``folder`` (or in the folder where it would be created, its
    nearest existing parent): checked by creating and removing a probe file, as a write would."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        handle, probe = tempfile.mkstemp(prefix=".specenergy-probe-", dir=existing)
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    os.close(handle)
    os.unlink(probe)
    return None


#: Bytes a folder an output goes to must have free at a session's start: a full disk is found
#: before anything is measured, not after the last case (audit 3, N15, T17, T18, T43).
MIN_FREE_BYTES = 1 << 20


def too_full(folder: Path) -> str | None:
    """Why ``folder`` (or its nearest existing parent) has too little room for an output, or None
    (also where its file system cannot say)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        stats = os.statvfs(existing)
    except OSError:
        return None
    free = stats.f_bavail * stats.f_frsize
    if free >= MIN_FREE_BYTES:
        return None
    return (
        f"only {free} bytes free on its file system; at least {MIN_FREE_BYTES // 1024} KiB are "
        "needed (free some space, or point the option at another folder)"
    )
