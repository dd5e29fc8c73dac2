"""The fault matrix's rows of reliability-audit-3 on the reference server, admission caps, the
zygote's socket, engine options, disks and signals (T1-T8, T16-T20, T26, T36, T41-T46), and the
earlier audits' probes that were listed as not automated and run on this machine (R-1d, R-1e,
R-3d, R-3e, R-5e, N1, N2, N5, N6, N15, N17, N18, N26, N42, N45).

Kept apart from ``fault_matrix.py`` (which adds them with :func:`add_probes`). Rows that need a
full or read-only disk mount a tmpfs (this machine lets root do so) and unmount it whatever
happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any
from typing import Callable

from fault_gate import USAGE
from fault_gate import fill
from fault_gate import json_of
from fault_gate import note
from fault_gate import post
from fault_gate import read_only
from fault_gate import run_env
from fault_gate import tmpfs

#: The fault matrix module (``fault_matrix.py``): its helpers.
M: Any = None
ROWS: list[tuple[str, str, str, Callable, dict]] = []


def row(id: str, did: str, expected: str, **kw: Any) -> Callable:
    """Declare one probe row (added to the matrix by :func:`add_probes`, in this order)."""

    def add(fn: Callable) -> Callable:
        ROWS.append((id, did, expected, fn, kw))
        return fn

    return add


B4 = """
import pytest

@pytest.mark.model("tiny:dense"MRR)
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(4)
@pytest.mark.generation(max_new_tokens=16, prompts=12)
def test_b4(spec_pair):
    spec_pair.measure()
"""

# Another client of the engines sets their admission cap every 0.2 s (T3: the speculative one; T4:
# both), as a second process on the runner could.
CAPPER = """
import json, os, threading, time, urllib.request
import pytest

CAP, WHICH = int(os.environ["PROBE_CAP"]), os.environ["PROBE_WHICH"]

def _loop(config):
    from pytest_specenergy.session import SESSION_KEY
    session = config.stash[SESSION_KEY]
    while True:
        measurer = session._measurer
        for cfg, server in list(getattr(getattr(measurer, "pool", None), "_live", {}).items()):
            if WHICH == "both" or cfg.is_speculative:
                body = json.dumps({"max_running_requests": CAP}).encode()
                request = urllib.request.Request(
                    f"http://127.0.0.1:{server.port}/set_internal_state", data=body,
                    headers={"Content-Type": "application/json"})
                try:
                    urllib.request.urlopen(request, timeout=2).read()
                except Exception:
                    pass
        time.sleep(0.2)

def pytest_sessionstart(session):
    threading.Thread(target=_loop, args=(session.config,), daemon=True).start()
"""

# T5: what the measurer asks of each engine's admission cap, and its peak requests in flight.
REFILL_SPY = """
import json, threading
import pytest
from pytest_specenergy.engines import client

calls, live, peak, lock = {}, {}, {}, threading.Lock()
_set, _generate = client.EngineClient.set_internal_state, client.EngineClient.generate

def set_internal_state(self, **values):
    calls.setdefault(self.base_url, []).append(values)
    return _set(self, **values)

def generate(self, *args, **kwargs):
    with lock:
        live[self.base_url] = live.get(self.base_url, 0) + 1
        peak[self.base_url] = max(peak.get(self.base_url, 0), live[self.base_url])
    try:
        return _generate(self, *args, **kwargs)
    finally:
        with lock:
            live[self.base_url] -= 1

client.EngineClient.set_internal_state = set_internal_state
client.EngineClient.generate = generate

def pytest_sessionfinish(session):
    with open("refill.json", "w") as out:
        json.dump({"calls": list(calls.values()), "peak": sorted(peak.values())}, out)
"""

# T7: every speculative window's ramp is slowed: the next 7 sends after each flush are delayed.
DISTURBER = """
import random, threading, time
from pytest_specenergy.engines import client

_flush, _generate = client.EngineClient.flush_cache, client.EngineClient.generate
slow, speculative, rng = {}, {}, random.Random(7)

def flush_cache(self, *args, **kwargs):
    slow[self.base_url] = 7
    return _flush(self, *args, **kwargs)

def generate(self, *args, **kwargs):
    if speculative.get(self.base_url) and slow.get(self.base_url, 0) > 0:
        slow[self.base_url] -= 1
        time.sleep(rng.uniform(0.3, 2.1))
    return _generate(self, *args, **kwargs)

client.EngineClient.flush_cache = flush_cache
client.EngineClient.generate = generate

