"""No orphan engines, and engine deaths reported as such (issue #12 items 3 and 6).

Every test here starts real processes. The parent-death tests run the launcher in a child
Python process and ``kill -9`` it, as a crashed pytest or xdist worker would be killed, then
watch the server's process group disappear.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_engine import ROOT
from fake_engine import FakeBackend
from fake_engine import group_members
from fake_engine import wait_gone

from pytest_specenergy.engines import pool as pool_module
from pytest_specenergy.engines import zygote as zygote_module
from pytest_specenergy.engines.client import DEFAULT_REQUEST_TIMEOUT_S
from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.engines.client import EngineError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.engines.pool import EngineTerminated

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
CONFIG = EngineConfig(engine="fake", model="m")
HERE = str(Path(__file__).parent)

# The launcher inside a child process: it prints the server's group id, then waits to die.
LAUNCHER = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
if sys.argv[2] == "reference":
    from pytest_specenergy.engines.refserver import ReferenceBackend
    config, backend = EngineConfig(engine="reference", model="tiny:dense"), ReferenceBackend()
else:
    from fake_engine import FakeBackend
    config, backend = EngineConfig(engine="fake", model="m"), FakeBackend(**json.loads(sys.argv[2]))
server = ServerProcess(config, backend, Path(sys.argv[3])).start()
from pytest_specenergy.engines import zygote
print(json.dumps({"pgid": server.pid, "log": str(server.log_path), "identity": server.identity,
                  "forked": type(server._proc).__name__,
                  "zygote": zygote._zygote.pid if zygote._zygote else None,
                  "own_zygote": bool(zygote._zygote and zygote._zygote.proc)}), flush=True)
time.sleep(600)
"""

# The pool inside a child process, shut down the way pytest does after KeyboardInterrupt.
POOL_OWNER = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from fake_engine import FakeBackend
from pytest_specenergy.engines import pool as pool_module
from pytest_specenergy.engines import zygote as zygote_module
from pytest_specenergy.engines.config import EngineConfig
pool_module.get_backend = lambda name: FakeBackend(**json.loads(sys.argv[2]))
pool = pool_module.EnginePool(Path(sys.argv[3]))
try:  # as pytest's main: a KeyboardInterrupt anywhere in the session ends it cleanly
    server = pool.get(EngineConfig(engine="fake", model="m"))
    print(json.dumps({"pgid": server.pid, "tmp": sys.argv[3]}), flush=True)
    time.sleep(60)
except KeyboardInterrupt as exc:
    print("interrupted by", type(exc).__name__, flush=True)
finally:
    pool.close()
    print("pool closed", flush=True)
