"""benchmarks/suite_cpu.py counts the CPU of the command's own process tree, by kind, and
nothing else running on the machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Burns ``seconds`` of its own CPU time (not wall time: the figure must not depend on load).
BURN = "import sys, time\nwhile time.process_time() < float(sys.argv[1]): pass\n"


def test_the_command_tree_is_counted_by_kind_and_a_stranger_is_not(tmp_path: Path) -> None:
    burn = tmp_path / "burn.py"
    burn.write_text(BURN)
    # The command burns 0.6 s and starts a child whose command line reads as an SGLang
    # server's, which burns 0.6 s; a busy process outside its tree burns 1.5 s meanwhile.
    command = tmp_path / "command.py"
    command.write_text(
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, {str(burn)!r}, '0.6', 'sglang.launch_server'])\n"
        f"exec(open({str(burn)!r}).read().replace('sys.argv[1]', '0.6'))\n"
        "child.wait()\n"
    )
    stranger = subprocess.Popen([sys.executable, str(burn), "1.5"])
    try:
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "suite_cpu.py"),
                "--interval=0.05",
                f"--log={tmp_path / 'out.log'}",
                "--",
                sys.executable,
                str(command),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stranger.wait(60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        m.group(1).strip(): (int(m.group(2)), float(m.group(3)))
        for m in re.finditer(r"^(.{34}) +(\d+) +([\d.]+) +[\d.]+%$", done.stdout, re.M)
    }
    assert rows["SGLang servers"][0] == 1 and 0.5 <= rows["SGLang servers"][1] <= 0.9, done.stdout
    assert rows["other"][0] == 1 and 0.5 <= rows["other"][1] <= 0.9, done.stdout
    counted = float(re.search(r"^counted +\d+ +([\d.]+)$", done.stdout, re.M).group(1))
    assert counted < 2.0, done.stdout  # the stranger's 1.5 s is not among them
    assert "wall " in done.stdout and "the machine was busy" in done.stdout


def test_kinds_follow_the_command_line() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from suite_cpu import kind_of

    assert kind_of("python -m pytest_specenergy.engines.zygote_serve --fd 3") == (
        "reference engines (zygote)"
    )
    assert kind_of("python -m pytest_specenergy.refserver --model tiny:dense") == (
        "reference engines (plain start)"
    )
    assert kind_of("python -c from multiprocessing.spawn import spawn_main") == "SGLang servers"
    watchdog = "python -m pytest_specenergy.engines.watchdog -- python -m sglang.launch_server"
    assert kind_of(watchdog) == "engine watchdogs"
    assert kind_of("python -u -c import sys;exec(eval(sys.stdin.readline()))") == (
        "pytest processes"
    )
    assert kind_of("chromium --headless") == "other"