def pytest_sessionstart(session):
    from pytest_specenergy.session import SESSION_KEY
    state = session.config.stash[SESSION_KEY]

    def watch():
        while True:
            pool = getattr(state._measurer, "pool", None)
            for cfg, server in list(getattr(pool, "_live", {}).items()):
                speculative[f"http://127.0.0.1:{server.port}"] = cfg.is_speculative
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
"""

# ---------------------------------------------------------------------------------------------
# the reference server (T1, T2, T26, T45, R-5e)


@row(
    "T1.set-internal-state-values",
    "POST /set_internal_state with 0, -1, 1.5, '4', true, null, 10**30, NaN, Infinity, 2.0, an "
    "extra key, another key, a list, an empty body, 33 (above the engine's 32); then 3",
    "every bad body HTTP 400; 3 -> 200",
    rc=(0,),
    text=r"bad bodies: 15 of 15 answered 400; 3 -> 200",
)
def _set_state(d: Path) -> Any:
    port = M.Server.get()
    bodies = [
        *(
            json.dumps({"max_running_requests": v}).encode()
            for v in (0, -1, 1.5, "4", True, None, 10**30, 2.0, 33)
        ),
        b'{"max_running_requests": NaN}',
        b'{"max_running_requests": Infinity}',
        b'{"max_running_requests": 3, "x": 1}',
        b'{"other": 3}',
        b"[3]",
        b"",
    ]
    codes = [post(port, "/set_internal_state", body)[0] for body in bodies]
    good = post(port, "/set_internal_state", b'{"max_running_requests": 3}')[0]
    post(port, "/set_internal_state", b'{"max_running_requests": 32}')
    bad = sum(code == 400 for code in codes)
    return M.Obs(
        0 if bad == len(bodies) and good == 200 else 1,
        f"bad bodies: {bad} of {len(bodies)} answered 400; 3 -> {good} (codes {codes})",
    )


@row(
    "T2.set-internal-state-race",
    "2 threads flip the admission cap to random 1..32 while 4 threads generate 16 tokens, 6 s",
    "every answer 200 and equal to the solo run's",
    rc=(0,),
    text=r"differing or failed: 0",
)
def _cap_race(d: Path) -> Any:
    port = M.Server.get()
    body = json.dumps({"input_ids": [[5, 6, 7, 8]], "sampling_params": {"max_new_tokens": 16}})
    solo = _outputs(post(port, "/generate", body.encode(), timeout=60)[1])
    stop, lock = time.monotonic() + 6, threading.Lock()
    results: dict[str, int] = {"ok": 0, "bad": 0, "sets": 0}

    def flip() -> None:
        rng = random.Random()
        while time.monotonic() < stop:
            value = json.dumps({"max_running_requests": rng.randint(1, 32)}).encode()
            post(port, "/set_internal_state", value)
            with lock:
                results["sets"] += 1

    def generate() -> None:
        while time.monotonic() < stop:
            code, text = post(port, "/generate", body.encode(), timeout=60)
            with lock:
                results["ok" if code == 200 and _outputs(text) == solo else "bad"] += 1

    threads = [threading.Thread(target=flip) for _ in range(2)]
    threads += [threading.Thread(target=generate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    post(port, "/set_internal_state", b'{"max_running_requests": 32}')
    return M.Obs(
        0,
        f"{results['sets']} cap changes; answers equal to the solo run: {results['ok']}; "
        f"differing or failed: {results['bad']}",
    )


def _outputs(text: str) -> list[list[int]] | None:
    """The generated token ids of a /generate answer (None for anything else)."""
    try:
        return [item["output_ids"] for item in json.loads(text)]
    except (ValueError, TypeError, KeyError):
        return None


@row(
    "T26.loopback-flood",
    "60 keep-alive clients generating 8 tokens for 8 s; /health every 0.5 s meanwhile",
    "every request 200; /health answers throughout",
    rc=(0,),
    text=r"generate \{200: \d+\}; health \{200: \d+\}",
)
def _flood(d: Path) -> Any:
    import http.client

    port = M.Server.get()
    body = json.dumps({"input_ids": [[5, 6, 7]], "sampling_params": {"max_new_tokens": 8}})
    stop, lock = time.monotonic() + 8, threading.Lock()
    codes: dict[int, int] = {}
    health: dict[int, int] = {}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < stop:
            try:
                conn.request("POST", "/generate", body=body, headers={"Content-Type": "x"})
                answer = conn.getresponse()
                answer.read()
                code = answer.status
            except (OSError, http.client.HTTPException):
                code = 0
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            with lock:
                codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(60)]
    for t in threads:
        t.start()
    while time.monotonic() < stop:
        code = M.Server.request("GET", "/health", timeout=5)[0]
        health[code] = health.get(code, 0) + 1
        time.sleep(0.5)
    for t in threads:
        t.join(90)
    return M.Obs(0, f"generate {dict(sorted(codes.items()))}; health {health}")


@row(
    "R-5e.concurrent-with-flushes",
    "8 threads x 7 POST /generate (1-3 prompts, 32 tokens) while /flush_cache every 0.3 s",
    "every generate 200 with the right number of answers; /health 200",
    rc=(0,),
    text=r"generate \{200: 56\}; bad answers 0; health 200",
)
def _conc_flush(d: Path) -> Any:
    port = M.Server.get()
    lock, codes, bad = threading.Lock(), {}, [0]
    done = threading.Event()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(7):
            n = rng.randint(1, 3)
            body = {"input_ids": [[5, 6, 7, 8]] * n, "sampling_params": {"max_new_tokens": 32}}
            code, text = post(port, "/generate", json.dumps(body).encode(), timeout=120)
            with lock:
                codes[code] = codes.get(code, 0) + 1
                outputs = _outputs(text) if code == 200 else []
                if code == 200 and (outputs is None or len(outputs) != n):
                    bad[0] += 1

    def flush() -> None:
        while not done.is_set():
            post(port, "/flush_cache", b"")
            time.sleep(0.3)

    flusher = threading.Thread(target=flush)
    flusher.start()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    done.set()
    flusher.join(10)
    health = M.Server.request("GET", "/health")[0]
    return M.Obs(0, f"generate {codes}; bad answers {bad[0]}; health {health}")


for _flag, _value, _msg in (
    ("--port", "70000", "expected a port from 0 to 65535"),
    ("--threads", "-1", "thread count >= 0"),
    ("--max-connections", "0", ""),
    ("--request-timeout", "nan", ""),
    ("--http-timeout", "-1", ""),
    ("--max-running-requests", "0", ""),
):

    def _edge(d: Path, flag: str = _flag, value: str = _value) -> Any:
        args = [M.PY, "-m", "pytest_specenergy.refserver", "--model", "tiny:dense"]
        port = [] if flag == "--port" else ["--port", "0"]
        return M.run_cmd([*args, *port, flag, value], d, timeout=90)

    ROWS.append(
        (
            f"T45.refserver{_flag}={_value}",
            f"python -m pytest_specenergy.refserver {_flag} {_value}",
            "rc 2 with a message naming the flag; no traceback, no server",
            _edge,
            {"rc": (2,), "text": re.escape(_flag) + r".*" + _msg, "absent": r"Traceback|ready on"},
        )
    )


# ---------------------------------------------------------------------------------------------
# admission caps and windows (T3-T7)


def _capped(d: Path, which: str, cap: int) -> Any:
    M.write(d, {"conftest.py": CAPPER, "test_p.py": B4.replace("MRR", "")})
    env = {"PROBE_CAP": str(cap), "PROBE_WHICH": which}
    return run_env(M.pytest_args(), d, env, timeout=300)


@row(
    "T3.cap-speculative-by-another-client",
    "b4 session; another client sets the speculative engine's cap to 2 every 0.2 s",
    "FAILED concurrency-below-batch (the checks catch the override)",
    rc=(1,),
    text=r"concurrency-below-batch",
)
def _cap_spec(d: Path) -> Any:
    return _capped(d, "spec", 2)


@row(
    "T4.cap-both-engines",
    "b4 session; both engines capped at 3 every 0.2 s by another client",
    "FAILED concurrency-below-batch",
    rc=(1,),
    text=r"concurrency-below-batch",
)
def _cap_both(d: Path) -> Any:
    return _capped(d, "both", 3)


@row(
    "T5.queued-refill",
    "b4 session; the measurer's set_internal_state calls and each engine's peak requests in "
    "flight (a conftest counts them)",
    "one call per engine (max_running_requests 4); more than 4 in flight (the queued refill)",
    rc=(0,),
    text=r"calls \[\[\{\"max_running_requests\": 4\}\], \[\{\"max_running_requests\": 4\}\]\]",
)
def _refill(d: Path) -> Any:
    M.write(d, {"conftest.py": REFILL_SPY})
    obs = M.suite_run(d, suite=B4.replace("MRR", ""), timeout=300)
    facts = json_of(d / "refill.json")
    peak = facts.get("peak", [])
    if not peak or min(peak) <= 4:
        obs.rc = 99
    return note(obs, f"calls {json.dumps(facts.get('calls'))}; peak in flight {peak}")


@row(
    "T6.declared-running-requests",
    "model(max_running_requests=4) at b4 and model(max_running_requests=3) at b4",
    "4: passes without a cap call; 3: FAILED concurrency-below-batch (the engine admits 3)",
    rc=(1,),
    text=r"(?s)1 failed, 1 passed",
)
def _declared(d: Path) -> Any:
    four = B4.replace("MRR", ", max_running_requests=4")
    three = B4.replace("MRR", ", max_running_requests=3").replace("import pytest", "")
    suite = four + three.replace("def test_b4", "def test_b4_three")
    obs = M.suite_run(d, suite=suite, timeout=300)
    if "concurrency-below-batch" not in obs.out:
        obs.rc = 99
    return obs


@row(
    "T7.disturbed-windows",
    "b4 session; every speculative window's ramp slowed (the next 7 sends after each flush "
    "delayed 0.3-2.1 s, a conftest)",
    "the windows run again and the case fails, saying so",
    rc=(1,),
    text=r"run again|concurrency-differs|concurrency-below-batch",
)
def _disturbed(d: Path) -> Any:
    M.write(d, {"conftest.py": DISTURBER})
    return M.suite_run(d, suite=B4.replace("MRR", ""), timeout=400)


# ---------------------------------------------------------------------------------------------
# the zygote's socket (T8)


@row(
    "T8.zygote-socket-modes",
    "during a session: the zygote socket's folder mode; connect to it as uid 65534",
    "folder 0700; the other user is refused (PermissionError)",
    rc=(0,),
    text=r"folder mode 700; as nobody: PermissionError",
)
def _socket_modes(d: Path) -> Any:
    M.write(d, {"test_p.py": getattr(M.fault_zygote, "RAW_CLIENT_TESTS", M.SUITE)})
    run = M.Spawned(M.pytest_args("-v"), d)
    found = "no zygote socket found"
    if run.wait_for(r"test_a.*PASSED", 180):
        for pid in M.descendants(run.proc.pid):
            match = re.search(r"--listen (\S+)", M.cmdline(pid))
            if match:
                sock = Path(match.group(1))
                mode = oct(sock.parent.stat().st_mode & 0o777)[2:]
                child = os.fork()
                if child == 0:
                    code = 3
                    try:
                        os.setgid(65534)
                        os.setuid(65534)
                        with socket.socket(socket.AF_UNIX) as s:
                            s.connect(str(sock))
                        code = 0
                    except PermissionError:
                        code = 1
                    finally:
                        os._exit(code)
                _, status = os.waitpid(child, 0)
                how = {0: "connected", 1: "PermissionError"}.get(os.waitstatus_to_exitcode(status))
                found = f"folder mode {mode}; as nobody: {how}"
                break
    return note(run.finish(240), found)


# ---------------------------------------------------------------------------------------------
# residency (T16), SGLang option values (T36)

RESIDENCY = """
import json
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.sglang_residency import decide

