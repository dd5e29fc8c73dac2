"""The fault matrix's probes of the engine zygote, the stop signals, hung engines and the reference
server's connection slots (reliability-audit-3 T9-T15, T27, T44; issue 42 items 3 and 5).

Kept apart from ``fault_matrix.py`` (which adds them with :func:`add_probes`), so that the probe
table's other rows can change beside them. Each row is a scenario as the audit ran it, with the
outcome the fixed code must show; see ``fault_matrix.py`` for how a row is run and judged.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any

#: The fault matrix module (``fault_matrix.py``, run as a script or imported): its helpers.
M: Any = None

# test_a finishes quickly; test_b keeps the engines busy long enough to be hit; test_c after it.
THREE_TESTS = """
import pytest

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code"), pytest.mark.drafter("ngram"),
              pytest.mark.batch(1)]

@pytest.mark.generation(max_new_tokens=16, prompts=2)
def test_a(spec_pair):
    spec_pair.measure()

@pytest.mark.generation(max_new_tokens=3000, prompts=2, ignore_eos=True)
def test_b(spec_pair):
    spec_pair.measure()

@pytest.mark.generation(max_new_tokens=16, prompts=3)
def test_c(spec_pair):
    spec_pair.measure()
"""

# test_a starts the engines (and the zygote), test_b gives raw clients 15 s to write to the
# zygote, test_c needs the same engines again.
RAW_CLIENT_TESTS = """
import time
import pytest

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code"), pytest.mark.drafter("ngram"),
              pytest.mark.batch(1)]

@pytest.mark.generation(max_new_tokens=16, prompts=2)
def test_a(spec_pair):
    spec_pair.measure()

def test_b():
    time.sleep(15)

@pytest.mark.generation(max_new_tokens=16, prompts=3)
def test_c(spec_pair):
    spec_pair.measure()
"""

# test_a measures, then forks a helper that outlives pytest (a fixture's server made with os.fork).
FORKING_TESTS = """
import os, time
import pytest

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code"), pytest.mark.drafter("ngram"),
              pytest.mark.batch(1)]

@pytest.mark.generation(max_new_tokens=16, prompts=2)
def test_a(spec_pair):
    spec_pair.measure()
    if os.fork() == 0:  # after the engines started: it inherits their lifelines, the zygote's socket
        time.sleep(90)
        os._exit(0)

@pytest.mark.generation(max_new_tokens=3000, prompts=2, ignore_eos=True)
def test_b(spec_pair):
    spec_pair.measure()
"""

# A "zygote" of someone else's: a listening socket in a folder others may enter, answering ready
# like a zygote of ours and writing down what it is sent.
FAKE_ZYGOTE = r"""
import json, os, socket, sys
folder, package = sys.argv[1], sys.argv[2]
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(os.path.join(folder, "socket"))
os.chmod(folder, 0o755)
listener.listen(8)
ready = {"ready": os.getpid(), "python": sys.executable, "package": package, "shared": None}
with open(os.path.join(folder, "got.txt"), "a") as got:
    while True:
        conn, _ = listener.accept()
        got.write("connection\n"); got.flush()
        try:
            conn.send(json.dumps(ready).encode())
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
            env = json.loads(message).get("env", {})
            got.write(f"request with {len(env)} variables, secret {'CI_SECRET_TOKEN' in env}\n")
            got.flush()
            conn.send(b'{"error": "fake"}')
        except (OSError, ValueError):
            pass
        conn.close()
"""


def _zygote_of(pid: int) -> tuple[int, str] | None:
    """The zygote among ``pid``'s descendants: its pid and the socket it listens at."""
    for p in M.descendants(pid):
        line = M.cmdline(p)
        if "engines.zygote" in line and "--listen" in line:
            return p, line.split("--listen", 1)[1].split()[0]
    return None


