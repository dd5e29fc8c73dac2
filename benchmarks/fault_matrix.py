"""The fault matrix: every probe of faults and bad input, old and new, with its outcome.

Each probe is a small self-contained scenario in its own temporary folder, run as a CI pipeline and
its users would hit it: a tiny pytest suite on the reference server (``tiny:dense``, 2 prompts, 16
new tokens, 1 or 2 repeats, no warm-up), a ``specenergy`` CLI call, or a request to a reference
server. One row per probe: id, what was done, the expected outcome, the observed outcome (exit
status and the decisive line of output), and PASS/FAIL of the expectation. Probes that need a GPU,
real SGLang, or a harness this script does not automate are listed as SKIPPED with the reason, never
dropped.

Sources of the probe list (ids keep the audits' numbering):
  ``R-*``   the 32 rows of the first audit (reference/fault-audit.md), as re-run in reliability-audit-2
  ``N*``    the 45 new probes of reference/reliability-audit-2.md
  ``I23-*`` the 20 items of issue 23 (several are the same fault as an N probe: the row names both)
  ``T*``    reliability-audit-3's 47 new probes: the zygote, SIGHUP and the server's connection
            slots (T9-T15, T27, T44) in fault_zygote.py; the gate, history, CLI and reports in
            fault_gate.py; the servers, caps, disks and signals in fault_hosts.py, which also
            automates the earlier rows once listed as not run (R-1d, R-1e, R-3d, R-3e, N1, ...)
  ``I38-5``, ``I40-2`` engine faults a suite must catch: a dead drafter, the hybrid's
            partial-accept-state bug at the quickstart's size
A row answers every audit id in its name (``N15.storage-full/T17`` answers N15 and T17); the
run ends with the count of the audit's 77 earlier and 47 new probes by their rows' worst verdict.

Usage:
  PYTHONPATH=$PWD .venv/bin/python benchmarks/fault_matrix.py [--quick] [--only ID[,ID]] [--list]
      [--package DIR]   (DIR's pytest_specenergy instead of this checkout's: the table before)

Every child process has a timeout and runs in its own process group, which is killed when the
timeout passes; engines die with their pytest through the plugin's watchdog.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
#: The folder whose ``pytest_specenergy`` every child process runs (``--package``: another checkout's,
#: for the table before a change).
PACKAGE = REPO
PY = sys.executable
CLI = [PY, "-c", "import sys; from pytest_specenergy.cli.main import main; sys.exit(main())"]
FAST = ["-p", "no:cacheprovider", "--specenergy-warmup=0"]
USAGE, COLLECT = 4, 2  # pytest's exit codes for a usage error and an interrupted/collection error

SUITE = """
import pytest

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=16, prompts=2)
def test_p(spec_pair):
    spec_pair.measure()
"""

# test_a finishes quickly; test_b keeps the engines busy long enough to be interrupted.
TWO_TESTS = """
import pytest

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code"), pytest.mark.drafter("ngram"),
              pytest.mark.batch(1)]

@pytest.mark.generation(max_new_tokens=16, prompts=2)
def test_a(spec_pair):
    spec_pair.measure()

@pytest.mark.generation(max_new_tokens=3000, prompts=2, ignore_eos=True)
def test_b(spec_pair):
    spec_pair.measure()
"""


# ---------------------------------------------------------------------------------------------
# running things


@dataclass
class Obs:
    """What a probe saw: the exit status, the whole output, and notes added by its checks."""

    rc: int | None
    out: str
    notes: list[str] = field(default_factory=list)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE), env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _preexec(mem_gb: float | None) -> Callable[[], None]:
    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background shell may have ignored it
        if mem_gb:
            import resource

            limit = int(mem_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return setup


def run_cmd(args: list[str], cwd: Path, timeout: float = 240, mem_gb: float | None = None) -> Obs:
    """Run ``args`` in its own process group; kill the group when ``timeout`` passes (rc 124)."""
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
        preexec_fn=_preexec(mem_gb),
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return Obs(proc.returncode, out)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, _ = proc.communicate()
        return Obs(124, out + f"\n[fault_matrix] timed out after {timeout:.0f} s")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Spawned:
    """A background pytest whose output goes to a file, so a probe can wait for a line and signal
    it."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.log = cwd / "_output.txt"
        self._fh = open(self.log, "w")
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=child_env(),
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_preexec(None),
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.text(), re.M):
                return True
            if self.proc.poll() is not None:
                return bool(re.search(pattern, self.text(), re.M))
            time.sleep(0.2)
        return False

    def finish(self, timeout: float) -> Obs:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc.pid)
            self.proc.wait()
            rc = 124
        self._fh.close()
        return Obs(rc, self.text())


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def servers_of(pid: int, speculative: bool | None = None) -> list[int]:
    """Engine server processes under ``pid``; ``speculative`` picks the drafter's or the twin's.

    A server writes to its engine's log (``<stamp>-<label>-<port>.log``, the label naming the arm)
    and is not its process group's leader (its watchdog is). Its command line cannot tell: one
    forked from the zygote shows the zygote's (R-1a and N4 found nothing to kill after the zygote
    came), and ``--speculative`` never appears in a reference server's (N4 killed nothing, R-1a
    both)."""
    found = []
    for p in descendants(pid):
        try:
            log = Path(os.readlink(f"/proc/{p}/fd/2")).name
            group = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, IndexError, ValueError):
            continue
        if not log.endswith(".log") or group == p:
            continue
        drafting = not re.search(r"_baseline_-\d+\.log$", log)
        if speculative is None or drafting == speculative:
            found.append(p)
    return found


def pytest_args(*extra: str, repeats: int = 1) -> list[str]:
    return [PY, "-m", "pytest", *FAST, f"--specenergy-repeats={repeats}", *extra]


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def suite_run(
    folder: Path,
    *extra: str,
    suite: str = SUITE,
    files: dict[str, str] | None = None,
    repeats: int = 1,
    timeout: float = 240,
) -> Obs:
    write(folder, {"test_p.py": suite, **(files or {})})
    return run_cmd(pytest_args(*extra, repeats=repeats), folder, timeout=timeout)


def cli(folder: Path, *args: str, timeout: float = 60) -> Obs:
    return run_cmd([*CLI, *args], folder, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# a stored run shared by the CLI and baseline probes (made once per matrix run)


class Fixture:
    """A folder (a git repository) holding one complete saved run ``main`` (2 repeats) and run.json."""

    root: Path | None = None
    work: Path = Path(tempfile.gettempdir())

    @classmethod
    def get(cls) -> Path:
        if cls.root is None:
            root = cls.work / "fixture"
            root.mkdir()
            write(root, {"test_p.py": SUITE})
            for git in (
                ["init", "-q"],
                ["add", "-A"],
                ["-c", "user.name=fm", "-c", "user.email=fm@localhost", "commit", "-qm", "fixture"],
            ):
                subprocess.run(["git", *git], cwd=root, capture_output=True, timeout=30)
            obs = run_cmd(
                pytest_args("--specenergy-save=main", "--specenergy-json=run.json", repeats=2),
                root,
                timeout=300,
            )
            if obs.rc != 0 or not (root / "run.json").exists():
                raise RuntimeError(f"the fixture run failed (rc {obs.rc}):\n{obs.out[-3000:]}")
            cls.root = root
        return cls.root

    @classmethod
    def document(cls) -> dict:
        return json.loads((cls.get() / "run.json").read_text())

    @classmethod
    def storage_into(cls, folder: Path) -> Path:
        """Copy the fixture's history (logs included) into ``folder``; return its run folder."""
        shutil.copytree(cls.get() / ".specenergy", folder / ".specenergy")
        return stored_runs(folder)[0].parent


def stored_runs(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / ".specenergy").rglob("[0-9][0-9][0-9][0-9]_*.json"))


def edited_run(folder: Path, name: str, edit: Callable[[dict], None]) -> Path:
    doc = Fixture.document()
    edit(doc)
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


def every_sample(doc: dict):
    for result in doc["results"]:
        for arm in ("baseline", "speculative"):
            yield from result[arm]["samples"]


