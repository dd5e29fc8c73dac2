"""The fault matrix's rows of reliability-audit-3 on the gate, the history, the CLI and the reports
(T21-T25, T28-T38, T47; issue 42 items 1, 2, 4, 5 and issue 40 item 4), with the helpers the
other new rows share (``fault_hosts.py``: the servers, disks, signals and the earlier audits'
rows that were not automated).

Kept apart from ``fault_matrix.py`` (which adds them with :func:`add_probes`), as
``fault_zygote.py`` is. Each row is the audit's scenario made small enough for a shared 2-core
machine, with the outcome the fixed code must show.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any
from typing import Callable
from typing import Iterator

#: The fault matrix module (``fault_matrix.py``): its helpers.
M: Any = None
USAGE = 4  # pytest's exit status for a usage error
ROWS: list[tuple[str, str, str, Callable, dict]] = []


def row(id: str, did: str, expected: str, **kw: Any) -> Callable:
    """Declare one probe row (added to the matrix by :func:`add_probes`, in this order)."""

    def add(fn: Callable) -> Callable:
        ROWS.append((id, did, expected, fn, kw))
        return fn

    return add


# ---------------------------------------------------------------------------------------------
# helpers


def run_env(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> Any:
    """``M.run_cmd`` with extra environment variables (``CI=true``)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return M.run_cmd(args, cwd, timeout=timeout)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block (lazily unmounted after it)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)


