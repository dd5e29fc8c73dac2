"""``specenergy faults [--faults A,B] [--sizes 8x32,16x64] [--] PYTEST ARGS``: the suite run once
healthy and once under each reference-server fault (``--specenergy-fault``), and per test which
faults it catches (passed healthy, failed faulted) and which pass silently; a fault a test misses
is run again at growing sizes (``--specenergy-size``, prompts x tokens) until the test catches it,
so the table says how large a test must be. ``numerical-noise`` is the other way round: it is
rounding, not a bug, so a test must pass under it (``tolerated``); one that fails is a false
alarm. Exit 0 when every bug fault was caught by some test and no test raised a false alarm, 1
otherwise, 2 when the healthy run itself did not pass."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from typing import Sequence

from pytest_specenergy.options import FAULTS  # the fault names (the reference server owns them)

#: Faults a correct suite passes: they emulate what a healthy engine does (bf16 kernels rounding
#: differently at different step shapes), so a test failing under them fails healthy GPU runs too.
TOLERATED = frozenset({"numerical-noise"})
#: The sizes (prompts x max_new_tokens) a missed fault is tried at, smallest first.
DEFAULT_SIZES = ((8, 32), (16, 64))
#: Runs one pytest command (the arguments after ``-m pytest``); returns its exit status.
Runner = Callable[[list[str]], int]


@dataclass(frozen=True)
class Sweep:
    """What a sweep found: per test its healthy outcome, per (fault, test) the outcome at the
    suite's own size, and per missed (fault, test) the first size that caught it (None: none)."""

    healthy: dict[str, str]
    faulted: dict[str, dict[str, str]]
    caught_at: dict[tuple[str, str], str | None]

    def cell(self, fault: str, test: str) -> str:
        """``caught``, ``caught at 16x64``, ``silent`` or ``-`` (failed healthy: nothing to tell);
        for a :data:`TOLERATED` fault ``tolerated`` or ``false alarm``."""
        if self.healthy.get(test) != "passed":
            return "-"
        failed = self.faulted[fault].get(test) in ("failed", "error")
        if fault in TOLERATED:
            return "false alarm" if failed else "tolerated"
        if failed:
            return "caught"
        size = self.caught_at.get((fault, test))
        return f"caught at {size}" if size else "silent"

    def missed(self) -> list[str]:
        """Bug faults no test caught at any size."""
        return [
            fault
            for fault in self.faulted
            if fault not in TOLERATED
            and not any(self.cell(fault, test).startswith("caught") for test in self.healthy)
        ]

    def false_alarms(self) -> list[str]:
        """Tolerated faults some test failed under."""
        return [
            fault
            for fault in self.faulted
            if any(self.cell(fault, test) == "false alarm" for test in self.healthy)
        ]

    def table(self) -> str:
        """One row per fault, one column per test."""
        tests = sorted(self.healthy)
        width = max((len(f) for f in self.faulted), default=5)
        cols = [max(len(_short(t)), 16) for t in tests]
        lines = [
            f"{'fault':<{width}}  " + "  ".join(f"{_short(t):<{w}}" for t, w in zip(tests, cols)),
            "-" * width + "  " + "  ".join("-" * w for w in cols),
        ]
        for fault in self.faulted:
            cells = (f"{self.cell(fault, t):<{w}}" for t, w in zip(tests, cols))
            lines.append(f"{fault:<{width}}  " + "  ".join(cells))
        return "\n".join(lines)