def _raw(path: str, message: bytes, fds: list[int]) -> str:
    """Send one message to the zygote at ``path`` as any process of this user could: its answer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(15)
    try:
        sock.connect(path)
        sock.recv(1 << 20)  # its ready line
        socket.send_fds(sock, [message], fds)
        return sock.recv(1 << 20).decode(errors="replace")[:160] or "(closed, no answer)"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()


class RawClients:
    """One session (RAW_CLIENT_TESTS) during whose test_b three raw clients write to its zygote;
    the rows T9, T10 and T11 read its outcome (run once, whichever row asks first)."""

    obs: Any = None

    @classmethod
    def get(cls, d: Path) -> Any:
        if cls.obs is None:
            cls.obs = cls._run(d)
        return cls.obs

    @staticmethod
    def _run(d: Path) -> Any:
        M.write(d, {"test_p.py": RAW_CLIENT_TESTS})
        run = M.Spawned(M.pytest_args("-v"), d)
        if not run.wait_for(r"test_a.* PASSED|PASSED .*test_a", 240):
            return run.finish(5)
        found = _zygote_of(run.proc.pid)
        if found is None:
            obs = run.finish(240)
            obs.notes.append("no zygote found")
            return obs
        zpid, path = found
        lines = [f"garbage -> {_raw(path, b'garbage garbage', [])}"]
        time.sleep(5.0)  # a zygote that dies of it takes seconds (traceback, teardown)
        alive = M.alive(zpid)
        read_end, write_end = os.pipe()
        argv = [M.PY, "-m", "pytest_specenergy.refserver", "--model", "tiny:dense", "--port", "1"]
        request = {"argv": argv, "env": {}, "cwd": str(d), "log": str(d / "crafted.log")}
        lines.append(f"no descriptor -> {_raw(path, json.dumps(request).encode(), [])}")
        time.sleep(2.0)  # what a forked child would have removed by now
        kept = os.path.exists(path)
        other = {**request, "argv": ["/bin/sh", "-c", f"touch {d / 'PWNED'}"]}
        lines.append(f"other program -> {_raw(path, json.dumps(other).encode(), [read_end])}")
        os.close(read_end)
        os.close(write_end)
        obs = run.finish(240)
        obs.out += "".join(f"\n[fault_matrix] {line}" for line in lines)
        obs.out += (
            f"\n[fault_matrix] zygote alive after garbage: {alive}; socket kept: {kept}; "
            f"PWNED made: {(d / 'PWNED').exists()}"
        )
        return obs


def _t13(d: Path) -> Any:
    M.write(d, {"test_p.py": THREE_TESTS})
    run = M.Spawned(M.pytest_args("-v", "-rA"), d)
    if not run.wait_for(r"test_a.* PASSED|PASSED .*test_a", 240):
        return run.finish(5)
    time.sleep(3.0)
    found = _zygote_of(run.proc.pid)
    if found is not None:
        M._kill_one(found[0])
    obs = run.finish(300)
    if found is None:
        obs.notes.append("no zygote found")
    return obs


def _t14(d: Path) -> Any:
    M.write(d, {"test_p.py": FORKING_TESTS})
    run = M.Spawned(M.pytest_args("-v"), d)
    if not run.wait_for(r"test_a.* PASSED|PASSED .*test_a", 240):
        return run.finish(5)
    time.sleep(1.0)
    family = M.descendants(run.proc.pid)
    engines = [p for p in family if "pytest_specenergy" in M.cmdline(p)]
    helpers = [p for p in family if p not in engines]
    os.kill(run.proc.pid, signal.SIGKILL)
    obs = run.finish(30)
    started = time.monotonic()
    while time.monotonic() - started < 15 and any(M.alive(p) for p in engines):
        time.sleep(0.5)
    left = [p for p in engines if M.alive(p)]
    helper_alive = any(M.alive(p) for p in helpers)
    obs.out += (
        f"\n[fault_matrix] {len(engines)} engine processes (zygote, watchdogs, servers); "
        f"15 s after kill -9: engine processes left {len(left)}; forked helper alive "
        f"{helper_alive}"
    )
    for p in left + helpers:
        M._kill_one(p)
    return obs


def _t15(d: Path) -> Any:
    M.write(d, {"test_p.py": M.SUITE})
    run = M.Spawned(M.pytest_args("-v"), d)
    found = None
    deadline = time.monotonic() + 240
    while found is None and run.proc.poll() is None and time.monotonic() < deadline:
        found = _zygote_of(run.proc.pid)
        time.sleep(0.2)
    obs = run.finish(240)
    if found is None:
        obs.notes.append("no zygote seen")
        return obs
    ended = time.monotonic()
    while M.alive(found[0]) and time.monotonic() - ended < 30:
        time.sleep(0.1)
    took = time.monotonic() - ended
    obs.out += f"\n[fault_matrix] the zygote was gone {took:.1f} s after its pytest exited"
    if M.alive(found[0]):
        M._kill_one(found[0])
    return obs


def _zygote_gone_in_time(folder: Path, obs: Any) -> str | None:
    match = re.search(r"gone ([0-9.]+) s after", obs.out)
    if match and float(match.group(1)) <= 3.0:
        return None
    return "the zygote outlived its pytest by more than 3 s"


def _t12(d: Path) -> Any:
    folder = d / "zy"
    folder.mkdir()
    package = str(M.REPO / "pytest_specenergy")
    fake = subprocess.Popen([M.PY, "-c", FAKE_ZYGOTE, str(folder), package], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (folder / "socket").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        M.write(d, {"test_p.py": M.SUITE})
        obs = _run_with_env(
            M.pytest_args("-v"),
            d,
            {"SPECENERGY_ZYGOTE_SOCKET": str(folder / "socket"), "CI_SECRET_TOKEN": "ghp_x"},
        )
    finally:
        M._kill_group(fake.pid)
        fake.wait()
    got = (folder / "got.txt").read_text() if (folder / "got.txt").exists() else ""
    obs.out += (
        f"\n[fault_matrix] the foreign socket got {got.count('connection')} connection(s): "
        f"{got.strip().splitlines()[-1:] or 'nothing'}"
    )
    return obs


def _run_with_env(args: list[str], cwd: Path, extra: dict[str, str], timeout: float = 240) -> Any:
    """``fault_matrix.run_cmd`` with ``extra`` in the environment."""
    env = {**M.child_env(), **extra}
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return M.Obs(proc.returncode, out)
    except subprocess.TimeoutExpired:
        M._kill_group(proc.pid)
        out, _ = proc.communicate()
        return M.Obs(124, out + f"\n[fault_matrix] timed out after {timeout:.0f} s")


def _t27(d: Path) -> Any:
    """300 idle loopback clients, each reconnecting when closed, for 8 s; /health every second;
    then one /generate while they still hold their connections."""
    port = M.Server.get()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
    health: dict[int, int] = {}
    closed = 0
    end = time.monotonic() + 8
    while time.monotonic() < end:
        readable, _, _ = select.select(socks, [], [], 1.0)
        for i, sock in enumerate(socks):
            if sock in readable:  # closed by the server: the flood reconnects at once
                sock.close()
                closed += 1
                socks[i] = socket.create_connection(("127.0.0.1", port), timeout=5)
        code = M.Server.request("GET", "/health", timeout=5)[0]
        health[code] = health.get(code, 0) + 1
    body = json.dumps({"input_ids": [[5, 6, 7]], "sampling_params": {"max_new_tokens": 4}})
    generate = M.Server.request(
        "POST", "/generate", body.encode(), {"Content-Type": "application/json"}, timeout=60
    )[0]
    for sock in socks:
        sock.close()
    return M.Obs(
        0,
        f"300 idle clients reconnecting for 8 s ({closed} closed by the server): /health "
        f"{dict(sorted(health.items()))}; then /generate {generate}",
    )


def add_probes(matrix: ModuleType) -> None:
    """Append this module's rows to ``matrix.PROBES`` (``matrix`` is ``fault_matrix``)."""
    global M
    M = matrix
    probe = matrix.Probe
    raw = RawClients.get
    matrix.PROBES.extend(
        [
            probe(
                "T9.zygote-garbage",
                "during a session, 15 bytes of garbage to its zygote's socket (any same-user "
                "process can); then test_c",
                "answered with an error; the zygote lives on; the session passes (3 passed)",
                run=raw,
                rc=(0,),
                text=r"(?s)garbage -> \{\"error\".*zygote alive after garbage: True",
                check=_passed(3),
            ),
            probe(
                "T10.zygote-no-descriptor",
                "during a session, a valid engine request with no lifeline descriptor",
                "refused (one descriptor expected); the zygote's socket stays",
                run=raw,
                rc=(0,),
                text=r"(?s)no descriptor -> \{\"error\": \"a request carries exactly one.*"
                r"socket kept: True",
            ),
            probe(
                "T11.zygote-other-program",
                "during a session, a crafted request for /bin/sh (with a pipe descriptor)",
                "refused (argv must be the reference server's); nothing run",
                run=raw,
                rc=(0,),
                text=r"(?s)other program -> \{\"error\": \"argv must start with.*PWNED made: "
                r"False",
            ),
            probe(
                "T12.foreign-zygote-socket",
                "SPECENERGY_ZYGOTE_SOCKET names a socket in a mode-755 folder answering like a "
                "zygote; CI_SECRET_TOKEN set",
                "nothing sent to it (no connection); a ZygoteWarning says why; the session passes",
                run=_t12,
                rc=(0,),
                text=r"(?s)ZygoteWarning.*mode 755.*foreign socket got 0 connection",
            ),
            probe(
                "T13.zygote-kill9",
                "kill -9 the zygote 3 s into test_b (long); test_c after it",
                "test_b fails naming its engine's end; the engines restart forked from a new "
                "zygote; test_c passes",
                run=_t13,
                rc=(1,),
                text=r"(?s)died \(exit code unknown \(the engine zygote.*is restarted",
                check=_passed(2),
            ),
            probe(
                "T14.kill9-pytest-forked-helper",
                "test_a forks a helper (sleeps 90 s); kill -9 pytest during test_b",
                "zygote, watchdogs and servers gone within 15 s; the helper lives on",
                run=_t14,
                text=r"engine processes left 0; forked helper alive True",
            ),
            probe(
                "T15.zygote-exits-with-pytest",
                "a passing session; how long its zygote outlives pytest",
                "gone within 3 s (no interpreter teardown of torch)",
                run=_t15,
                rc=(0,),
                text=r"the zygote was gone",
                check=_zygote_gone_in_time,
            ),
            probe(
                "T44.sighup",
                "SIGHUP to pytest after test_a passed (a closed terminal or SSH session)",
                "rc 2; run.json interrupted with test_a; saved; no process left",
                run=lambda d: matrix.interrupted_session(d, signal.SIGHUP),
                rc=(2,),
                text=r"results 1 interrupted True\n.*saved runs 1; processes left 0",
            ),
            probe(
                "T27.idle-flood",
                "300 idle loopback clients reconnecting whenever closed, 8 s, against one "
                "reference server (--max-connections 256)",
                "every /health 200; a /generate 200 during the flood",
                run=_t27,
                rc=(0,),
                text=r"/health \{200: \d+\}; then /generate 200",
            ),
        ]
    )


def _passed(count: int) -> Any:
    """A check: the session's summary line says ``count`` passed."""

    def check(folder: Path, obs: Any) -> str | None:
        return None if re.search(rf"\b{count} passed\b", obs.out) else f"not {count} passed"

    return check