"""


@pytest.fixture
def start_child(tmp_path):
    """Run a script in a child Python: ``start(script, mode)`` returns it and the JSON line
    it prints. Children still running after the test are killed."""
    children: list[subprocess.Popen[str]] = []

    def start(script: str, mode: str, *, wait_s: float = 60.0, shared_zygote: bool = False):
        return _start_child(children, script, tmp_path, mode, wait_s, shared_zygote)

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()


def _start_child(
    children: list, script: str, tmp_path: Path, mode: str, wait_s: float, shared_zygote: bool
):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), HERE])}
    if not shared_zygote:  # the child starts its own, as a pytest process of its own would
        env.pop(zygote_module.SHARED, None)
    errors = (tmp_path / "child.stderr").open("w+")
    child = subprocess.Popen(
        [sys.executable, "-c", script, HERE, mode, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        env=env,
        # as a pytest started from a terminal: under nohup the suite's children inherit an
        # ignored SIGHUP, which the pool rightly leaves ignored, and the SIGHUP test timed out
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    children.append(child)
    ready, _, _ = select.select([child.stdout], [], [], wait_s)
    line = child.stdout.readline() if ready else ""
    try:
        return child, json.loads(line)
    except ValueError:
        child.kill()
        child.wait()
        errors.seek(0)
        pytest.fail(f"the child started no server within {wait_s} s: {line}{errors.read()}")


def test_kill_9_of_the_launcher_stops_the_server_group(tmp_path, start_child, reap_group):
    grandchild = tmp_path / "grandchild.pid"
    child, facts = start_child(LAUNCHER, json.dumps({"grandchild": str(grandchild)}))
    reap_group(facts["pgid"])
    assert len(group_members(facts["pgid"])) == 3  # watchdog, server, the server's child
    child.kill()  # kill -9: no handler, no atexit, no teardown runs in the launcher
    child.wait()
    assert wait_gone(facts["pgid"], within_s=5.0) < 5.0
    assert "parent" in Path(facts["log"]).read_text() and "died" in Path(facts["log"]).read_text()


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the reference server needs torch"
)
@pytest.mark.parametrize("shared_zygote", [False, True], ids=["own-zygote", "parents-zygote"])
def test_kill_9_of_pytest_frees_a_real_reference_server(start_child, reap_group, shared_zygote):
    # The probe of fault-audit 2b/7b: a dead pytest (or xdist worker) left its server running.
    # parents-zygote: a nested pytest run forking its engines from this process's zygote
    # (SPECENERGY_ZYGOTE_SOCKET); its engines must stop with it, the zygote stays ours.
    ours = None
    if shared_zygote:
        ours = zygote_module.zygote_for(
            [sys.executable, "-m", zygote_module.REFSERVER, "--device", "cpu"], dict(os.environ)
        )
        assert ours is not None and ours.shared
    child, facts = start_child(LAUNCHER, "reference", wait_s=240.0, shared_zygote=shared_zygote)
    reap_group(facts["pgid"])
    members = group_members(facts["pgid"])
    assert len(members) >= 2  # the watchdog and the reference server
    assert facts["identity"].startswith(("pid ", "port "))  # it was proven to be ours
    assert facts["forked"] == "ZygoteChild" and facts["zygote"], facts
    assert facts["own_zygote"] is not shared_zygote, facts
    if not shared_zygote:
        # Forked from the launcher's zygote (engines/zygote.py), which must not outlive it either.
        reap_group(facts["zygote"])
    child.kill()
    child.wait()
    took = wait_gone(facts["pgid"], within_s=20.0)
    print(f"reference server group gone {took:.1f} s after kill -9 of its launcher")
    if shared_zygote:
        assert facts["zygote"] == ours.pid and ours.alive  # the parent's zygote serves on
    else:
        wait_gone(facts["zygote"], within_s=20.0)


def test_sigterm_ends_the_session_like_ctrl_c_and_stops_the_engines(start_child, reap_group):
    child, facts = start_child(POOL_OWNER, json.dumps({}))
    reap_group(facts["pgid"])
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=30)
    assert "interrupted by EngineTerminated" in out and "pool closed" in out, (
        child.returncode,
        (Path(facts["tmp"]) / "child.stderr").read_text(),
    )
    assert child.returncode == 0
    assert wait_gone(facts["pgid"], within_s=5.0) < 5.0


def test_sighup_ends_the_session_like_sigterm(start_child, reap_group):
    """Reliability-audit-3 T44: SIGHUP (a closed terminal or SSH session) killed pytest outright
    and lost every finished result; it now ends the session like SIGTERM, so teardown runs."""
    child, facts = start_child(POOL_OWNER, json.dumps({}))
    reap_group(facts["pgid"])
    child.send_signal(signal.SIGHUP)
    out, _ = child.communicate(timeout=30)
    assert "interrupted by EngineTerminated" in out and "pool closed" in out, (
        child.returncode,
        (Path(facts["tmp"]) / "child.stderr").read_text(),
    )
    assert child.returncode == 0
    assert wait_gone(facts["pgid"], within_s=5.0) < 5.0


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers can only be set from the main thread",
)
def test_a_handler_someone_set_to_ignore_sighup_is_respected(pool_with):
    """nohup: whoever started pytest asked for SIGHUP to be ignored; the pool leaves it so, and
    still handles SIGTERM."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        pool = pool_with()
        pool.get(CONFIG)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == pool._on_sigterm
        pool.close()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.fixture
