"""Engine lifecycle with real processes: early exit, start-up timeout, group teardown, pooling."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from pytest_specenergy.engines.base import BackendDefaults
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import EngineStartError
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.pool import EnginePool

# Just enough of the protocol for the lifecycle: /health and /server_info, on ``port``.
SERVE = r"""
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"engine": "fake", "device": "cpu"}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

# A minimal server that also starts a grandchild to prove the whole process group is stopped.
HEALTHY = (
    r"""
import http.server, json, subprocess, sys
port = int(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
"""
    + SERVE
)


class ScriptBackend(BackendDefaults):
    """A backend whose 'server' is a Python snippet (lifecycle tests only)."""

    name = "script"
    startup_timeout_s = 20.0

    def __init__(self, script: str, *extra: str) -> None:
        self.script = script
        self.extra = extra

    def check(self, config):
        pass

    def command(self, config, host, port):
        return [sys.executable, "-c", self.script, str(port), *self.extra]

    def environment(self, config):
        return {}

    def drafters(self):
        return ()


CONFIG = EngineConfig(engine="script", model="m")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): look at its state
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def test_early_exit_quotes_the_log(tmp_path):
    backend = ScriptBackend("import sys; print('model weights not found: /x'); sys.exit(3)")
    server = ServerProcess(CONFIG, backend, tmp_path)
    with pytest.raises(EngineStartError) as info:
        server.start()
    text = str(info.value)
    assert "exited with code 3 during start-up" in text
    assert str(server.log_path) in text
    assert "model weights not found: /x" in text


def test_startup_timeout_stops_the_process(tmp_path):
    backend = ScriptBackend("import time; print('loading...', flush=True); time.sleep(600)")
    server = ServerProcess(CONFIG, backend, tmp_path, startup_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(EngineStartError, match=r"did not answer /health within 2 s(.|\n)*loading"):
        server.start()
    assert time.monotonic() - started < 15
    assert not server.alive()


def test_stop_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    server = ServerProcess(CONFIG, ScriptBackend(HEALTHY, str(pid_file)), tmp_path).start()
    child = int(pid_file.read_text())
    assert server.alive() and alive(child)
    server.stop()
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


# A server like SGLang's: on SIGTERM it drains (writes a marker) and exits; its child (the
# scheduler) records a SIGTERM of its own, which only a signal to the whole group sends.
DRAINING = (
    r"""
import http.server, json, pathlib, signal, subprocess, sys
port, out = int(sys.argv[1]), pathlib.Path(sys.argv[2])
child = subprocess.Popen([sys.executable, "-c", "import pathlib, signal, sys, time\n"
    f"mark = pathlib.Path({str(out / 'child')!r})\n"
    "signal.signal(signal.SIGTERM, lambda *_: (mark.write_text('term'), sys.exit(0)))\n"
    "print('ready', flush=True)\ntime.sleep(600)"], stdout=subprocess.PIPE)
child.stdout.readline()  # its handler is set: a SIGTERM from now on leaves the mark
def drain(*_):
    (out / "server").write_text("drained")
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
"""
    + SERVE
)


@pytest.mark.parametrize("leader_only", [True, False])
def test_pool_close_stops_each_engine_the_way_its_backend_asks(tmp_path, monkeypatch, leader_only):
    """A leader-only backend (SGLang) drains: at the session's end only the server gets SIGTERM
    and its children are left to it (SGLang's scheduler killed by a group SIGTERM logged a crash
    and skipped its release). Any other backend's whole group gets SIGTERM."""
    backend = ScriptBackend(DRAINING, str(tmp_path))
    backend.stop_signal_leader_only = leader_only
    monkeypatch.setattr("pytest_specenergy.engines.pool.get_backend", lambda name: backend)
    pool = EnginePool(tmp_path)
    server = pool.get(CONFIG)
    pool.close()
    assert not server.alive()
    assert (tmp_path / "server").read_text() == "drained"
    assert (tmp_path / "child").exists() is not leader_only


def test_pool_starts_each_config_once_and_remembers_failures(tmp_path, monkeypatch):
    backends = {
        "script": ScriptBackend(HEALTHY, str(tmp_path / "c.pid")),
        "broken": ScriptBackend("import sys; sys.exit(1)"),
    }
    monkeypatch.setattr("pytest_specenergy.engines.pool.get_backend", lambda name: backends[name])
    told: list[tuple[int, str]] = []
    pool = EnginePool(tmp_path, progress=lambda level, text: told.append((level, text)))
    try:
        first = pool.get(CONFIG)
        assert pool.get(EngineConfig(engine="script", model="m")) is first
        assert pool.starts == [CONFIG]
        broken = EngineConfig(engine="broken", model="m")
        with pytest.raises(EngineStartError):
            pool.get(broken)
        with pytest.raises(EngineStartError):
            pool.get(broken)
        assert pool.starts.count(broken) == 1
        # One progress line per start, at the default verbosity: which engine, how long.
        assert [level for level, _ in told] == [0, 0]
        assert re.fullmatch(r"engine script:m\[baseline\] started in \d+\.\d s", told[0][1])
        assert re.fullmatch(
            r"engine broken:m\[baseline\] failed to start after \d+\.\d s", told[1][1]
        )
    finally:
        pool.close()
    assert not first.alive()


def test_pool_says_when_it_restarts_an_engine_that_died(tmp_path, monkeypatch):
    # Issue 23 item 19 (fault-matrix probe N4): an engine killed after its start was started
    # again with only the ordinary "started" line, so nothing said a new process was measured.
    backend = ScriptBackend(HEALTHY, str(tmp_path / "c.pid"))
    monkeypatch.setattr("pytest_specenergy.engines.pool.get_backend", lambda name: backend)
    told: list[str] = []
    pool = EnginePool(tmp_path, progress=lambda level, text: told.append(text))
    try:
        first = pool.get(CONFIG)
        os.killpg(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while first.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = pool.get(CONFIG)
        assert second is not first and second.alive() and pool.starts == [CONFIG, CONFIG]
        died = [t for t in told if "died" in t]
        assert (
            len(died) == 1 and "exit code -9 (SIGKILL)" in died[0] and "is restarted" in died[0]
        ), told
        assert str(first.log_path) in died[0]
    finally:
        pool.close()


def test_pool_with_one_live_engine_stops_the_previous(tmp_path, monkeypatch):
    backend = ScriptBackend(HEALTHY, str(tmp_path / "c.pid"))
    monkeypatch.setattr("pytest_specenergy.engines.pool.get_backend", lambda name: backend)
    pool = EnginePool(tmp_path, max_live=1)
    try:
        a = pool.get(EngineConfig(engine="script", model="a"))
        b = pool.get(EngineConfig(engine="script", model="b"))
        assert b.alive() and not a.alive()
    finally:
        pool.close()