def fill(path: Path, leave: int) -> None:
    """Fill the file system of ``path`` until ``leave`` bytes are free."""
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize
    with contextlib.suppress(OSError), open(path / ".filler", "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))


def post(port: int, path: str, body: bytes, timeout: float = 30) -> tuple[int, str]:
    """POST ``body`` to a local server; (status, the whole answer) or (0, the error)."""
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def note(obs: Any, text: str) -> Any:
    obs.out += f"\n[fault_matrix] {text}"
    return obs


def json_of(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def untouched(path: Path, digest: str) -> Callable[[Path, Any], str | None]:
    def check(folder: Path, obs: Any) -> str | None:
        if not path.exists():
            return f"{path.name} is gone"
        return None if M.md5(path) == digest else f"{path.name} was modified"

    return check


# T35: the gate asks for 2 more repeats once (as an INCONCLUSIVE case does), and the speculative
# engine is killed just before them; warm-up runs are counted.
ADDED_REPEAT_KILL = """
import json, os, signal, time
import pytest_specenergy.gate.gatekeeper as gk
import pytest_specenergy.measure.pairs as pairs
import pytest_specenergy.measure.arm as arm

asked, warmups = [], []
_judge, _add, _warm = gk.Gatekeeper.judge, pairs.PairMeasurer.add_repeats, arm.ArmMeasurer.warm_up

def judge(self, record, limits):
    if not asked:
        asked.append(1)
        return gk.NeedsRepeats(2)
    return _judge(self, record, limits)

def add_repeats(self, case, extra):
    server = self.pool._live.get(self.engine_config(case.spec_config()))
    os.killpg(server.pid, signal.SIGKILL)
    while server.alive():
        time.sleep(0.05)
    warmups.append("killed")
    return _add(self, case, extra)

def warm_up(self, *args, **kwargs):
    runs = args[0] if args else kwargs.get("runs", self.warmup)
    warmups.append(runs if runs is not None else self.warmup)
    return _warm(self, *args, **kwargs)

gk.Gatekeeper.judge = judge
pairs.PairMeasurer.add_repeats = add_repeats
arm.ArmMeasurer.warm_up = warm_up

def pytest_sessionfinish(session):
    after = warmups[warmups.index("killed") + 1:] if "killed" in warmups else []
    with open("warmups.json", "w") as out:
        json.dump({"warm_up_runs_after_the_kill": sum(after)}, out)
"""


def _two_case_baseline(d: Path) -> Path:
    """The fixture run with a second case (test_q), as a baseline of a larger suite."""

    def add_case(doc: dict) -> None:
        other = json.loads(json.dumps(doc["results"][0]))
        other["nodeid"] = other["nodeid"].replace("test_p[", "test_q[")
        doc["results"].append(other)

    return M.edited_run(d, "base2.json", add_case)


def _fail_check(doc: dict) -> None:
    for result in doc["results"]:
        result["checks"] = [
            {"name": "concurrency-below-batch", "severity": "fail", "message": "2.0 of 4 rows"}
        ]


# ---------------------------------------------------------------------------------------------
# the history: corrupted, huge, overwritten (T21, T22, T29, T47)


def _corrupt_history(d: Path) -> Path:
    folder = M.Fixture.storage_into(d)
    (folder / "0003_bytes_20261203_000000.json").write_bytes(os.urandom(2000))
    (folder / "0004_dir_20261204_000000.json").mkdir()
    (folder / "0005_pw_20261205_000000.json").symlink_to("/etc/passwd")
    os.mkfifo(folder / "0006_fifo_20261206_000000.json")
    (folder / "0007_g_20261207_000000.json").write_text(
        json.dumps({"kind": "golden", "schema_version": 1})
    )
    return folder


@row(
    "T21.corrupt-history",
    "history with random bytes, a directory, a symlink to /etc/passwd, a FIFO and a golden-kind "
    "file named like runs: specenergy history",
    "each skipped with a named message; no hang on the FIFO",
    text=r"skipping .*0007_g",
    absent=r"Traceback",
)
def _history_corrupt(d: Path) -> Any:
    _corrupt_history(d)
    return M.cli(d, "history", timeout=60)


@row(
    "T21.corrupt-last-pytest",
    "the same history; pytest --specenergy-compare=last",
    "a usage error at start naming 0007 (the newest), nothing measured",
    rc=(USAGE,),
    text=r"0007_g.*golden",
)
def _pytest_corrupt_last(d: Path) -> Any:
    _corrupt_history(d)
    return M.suite_run(d, "--specenergy-compare=last", timeout=120)


@row(
    "T22.huge-run-file",
    "a 3 GB (sparse) file named like the newest run; specenergy report last --markdown r.md "
    "(address space capped at 2.5 GiB)",
    "rc 2 at once: not read (its size named); no MemoryError",
    rc=(2,),
    text=r"not read",
    absent=r"MemoryError|Traceback",
)
def _huge_run(d: Path) -> Any:
    folder = M.Fixture.storage_into(d)
    with open(folder / "0009_main_20261209_000000.json", "wb") as handle:
        handle.truncate(3_000_000_000)
    return M.run_cmd([*M.CLI, "report", "last", "--markdown", "r.md"], d, timeout=120, mem_gb=2.5)


def _json_onto_stored(d: Path) -> Any:
    M.Fixture.storage_into(d)
    target = M.stored_runs(d)[0]
    _digest[str(target)] = M.md5(target)
    return M.suite_run(d, "--specenergy-compare=main", f"--specenergy-json={target}", timeout=120)


_digest: dict[str, str] = {}


def _stored_untouched(d: Path, obs: Any) -> str | None:
    target = M.stored_runs(d)[0]
    return None if M.md5(target) == _digest.get(str(target)) else f"{target.name} was modified"


ROWS.append(
    (
        "T29.json-onto-stored-run",
        "pytest --specenergy-compare=main --specenergy-json=<the stored file main resolves to>",
        "rc 4 at start: it would replace a run in the history; the file unchanged",
        _json_onto_stored,
        {"rc": (USAGE,), "text": r"is a run in the history", "check": _stored_untouched},
    )
)


def _markdown_onto_stored(d: Path) -> Any:
    M.Fixture.storage_into(d)
    target = M.stored_runs(d)[0]
    second = M.edited_run(target.parent, "0002_pr_20261202_000000.json", lambda doc: None)
    _digest[str(target)] = M.md5(target)
    return M.cli(d, "report", str(second), "--markdown", str(target))


ROWS.append(
    (
        "T47.report-onto-stored-run",
        "specenergy report <0002> --markdown <0001, another run in the history>",
        "rc 2: it would replace a run in the history; 0001 unchanged",
        _markdown_onto_stored,
        {"rc": (2,), "text": r"is a run in the history", "check": _stored_untouched},
    )
)


# ---------------------------------------------------------------------------------------------
# reports (T23, T24, T34)

HOSTILE = [
    "</script><script>alert(1)</script> what is 2+2?",
    '<img src=x onerror="alert(2)"> list three fruits',
    "[x](javascript:alert(3)) write a haiku",
    "${jndi:ldap://x/a}; DROP TABLE users; -- explain SQL",
]


@row(
    "T23.hostile-prompts-in-reports",
    "a session on a corpus of hostile prompts (</script>, <img onerror>, javascript: links, "
    "${jndi}), then specenergy report --html --markdown",
    "prompts never reach the reports; no raw payload",
    rc=(0,),
    text=r"raw payloads: none",
)
def _hostile_prompts(d: Path) -> Any:
    lines = "\n".join(json.dumps({"prompt": p}) for p in HOSTILE)
    M.write(d, {"hostile.jsonl": lines + "\n"})
    obs = M.suite_run(
        d,
        "--specenergy-json=run.json",
        suite=M.SUITE.replace('corpus("code")', 'corpus("jsonl:hostile.jsonl")'),
        timeout=240,
    )
    report = M.cli(d, "report", "run.json", "--html", "r.html", "--markdown", "r.md")
    raw = [
        f
        for f in ("r.html", "r.md")
        if (d / f).exists()
        and re.search(r"<script>alert|<img src=x|javascript:alert|DROP TABLE", (d / f).read_text())
    ]
    rc = 0 if obs.rc == 0 and report.rc == 0 and (d / "r.html").exists() else 1
    return M.Obs(rc, obs.out + report.out + f"\n[fault_matrix] raw payloads: {raw or 'none'}")


def _injected_nodeid(doc: dict) -> None:
    doc["results"][0]["nodeid"] = (
        "test_x.py::test_x[a|b|c\n## injected heading [link](javascript:alert(1))]"
    )


@row(
    "T24.markdown-injection",
    "node id with |, a newline, '## heading' and [link](javascript:...); specenergy report "
    "--markdown",
    "one table row, escaped: no injected heading line, no raw link",
    rc=(0,),
    check=lambda d, o: (
        "injected heading line"
        if re.search(r"^## injected", (d / "r.md").read_text(), re.M)
        or "](javascript:" in (d / "r.md").read_text()
        else None
    ),
)
def _md_injection(d: Path) -> Any:
    M.edited_run(d, "run.json", _injected_nodeid)
    return M.cli(d, "report", "run.json", "--markdown", "r.md")


@row(
    "T34.reports-of-an-interrupted-run",
    "specenergy report <an interrupted run> --markdown r.md --html r.html",
    "both files say the run was interrupted",
    rc=(0,),
    text=r"interrupted in r\.md: True, in r\.html: True",
)
def _reports_interrupted(d: Path) -> Any:
    M.edited_run(d, "int.json", lambda doc: doc.update(interrupted=True))
    obs = M.cli(d, "report", "int.json", "--markdown", "r.md", "--html", "r.html", "--no-plots")
    said = {
        f: (d / f).exists() and "interrupted" in (d / f).read_text().lower()
        for f in ("r.md", "r.html")
    }
    return note(obs, f"interrupted in r.md: {said['r.md']}, in r.html: {said['r.html']}")


# ---------------------------------------------------------------------------------------------
# corpora (T25, R-4d), the marker pool (T28)


@row(
    "T25.million-prompts",
    "a 1 000 000-prompt jsonl corpus (about 60 MB); pytest --collect-only",
    "1 test collected",
    rc=(0,),
    text=r"1 test collected",
)
def _million(d: Path) -> Any:
    with open(d / "big.jsonl", "w") as out:
        for i in range(1_000_000):
            out.write(f'{{"prompt": "prompt number {i} asks for a short answer"}}\n')
    M.write(d, {"test_p.py": M.SUITE.replace('corpus("code")', 'corpus("jsonl:big.jsonl")')})
    return M.run_cmd([*M.pytest_args("--collect-only")], d, timeout=240)


@row(
    "T25.huge-prompt",
    "a corpus whose one prompt is 200 MB; pytest --collect-only",
    "1 test collected (the prompt is refused later by the engine's context, per case)",
    rc=(0,),
    text=r"1 test collected",
)
def _huge_prompt(d: Path) -> Any:
    with open(d / "huge.jsonl", "w") as out:
        out.write('{"prompt": "' + "word " * 40_000_000 + '"}\n')
    M.write(d, {"test_p.py": M.SUITE.replace('corpus("code")', 'corpus("jsonl:huge.jsonl")')})
    return M.run_cmd([*M.pytest_args("--collect-only")], d, timeout=240)


@row(
    "R-4d.ten-thousand-prompts",
    "a 10 000-prompt jsonl corpus, batch 1, --specenergy-pool=16",
    "1 passed",
    rc=(0,),
    text=r"1 passed",
)
def _ten_thousand(d: Path) -> Any:
    M.write(
        d,
        {
            "many.jsonl": "".join(
                json.dumps({"prompt": f"question {i}: name a colour"}) + "\n" for i in range(10_000)
            )
        },
    )
    suite = M.SUITE.replace('corpus("code")', 'corpus("jsonl:many.jsonl")').replace(
        "generation(max_new_tokens=16, prompts=2)", "generation(max_new_tokens=8)"
    )
    # The probe is about the corpus's size; n-gram accepts none of its drafts on these 8-token
    # answers of the tiny model (accept length 1.000), which the dead-drafter check rightly
    # fails, so the checks warn here.
    return M.suite_run(
        d, "--specenergy-pool=16", "--specenergy-checks=warn", suite=suite, timeout=300
    )


@row(
    "T28.marker-pool-huge/N8",
    "generation(prompts=99999999999999999999999) on the marker (address space capped at 3 GiB)",
    "a collection error naming the bound (4096); no engine started, no MemoryError",
    rc=(2,),
    text=r"expected a prompt count from 1 to 4096",
    absent=r"MemoryError",
)
def _marker_pool(d: Path) -> Any:
    M.write(
        d,
        {"test_p.py": M.SUITE.replace("prompts=2", "prompts=99999999999999999999999")},
    )
    return M.run_cmd(M.pytest_args(), d, timeout=200, mem_gb=3)


# ---------------------------------------------------------------------------------------------
# the gate: compare's exit status (T30), coverage (T31), failed baselines (T32), merge (T33),
# added repeats (T35), other baselines (T38)


def _nosamples(doc: dict) -> None:
    for result in doc["results"]:
        result["speculative"]["samples"] = []


@row(
    "T30.cli-incomparable",
    "specenergy compare nosamples.json run.json (baseline samples: [])",
    "exit 1: incomparable (was 0)",
    rc=(1,),
    text=r"incomparable",
)
def _cli_incomparable(d: Path) -> Any:
    M.edited_run(d, "nosamples.json", _nosamples)
    M.edited_run(d, "run.json", lambda doc: None)
    return M.cli(d, "compare", "nosamples.json", "run.json")


@row(
    "T30.cli-empty-baseline",
    "specenergy compare noresults.json run.json (a baseline with no results)",
    "exit 1: every case without a baseline (was 0)",
    rc=(1,),
    text=r"no baseline",
)
def _cli_empty(d: Path) -> Any:
    M.edited_run(d, "noresults.json", lambda doc: doc.update(results=[]))
    M.edited_run(d, "run.json", lambda doc: None)
    return M.cli(d, "compare", "noresults.json", "run.json")


@row(
    "T30.cli-strict-missing",
    "specenergy compare noresults.json run.json --strict",
    "exit 1 (--strict covers a missing baseline; was 0)",
    rc=(1,),
)
def _cli_strict(d: Path) -> Any:
    M.edited_run(d, "noresults.json", lambda doc: doc.update(results=[]))
    M.edited_run(d, "run.json", lambda doc: None)
    return M.cli(d, "compare", "noresults.json", "run.json", "--strict")


@row(
    "T31.pytest-k-shrinks-the-gate",
    "a 2-case baseline (test_p, test_q); the current run measures test_p only; CI=true",
    "test_q listed as not measured; rc 1 (the coverage fails in CI)",
    rc=(1,),
    text=r"(?s)1 of 2 baseline case\(s\).*test_q",
)
def _pytest_coverage(d: Path) -> Any:
    _two_case_baseline(d)
    M.write(d, {"test_p.py": M.SUITE})
    return run_env(
        M.pytest_args("--specenergy-compare=base2.json", repeats=2), d, {"CI": "true"}, 300
    )


@row(
    "T31.pytest-k-declared",
    "the same, with --specenergy-unmeasured-ok='*test_q*'",
    "listed as declared; rc 0",
    rc=(0,),
    text=r"declared by --specenergy-unmeasured-ok",
)
def _pytest_coverage_ok(d: Path) -> Any:
    _two_case_baseline(d)
    M.write(d, {"test_p.py": M.SUITE})
    args = M.pytest_args(
        "--specenergy-compare=base2.json", "--specenergy-unmeasured-ok=*test_q*", repeats=2
    )
    return run_env(args, d, {"CI": "true"}, 300)


@row(
    "T31.cli-coverage",
    "specenergy compare base2.json run.json (2-case baseline, 1-case run), CI=true",
    "test_q listed; exit 1",
    rc=(1,),
    text=r"(?s)test_q.*exit status 1",
)
def _cli_coverage(d: Path) -> Any:
    _two_case_baseline(d)
    M.edited_run(d, "run.json", lambda doc: None)
    return run_env([*M.CLI, "compare", "base2.json", "run.json"], d, {"CI": "true"}, 60)


@row(
    "T32.pytest-failed-check-baseline",
    "pytest --specenergy-compare=baseline.json whose stored case failed concurrency-below-batch",
    "the case fails: the baseline is refused, naming the check (was: passed)",
    rc=(1,),
    text=r"refused: the baseline record's own fail-closed checks failed.*concurrency-below-batch",
)
def _pytest_failed_baseline(d: Path) -> Any:
    return M.gated(d, _fail_check, "--specenergy-incomparable=warn")


@row(
    "T32.cli-failed-check-baseline",
    "specenergy compare baseline.json run.json, the baseline's case failed a check",
    "exit 1: refused by name",
    rc=(1,),
    text=r"refused.*concurrency-below-batch",
)
def _cli_failed_baseline(d: Path) -> Any:
    M.edited_run(d, "baseline.json", _fail_check)
    M.edited_run(d, "run.json", lambda doc: None)
    return M.cli(d, "compare", "baseline.json", "run.json")


@row(
    "T33.merge-interrupted-shard",
    "specenergy merge a.json b_int.json --output m.json --save main (b saved by an interrupted "
    "session)",
    "the merged file and the saved run are marked interrupted",
    rc=(0,),
    text=r"merged interrupted: True; saved interrupted: True",
)
def _merge_interrupted(d: Path) -> Any:
    M.edited_run(d, "a.json", lambda doc: None)

    def other_test(doc: dict) -> None:
        doc["interrupted"] = True
        for result in doc["results"]:
            result["nodeid"] = result["nodeid"].replace("test_p[", "test_b[")

    M.edited_run(d, "b.json", other_test)
    obs = M.cli(d, "merge", "a.json", "b.json", "--output", "m.json", "--save", "main")
    saved = M.stored_runs(d)
    merged = json_of(d / "m.json").get("interrupted") is True
    stored = bool(saved) and json_of(saved[0]).get("interrupted") is True
    return note(obs, f"merged interrupted: {merged}; saved interrupted: {stored}")


@row(
    "T37.merge-storage-url/R-4g",
    "specenergy merge run.json --output m.json --save m --storage http://x",
    "rc 2 before anything is written: no ./http: folder, no m.json",
    rc=(2,),
    text=r"only local directories",
    check=lambda d, o: (
        "something was written" if (d / "http:").exists() or (d / "m.json").exists() else None
    ),
)
def _merge_url(d: Path) -> Any:
    M.edited_run(d, "run.json", lambda doc: None)
    return M.cli(
        d, "merge", "run.json", "--output", "m.json", "--save", "m", "--storage", "http://x"
    )


@row(
    "R-6c.merge-bad-save-first",
    "specenergy merge run.json --output m3.json --save ../../etc/x",
    "rc 2 before anything is written: no m3.json",
    rc=(2,),
    text=r"contains",
    check=lambda d, o: "m3.json was written" if (d / "m3.json").exists() else None,
)
def _merge_bad_name(d: Path) -> Any:
    M.edited_run(d, "run.json", lambda doc: None)
    return M.cli(d, "merge", "run.json", "--output", "m3.json", "--save", "../../etc/x")


@row(
    "T35.restart-during-added-repeats",
    "--specenergy-warmup=1; the gate asks for 2 more repeats (a conftest), the speculative "
    "engine is killed just before them",
    "the restart recorded (order.restarts, engine-restarted) and the new engine warmed up",
    rc=(0,),
    text=r"restarts \[\{.arm.: .speculative., .before_repeat.: 2\}\]; flagged True; "
    r"warm-up runs after the kill: [1-9]",
)
def _added_restart(d: Path) -> Any:
    M.write(d, {"conftest.py": ADDED_REPEAT_KILL})
    M.edited_run(d, "baseline.json", lambda doc: None)
    obs = M.suite_run(
        d,
        "--specenergy-compare=baseline.json",
        "--specenergy-warmup=1",
        "--specenergy-incomparable=warn",
        "--specenergy-json=run.json",
        repeats=2,
        timeout=300,
    )
    record = (json_of(d / "run.json").get("results") or [{}])[0]
    restarts = record.get("order", {}).get("restarts", [])
    flagged = any(c.get("name") == "engine-restarted" for c in record.get("checks", []))
    warm = json_of(d / "warmups.json").get("warm_up_runs_after_the_kill")
    obs.rc = 0 if obs.rc in (0, 1) else obs.rc
    return note(
        obs,
        f"restarts {json.dumps(restarts)}; flagged {flagged}; warm-up runs after the kill: {warm}",
    )


def _other_digest(doc: dict) -> None:
    for result in doc["results"]:
        result["case"]["corpus"]["digest"] = "0" * 16


def _other_tokens(doc: dict) -> None:
    for result in doc["results"]:
        result["case"]["generation"]["max_new_tokens"] = 64


for _pid, _edit in (("corpus-digest", _other_digest), ("max-new-tokens", _other_tokens)):
    ROWS.append(
        (
            f"T38.baseline-other-{_pid}",
            f"pytest --specenergy-compare=baseline.json whose {_pid} differs",
            "FAILED incomparable (rc 1)",
            lambda d, e=_edit: M.gated(d, e),
            {"rc": (1,), "text": r"incomparable|cannot be compared"},
        )
    )


# ---------------------------------------------------------------------------------------------


def add_probes(matrix: ModuleType) -> None:
    """Append this module's rows to ``matrix.PROBES`` (``matrix`` is ``fault_matrix``)."""
    global M
    M = matrix
    for id, did, expected, fn, kw in ROWS:
        matrix.PROBES.append(matrix.Probe(id, did, expected, run=fn, **kw))
