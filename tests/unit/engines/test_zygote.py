"""Reference engines forked from a zygote that imported torch and transformers once
(:mod:`pytest_specenergy.engines.zygote`): the same supervision, exit codes, environment and
working directory as a fresh interpreter, and the plain start when it is off or dead."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest
from fake_engine import group_members
from fake_engine import wait_gone

from pytest_specenergy.engines import zygote as zygote_module
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.identity import EngineStartError
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.refserver import ReferenceBackend
from pytest_specenergy.engines.zygote import Zygote
from pytest_specenergy.engines.zygote import ZygoteChild

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
CONFIG = EngineConfig(engine="reference", model="tiny:dense")


def _server_pid(server: ServerProcess) -> int:
    return int(server.client.server_info()["pid"])


def test_a_reference_engine_is_forked_and_stops_like_a_fresh_one(tmp_path, monkeypatch, reap_group):
    monkeypatch.chdir(tmp_path)  # the engine works where the launcher works, as Popen's would
    server = ServerProcess(CONFIG, ReferenceBackend(), tmp_path / "logs").start()
    reap_group(server.pid)
    assert isinstance(server._proc, ZygoteChild)
    pid = _server_pid(server)
    assert os.getpgid(pid) == server.pid and server.identity == f"pid {pid} in group {server.pid}"
    assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
    [answer] = server.client.generate(text=["def f(x):"], sampling_params={"max_new_tokens": 4})
    assert answer["meta_info"]["completion_tokens"] == 4
    server.stop(grace_s=5.0)
    assert wait_gone(pid, within_s=5.0) < 5.0 and not group_members(pid)
    log = server.log_path.read_text()
    assert "reference server ready" in log and "Traceback" not in log, log


def test_a_forked_engines_bad_start_reports_its_exit_code_and_log(tmp_path):
    bad = EngineConfig(engine="reference", model=str(tmp_path / "no-such-checkpoint"))
    server = ServerProcess(bad, ReferenceBackend(), tmp_path / "logs", startup_timeout_s=60)
    with pytest.raises(EngineStartError, match=r"exited with code 2 during start-up") as info:
        server.start()
    assert "no-such-checkpoint" in str(info.value)  # the server's own line, from its log


def test_off_or_dead_the_zygote_leaves_the_plain_start(tmp_path, monkeypatch, reap_group):
    monkeypatch.setenv(zygote_module.SWITCH, "0")
    server = ServerProcess(CONFIG, ReferenceBackend(), tmp_path / "off").start()
    reap_group(server.pid)
    assert isinstance(server._proc, subprocess.Popen)
    server.stop(grace_s=5.0)
    monkeypatch.delenv(zygote_module.SWITCH)
    dead = Zygote(dict(os.environ))
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    deadline = time.monotonic() + 5
    while dead.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setattr(zygote_module, "_zygote", dead)
    monkeypatch.setattr(zygote_module, "_zygote_failed", False)
    server = ServerProcess(CONFIG, ReferenceBackend(), tmp_path / "dead").start()
    reap_group(server.pid)
    assert isinstance(server._proc, subprocess.Popen) and zygote_module._zygote_failed
    server.stop(grace_s=5.0)


def test_only_a_cpu_reference_server_of_this_interpreter_is_forked(monkeypatch):
    import sys

    running = SimpleNamespace(alive=True)  # stands for the process's zygote: none is started
    monkeypatch.setattr(zygote_module, "_zygote", running)
    monkeypatch.setattr(zygote_module, "_zygote_failed", False)
    ref = [sys.executable, "-m", "pytest_specenergy.refserver", "--model", "tiny:dense"]
    assert zygote_module.zygote_for([*ref, "--device", "cpu"], {}) is running
    assert zygote_module.zygote_for([*ref, "--device", "cuda:0"], {}) is None
    assert zygote_module.zygote_for([*ref, "--device", "cpu"], {zygote_module.SWITCH: "0"}) is None
    assert zygote_module.zygote_for(["/other/python", *ref[1:], "--device", "cpu"], {}) is None
    assert zygote_module.zygote_for([sys.executable, "-m", "sglang.launch_server"], {}) is None