def md5(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# the probe table


@dataclass
class Probe:
    """One row: ``run`` makes the scenario in a fresh folder; the outcome must match the
    expectation: the exit status is in ``rc`` (None: any), ``text`` (a regex) is in the output,
    ``absent`` is not, and ``check`` (folder, obs) returns None or what went wrong."""

    id: str
    did: str
    expected: str
    run: Callable[[Path], Obs] | None = None
    rc: tuple[int, ...] | None = None
    text: str | None = None
    absent: str | None = None
    check: Callable[[Path, Obs], str | None] | None = None
    quick: bool = False
    skip: str | None = None


PROBES: list[Probe] = []


def probe(id: str, did: str, expected: str, **kw) -> Callable:
    def add(fn: Callable[[Path], Obs]) -> Callable[[Path], Obs]:
        PROBES.append(Probe(id, did, expected, run=fn, **kw))
        return fn

    return add


def skipped(id: str, did: str, expected: str, reason: str) -> None:
    PROBES.append(Probe(id, did, expected, skip=reason))


def option_probe(id: str, option: str, message: str, quick: bool = False, **kw) -> None:
    """A bad option value: a usage error at start (rc 4) naming the option, before any engine
    starts."""
    PROBES.append(
        Probe(
            id,
            f"pytest {option}",
            f"rc 4 at start: {message}",
            quick=quick,
            run=lambda d, o=option: suite_run(d, *o.split(" "), timeout=90),
            rc=(USAGE,),
            text=re.escape(option.split("=")[0]) + ".*" + message,
            **kw,
        )
    )


def _untouched(path_of: Callable[[Path], Path], digest: dict) -> Callable[[Path, Obs], str | None]:
    def check(folder: Path, obs: Obs) -> str | None:
        path = path_of(folder)
        if not path.exists():
            return f"{path.name} is gone"
        if md5(path) != digest.get(str(path)):
            return f"{path.name} was modified"
        obs.notes.append(f"{path.name} unchanged")
        return None

    return check


# --- option values checked at start (R-4e, R-4f, R-4g, N7, N8, N10, N44, I23-12/13/14) --------

option_probe("R-4e.repeats", "--specenergy-repeats=0", "expected a positive integer", quick=True)
option_probe("R-4e.meter", "--specenergy-meter=bogus", "")
option_probe("R-4e.compare-fail", "--specenergy-compare-fail=nonsense", "")
option_probe("R-4e.warmup", "--specenergy-warmup=-3", "")
option_probe("R-4e.max-repeats", "--specenergy-max-repeats=2 --specenergy-repeats=3", "at least")
option_probe("R-4e.request-timeout", "--specenergy-request-timeout=0", "seconds > 0")
option_probe("R-4e.checks", "--specenergy-checks=bogus", "")
option_probe("R-4e.xdist", "--specenergy-xdist=bogus", "")
option_probe("R-4f.alpha", "--specenergy-alpha=2", "between 0 and 1", quick=True)
option_probe("R-4f.alpha-nan", "--specenergy-alpha=nan", "between 0 and 1")
option_probe("R-4g.startup-timeout", "--specenergy-startup-timeout=-5", "seconds > 0")
option_probe("R-4g.fault", "--specenergy-fault=bogus", "unknown fault")
option_probe("R-4g.storage-url/I23-12", "--specenergy-storage=http://x", "", quick=True)
option_probe("R-3f.save-traversal", "--specenergy-save=../../etc/x", "contains")
option_probe("R-3g.save-too-long/I23-7", "--specenergy-save=" + "n" * 300, "", quick=True)
option_probe("N7.pool-zero", "--specenergy-pool=0", "expected a prompt count")
option_probe("N7.pool-abc", "--specenergy-pool=abc", "expected a prompt count")
option_probe("N10.latency-target", "--specenergy-latency-target=-1", "")
option_probe("N44.modeled-bogus/I23-14", "--specenergy-meter=modeled:bogus", "bogus", quick=True)
option_probe("I23-13.pool-5000", "--specenergy-pool=5000", "", quick=True)


@probe(
    "N8.pool-huge/I23-13",
    "pytest --specenergy-pool=99999999999999999999999 (address space capped at 6 GiB)",
    "rc 4 at start naming the option (no OOM)",
    rc=(USAGE,),
    text=r"--specenergy-pool",
)
def _pool_huge(d: Path) -> Obs:
    write(d, {"test_p.py": SUITE})
    return run_cmd(
        pytest_args("--specenergy-pool=99999999999999999999999"), d, timeout=120, mem_gb=6
    )


# --- outputs checked for writability at start (N14, N32, N33, N16, I23-7, I23-10) -------------


@probe(
    "N14.storage-unwritable/I23-7",
    "pytest --specenergy-save=main --specenergy-storage=<a path under a "
    "regular file> (root ignores read-only modes, so the folder cannot be made otherwise)",
    "rc 4 at start naming the storage",
    rc=(USAGE,),
    text=r"storage",
    quick=True,
)
def _storage_unwritable(d: Path) -> Obs:
    (d / "afile").write_text("x")
    return suite_run(d, "--specenergy-save=main", "--specenergy-storage=afile/store", timeout=120)


@probe(
    "N32.json-unwritable/I23-7",
    "pytest --specenergy-json=<path under a regular file> --specenergy-save=main",
    "rc 4 at start naming --specenergy-json",
    rc=(USAGE,),
    text=r"--specenergy-json",
    quick=True,
)
def _json_unwritable(d: Path) -> Obs:
    (d / "afile").write_text("x")
    return suite_run(d, "--specenergy-save=main", "--specenergy-json=afile/run.json", timeout=120)


_digests: dict = {}


def _json_onto_baseline(d: Path) -> Obs:
    path = edited_run(d, "baseline.json", lambda doc: None)
    _digests[str(path)] = md5(path)
    return suite_run(
        d, "--specenergy-compare=baseline.json", "--specenergy-json=baseline.json", timeout=240
    )


PROBES.append(
    Probe(
        "N33.json-onto-baseline/I23-10",
        "pytest --specenergy-compare=baseline.json --specenergy-json=baseline.json",
        "refused (rc 4), the baseline file unchanged",
        run=_json_onto_baseline,
        rc=(USAGE,),
        text=r"baseline\.json",
        check=_untouched(lambda d: d / "baseline.json", _digests),
        quick=True,
    )
)


@probe(
    "N16.golden-unwritable",
    "pytest --specenergy-golden=check --specenergy-baselines=<path under a regular file>",
    "a named refusal, no raw OSError traceback",
    rc=(USAGE, 1),
    text=r"baselines|golden",
    absent=r"^E\s+OSError|^OSError",
)
def _golden_unwritable(d: Path) -> Obs:
    (d / "afile").write_text("x")
    return suite_run(
        d, "--specenergy-golden=check", "--specenergy-baselines=afile/golden", timeout=240
    )


# --- markers and corpora at collection (R-4a, R-4b, N22, N23, N40, N41, I23-14, I23-16) -------


def collect(d: Path, suite: str, files: dict[str, str] | None = None) -> Obs:
    return suite_run(d, "--collect-only", "-q", suite=suite, files=files, timeout=90)


def corpus_suite(path: str) -> str:
    return SUITE.replace('corpus("code")', f'corpus("jsonl:{path}")')


CORPORA = {
    "malformed": ('{"prompt": "a"}\n{"prompt": "b\n', r"line 2: not valid JSON"),
    "not-utf8": (None, r"not UTF-8"),
    "empty": ("", r"no prompts"),
    "number": ('{"prompt": 42}\n', r"line 1"),
}
for _name, (_text, _msg) in CORPORA.items():

    def _corpus(d: Path, name=_name, text=_text) -> Obs:
        path = d / f"{name}.jsonl"
        if text is None:
            path.write_bytes(b'{"prompt": "caf\xe9 \xff"}\n')
        else:
            path.write_text(text)
        return collect(d, corpus_suite(path.name))

    PROBES.append(
        Probe(
            f"R-4a.{_name}",
            f"corpus file {_name}.jsonl, --collect-only",
            f"collection error naming file and line ({_msg})",
            run=_corpus,
            rc=(COLLECT,),
            text=_msg,
            absent=r"Traceback",
            quick=_name == "malformed",
        )
    )


@probe(
    "R-4b.text-alias",
    'corpus line {"text": ...} only, --collect-only',
    "collected (documented alias)",
    rc=(0,),
    text=r"1 test collected|test_p\.py::test_p",
)
def _text_alias(d: Path) -> Obs:
    (d / "t.jsonl").write_text('{"text": "hello world"}\n{"text": "again"}\n')
    return collect(d, corpus_suite("t.jsonl"))


@probe(
    "N22.lone-surrogate/I23-16",
    r'corpus line {"prompt": "lone \ud800 here"}, --collect-only',
    "collection error naming file and line, no UnicodeEncodeError traceback",
    rc=(COLLECT,),
    text=r"surrogate\.jsonl.*line 1|line 1.*surrogate",
    absent=r"UnicodeEncodeError",
    quick=True,
)
def _surrogate(d: Path) -> Obs:
    (d / "surrogate.jsonl").write_text('{"prompt": "lone \\ud800 here"}\n{"prompt": "fine"}\n')
    return collect(d, corpus_suite("surrogate.jsonl"))


@probe(
    "N23.model-missing",
    'model("does/not/exist"), --collect-only',
    "collection error naming the marker",
    rc=(COLLECT,),
    text=r"marker model.*does/not/exist",
)
def _model_missing(d: Path) -> Obs:
    return collect(d, SUITE.replace('"tiny:dense"', '"does/not/exist"'))


@probe(
    "N40.dtype-marker/I23-14",
    'model("tiny:dense", dtype="float64 --host 0.0.0.0"), --collect-only',
    "collection error naming the test and dtype",
    rc=(COLLECT,),
    text=r"dtype",
    quick=True,
)
def _dtype_marker(d: Path) -> Obs:
    return collect(d, SUITE.replace('"tiny:dense"', '"tiny:dense", dtype="float64 --host 0.0.0.0"'))


@probe(
    "N40.device-marker/I23-14",
    'model("tiny:dense", device="cpu; touch PWNED"), --collect-only',
    "collection error naming device; no PWNED file",
    rc=(COLLECT,),
    text=r"device",
    check=lambda d, o: "PWNED exists" if (d / "PWNED").exists() else None,
)
def _device_marker(d: Path) -> Obs:
    return collect(d, SUITE.replace('"tiny:dense"', '"tiny:dense", device="cpu; touch PWNED"'))


@probe(
    "N41.drafter-id-traversal",
    'Drafter("ngram", id="../../..x"), --collect-only',
    "collection error on the Drafter id",
    rc=(COLLECT,),
    text=r"Drafter id",
)
def _drafter_id(d: Path) -> Obs:
    suite = SUITE.replace('drafter("ngram")', 'drafter(Drafter("ngram", id="../../..x"))')
    return collect(d, "from pytest_specenergy import Drafter\n" + suite)


SGLANG_SUITE = """
import pytest

@pytest.mark.model("Qwen/Qwen3-8B", engine="sglang"{extra})
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1)
def test_s(spec_pair):
    spec_pair.measure()
"""
DRY = ["--specenergy-dry-run", "--specenergy-sglang-version=0.5.23"]


@probe(
    "N39.sglang-dry-run-control",
    "SGLang suite, --specenergy-dry-run --specenergy-sglang-version=0.5.23",
    "rc 0, prints the command with --host 127.0.0.1",
    rc=(0,),
    text=r"--host 127\.0\.0\.1",
)
def _sglang_control(d: Path) -> Obs:
    return suite_run(d, *DRY, suite=SGLANG_SUITE.format(extra=""), timeout=90)


@probe(
    "N39.sglang-list-host/I23-17",
    'SGLang option chat_template=["x", "--host", "0.0.0.0"], dry run',
    "refused: the dry run prints REFUSED for the option holding --host, no command carries it",
    text=r"REFUSED.*--host",
    absent=r"launch_server.*--host 0\.0\.0\.0",
    quick=True,
)
def _sglang_list_host(d: Path) -> Obs:
    return suite_run(
        d,
        *DRY,
        suite=SGLANG_SUITE.format(extra=', chat_template=["x", "--host", "0.0.0.0"]'),
        timeout=90,
    )


@probe(
    "N39.sglang-dist-init",
    'SGLang option dist_init_addr="0.0.0.0:5000", dry run',
    "refused or kept on loopback",
    rc=(COLLECT, 1, USAGE),
    text=r"dist_init_addr|dist-init-addr",
)
def _sglang_dist(d: Path) -> Obs:
    return suite_run(
        d, *DRY, suite=SGLANG_SUITE.format(extra=', dist_init_addr="0.0.0.0:5000"'), timeout=90
    )


@probe(
    "N40.sglang-shell-meta",
    'SGLang chat_template="$(touch PWNED); --host 0.0.0.0", dry run',
    "rc 0, the value printed quoted as one argument, no PWNED file",
    rc=(0,),
    text=r"'\$\(touch PWNED\); --host 0\.0\.0\.0'",
    check=lambda d, o: "PWNED exists" if (d / "PWNED").exists() else None,
)
def _sglang_meta(d: Path) -> Obs:
    return suite_run(
        d,
        *DRY,
        suite=SGLANG_SUITE.format(extra=', chat_template="$(touch PWNED); --host 0.0.0.0"'),
        timeout=90,
    )


# --- specenergy predict (N11, I23-15) ----------------------------------------------------------

PREDICT = ["predict", "--shape", "qwen3-8b", "--verified", "4", "--accept-length", "2"]
for _pid, _extra, _quick in (
    ("context", ["--context", "-5"], True),
    ("draft-passes", ["--draft-shape", "qwen3-0.6b", "--draft-passes", "-3"], False),
    ("draft-cost-nan", ["--draft-cost", "nan"], True),
    ("draft-cost-neg", ["--draft-cost", "-5"], False),
    ("shape", [], False),
):
    _args = (
        ["predict", "--shape", "nope", "--verified", "4"] if _pid == "shape" else PREDICT + _extra
    )
    PROBES.append(
        Probe(
            f"N11.predict-{_pid}/I23-15",
            "specenergy " + " ".join(_args),
            "rc 2, the value named",
            run=lambda d, a=_args: cli(d, *a),
            rc=(2,),
            text=r"error|expected|unknown",
            quick=_quick,
        )
    )


# --- the CLI on stored runs (R-3c, R-6a, R-6c, N12, N13, N35-N38, I23-1/8/10/11/12) ------------


@probe(
    "I23-1.cli-after-pytest/T40",
    "pytest --specenergy-save=main (leaves .specenergy/logs), then "
    "`specenergy history` in that folder",
    "rc 0 (logs is not a machine key)",
    rc=(0,),
    absent=r"machine keys",
    quick=True,
)
def _cli_after_pytest(d: Path) -> Obs:
    Fixture.storage_into(d)
    return cli(d, "history")


@probe(
    "I23-1.report-last/T40",
    "after a saved run: `specenergy report last --markdown r.md`",
    "rc 0, r.md written",
    rc=(0,),
    absent=r"machine keys",
    check=lambda d, o: None if (d / "r.md").exists() else "r.md missing",
)
def _report_last(d: Path) -> Obs:
    Fixture.storage_into(d)
    return cli(d, "report", "last", "--markdown", "r.md")


@probe(
    "I23-1.compare-path/T40",
    "`specenergy compare run.json run2.json` (two copies of one complete run)",
    "rc 0, no regression",
    rc=(0,),
)
def _compare_paths(d: Path) -> Obs:
    edited_run(d, "run.json", lambda doc: None)
    edited_run(d, "run2.json", lambda doc: None)
    return cli(d, "compare", "run.json", "run2.json")


def _report_onto_input(d: Path) -> Obs:
    path = edited_run(d, "victim.json", lambda doc: None)
    _digests[str(path)] = md5(path)
    return cli(d, "report", "victim.json", "--markdown", "victim.json")


PROBES.append(
    Probe(
        "N13.report-onto-run/I23-10",
        "specenergy report victim.json --markdown victim.json",
        "refused (rc 2), the run file unchanged",
        run=_report_onto_input,
        rc=(2,),
        text=r"victim\.json",
        check=_untouched(lambda d: d / "victim.json", _digests),
        quick=True,
    )
)


def _mark_interrupted(doc: dict) -> None:
    doc["interrupted"] = True


@probe(
    "N35.compare-interrupted/I23-11",
    "specenergy compare interrupted.json run.json (baseline saved by an interrupted session)",
    "said so: 'interrupted' in the output (or refused)",
    text=r"interrupted",
    quick=True,
)
def _compare_interrupted(d: Path) -> Obs:
    edited_run(d, "interrupted.json", _mark_interrupted)
    edited_run(d, "run.json", lambda doc: None)
    return cli(d, "compare", "interrupted.json", "run.json")


@probe(
    "N35.history-interrupted/I23-11",
    "specenergy history of a folder with one complete and one interrupted run",
    "the interrupted run is said (or left out)",
    text=r"interrupted",
)
def _history_interrupted(d: Path) -> Obs:
    folder = Fixture.storage_into(d)
    edited_run(folder, "0002_main_20261202_000000.json", _mark_interrupted)
    return cli(d, "history")


def _text_accept_lengths(doc: dict) -> None:
    for sample in every_sample(doc):
        sample["accept_lengths"] = ["x", "y"]


@probe(
    "N36.cli-accept-lengths-text/I23-11",
    'specenergy compare bad.json run.json, samples "accept_lengths": ["x", "y"]',
    "rc 2 naming bad.json (not rc 1, no traceback)",
    rc=(2,),
    text=r"bad\.json",
    absent=r"Traceback",
    quick=True,
)
def _cli_text_al(d: Path) -> Obs:
    edited_run(d, "bad.json", _text_accept_lengths)
    edited_run(d, "run.json", lambda doc: None)
    return cli(d, "compare", "bad.json", "run.json")


def _nan_text(doc: dict) -> None:
    for sample in every_sample(doc):
        sample["decode_joules"] = (
            "NaN?"  # a sample's energy_per_token is derived on reading, never read
        )


@probe(
    "R-3c.cli-nan-text",
    'specenergy compare bad.json run.json, sample "decode_joules": "NaN?"',
    "rc 2 naming the file and field",
    rc=(2,),
    text=r"bad\.json.*decode_joules",
    absent=r"Traceback",
)
def _cli_nan(d: Path) -> Obs:
    edited_run(d, "bad.json", _nan_text)
    edited_run(d, "run.json", lambda doc: None)
    return cli(d, "compare", "bad.json", "run.json")


@probe(
    "I23-12.compare-main-last",
    "one saved run; specenergy compare main last",
    "refused: the two references are the same run",
    rc=(2,),
    text=r"same",
    quick=True,
)
def _main_last(d: Path) -> Obs:
    Fixture.storage_into(d)
    return cli(d, "compare", "main", "last")


@probe(
    "R-4g.cli-storage-url/I23-12",
    "specenergy history --storage http://x",
    "refused (rc 2), no ./http: folder",
    rc=(2,),
    check=lambda d, o: "a local http: folder was made" if (d / "http:").exists() else None,
)
def _cli_storage_url(d: Path) -> Obs:
    return cli(d, "history", "--storage", "http://x")


for _pid, _content, _msg in (
    ("truncated", '{"schema_version": 1, "results": [', r"not valid JSON|truncated"),
    ("empty", "", r"empty"),
    ("garbage", "\x00\x01garbage", r"not valid JSON|not UTF-8|trunc"),
):

    def _broken(d: Path, content=_content) -> Obs:
        (d / "broken.json").write_text(content)
        return cli(d, "report", "broken.json", "--markdown", "r.md")

    PROBES.append(
        Probe(
            f"N12.report-{_pid}",
            f"specenergy report broken.json ({_pid} file)",
            "rc 2 naming the file, no traceback",
            run=_broken,
            rc=(2,),
            text=_msg,
            absent=r"Traceback",
        )
    )


@probe(
    "R-6c.history-nonexistent",
    "specenergy history /nonexistent/dir",
    "rc 2, named",
    rc=(2,),
    text=r"nonexistent",
    absent=r"Traceback",
)
def _history_missing(d: Path) -> Obs:
    return cli(d, "history", "/nonexistent/dir")


@probe(
    "R-6c.latency-target-abc",
    "specenergy report run.json --latency-target abc",
    "rc 2 usage error",
    rc=(2,),
    text=r"latency-target",
)
def _latency_abc(d: Path) -> Obs:
    edited_run(d, "run.json", lambda doc: None)
    return cli(d, "report", "run.json", "--markdown", "r.md", "--latency-target", "abc")


@probe(
    "R-6c.latency-target-neg",
    "specenergy report run.json --latency-target -5 (the plugin refuses -5)",
    "rc 2 usage error",
    rc=(2,),
    text=r"latency",
)
def _latency_neg(d: Path) -> Obs:
    edited_run(d, "run.json", lambda doc: None)
    return cli(d, "report", "run.json", "--markdown", "r.md", "--latency-target=-5")


def _evil_key(doc: dict) -> None:
    doc["machine_key"] = "../../../..evil"
    for result in doc["results"]:
        result["machine_key"] = "../../../..evil"


@probe(
    "N38.merge-evil-key",
    "specenergy merge evil.json --output m.json --save ok (machine_key '../../../..evil')",
    "refused (rc 2): not path-safe; nothing written outside",
    rc=(2,),
    text=r"path-safe",
    check=lambda d, o: "escaped the storage" if any(d.parent.parent.glob("*evil*")) else None,
)
def _merge_evil(d: Path) -> Obs:
    edited_run(d, "evil.json", _evil_key)
    return cli(d, "merge", "evil.json", "--output", "m.json", "--save", "ok")


XSS = "<script>alert(1)</script>"


def _xss(doc: dict) -> None:
    for result in doc["results"]:
        result["case"]["model"] = XSS
        result["case_id"] = result["case_id"] + '"><img src=x onerror=alert(2)>'


@probe(
    "R-6a.report-escapes",
    "specenergy report xss.json --html r.html --markdown r.md (model <script>..., "
    "case id with <img onerror>)",
    "rc 0, no raw <script>alert / <img src=x in either file",
    rc=(0,),
)
def _report_xss(d: Path) -> Obs:
    edited_run(d, "xss.json", _xss)
    obs = cli(d, "report", "xss.json", "--html", "r.html", "--markdown", "r.md")
    raw = [
        f
        for f in ("r.html", "r.md")
        if (d / f).exists() and re.search(r"<script>alert|<img src=x", (d / f).read_text())
    ]
    if raw:
        obs.rc, obs.out = 99, obs.out + f"\n[fault_matrix] raw payload in {', '.join(raw)}"
    return obs


@probe(
    "N43.file-modes",
    "modes of the saved run and run.json under umask 022",
    "0644 (readable by a CI artifact reader)",
    rc=(0,),
    text=r"modes 644 644",
)
def _modes(d: Path) -> Obs:
    root = Fixture.get()
    modes = [oct(p.stat().st_mode & 0o777)[2:] for p in (stored_runs(root)[0], root / "run.json")]
    return Obs(0, "modes " + " ".join(modes))


@probe(
    "I23-20.run-carries-commit",
    "the fixture run (in a git repository): does run.json name the commit?",
    "a sha and a dirty flag in the run document",
    rc=(0,),
    text=r"sha",
)
def _commit(d: Path) -> Obs:
    text = (Fixture.get() / "run.json").read_text()
    found = re.search(r'"sha":\s*"?[0-9a-f]*"?[^}]*"dirty":\s*\w+', text)
    return Obs(0, found.group(0) if found else "no sha/dirty in run.json")


@probe(
    "I23-20.ci-install",
    "example_suites/ci_gate/specenergy-gate.yml: install step",
    "installs this checkout (pip install -e .), not the unpublished package from the index",
    rc=(0,),
    text=r"pip install -e",
)
def _ci_install(d: Path) -> Obs:
    text = (REPO / "example_suites/ci_gate/specenergy-gate.yml").read_text()
    lines = [
        ln.strip()
        for ln in text.splitlines()
        if "pip install" in ln and not ln.strip().startswith("#")
    ]
    return Obs(0, "\n".join(lines) or "no pip install line")


# --- pytest sessions gated against a baseline (R-3a, R-3b, N31, N34, N36, N37, I23-3/5/8) -------


def gated(d: Path, edit: Callable[[dict], None] | None, *extra: str, repeats: int = 2) -> Obs:
    if edit is not None:
        edited_run(d, "baseline.json", edit)
    return suite_run(d, "--specenergy-compare=baseline.json", *extra, repeats=repeats, timeout=300)


@probe(
    "R-3-control.gate-passes",
    "pytest --specenergy-compare=<a copy of the fixture run>, repeats 2",
    "1 passed (the gate opens on a good baseline)",
    rc=(0,),
    text=r"1 passed",
)
def _gate_control(d: Path) -> Obs:
    return gated(d, lambda doc: None)


@probe(
    "N31.compare-missing-path/I23-5",
    "pytest --specenergy-compare=baseline.json (no such file)",
    "a usage error at start naming the file; nothing measured (issue 40 item 4)",
    rc=(USAGE,),
    text=r"--specenergy-compare=baseline\.json: no such file",
    absent=r"started in",
    quick=True,
)
def _compare_missing(d: Path) -> Obs:
    return gated(d, None, repeats=1)


@probe(
    "N31.compare-typo/I23-5",
    "fixture history; pytest --specenergy-compare=mian (typo of main)",
    "a usage error at start: no run 'mian', the available ones listed; nothing measured",
    rc=(USAGE,),
    text=r"--specenergy-compare=mian: no run 'mian'.*available",
    absent=r"started in",
)
def _compare_typo(d: Path) -> Obs:
    Fixture.storage_into(d)
    return suite_run(d, "--specenergy-compare=mian", timeout=240)


@probe(
    "I23-5.missing-baseline-warn",
    "pytest --specenergy-compare=mian --specenergy-missing-baseline=warn",
    "the documented opt-out: passes with a warning",
    rc=(0,),
    text=r"1 passed",
)
def _compare_typo_warn(d: Path) -> Obs:
    Fixture.storage_into(d)
    return suite_run(
        d, "--specenergy-compare=mian", "--specenergy-missing-baseline=warn", timeout=240
    )


@probe(
    "R-3a.truncated-last",
    "fixture history with a truncated 0002_main as last; pytest --specenergy-compare=last",
    "a usage error at start naming the file (nothing measured); the file unchanged",
    rc=(USAGE,),
    text=r"cannot be read.*0002_main",
)
def _truncated_last(d: Path) -> Obs:
    folder = Fixture.storage_into(d)
    (folder / "0002_main_20261202_000000.json").write_text(
        '{"schema_version": 1, "kind": "specenergy-run", "res'
    )
    return suite_run(d, "--specenergy-compare=last", timeout=240)


def _schema99(doc: dict) -> None:
    doc["schema_version"] = 99


@probe(
    "R-3b.schema-99",
    "pytest --specenergy-compare=baseline.json with schema_version 99",
    "a usage error at start naming the schema; nothing measured",
    rc=(USAGE,),
    text=r"schema_version 99",
)
def _schema(d: Path) -> Obs:
    return gated(d, _schema99, repeats=1)


@probe(
    "R-3c.pytest-nan-text",
    'pytest --specenergy-compare=baseline.json, sample "decode_joules": "NaN?"',
    "a usage error at start naming the file and field; nothing measured",
    rc=(USAGE,),
    text=r"baseline\.json.*decode_joules",
)
def _pytest_nan(d: Path) -> Obs:
    return gated(d, _nan_text, repeats=1)


@probe(
    "N34.compare-interrupted-path",
    "pytest --specenergy-compare=<a run saved by an interrupted session>",
    "a usage error at start: the baseline is interrupted; nothing measured",
    rc=(USAGE,),
    text=r"interrupted",
)
def _pytest_interrupted(d: Path) -> Obs:
    return gated(d, _mark_interrupted, repeats=1)


@probe(
    "N36.pytest-accept-lengths-text/I23-11",
    'pytest --specenergy-compare=baseline.json, samples "accept_lengths": ["x", "y"]',
    "a usage error at start naming baseline.json (no bare ValueError); nothing measured",
    rc=(USAGE,),
    text=r"baseline\.json.*accept_lengths|accept_lengths.*baseline\.json",
    absent=r"^E\s+ValueError",
)
def _pytest_text_al(d: Path) -> Obs:
    return gated(d, _text_accept_lengths, repeats=1)


def _null_energy(doc: dict) -> None:
    for sample in every_sample(doc):
        for key in ("energy_per_token", "decode_joules", "decode_tokens"):
            sample[key] = None


@probe(
    "N37.null-energy-baseline/I23-8",
    "pytest --specenergy-compare=baseline.json whose samples' energy "
    "figures are all null (default --specenergy-incomparable)",
    "the run fails, never a warning: refused at start (rc 4, a sample without its energy is no "
    "readable baseline), or the case fails",
    rc=(1, USAGE),
    text=r"incomparable|INCOMPARABLE|no energy|cannot be read",
    quick=True,
)
def _null_energy_probe(d: Path) -> Obs:
    return gated(d, _null_energy)


def _better_accept(doc: dict) -> None:
    for result in doc["results"]:
        for sample in result["speculative"]["samples"]:
            sample["accept_lengths"] = [a * 1.25 for a in sample["accept_lengths"]]
            # The sample's own accept length (1 + correct / verify) rises alike, so the row's
            # medians show the 25% the per-request bootstrap judges.
            if sample.get("correct_drafts") is not None and sample.get("verify_steps"):
                steps = sample["verify_steps"]
                sample["correct_drafts"] = round(1.25 * (sample["correct_drafts"] + steps) - steps)
        result["accept_length"] = result["accept_length"] * 1.25
        result["speculative"]["accept_length"] = result["speculative"]["accept_length"] * 1.25


@probe(
    "I23-3.one-limit-keeps-defaults/T39",
    "baseline with accept lengths 25% higher; pytest --specenergy-compare=baseline.json "
    "--specenergy-compare-fail=energy:5% (the README's own limit)",
    "the case fails on accept_length (the default accept-length limit still applies)",
    rc=(1,),
    text=r"accept_length.*(REGRESSED|regressed)|regressed.*accept_length",
    quick=True,
)
def _one_limit(d: Path) -> Obs:
    return gated(d, _better_accept, "--specenergy-compare-fail=energy:5%")


# --- plain pytest sessions (R-1c, R-4c, N3, N9, N21, N24, I23-2/6) -----------------------------


@probe(
    "BASE.suite-passes",
    "the base suite (tiny:dense, code, ngram, b1, 2 prompts, 16 tokens), repeats 1",
    "1 passed, a table row",
    rc=(0,),
    text=r"1 passed",
)
def _base(d: Path) -> Obs:
    return suite_run(d)


@probe(
    "R-3h.unicode-save-name",
    "pytest --specenergy-save='ünï-名前-🙂'",
    "saved under that name",
    rc=(0,),
    text=r"run saved: .*ünï-名前-🙂",
)
def _unicode_save(d: Path) -> Obs:
    return suite_run(d, "--specenergy-save=ünï-名前-🙂")


@probe(
    "R-1c.empty-checkpoint",
    'model("emptyckpt") (an empty folder) next to a good case',
    "that case fails quoting the engine's start-up error; the good one passes",
    rc=(1,),
    text=r"1 failed, 1 passed",
)
def _empty_ckpt(d: Path) -> Obs:
    (d / "emptyckpt").mkdir()
    suite = SUITE + SUITE.replace("def test_p", "def test_q").replace('"tiny:dense"', '"emptyckpt"')
    return suite_run(d, suite=suite, timeout=300)


@probe(
    "R-4c.long-prompt-isolated",
    "case A on a corpus with a 20000-token prompt, case B on code",
    "A fails with HTTP 400 (context), B passes",
    rc=(1,),
    text=r"1 failed, 1 passed",
)
def _long_prompt(d: Path) -> Obs:
    (d / "long.jsonl").write_text(json.dumps({"prompt": "word " * 20000}) + "\n")
    suite = SUITE.replace("def test_p", "def test_a").replace(
        'corpus("code")', 'corpus("jsonl:long.jsonl")'
    ).replace("prompts=2", "prompts=1") + SUITE.replace("def test_p", "def test_b")
    return suite_run(d, suite=suite, timeout=300)


@probe(
    "N9.pool-below-batch",
    "pytest --specenergy-pool=2 with batch(4)",
    "the case fails concurrency-below-batch (or the pool is refused)",
    rc=(1, USAGE, COLLECT),
    text=r"concurrency|pool",
)
def _pool_below(d: Path) -> Obs:
    suite = SUITE.replace("batch(1)", "batch(4)").replace(", prompts=2", "")
    return suite_run(d, "--specenergy-pool=2", suite=suite, timeout=300)


@probe(
    "N21.unicode-corpus",
    "corpus of emoji, RTL, combining marks, zero-width, CJK, control chars, BOM first",
    "1 passed",
    rc=(0,),
    text=r"1 passed",
)
def _unicode_corpus(d: Path) -> Obs:
    lines = [
        "\ufeff" + json.dumps({"prompt": "emoji 🙂🚀 and RTL שלום"}),
        json.dumps({"prompt": "combining e\u0301 zero\u200bwidth 名前 \x07ctl"}),
    ]
    (d / "u.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # The probe is about the text's path through the engines; n-gram accepts none of 240 drafts on
    # these two prompts of the tiny model (accept length 1.000), which the dead-drafter check
    # rightly fails, so the checks warn here.
    return suite_run(d, "--specenergy-checks=warn", suite=corpus_suite("u.jsonl"))


@probe(
    "N3.draft-removal",
    "pytest --specenergy-draft-removal=on, ngram",
    "1 passed",
    rc=(0,),
    text=r"1 passed",
)
def _removal(d: Path) -> Obs:
    return suite_run(d, "--specenergy-draft-removal=on")


@probe(
    "N24.relative-model-path/I23-16",
    'rootdir sub/ (pytest.ini, an empty ckpt/), model("ckpt"), pytest run from the parent folder',
    "the check resolves the path where the engine would (the working directory, "
    "which has no ckpt/): a collection error saying so, no engine started",
    rc=(COLLECT,),
    text=r"no such model directory .*relative to the working directory",
)
def _relative_model(d: Path) -> Obs:
    sub = d / "sub"
    (sub / "ckpt").mkdir(parents=True)
    write(sub, {"pytest.ini": "[pytest]\n", "test_p.py": SUITE.replace('"tiny:dense"', '"ckpt"')})
    return run_cmd(pytest_args("sub/test_p.py"), d, timeout=240)


@probe(
    "I23-2.xdist-default/R-7a",
    "pytest -n 2 (no --specenergy-xdist) on two cases",
    "both measured: 2 passed, none skipped",
    rc=(0,),
    text=r"2 passed",
    absent=r"skipped",
    quick=True,
)
def _xdist_default(d: Path) -> Obs:
    suite = SUITE + SUITE.replace("def test_p", "def test_q").replace("prompts=2", "prompts=3")
    return suite_run(d, "-n", "2", suite=suite, timeout=400)


KILL_SELF = """
import os, signal

def test_zz_dies():
    os.kill(os.getpid(), signal.SIGKILL)
"""


@probe(
    "N28.xdist-killed-worker/I23-6/R-7b",
    "pytest -n 1 --specenergy-json=run.json: the worker passes test_p, then "
    "kills itself in the next test",
    "run.json keeps test_p's result and is marked interrupted",
    rc=(1,),
    text=r"results 1 interrupted True",
    quick=True,
)
def _killed_worker(d: Path) -> Obs:
    obs = suite_run(
        d, "-n", "1", "--specenergy-json=run.json", files={"test_zz.py": KILL_SELF}, timeout=400
    )
    obs.out += "\n" + _json_summary(d / "run.json")
    return obs


def _json_summary(path: Path) -> str:
    if not path.exists():
        return f"[fault_matrix] {path.name}: not written"
    doc = json.loads(path.read_text())
    return (
        f"[fault_matrix] {path.name}: results {len(doc['results'])} interrupted "
        f"{doc.get('interrupted', False)}"
    )


# --- signals and kills (R-1a, R-1b, R-2a, R-2b, N25, N27, N29, N30, N4, I23-4/6/19) ------------


def interrupted_session(
    d: Path,
    sig: signal.Signals,
    twice: bool = False,
    xdist: bool = False,
    extra: tuple[str, ...] = (),
) -> Obs:
    """Run TWO_TESTS -v with a save and a JSON; once test_a has passed, send ``sig`` (twice, 0.3 s
    apart)."""
    write(d, {"test_p.py": TWO_TESTS})
    args = pytest_args("-v", "--specenergy-save=main", "--specenergy-json=run.json", *extra)
    if xdist:
        args += ["-n", "1"]
    run = Spawned(args, d)
    if not run.wait_for(r"test_a.* PASSED|PASSED .*test_a", 240):
        obs = run.finish(5)
        obs.notes.append("test_a never passed: no signal sent")
        return obs
    time.sleep(1.0)
    family = [run.proc.pid, *descendants(run.proc.pid)]
    os.kill(run.proc.pid, sig)
    if twice:
        time.sleep(0.3)
        os.kill(run.proc.pid, sig)
    obs = run.finish(90)
    time.sleep(3)
    left = [p for p in family if alive(p)]
    obs.out += "\n" + _json_summary(d / "run.json")
    saved = stored_runs(d)
    obs.out += f"\n[fault_matrix] saved runs {len(saved)}; processes left {len(left)}"
    for p in left:
        _kill_one(p)
    return obs


def _kill_one(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@probe(
    "N27.double-sigterm/I23-4",
    "SIGTERM to pytest twice 0.3 s apart (coreutils timeout) after test_a passed",
    "run.json written with test_a, marked interrupted; a run saved; no process left",
    text=r"results 1 interrupted True\n.*saved runs 1; processes left 0",
    quick=True,
)
def _double_term(d: Path) -> Obs:
    return interrupted_session(d, signal.SIGTERM, twice=True)


@probe(
    "R-2b.sigterm",
    "SIGTERM to pytest once after test_a passed",
    "rc 2; run.json interrupted with test_a; saved; no process left",
    rc=(2,),
    text=r"results 1 interrupted True\n.*saved runs 1; processes left 0",
)
def _single_term(d: Path) -> Obs:
    return interrupted_session(d, signal.SIGTERM)


@probe(
    "R-2a.sigint",
    "SIGINT to pytest after test_a passed",
    "rc 2; run.json interrupted with test_a; saved; no process left",
    rc=(2,),
    text=r"results 1 interrupted True\n.*saved runs 1; processes left 0",
)
def _sigint(d: Path) -> Obs:
    return interrupted_session(d, signal.SIGINT)


@probe(
    "N29.xdist-controller-sigterm/I23-6",
    "pytest -n 1: SIGTERM to the controller after test_a passed",
    "test_a's result kept: run.json and a saved run, marked interrupted; no process left",
    text=r"results 1 interrupted True\n.*saved runs 1; processes left 0",
)
def _xdist_term(d: Path) -> Obs:
    return interrupted_session(d, signal.SIGTERM, xdist=True)


@probe(
    "N30.exitfirst",
    "pytest -x: test_a measures then fails; --specenergy-save=mx",
    "the saved run is marked interrupted",
    rc=(1,),
    text=r"interrupted True",
)
def _exitfirst(d: Path) -> Obs:
    suite = SUITE.replace(
        "    spec_pair.measure()", "    spec_pair.measure()\n    assert False"
    ) + SUITE.replace("def test_p", "def test_q")
    obs = suite_run(d, "-x", "--specenergy-save=mx", suite=suite, timeout=300)
    saved = stored_runs(d)
    obs.out += "\n[fault_matrix] " + (
        f"{saved[0].name}: interrupted {json.loads(saved[0].read_text()).get('interrupted', False)}"
        if saved
        else "nothing saved"
    )
    return obs


@probe(
    "N25.kill9-pytest",
    "kill -9 pytest while its two engines run test_b",
    "every engine and watchdog gone within 10 s (parent-death watchdog)",
    text=r"processes left 0",
)
def _kill9(d: Path) -> Obs:
    write(d, {"test_p.py": TWO_TESTS})
    run = Spawned(pytest_args("-v"), d)
    if not run.wait_for(r"test_a.* PASSED|PASSED .*test_a", 240):
        return run.finish(5)
    time.sleep(1.0)
    family = descendants(run.proc.pid)
    os.kill(run.proc.pid, signal.SIGKILL)
    obs = run.finish(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in family):
        time.sleep(0.5)
    left = [p for p in family if alive(p)]
    obs.out += (
        f"\n[fault_matrix] {len(family)} descendants before the kill; processes left {len(left)}"
    )
    for p in left:
        _kill_one(p)
    return obs


@probe(
    "R-1a.kill9-baseline-engine",
    "kill -9 the baseline engine during test_b; test_a ran before",
    "test_b fails quoting the engine's exit (SIGKILL) and its log",
    rc=(1,),
    text=r"exited with code -9|SIGKILL",
)
def _kill_engine(d: Path) -> Obs:
    write(d, {"test_p.py": TWO_TESTS})
    run = Spawned(pytest_args("-v", "--specenergy-request-timeout=120"), d)
    if not run.wait_for(r"test_a.* PASSED|PASSED .*test_a", 240):
        return run.finish(5)
    time.sleep(2.0)
    for p in servers_of(run.proc.pid, speculative=False):
        _kill_one(p)
    return run.finish(240)


@probe(
    "R-1b.sigstop-engine",
    "kill -STOP both engines during test_b, --specenergy-request-timeout=10",
    "test_b fails: did not answer within 10 s; the stopped engines are gone afterwards",
    rc=(1,),
    text=r"did not answer POST /generate within 10 s",
)
def _stop_engine(d: Path) -> Obs:
    write(d, {"test_p.py": TWO_TESTS})
    run = Spawned(pytest_args("-v", "--specenergy-request-timeout=10"), d)
    if not run.wait_for(r"test_a.* PASSED|PASSED .*test_a", 240):
        return run.finish(5)
    time.sleep(1.0)
    stopped = servers_of(run.proc.pid)
    for p in stopped:
        os.kill(p, signal.SIGSTOP)
    obs = run.finish(180)
    left = [p for p in stopped if alive(p)]
    obs.out += f"\n[fault_matrix] stopped engines left {len(left)}"
    for p in left:
        _kill_one(p)
    return obs


@probe(
    "N4.engine-restart-flagged/I23-19",
    "repeats 2: kill -9 the speculative engine as soon as it has started (it is restarted)",
    "the restart is said in the output (a flag, note or warning)",
    text=r"restart",
)
def _restart(d: Path) -> Obs:
    write(d, {"test_p.py": SUITE.replace("max_new_tokens=16", "max_new_tokens=64")})
    run = Spawned(pytest_args("-v", "-rA", repeats=2), d)
    if not run.wait_for(r"\[ngram\] started", 240):
        return run.finish(5)
    for p in servers_of(run.proc.pid, speculative=True):
        _kill_one(p)
    return run.finish(300)


# --- the reference server itself (R-5a-5e, N19, N20, I23-18) -----------------------------------


class Server:
    """One reference server (tiny:dense, --http-timeout 3) shared by the server probes."""

    proc: subprocess.Popen | None = None
    port = 0

    @classmethod
    def get(cls) -> int:
        if cls.proc is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                cls.port = s.getsockname()[1]
            cls.proc = subprocess.Popen(
                [
                    PY,
                    "-m",
                    "pytest_specenergy.refserver",
                    "--model",
                    "tiny:dense",
                    "--port",
                    str(cls.port),
                    "--http-timeout",
                    "3",
                    "--threads",
                    "1",
                ],
                env=child_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if cls.request("GET", "/health")[0] == 200:
                    break
                time.sleep(0.5)
        return cls.port

    @classmethod
    def stop(cls) -> None:
        if cls.proc is not None:
            _kill_group(cls.proc.pid)
            cls.proc.wait()
            cls.proc = None

    @classmethod
    def request(
        cls,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict | None = None,
        timeout: float = 30,
    ) -> tuple[int, str]:
        import http.client

        try:
            conn = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=timeout)
            conn.request(method, path, body=body, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, answer.read().decode(errors="replace")[:300]
        except (OSError, http.client.HTTPException) as exc:
            return 0, f"{type(exc).__name__}: {exc}"


def server_probe(
    id: str,
    did: str,
    method: str,
    path: str,
    body: bytes,
    status: int,
    text: str,
    quick: bool = False,
) -> None:
    def run(d: Path) -> Obs:
        Server.get()
        code, answer = Server.request(method, path, body, {"Content-Type": "application/json"})
        return Obs(code, f"HTTP {code}: {answer}")

    PROBES.append(
        Probe(id, did, f"HTTP {status}, {text}", run=run, rc=(status,), text=text, quick=quick)
    )


server_probe(
    "R-5b.malformed-json",
    "POST /generate with a malformed JSON body",
    "POST",
    "/generate",
    b"{nope",
    400,
    r"JSON",
    quick=True,
)
server_probe(
    "R-5b.negative-tokens",
    "POST /generate, max_new_tokens -5",
    "POST",
    "/generate",
    json.dumps({"input_ids": [[1, 2, 3]], "sampling_params": {"max_new_tokens": -5}}).encode(),
    400,
    r"max_new_tokens",
)
server_probe(
    "R-5b.vocab",
    "POST /generate, a token id out of the vocabulary",
    "POST",
    "/generate",
    json.dumps({"input_ids": [[10**9]], "sampling_params": {"max_new_tokens": 2}}).encode(),
    400,
    r"",
)
server_probe(
    "R-5b.nested",
    "POST /generate, a body of 100000 nested '['",
    "POST",
    "/generate",
    b"[" * 100000,
    400,
    r"",
)
server_probe(
    "R-5c.flush-malformed",
    "POST /flush_cache with a malformed JSON body",
    "POST",
    "/flush_cache",
    b"{nope",
    400,
    r"JSON",
)


@probe(
    "R-5a.bind-any",
    "python -m pytest_specenergy.refserver --host 0.0.0.0",
    "rc 2: loopback only",
    rc=(2,),
    text=r"loopback only",
    quick=True,
)
def _bind_any(d: Path) -> Obs:
    return run_cmd(
        [
            PY,
            "-m",
            "pytest_specenergy.refserver",
            "--model",
            "tiny:dense",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        d,
        timeout=120,
    )


@probe(
    "R-5d.short-body",
    "POST /generate, Content-Length 100 but 4 bytes sent (--http-timeout 3)",
    "HTTP 408 within a few seconds",
    rc=(408,),
    text=r"408",
)
def _short_body(d: Path) -> Obs:
    port = Server.get()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"a"'
        )
        start = time.monotonic()
        try:
            data = s.recv(4096).decode(errors="replace")
        except OSError as exc:
            data = f"{type(exc).__name__}: {exc}"
    first = data.splitlines()[0] if data else "(connection closed, no answer)"
    code = int(first.split()[1]) if first.startswith("HTTP/") else 0
    return Obs(code, f"{first} after {time.monotonic() - start:.1f} s")


@probe(
    "N20.slowloris/I23-18",
    "40 loopback connections, each dripping one header byte every 1 s for 15 s (--http-timeout 3)",
    "the server closes them (a whole-request deadline or a connection cap); /health still answers",
    rc=(0,),
    text=r"\b0 still open",
)
def _slowloris(d: Path) -> Obs:
    port = Server.get()
    socks = []
    for _ in range(40):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        socks.append(s)
    open_ = set(range(len(socks)))
    end = time.monotonic() + 15
    while time.monotonic() < end and open_:
        for i in list(open_):
            try:
                socks[i].sendall(b"X")
            except OSError:
                open_.discard(i)
        time.sleep(1.0)
    health = Server.request("GET", "/health", timeout=10)[0]
    for s in socks:
        s.close()
    return Obs(0, f"40 drip connections: {len(open_)} still open after 15 s; /health {health}")


@probe(
    "N19.concurrent-generate",
    "50 concurrent POST /generate (8 tokens), one thread each",
    "all 50 answer 200; /health 200",
    rc=(0,),
    text=r"\{200: 50\}.*health 200",
)
def _concurrent(d: Path) -> Obs:
    Server.get()
    codes: dict[int, int] = {}
    lock = threading.Lock()
    body = json.dumps(
        {"input_ids": [[5, 6, 7, 8]], "sampling_params": {"max_new_tokens": 8}}
    ).encode()

    def one() -> None:
        code = Server.request(
            "POST", "/generate", body, {"Content-Type": "application/json"}, timeout=120
        )[0]
        with lock:
            codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    return Obs(
        0,
        f"50 concurrent: {dict(sorted(codes.items()))}; health "
        f"{Server.request('GET', '/health')[0]}",
    )


# --- the checks of issue 38 item 5 and issue 40 item 2: engine faults a suite must catch ---------


@probe(
    "I38-5.dead-drafter",
    "pytest --specenergy-fault=dead-drafter (every draft rejected; output exact)",
    "the case fails (rc 1) on the dead-drafter check, accept length 1.000",
    rc=(1,),
    text=r"dead-drafter.*accept length 1\.000",
)
def _dead_drafter(d: Path) -> Obs:
    return suite_run(d, "--specenergy-fault=dead-drafter", timeout=240)


@probe(
    "I40-2.partial-accept-state",
    "the shipped quickstart's hybrid test (b1) under --specenergy-fault=partial-accept-state",
    "fails (rc 1): no divergence is a tie on a float32 engine (was: passed at 75% exact)",
    rc=(1,),
    text=r"not the target's greedy text",
)
def _partial_accept_state(d: Path) -> Obs:
    quickstart = REPO / "example_suites" / "quickstart" / "test_quickstart.py"
    return suite_run(
        d,
        "-k",
        "hybrid and b1",
        "--specenergy-fault=partial-accept-state",
        suite=quickstart.read_text(),
        timeout=300,
    )


# --- the zygote, SIGHUP and the server's slots (T9-T15, T27, T44; issue 42 items 3, 5) ----------
# In a module of their own beside this script (benchmarks/fault_zygote.py).

import fault_zygote  # noqa: E402  (a benchmark script beside this one, not a package)

fault_zygote.add_probes(sys.modules[__name__])

# --- the rest of reliability-audit-3 (T1-T8, T16-T47) and the earlier audits' rows that were not
# automated: in benchmarks/fault_gate.py.

import fault_gate  # noqa: E402  (benchmark scripts beside this one, not a package)
import fault_hosts  # noqa: E402

fault_gate.add_probes(sys.modules[__name__])
fault_hosts.add_probes(sys.modules[__name__])


# --- listed, not run here -----------------------------------------------------------------------

skipped(
    "R-6b.browser-dom",
    "headless Chromium on the HTML report",
    "no script runs",
    "no browser on this machine",
)
skipped(
    "GPU.nvml-meter",
    "--specenergy-meter=nvml on an H100/H200",
    "energy from the board counter, GPU named",
    "needs a GPU (benchmarks/gpu_smoke.py)",
)
skipped(
    "GPU.sglang-engine",
    "the suites on real SGLang (engine='sglang')",
    "same checks as the reference server",
    "needs a GPU and SGLang (benchmarks/sglang_gpu_check.py); the dry-run probes cover the argv",
)
skipped(
    "I23-20.ci-gate-gpu",
    "example_suites/ci_gate and gpu at batch 64 on a GPU runner",
    "no concurrency-below-batch",
    "needs a GPU; tests/integration/test_ci_workflow.py runs the CPU form",
)


# ---------------------------------------------------------------------------------------------
# judging and printing


def judge(p: Probe, obs: Obs, folder: Path) -> tuple[bool, str]:
    problems = []
    if p.rc is not None and obs.rc not in p.rc:
        problems.append(f"rc {obs.rc} not in {p.rc}")
    # The last match decides: the first is often the session header echoing the option.
    found = next(reversed(list(re.finditer(p.text, obs.out, re.M))), None) if p.text else None
    if p.text and not found:
        problems.append("expected text absent")
    bad = re.search(p.absent, obs.out, re.M) if p.absent else None
    if bad:
        problems.append(f"unexpected: {bad.group(0).strip()[:60]}")
    if p.check is not None:
        try:
            problem = p.check(folder, obs)
        except Exception as exc:  # a probe's own check failing is a FAIL, not a crash of the matrix
            problem = f"check raised {exc!r}"
        if problem:
            problems.append(problem)
    line = decisive_line(obs.out, found, bad)
    return not problems, line + (f" [{'; '.join(obs.notes)}]" if obs.notes else "") + (
        f" <- {'; '.join(problems)}" if problems else ""
    )


_DECISIVE = re.compile(
    r"^(ERROR|E\s+\w*Error|error:|specenergy: |.*\bfailed\b.*\bin\b|.*\bpassed\b.*\bin\b|"
    r"\[fault_matrix\]|.*Traceback|.*Error:|HTTP )",
    re.M,
)


def decisive_line(out: str, found: re.Match | None, bad: re.Match | None) -> str:
    """The line that decided: the unexpected match, else the expected one, else the last telling
    line."""

    def line_of(match: re.Match) -> str:
        start = out.rfind("\n", 0, match.start()) + 1
        end = out.find("\n", match.end())
        return out[start : end if end >= 0 else None]

    if bad:
        text = line_of(bad)
    elif found:
        text = line_of(found)
    else:
        telling = [ln for ln in out.splitlines() if _DECISIVE.match(ln.strip())]
        text = (
            telling[-1]
            if telling
            else next((ln for ln in reversed(out.splitlines()) if ln.strip()), "")
        )
    text = re.sub(r"\s+", " ", text.strip().strip("=").strip())
    return text[:160] + ("..." if len(text) > 160 else "")


QUICK_EXTRA: set[str] = set()


def run_probe(p: Probe, work: Path) -> tuple[str, str, float]:
    if p.skip:
        return "SKIPPED", p.skip, 0.0
    # A neutral folder name: the id's words in every path would satisfy the probes' own regexes.
    folder = Path(tempfile.mkdtemp(prefix="probe-", dir=work))
    start = time.monotonic()
    try:
        obs = p.run(folder)
    except Exception as exc:  # the scenario could not be made: a FAIL with the reason
        return (
            "FAIL",
            f"probe error: {type(exc).__name__}: {str(exc)[:200]}",
            time.monotonic() - start,
        )
    ok, line = judge(p, obs, folder)
    return ("PASS" if ok else "FAIL"), f"rc {obs.rc}: {line}", time.monotonic() - start


def select(args: argparse.Namespace) -> list[Probe]:
    probes = PROBES
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        probes = [
            p
            for p in PROBES
            if any(p.id == w or p.id.startswith(w + ".") or w in p.id.split("/") for w in wanted)
        ]
        if not probes:
            raise SystemExit(f"no probe matches {args.only!r}; --list shows the ids")
    elif args.quick:
        probes = [p for p in PROBES if p.quick or p.skip]
    return probes


#: The audits' probe ids (reliability-audit-3): the 77 earlier ones (the first audit's 32 rows and
#: the second's N1-N45) and its 47 new ones.
OLD_IDS = (
    [
        f"R-{n}{c}"
        for n, cs in ((1, "abcde"), (2, "ab"), (3, "abcdefgh"), (4, "abcdefg"), (5, "abcde"))
        for c in cs
    ]
    + ["R-6a", "R-6b", "R-6c", "R-7a", "R-7b"]
    + [f"N{i}" for i in range(1, 46)]
)
NEW_IDS = [f"T{i}" for i in range(1, 48)]


def audit_ids(row_id: str) -> list[str]:
    """The audit probe ids a row answers: its first name and every alias after a '/'."""
    names = [row_id.split(".")[0], *row_id.split("/")[1:]]
    return [n.split(".")[0] for n in names]


def audit_summary(verdicts: dict[str, str]) -> list[str]:
    """Per audit probe id, its rows' worst verdict (FAIL over SKIPPED over PASS), counted for the
    77 earlier and the 47 new probes; an id no row answers is listed."""
    worst: dict[str, str] = {}
    rank = {"FAIL": 0, "SKIPPED": 1, "PASS": 2}
    for row_id, verdict in verdicts.items():
        for name in audit_ids(row_id):
            if name not in worst or rank[verdict] < rank[worst[name]]:
                worst[name] = verdict
    lines = []
    for label, ids in (("earlier", OLD_IDS), ("new", NEW_IDS)):
        found = {v: [i for i in ids if worst.get(i) == v] for v in ("PASS", "FAIL", "SKIPPED")}
        missing = [i for i in ids if i not in worst]
        lines.append(
            f"# audit probes, {label} {len(ids)}: PASS {len(found['PASS'])}, FAIL "
            f"{len(found['FAIL'])} {found['FAIL']}, SKIPPED {len(found['SKIPPED'])} "
            f"{found['SKIPPED']}" + (f", not in this run {missing}" if missing else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a representative subset (and the SKIPPED rows)"
    )
    parser.add_argument(
        "--only", metavar="ID[,ID]", help="run these probes (an id, or its prefix before '.')"
    )
    parser.add_argument("--list", action="store_true", help="list the probes and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders")
    parser.add_argument(
        "--package",
        metavar="DIR",
        type=Path,
        help="run this folder's pytest_specenergy (another checkout: the table before a change)",
    )
    args = parser.parse_args(argv)
    if args.package:
        global PACKAGE
        PACKAGE = args.package.resolve()
    probes = select(args)
    if args.list:
        for p in probes:
            print(
                f"{p.id:40} "
                f"{'quick ' if p.quick else '      '}{'SKIPPED ' if p.skip else ''}{p.did}"
            )
        return 0
    work = Path(tempfile.mkdtemp(prefix="fault_matrix-"))
    Fixture.work, Fixture.root = work, None
    counts: dict[str, int] = {}
    verdicts: dict[str, str] = {}
    started = time.monotonic()
    print(f"{'id':34} | {'what was done':60} | {'expected':50} | observed | verdict", flush=True)
    try:
        for p in probes:
            verdict, observed, took = run_probe(p, work)
            counts[verdict] = counts.get(verdict, 0) + 1
            verdicts[p.id] = verdict
            print(
                f"{p.id:34} | {p.did[:200]:60} | {p.expected[:160]:50} | {observed} | {verdict}"
                f"{f' ({took:.0f} s)' if took >= 1 else ''}",
                flush=True,
            )
    finally:
        Server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    total = " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"# {len(probes)} probes: {total}; {time.monotonic() - started:.0f} s")
    for line in audit_summary(verdicts):
        print(line)
    return 1 if counts.get("FAIL") else 0


if __name__ == "__main__":
    sys.exit(main())