def pool_with(monkeypatch, tmp_path):
    """An EnginePool whose backend is a fake engine with the given spec."""
    pools = []

    def make(request_timeout_s=None, **spec):
        monkeypatch.setattr(pool_module, "get_backend", lambda name: FakeBackend(**spec))
        pool = EnginePool(tmp_path, request_timeout_s=request_timeout_s)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers can only be set from the main thread",
)
def test_sigterm_handler_chains_the_previous_one_and_is_restored(pool_with):
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        pool = pool_with()
        server = pool.get(CONFIG)
        assert signal.getsignal(signal.SIGTERM) == pool._on_sigterm
        with pytest.raises(EngineTerminated, match="SIGTERM received: stopping 1 engine"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        assert calls == [signal.SIGTERM]
        pool.close()
        assert not server.alive()
        assert signal.getsignal(signal.SIGTERM) is not pool._on_sigterm
        os.kill(os.getpid(), signal.SIGTERM)  # the earlier handler is back in place
        time.sleep(0.1)
        assert calls == [signal.SIGTERM, signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_no_handler_is_set_off_the_main_thread(pool_with):
    before = signal.getsignal(signal.SIGTERM)
    pool = pool_with()
    result = []
    thread = threading.Thread(target=lambda: result.append(pool.get(CONFIG)))
    thread.start()
    thread.join(30)
    assert result and result[0].alive()
    assert signal.getsignal(signal.SIGTERM) == before


def test_engine_killed_mid_request_reports_exit_code_and_log(tmp_path):
    server = ServerProcess(CONFIG, FakeBackend(post="crash"), tmp_path).start()
    try:
        with pytest.raises(EngineError) as info:
            server.client.generate(text=["hi"], sampling_params={"max_new_tokens": 4})
    finally:
        server.stop()
    text = str(info.value)
    assert "exited with code -9 (SIGKILL) during POST /generate" in text
    assert str(server.log_path) in text and "CUDA error: an illegal memory access" in text


def test_hung_engine_ends_the_request_at_the_timeout(pool_with):
    server = pool_with(post="hang", request_timeout_s=1.0).get(CONFIG)
    assert server.client.timeout_s == 1.0
    started = time.monotonic()
    with pytest.raises(EngineError) as info:
        server.client.generate(text=["hi"], sampling_params={"max_new_tokens": 4})
    assert time.monotonic() - started < 10
    text = str(info.value)
    assert "did not answer POST /generate within 1 s" in text and "stuck in a collective" in text
    assert "--specenergy-request-timeout" in text
    assert not server.alive()  # stopped, so the next case gets a fresh engine


def test_every_request_in_flight_to_a_hung_engine_gets_its_diagnosis(pool_with):
    """Reliability-audit-3 1b: batch 1 keeps two requests in flight; the first to time out stopped
    the engine, and the other then failed with a bare "no answer", which the case reported in
    place of the diagnosis. Each now carries the timeout, the stop and the log tail."""
    server = pool_with(post="hang", request_timeout_s=1.0).get(CONFIG)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            server.client.generate(text=["hi"], sampling_params={"max_new_tokens": 4})
        except BaseException as exc:  # noqa: BLE001 - collected for the assertions
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # sent one after the other, as refills are
    for thread in threads:
        thread.join(30)
    assert len(errors) == 3
    for error in errors:
        text = str(error)
        assert isinstance(error, EngineError), text
        assert "did not answer POST /generate within 1 s" in text, text
        assert "the engine was stopped" in text and "stuck in a collective" in text, text
    assert not server.alive()


def test_request_timeout_default_and_validation():
    assert DEFAULT_REQUEST_TIMEOUT_S == 300.0
    assert EngineClient("http://127.0.0.1:1").timeout_s == DEFAULT_REQUEST_TIMEOUT_S
    with pytest.raises(ValueError, match="positive number of seconds"):
        EngineClient("http://127.0.0.1:1", timeout_s=0)


def run_watchdog(*command: str, parent: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_specenergy.engines.watchdog",
            "--parent",
            str(parent or os.getpid()),
            "--",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_watchdog_exits_with_the_servers_status():
    assert run_watchdog(sys.executable, "-c", "import sys; sys.exit(3)").returncode == 3
    killed = run_watchdog(sys.executable, "-c", "import os; os.kill(os.getpid(), 9)")
    assert killed.returncode == -signal.SIGKILL


def test_watchdog_refuses_to_start_for_a_dead_parent():
    result = run_watchdog(sys.executable, "-c", "print('started')", parent=1)
    assert result.returncode == 1 and "started" not in result.stdout
    assert "already gone" in result.stderr


def test_watchdog_without_pipe_sees_the_parent_die_and_kills_a_server_ignoring_sigterm(
    tmp_path, reap_group
):
    # The getppid() fallback (a pipe end may leak into a fork) and the SIGKILL after the grace.
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring SIGTERM', flush=True); time.sleep(600)"
    )
    parent = (
        "import os, subprocess, sys\n"
        "dog = subprocess.Popen([sys.executable, '-m', 'pytest_specenergy.engines.watchdog',"
        " '--parent', str(os.getpid()), '--grace', '1', '--', sys.executable, '-c', sys.argv[1]],"
        " start_new_session=True, stdout=sys.stderr, stderr=sys.stderr)\n"
        "print(dog.pid, flush=True)\n"
        "import time; time.sleep(1.5)\n"
        "os._exit(0)\n"
    )
    log = (tmp_path / "log").open("w+")
    child = subprocess.Popen(
        [sys.executable, "-c", parent, stubborn],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    pgid = int(child.stdout.readline())
    reap_group(pgid)
    child.wait(timeout=30)
    assert wait_gone(pgid, within_s=8.0) < 8.0
    log.seek(0)
    text = log.read()
    assert "died (now a child of" in text and "ignored SIGTERM for 1 s: SIGKILL" in text


def test_sigusr1_to_the_watchdog_stops_the_server_alone_and_gracefully(tmp_path):
    """The leader-only stop (SGLang's clean path): the launcher signals the watchdog, which
    sends SIGTERM to the server only; the server drains and exits 0 well inside the grace."""
    marker = tmp_path / "got-sigterm"
    server = (
        "import signal, sys, time, pathlib\n"
        f"def on_term(*_):\n    pathlib.Path({str(marker)!r}).write_text('yes'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_specenergy.engines.watchdog",
            "--parent",
            str(os.getpid()),
            "--grace",
            "30",
            "--",
            sys.executable,
            "-c",
            server,
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert watchdog.stdout.readline().strip() == "ready"
        started = time.monotonic()
        os.kill(watchdog.pid, signal.SIGUSR1)
        assert watchdog.wait(timeout=20) == 0
        assert time.monotonic() - started < 10  # not the 30 s grace: the server was told
        assert marker.read_text() == "yes"
    finally:
        if watchdog.poll() is None:
            os.killpg(watchdog.pid, signal.SIGKILL)
