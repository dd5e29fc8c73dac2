"""dev/share_dists.py TARGET_ENV SOURCE_ENV...

Hardlinks the files of TARGET_ENV's installed distributions to the identical files of a SOURCE_ENV,
so that virtual environments holding the same packages take their disk once. The real-SGLang
environments (dev/sglang_env.sh) each hold torch 2.13.0 (750 MB, also in .venv) and triton
(1 GB, the same release in both): linked, the two add 2.0 GB to .venv's 1.3 GB instead of 5.1 GB.

A distribution is shared when a source holds the same name and version with the same RECORD
(pip's list of the files it installed, with their sha256 and size): all of its files in
site-packages are then linked, each .py together with the .pyc files compiled from it, because a
.pyc is checked against its source's modification time. Each link replaces the file
atomically (link to a temporary name, then rename). pip removes or replaces an installed file by
unlinking it, never by writing into it, so no environment changes another's files. Sources whose
RECORD is not written yet (an install under way) are left alone. Prints what it linked.
"""

from __future__ import annotations

import csv
import errno
import os
import sys
from pathlib import Path


def site_packages(env: Path) -> Path | None:
    """The site-packages folder of the virtual environment ``env``, or None if it has none."""
    found = sorted(env.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def records(site: Path) -> dict[tuple[str, str], list[list[str]]]:
    """Each installed distribution of ``site``, by (normalized name, version): its RECORD rows."""
    out = {}
    for info in site.glob("*.dist-info"):
        record = info / "RECORD"
        if not record.is_file():
            continue
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        with open(record, newline="") as handle:
            rows = [row for row in csv.reader(handle) if row]
        out[(name.lower().replace("_", "-").replace(".", "-"), version)] = rows
    return out


def in_site(path: str) -> bool:
    """Whether a RECORD path is a file of the package itself: not a console script
    (``../../bin/...``, which names its own environment's interpreter), not pip's metadata."""
    return not path.startswith("..") and ".dist-info/" not in path


def hashed(rows: list[list[str]]) -> set[tuple[str, ...]]:
    """The package's files with their hash and size: what two identical installs have alike."""
    return {tuple(row[:3]) for row in rows if len(row) >= 3 and row[1] and in_site(row[0])}


def link(source: Path, target: Path, same_size: bool = True) -> int:
    """Replaces ``target`` with a hardlink to ``source``; returns the bytes this frees."""
    if not source.is_file() or not target.is_file() or os.path.samefile(source, target):
        return 0
    size = target.stat().st_size
    if same_size and source.stat().st_size != size:
        return 0
    temporary = target.with_name(f".{target.name}.share-{os.getpid()}")
    try:
        os.link(source, temporary)
    except OSError as error:  # another filesystem, or one without hardlinks: keep the copy
        if error.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            return 0
        raise
    os.replace(temporary, target)
    return size


def link_module(source: Path, target: Path) -> int:
    """Links a file and, for a ``.py``, the .pyc files compiled from it: a .pyc names its source's
    modification time, which is now the source environment's. The .pyc files differ in size (each
    holds its own path, which the import system corrects on loading), hence no size check."""
    freed = link(source, target)
    if source.suffix == ".py" and target.is_file() and os.path.samefile(source, target):
        for compiled in (source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"):
            freed += link(compiled, target.parent / "__pycache__" / compiled.name, same_size=False)
    return freed


def share(target_env: Path, source_envs: list[Path]) -> None:
    """Links TARGET_ENV's distributions to the first source that holds each one identically."""
    target_site = site_packages(target_env)
    if target_site is None:
        raise SystemExit(f"share_dists: {target_env} is not a virtual environment")
    sources = [(site, records(site)) for site in map(site_packages, source_envs) if site]
    saved = 0
    for key, rows in sorted(records(target_site).items()):
        for source_site, source_records in sources:
            source_rows = source_records.get(key)
            if source_rows is None or hashed(source_rows) != hashed(rows):
                continue
            paths = [row[0] for row in rows if in_site(row[0]) and not row[0].endswith(".pyc")]
            freed = sum(link_module(source_site / path, target_site / path) for path in paths)
            if freed:
                print(
                    f"share_dists: {key[0]} {key[1]}: {freed / 2**20:.0f} MB linked to "
                    f"{source_site}"
                )
                saved += freed
            break
    print(f"share_dists: {target_env}: {saved / 2**20:.0f} MB freed")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__.splitlines()[0])
    share(Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:] if Path(arg) != Path(sys.argv[1])])