def config(**options):
    return EngineConfig(engine="sglang", model="Qwen/Qwen3-8B", drafter=Drafter("ngram"),
        dtype="bf16", device="cuda", options=EngineConfig.freeze_options(
            {"sglang_version": "0.5.23", "python": "/py", **options}))

for name, options in (("nan", {"mem_fraction_static": float("nan")}),
                      ("inf", {"mem_fraction_static": float("inf")}),
                      ("abc", {"mem_fraction_static": "abc"}),
                      ("weights-inf", {"weights_gb": float("inf"), "resident": True}),
                      ("weights-1e300", {"weights_gb": 1e300, "resident": True})):
    spec = config(**options)
    try:
        r = decide([spec.twin(), spec], 2, 141 * 2**30, frozenset({"sleep_on_idle"}))
        print(f"{name}: resident={r.resident} share={r.mem_fraction} refused={bool(r.refused)}")
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}")
"""


@row(
    "T16.residency-hostile-values",
    "sglang_residency.decide() with mem_fraction_static nan/inf/'abc', weights_gb inf/1e300",
    "each refused, named (no resident=True, no raw OverflowError/ValueError)",
    rc=(0,),
    text=r"(?s)nan: resident=False .*refused=True.*inf: resident=False.*abc: resident=False",
    absent=r"resident=True|OverflowError|Traceback|: ValueError",
)
def _residency(d: Path) -> Any:
    return M.run_cmd([M.PY, "-c", RESIDENCY], d, timeout=60)


SGLANG_PATHS = """
import pytest
from pathlib import Path