def _short(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[-1]


def outcomes(junit: Path) -> dict[str, str]:
    """Per test node id (from a JUnit XML report of family xunit1, whose test cases name their
    file), ``passed``, ``failed``, ``error`` or ``skipped``."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        file, name = case.get("file", ""), case.get("name", "")
        owner = case.get("classname", "").rsplit(".", 1)[-1]
        parts = [file, *([owner] if owner != Path(file).stem else []), name]
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        found["::".join(parts)] = outcome.replace("failure", "failed")
    return found


def _run(runner: Runner, args: list[str], folder: Path, name: str, extra: list[str]) -> dict:
    junit = folder / f"{name}.xml"
    runner(
        [
            *args,
            *extra,
            f"--junitxml={junit}",
            "-o",
            "junit_family=xunit1",
            "-p",
            "no:cacheprovider",
        ]
    )
    if not junit.exists():
        raise SystemExit(f"specenergy faults: pytest wrote no report for the {name} run")
    return outcomes(junit)


def sweep(
    args: list[str],
    faults: Sequence[str],
    sizes: Sequence[tuple[int, int]],
    runner: Runner,
    folder: Path,
) -> Sweep:
    """Run the suite healthy, under each fault, and each missed fault at ``sizes``."""
    healthy = _run(runner, args, folder, "healthy", [])
    faulted = {f: _run(runner, args, folder, f, [f"--specenergy-fault={f}"]) for f in faults}
    caught_at: dict[tuple[str, str], str | None] = {}
    for fault, found in faulted.items():
        if fault in TOLERATED:
            continue  # a test must pass it at the suite's own size; nothing to grow
        missed = {
            t
            for t, o in healthy.items()
            if o == "passed" and found.get(t) not in ("failed", "error")
        }
        for prompts, tokens in sizes:
            if not missed:
                break
            size = f"{prompts}x{tokens}"
            # only the tests that missed it run again
            others = (f"--deselect={t}" for t in healthy if t not in missed)
            extra = [f"--specenergy-fault={fault}", f"--specenergy-size={size}", *others]
            larger = _run(runner, args, folder, f"{fault}-{size}", extra)
            for test in sorted(missed):
                if larger.get(test) in ("failed", "error"):
                    caught_at[(fault, test)] = size
            missed = {t for t in missed if (fault, t) not in caught_at}
        for test in missed:
            caught_at[(fault, test)] = None
    return Sweep(healthy, faulted, caught_at)


def _sizes(text: str) -> tuple[tuple[int, int], ...]:
    sizes = []
    for part in text.split(","):
        prompts, _, tokens = part.strip().lower().partition("x")
        if not (prompts.isdigit() and tokens.isdigit() and int(prompts) and int(tokens)):
            raise argparse.ArgumentTypeError(
                f"expected PROMPTSxTOKENS[,...] (8x32,16x64), got {text!r}"
            )
        sizes.append((int(prompts), int(tokens)))
    return tuple(sizes)


def _faults(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in FAULTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown fault(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(FAULTS)}"
        )
    return names


def pytest_runner(argv: list[str]) -> int:
    """Run ``python -m pytest ARGV`` in this interpreter, its output passed through."""
    return subprocess.run([sys.executable, "-m", "pytest", *argv], check=False).returncode


def main(argv: Sequence[str], runner: Runner = pytest_runner) -> int:
    """The sweep's command line; its table on stdout."""
    parser = argparse.ArgumentParser(prog="specenergy faults", description=__doc__)
    parser.add_argument("--faults", type=_faults, default=tuple(FAULTS), help="comma-separated")
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=DEFAULT_SIZES,
        help="PROMPTSxTOKENS[,...]: where a missed fault is tried again (default 8x32,16x64)",
    )
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's")
    args = parser.parse_args(list(argv))
    pytest_args = [a for a in args.pytest_args if a != "--"]
    if pytest_args[:1] == ["pytest"]:
        pytest_args = pytest_args[1:]
    with tempfile.TemporaryDirectory(prefix="specenergy-faults-") as folder:
        found = sweep(pytest_args, args.faults, args.sizes, runner, Path(folder))
    if not any(o == "passed" for o in found.healthy.values()):
        print("specenergy faults: no test passed healthy; nothing can be swept", file=sys.stderr)
        return 2
    print("specenergy fault sweep (caught: the test failed under the fault and passed healthy;")
    print(
        "silent: it passed under the fault at every size tried; caught at PxT: only at that size;"
    )
    print(f"tolerated / false alarm: {', '.join(sorted(TOLERATED))} is rounding, a test must pass)")
    print(found.table())
    missed, false_alarms = found.missed(), found.false_alarms()
    if missed:
        print(f"passed every test at every size: {', '.join(missed)}")
    if false_alarms:
        print(f"a test failed under rounding alone: {', '.join(false_alarms)}")
    return 1 if missed or false_alarms else 0
