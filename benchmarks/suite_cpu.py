"""Prints where a command's CPU time goes, by kind of process: the reference engines (forked from
the engine zygote, or started plainly), real SGLang servers, pytest processes (the session, its
xdist workers, pytester's subprocess runs) and the rest. Made for ``dev/test.sh``'s budget: on a
2-core machine its wall time is its CPU time over 2, so what to cut is where the CPU goes.

The command runs as a child of this script; every process descending from it is sampled from
``/proc`` every ``--interval`` seconds (its user + system time when last seen), so a process
that starts and ends between two samples is missed, and one whose parent ended before it was
first seen is not counted (it belongs to init by then). The printed total beside the machine's
own busy time (``/proc/stat``, over the same wall time) says how much was missed.

Usage: .venv/bin/python benchmarks/suite_cpu.py [--interval S] [--log FILE] [-- COMMAND...]
       (default COMMAND: bash dev/test.sh; its output goes to FILE, default suite_cpu.log)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")

#: Kinds of process by their command line, first match wins: (kind, any of these substrings).
KINDS = (
    ("reference engines (zygote)", ("pytest_specenergy.engines.zygote_serve",)),
    ("reference engines (plain start)", ("pytest_specenergy.refserver",)),
    # before SGLang: a watchdog's command line holds its server's after "--"
    ("engine watchdogs", ("pytest_specenergy.engines.watchdog",)),
    ("SGLang servers", ("sglang.launch_server", "multiprocessing.spawn", "sglang::")),
    # pytest, pytester's subprocess runs, and xdist's workers (execnet reads their code on stdin)
    ("pytest processes", ("-m pytest", "-mpytest", "bin/pytest", "sys.stdin.readline")),
)


@dataclass
class Seen:
    """One process as last sampled."""

    parent: int
    command: str
    cpu_s: float


def kind_of(command: str) -> str:
    """The kind of process ``command`` (its ``/proc/PID/cmdline``, NULs as spaces) is."""
    return next((kind for kind, marks in KINDS if any(m in command for m in marks)), "other")


def _stat(pid: str) -> tuple[int, str, float] | None:
    """(parent pid, start time, CPU seconds) of ``pid``, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[19], (int(fields[11]) + int(fields[12])) / TICK


def _command(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def sample(root: int, seen: dict[tuple[int, str], Seen]) -> None:
    """Update ``seen`` (keyed by pid and start time: pids are reused) with every process that
    descends from ``root``."""
    known = {pid for pid, _ in seen} | {root}
    fresh: dict[tuple[int, str], Seen] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(entry)
        if stat is None:
            continue
        parent, started, cpu = stat
        key = (int(entry), started)
        if key in seen:
            seen[key].cpu_s = cpu
            # a forked child execs after it was first seen: keep the newest command line
            seen[key].command = _command(entry) or seen[key].command
        else:
            fresh[key] = Seen(parent, _command(entry), cpu)
    # A new process counts if its parent does; a child and its parent may both be new.
    while True:
        added = {k: v for k, v in fresh.items() if v.parent in known or k[0] == root}
        if not added:
            return
        for key, value in added.items():
            seen[key] = value
            known.add(key[0])
            del fresh[key]


def busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (all but idle and iowait)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--log", type=Path, default=Path("suite_cpu.log"), help="command output")
    parser.add_argument("command", nargs="*", help="the command (after --)")
    args = parser.parse_args(argv)
    command = args.command or ["bash", "dev/test.sh"]
    seen: dict[tuple[int, str], Seen] = {}
    machine0, wall0 = busy_s(), time.monotonic()
    with args.log.open("w") as log:
        child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        while child.poll() is None:
            sample(child.pid, seen)
            time.sleep(args.interval)
    wall, machine = time.monotonic() - wall0, busy_s() - machine0
    totals: dict[str, list[float]] = {}
    for process in seen.values():
        entry = totals.setdefault(kind_of(process.command), [0, 0.0])
        entry[0] += 1
        entry[1] += process.cpu_s
    counted = sum(cpu for _, cpu in totals.values())
    print(f"command: {' '.join(command)} (exit {child.returncode}; output in {args.log})")
    print(f"{'kind of process':34} {'processes':>9} {'CPU s':>8} {'share':>6}")
    for kind, (count, cpu) in sorted(totals.items(), key=lambda item: -item[1][1]):
        print(f"{kind:34} {count:9d} {cpu:8.1f} {cpu / max(counted, 1e-9):6.1%}")
    print(f"{'counted':34} {len(seen):9d} {counted:8.1f}")
    print(
        f"wall {wall:.1f} s; the machine was busy {machine:.1f} CPU s over it "
        f"({machine / wall:.2f} of {os.cpu_count()} cores; counted here: {counted / wall:.2f})"
    )
    tail = args.log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    print(f"last line: {tail[0]}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