@pytest.mark.model("Qwen/Qwen3-8B", engine="sglang", sglang_version="0.5.23",
                   chat_template=[Path("x"), Path("--host"), Path("0.0.0.0")])
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1)
def test_s(spec_pair):
    spec_pair.measure()
"""


@row(
    "T36.sglang-path-list-host",
    "SGLang dry run, chat_template=[Path('x'), Path('--host'), Path('0.0.0.0')]",
    "refused (rc 4): the value would be read as another flag",
    rc=(USAGE,),
    text=r"another flag",
    absent=r"--host 0\.0\.0\.0",
)
def _sglang_paths(d: Path) -> Any:
    M.write(d, {"test_s.py": SGLANG_PATHS})
    return M.run_cmd(
        [M.PY, "-m", "pytest", "-p", "no:cacheprovider", "--specenergy-dry-run"], d, timeout=120
    )


# ---------------------------------------------------------------------------------------------
# disks: full, read-only (N15, T17-T20, T43)


@row(
    "N15.storage-full/T17",
    "storage on a full 200 kB tmpfs holding 0001_prev; --specenergy-save=main "
    "--specenergy-compare=last",
    "refused at start (rc 4) naming the free space; 0001_prev unchanged; nothing measured",
    rc=(USAGE,),
    text=r"--specenergy-storage .*bytes free",
)
def _storage_full(d: Path) -> Any:
    with tmpfs(d / "mnt", "200k") as mnt:
        import shutil

        key = M.Fixture.storage_into(d)
        store = mnt / "store"
        shutil.copytree(key, store / key.name)
        prev = {p: M.md5(p) for p in store.rglob("0*.json")}
        fill(mnt, 20_000)
        obs = M.suite_run(
            d,
            "--specenergy-save=main",
            "--specenergy-compare=last",
            f"--specenergy-storage={store}",
            timeout=120,
        )
        intact = all(p.exists() and M.md5(p) == digest for p, digest in prev.items())
        return note(
            obs, f"earlier runs intact: {intact}; engines started: {'started in' in obs.out}"
        )


@row(
    "T18.storage-fills-mid-write",
    "48 kB free on the storage tmpfs (the JSON fits, the run would not); --specenergy-save=main "
    "--specenergy-json on the same disk",
    "refused at start (rc 4): too little room; nothing partial",
    rc=(USAGE,),
    text=r"bytes free",
    check=lambda d, o: "a temp file was left" if list((d / "mnt").rglob("*.tmp*")) else None,
)
def _storage_mid(d: Path) -> Any:
    with tmpfs(d / "mnt", "300k") as mnt:
        fill(mnt, 48_000)
        obs = M.suite_run(
            d,
            "--specenergy-save=main",
            f"--specenergy-storage={mnt / 'store'}",
            f"--specenergy-json={mnt / 'run.json'}",
            timeout=120,
        )
        left = list(mnt.rglob("*.tmp*"))
        return note(obs, f"temp files left: {len(left)}")


@row(
    "T19.read-only-outputs",
    "storage, JSON folder and golden folder each on a read-only tmpfs (three sessions)",
    "rc 4 at start for each, naming the option",
    rc=(0,),
    text=r"storage 4, json 4, golden 4",
)
def _read_only(d: Path) -> Any:
    codes = {}
    with tmpfs(d / "ro", "1m") as mnt:
        (mnt / "store").mkdir()
        (mnt / "golden").mkdir()
        read_only(mnt)
        for name, option in (
            ("storage", ["--specenergy-save=main", f"--specenergy-storage={mnt / 'store'}"]),
            ("json", [f"--specenergy-json={mnt / 'run.json'}"]),
            (
                "golden",
                ["--specenergy-golden=check", f"--specenergy-baselines={mnt / 'golden'}"],
            ),
        ):
            codes[name] = M.suite_run(d, *option, timeout=120).rc
    return M.Obs(
        0 if set(codes.values()) == {4} else 1, ", ".join(f"{k} {v}" for k, v in codes.items())
    )


@row(
    "T20.key-folder-read-only",
    "storage root writable, its machine-key folder a read-only tmpfs; --specenergy-save=main "
    "--specenergy-json=run.json",
    "found at the end: rc 1 naming the folder (Read-only), the table printed, run.json kept",
    rc=(1,),
    text=r"could not be saved.*Read-only",
    check=lambda d, o: None if (d / "run.json").exists() else "run.json missing",
)
def _key_ro(d: Path) -> Any:
    key = M.Fixture.storage_into(d).name
    with tmpfs(d / "store" / key, "1m") as mnt:
        read_only(mnt)
        return M.suite_run(
            d,
            "--specenergy-save=main",
            f"--specenergy-storage={d / 'store'}",
            "--specenergy-json=run.json",
            timeout=240,
        )


@row(
    "T43.log-dir-read-only",
    "--specenergy-log-dir on a read-only tmpfs",
    "rc 4 at start naming --specenergy-log-dir; no engine started",
    rc=(USAGE,),
    text=r"--specenergy-log-dir .*(Read-only|cannot be written)",
    absent=r"OSError",
)
def _logs_ro(d: Path) -> Any:
    with tmpfs(d / "ro", "1m") as mnt:
        read_only(mnt)
        return M.suite_run(d, f"--specenergy-log-dir={mnt / 'logs'}", timeout=120)


@row(
    "T43.log-dir-full",
    "--specenergy-log-dir on a full tmpfs",
    "rc 4 at start naming --specenergy-log-dir and the free space",
    rc=(USAGE,),
    text=r"--specenergy-log-dir .*bytes free",
    absent=r"OSError",
)
def _logs_full(d: Path) -> Any:
    with tmpfs(d / "full", "200k") as mnt:
        fill(mnt, 0)
        return M.suite_run(d, f"--specenergy-log-dir={mnt / 'logs'}", timeout=120)


# ---------------------------------------------------------------------------------------------
# signals and workers (T41, T42, T46)


@row(
    "T41.coreutils-timeout",
    "timeout -k 30 40 pytest (test_a quick, test_b long) --specenergy-save=main "
    "--specenergy-json=run.json",
    "rc 124; run.json interrupted with test_a; the saved run marked interrupted; no engine left",
    rc=(124,),
    text=r"run\.json: results 1 interrupted True; saved interrupted True; processes left 0",
)
def _coreutils_timeout(d: Path) -> Any:
    M.write(d, {"test_p.py": M.TWO_TESTS})
    args = M.pytest_args("--specenergy-save=main", "--specenergy-json=run.json")
    obs = M.run_cmd(["timeout", "-k", "30", "40", *args], d, timeout=150)
    time.sleep(5)
    data = json_of(d / "run.json")
    saved = M.stored_runs(d)
    left = [p for p in _pids_in(d) if M.alive(p)]
    return note(
        obs,
        f"run.json: results {len(data.get('results', []))} interrupted "
        f"{data.get('interrupted')}; saved interrupted "
        f"{bool(saved) and json_of(saved[0]).get('interrupted')}; processes left {len(left)}",
    )


def _pids_in(folder: Path) -> list[int]:
    """Processes (not this one) whose working directory is ``folder``: a session's engines."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if Path(os.readlink(entry / "cwd")) == folder:
                found.append(int(entry.name))
    return found


@row(
    "T42.xdist-off",
    "pytest -n 2 --specenergy-xdist=off",
    "rc 1: spec_pair tests failed unmeasured, said once",
    rc=(1,),
    text=r"spec_pair tests failed unmeasured",
)
def _xdist_off(d: Path) -> Any:
    return M.suite_run(d, "-n", "2", "--specenergy-xdist=off", timeout=240)


@row(
    "T46.hung-engine-one-request",
    "prompts=1: kill -STOP both engines during test_b, --specenergy-request-timeout=10",
    "test_b fails with the diagnosis: did not answer within 10 s (hung), the engine was stopped",
    rc=(1,),
    text=r"did not answer POST /generate within 10 s",
)
def _hung_one(d: Path) -> Any:
    suite = M.TWO_TESTS.replace("max_new_tokens=3000, prompts=2", "max_new_tokens=3000, prompts=1")
    M.write(d, {"test_p.py": suite})
    run = M.Spawned(M.pytest_args("-v", "--specenergy-request-timeout=10"), d)
    if run.wait_for(r"test_a.*PASSED", 180):
        time.sleep(3)
        for pid in M.servers_of(run.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
    return run.finish(200)


# ---------------------------------------------------------------------------------------------
# earlier audits' rows that were listed as not automated (R-1d, R-1e, R-3e, N18, N26, N42, N45)

FORCED_PORT = """
import pytest_specenergy.engines.launch as launch

launch.free_port = lambda *a, **k: PORT
"""


def _held_port(d: Path, listener: Callable[[int], Any]) -> Any:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    holder = listener(port)
    try:
        M.write(d, {"conftest.py": FORCED_PORT.replace("PORT", str(port))})
        return M.suite_run(d, timeout=240)
    finally:
        holder()


def _plain_listener(port: int) -> Callable[[], None]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s.close


@row(
    "R-1d.port-plain-listener",
    "the plugin's port picker forced (conftest) onto a port a plain TCP listener holds",
    "the case fails naming the port (in use, or the start-up error and log); no traceback of the "
    "plugin's",
    rc=(1,),
    text=r"already in use|exited with code|not an engine|PortTaken",
)
def _plain_port(d: Path) -> Any:
    return _held_port(d, _plain_listener)


def _engine_listener(port: int) -> Callable[[], None]:
    proc = subprocess.Popen(
        [M.PY, "-m", "pytest_specenergy.refserver", "--model", "tiny:dense", "--port", str(port)],
        env=M.child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            break
        time.sleep(0.5)

    def stop() -> None:
        M._kill_group(proc.pid)
        proc.wait()

    return stop


@row(
    "R-1e.port-foreign-engine",
    "the port picker forced onto a port another reference server (not the session's) holds",
    "the case fails naming the foreign server (its model or pid), never using it",
    rc=(1,),
    text=r"already in use by another process|foreign server",
)
def _foreign_port(d: Path) -> Any:
    return _held_port(d, _engine_listener)


RACE_SAVE = """
import datetime as dt, json, sys
from multiprocessing import Pool
from pathlib import Path
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.storage import RunStore

def save(i):
    doc = RunDocument.from_dict(json.loads(Path("run.json").read_text()))
    now = dt.datetime(2026, 12, 1, 10, 0, 0)
    return [str(RunStore("store").save(doc, "race", now=now)) for _ in range(20)]

if __name__ == "__main__":
    with Pool(4) as pool:
        paths = [p for chunk in pool.map(save, range(4)) for p in chunk]
    files = list(Path("store").rglob("*_race_*.json"))
    tmp = list(Path("store").rglob("*.tmp*"))
    print(f"calls {len(paths)}, distinct {len(set(paths))}, files {len(files)}, tmp {len(tmp)}")
"""


@row(
    "R-3e.save-race",
    "4 processes x 20 RunStore.save, one name, one second",
    "80 distinct files, no temp file left",
    rc=(0,),
    text=r"calls 80, distinct 80, files 80, tmp 0",
)
def _save_race(d: Path) -> Any:
    M.edited_run(d, "run.json", lambda doc: None)
    return M.run_cmd([M.PY, "-c", RACE_SAVE], d, timeout=120)


SLOW_FSYNC = """
import os, time
import pytest_specenergy.atomic as atomic

_fsync = os.fsync

def slow_fsync(fd):
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = ""
    if "/.specenergy/" in name and ".json" in name:
        open("fsyncing", "w").close()
        time.sleep(10)
    return _fsync(fd)

atomic.os.fsync = slow_fsync
"""


@row(
    "N18.sigint-during-fsync",
    "SIGINT while the run's temp file in the history is fsynced (a conftest makes that fsync "
    "take 10 s); storage holds 0001_prev",
    "rc 130 or 2; 0001_prev unchanged; no temp file left; run.json written before",
    rc=(130, -2, 2),  # -2: killed by SIGINT as Python re-raises it (a shell says 130)
    text=r"tmp left 0; earlier runs intact True; run\.json True",
)
def _sigint_fsync(d: Path) -> Any:
    M.Fixture.storage_into(d)
    prev = M.stored_runs(d)
    digests = {p: M.md5(p) for p in prev}
    M.write(d, {"test_p.py": M.SUITE, "conftest.py": SLOW_FSYNC})
    args = M.pytest_args(
        "--specenergy-save=main",
        f"--specenergy-storage={d / '.specenergy'}",
        "--specenergy-json=run.json",
    )
    run = M.Spawned(args, d)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (d / "fsyncing").exists():
        if run.proc.poll() is not None:
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(run.proc.pid, signal.SIGINT)
    obs = run.finish(120)
    tmp = [p for p in (d / ".specenergy").rglob("*") if ".tmp" in p.name]
    intact = all(p.exists() and M.md5(p) == digest for p, digest in digests.items())
    return note(
        obs,
        f"tmp left {len(tmp)}; earlier runs intact {intact}; run.json {(d / 'run.json').exists()}",
    )


@row(
    "N26.kill-watchdog",
    "kill -9 the baseline engine's watchdog during test_b (long); test_c after it",
    "test_b fails naming its engine's end; the engine restarts; test_c passes",
    rc=(1,),
    text=r"(?s)died|exited with code.*1 failed, 2 passed",
)
def _kill_watchdog(d: Path) -> Any:
    M.write(d, {"test_p.py": M.fault_zygote.THREE_TESTS})
    run = M.Spawned(M.pytest_args("-v"), d)
    if run.wait_for(r"test_a.*PASSED", 180):
        time.sleep(3)
        for pid in M.servers_of(run.proc.pid, speculative=False):
            group = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
            with contextlib.suppress(ProcessLookupError):
                os.kill(group, signal.SIGKILL)  # the watchdog leads the server's group
    return run.finish(240)


@row(
    "N42.listening-sockets",
    "every listening socket of the session's processes, read from /proc during test_b",
    "only the engines' TCP ports on 127.0.0.1 and the zygote's Unix socket; no UDP, no 0.0.0.0",
    rc=(0,),
    text=r"tcp \['127\.0\.0\.1:\d+', '127\.0\.0\.1:\d+'\]; other addresses \[\]; udp 0",
)
def _listening(d: Path) -> Any:
    M.write(d, {"test_p.py": M.TWO_TESTS})
    run = M.Spawned(M.pytest_args("-v"), d)
    found = "not seen"
    if run.wait_for(r"test_a.*PASSED", 180):
        time.sleep(2)
        pids = [run.proc.pid, *M.descendants(run.proc.pid)]
        inodes = set()
        for pid in pids:
            with contextlib.suppress(OSError):
                for fd in (Path(f"/proc/{pid}/fd")).iterdir():
                    with contextlib.suppress(OSError):
                        link = os.readlink(fd)
                        if link.startswith("socket:["):
                            inodes.add(link[8:-1])
        listening, other, udp = [], [], 0
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                parts = line.split()
                if parts[9] in inodes and parts[3] == "0A":  # LISTEN
                    address = _address(parts[1])
                    (listening if address.startswith("127.0.0.1:") else other).append(address)
        for table in ("udp", "udp6"):
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
            udp += sum(1 for line in lines if line.split()[9] in inodes)
        found = f"tcp {sorted(listening)}; other addresses {other}; udp {udp}"
    obs = run.finish(200)
    obs.rc = 0
    return note(obs, found)


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    if len(host) == 8:
        ip = ".".join(str(int(host[i : i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        ip = "ipv6:" + host
    return f"{ip}:{int(port, 16)}"


ONE_LIVE = """
import pytest_specenergy.engines.pool as pool

_init = pool.EnginePool.__init__

def init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.max_live = 1

pool.EnginePool.__init__ = init
"""

LONG_CONTEXT = """
import pytest

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.drafter("ngram"), pytest.mark.batch(1),
              pytest.mark.generation(max_new_tokens=8, prompts=2)]

@pytest.mark.corpus("code")
def test_0_normal(spec_pair):
    spec_pair.measure()

@pytest.mark.corpus("jsonl:long.jsonl")
def test_a_long_prompt(spec_pair):
    spec_pair.measure()

@pytest.mark.corpus("code")
def test_b_normal(spec_pair):
    spec_pair.measure()
"""


@row(
    "N45.one-live-engine",
    "pool.max_live = 1 (the GPU path, a conftest); a normal case, one whose prompt exceeds the "
    "context, a normal case",
    "1 failed (the long prompt, HTTP 400), 2 passed; blocked order recorded",
    rc=(1,),
    text=r"(?s)exceeds the model's context.*1 failed, 2 passed",
)
def _one_live(d: Path) -> Any:
    M.write(
        d,
        {
            "conftest.py": ONE_LIVE,
            "long.jsonl": json.dumps({"prompt": "word " * 20000}) + "\n",
            "test_p.py": LONG_CONTEXT,
        },
    )
    return M.run_cmd(M.pytest_args("-v"), d, timeout=300)


def _concurrently(d: Path, extra: list[str], repeats: int = 1) -> list[Any]:
    M.write(d, {"test_p.py": M.SUITE})
    procs = []
    for i in range(2):
        log = open(d / f"_session{i}.txt", "w")
        proc = subprocess.Popen(
            M.pytest_args(*extra, repeats=repeats),
            cwd=d,
            env=M.child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append((proc, log))
        time.sleep(2)
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=300))
        except subprocess.TimeoutExpired:
            M._kill_group(proc.pid)
            codes.append(124)
        log.close()
    return codes


@row(
    "R-3d.two-sessions",
    "two pytest sessions at once, --specenergy-save=race into one storage",
    "both rc 0; two run files 0001 and 0002",
    rc=(0,),
    text=r"rc \[0, 0\]; runs \['0001_race', '0002_race'\]",
)
def _two_sessions(d: Path) -> Any:
    codes = _concurrently(d, ["--specenergy-save=race"])
    names = sorted("_".join(p.name.split("_")[:2]) for p in M.stored_runs(d))
    return M.Obs(0, f"rc {codes}; runs {names}")


@row(
    "N17.golden-concurrent",
    "two sessions at once with --specenergy-golden=check on an empty golden folder (1 repeat)",
    "neither passes: a golden created this session fails until reviewed",
    rc=(0,),
    text=r"rc \[1, 1\]",
)
def _golden_concurrent(d: Path) -> Any:
    codes = _concurrently(d, ["--specenergy-golden=check"])
    return M.Obs(
        0, f"rc {codes}; goldens {len(list((d / 'specenergy_baselines').rglob('*.json')))}"
    )


# N1/N2: another client aborts the baseline engine's requests (once 3 s into its first measured
# window; or every 1.5 s).
ABORTER = """
import json, os, threading, time, urllib.request

EVERY = float(os.environ["PROBE_ABORT_EVERY"])

def _abort(port):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/abort_request",
        data=json.dumps({"abort_all": True}).encode(), headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=5).read()
    except Exception:
        pass

def pytest_sessionstart(session):
    from pytest_specenergy.session import SESSION_KEY
    state = session.config.stash[SESSION_KEY]

    def watch():
        while True:
            pool = getattr(state._measurer, "pool", None)
            ports = [s.port for c, s in list(getattr(pool, "_live", {}).items())
                     if not c.is_speculative]
            if ports:
                break
            time.sleep(0.1)
        time.sleep(3)
        end = time.monotonic() + 22
        while True:
            for port in ports:
                _abort(port)
            if EVERY <= 0 or time.monotonic() > end:
                return
            time.sleep(EVERY)

    threading.Thread(target=watch, daemon=True).start()
"""

ABORT_SUITE = """
import pytest

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=200, prompts=8, ignore_eos=True)
def test_p(spec_pair):
    spec_pair.measure()
"""


@row(
    "N1.external-abort-once",
    "another client sends abort_all to the baseline engine once, 3 s after it started (b1, 8 x "
    "200 tokens)",
    "never a pass on cut answers: fails closed naming the abort or the windows' coverage, or "
    "passes with the cut requests generated again",
    rc=(0, 1),
    absent=r"Traceback \(most recent call last\)(?!.*specenergy)",
    check=lambda d, o: (
        None
        if o.rc == 1
        and re.search(r"abort|coverage-differs|cover", o.out)
        or o.rc == 0
        and "1 passed" in o.out
        else "neither a named failure nor a pass"
    ),
)
def _abort_once(d: Path) -> Any:
    M.write(d, {"conftest.py": ABORTER, "test_p.py": ABORT_SUITE})
    return run_env(M.pytest_args(), d, {"PROBE_ABORT_EVERY": "0"}, timeout=300)


@row(
    "N2.abort-during-regeneration/I23-9",
    "abort_all to the baseline engine every 1.5 s for 22 s (it also hits the unmetered "
    "regeneration)",
    "the case fails saying the engine aborted requests (their outputs incomplete), not blaming "
    "the drafter",
    rc=(1,),
    text=r"abort",
)
def _abort_often(d: Path) -> Any:
    M.write(d, {"conftest.py": ABORTER, "test_p.py": ABORT_SUITE})
    return run_env(M.pytest_args(), d, {"PROBE_ABORT_EVERY": "1.5"}, timeout=300)


AB_SUITE = """
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=CAND, id="cand"))
@pytest.mark.reference_drafter(Drafter("ngram", num_draft_tokens=REF, id="ref"))
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=32, prompts=3)
def test_ab(spec_pair):
    spec_pair.measure()
"""


@row(
    "N5.in-job-ab-worse",
    "in-job A/B: candidate ngram K=1 against reference K=8, repeats 3",
    "FAILED: regressed against the reference drafter (in-job A/B)",
    rc=(1,),
    text=r"regressed against reference drafter ref \(in-job A/B\)",
)
def _ab_worse(d: Path) -> Any:
    suite = AB_SUITE.replace("CAND", "1").replace("REF", "8")
    return M.suite_run(
        d, "--specenergy-compare-fail=energy:5%", suite=suite, repeats=3, timeout=400
    )


KILL_REFERENCE = """
import os, signal, time
import pytest_specenergy.measure.pairs as pairs

_timed, done = pairs.PairMeasurer._timed, []

def timed(self, measurer, arm, index, *args):
    result = _timed(self, measurer, arm, index, *args)
    if arm == "reference" and index == 0 and not done:
        done.append(1)
        os.killpg(measurer.server.pid, signal.SIGKILL)
        while measurer.server.alive():
            time.sleep(0.05)
    return result

pairs.PairMeasurer._timed = timed
"""


@row(
    "N6.in-job-ab-kill-reference",
    "in-job A/B, repeats 2: kill -9 the reference drafter's engine after its first measured repeat",
    "restarted and said so (engine-restarted); the case judged",
    rc=(0, 1),
    text=r"\[ref\].* died .*restarted|engine-restarted",
)
def _ab_kill(d: Path) -> Any:
    M.write(d, {"conftest.py": KILL_REFERENCE})
    suite = AB_SUITE.replace("CAND", "4").replace("REF", "4")
    return M.suite_run(d, "-rA", suite=suite, repeats=2, timeout=400)


# ---------------------------------------------------------------------------------------------


def add_probes(matrix: ModuleType) -> None:
    """Append this module's rows to ``matrix.PROBES`` (``matrix`` is ``fault_matrix``)."""
    global M
    M = matrix
    for id, did, expected, fn, kw in ROWS:
        matrix.PROBES.append(matrix.Probe(id, did, expected, run=fn, **kw))
