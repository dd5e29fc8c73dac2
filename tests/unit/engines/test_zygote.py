"""Reference engines forked from a zygote that imported torch and transformers once
(:mod:`pytest_specenergy.engines.zygote`): the same supervision, exit codes, environment and
working directory as a fresh interpreter, and the plain start when it is off or keeps dying. The
zygote's failure modes (reliability-audit-3 T9-T14) are in test_zygote_faults.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_engine import group_members
from fake_engine import wait_gone

from pytest_specenergy.engines import zygote as zygote_module
from pytest_specenergy.engines import zygote_serve
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


def test_the_zygote_builds_the_tiny_models_an_engine_asks_for_once(monkeypatch):
    """Before it forks an engine the zygote builds that engine's tiny target and draft under the
    key the engine's own load finds (device ``auto`` included), once, at one torch thread, then
    restores the thread count; another model (a checkpoint draft, a random or unknown one) or a
    bad flag builds nothing and raises nothing (the engine's start says what is wrong)."""
    import torch

    from pytest_specenergy.refserver import models

    monkeypatch.setattr(models, "_TINY_CACHE", {})
    threads, seen = torch.get_num_threads(), []
    real_load = models.load_model
    monkeypatch.setattr(
        models, "load_model", lambda *a: seen.append(torch.get_num_threads()) or real_load(*a)
    )
    head = [sys.executable, "-m", zygote_module.REFSERVER]
    argv = [
        *head,
        "--model",
        "tiny:dense",
        "--drafter",
        "draft_model",
        "--dtype",
        "auto",
        "--seed",
        "3",
    ]
    zygote_serve._build_tiny_models(argv)
    assert sorted((k[0], k[1]) for k in models._TINY_CACHE) == [
        ("tiny:dense", 3),
        ("tiny:dense-draft", 3),
    ]
    assert seen == [1, 1] and torch.get_num_threads() == threads
    built = dict(models._TINY_CACHE)
    assert (
        real_load("tiny:dense", "auto", "auto", 3) is built[("tiny:dense", 3, torch.float32, "cpu")]
    )
    zygote_serve._build_tiny_models(argv)
    for bad in (
        ["--model", "tiny:dense", "--seed", "x"],
        ["--model", "random:qwen3-4b:layers=1"],
        ["--model", "tiny:nope"],
        ["--model", "tiny:dense", "--seed", "3", "--drafter", "block", "--draft-model", "/no"],
    ):
        zygote_serve._build_tiny_models([*head, *bad])
    assert models._TINY_CACHE == built and torch.get_num_threads() == threads


def test_off_or_dead_for_good_the_zygote_leaves_the_plain_start(tmp_path, monkeypatch, reap_group):
    """Switched off, every engine starts the plain way; so it does once the process has lost
    MAX_LOST zygotes (one that keeps dying must not take every engine with it again)."""
    monkeypatch.setenv(zygote_module.SWITCH, "0")
    server = ServerProcess(CONFIG, ReferenceBackend(), tmp_path / "off").start()
    reap_group(server.pid)
    assert isinstance(server._proc, subprocess.Popen)
    server.stop(grace_s=5.0)
    monkeypatch.delenv(zygote_module.SWITCH)
    monkeypatch.delenv(zygote_module.SHARED, raising=False)  # restored after: the dead one's path
    dead = Zygote.start(dict(os.environ))
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    deadline = time.monotonic() + 5
    while dead.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setattr(zygote_module, "_zygote", dead)
    monkeypatch.setattr(zygote_module, "_zygotes_lost", zygote_module.MAX_LOST - 1)
    server = ServerProcess(CONFIG, ReferenceBackend(), tmp_path / "dead").start()
    reap_group(server.pid)
    assert isinstance(server._proc, subprocess.Popen)
    assert zygote_module._zygote is None and zygote_module._zygotes_lost == zygote_module.MAX_LOST
    assert not os.path.exists(os.path.dirname(dead.shared))  # retired: its folder removed
    server.stop(grace_s=5.0)


CLIENT = """
import json, os, sys
from pathlib import Path
from pytest_specenergy.engines import zygote
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.refserver import ReferenceBackend

server = ServerProcess(EngineConfig(engine="reference", model="tiny:dense"), ReferenceBackend(),
                       Path(sys.argv[1])).start()
[answer] = server.client.generate(text=["def f(x):"], sampling_params={"max_new_tokens": 4})
with open(f"/proc/{server.pid}/stat") as stat:  # the engine's watchdog: whose fork is it?
    forked_by = int(stat.read().rsplit(")", 1)[1].split()[1])
child = server._proc
server.stop(grace_s=5.0)
print(json.dumps({"own": zygote._zygote.proc is not None, "zygote": zygote._zygote.pid,
                  "listens": zygote._zygote.shared, "package": zygote.__file__,
                  "forked_by": forked_by, "exit": child.returncode,
                  "tokens": answer["meta_info"]["completion_tokens"]}))
"""


def test_a_process_this_one_starts_forks_its_engines_from_this_zygote(tmp_path):
    """A pytest run in a subprocess (pytester's, a CI job's nested suite) inherits the zygote's
    socket (SHARED): its engine is forked by this process's zygote, its exit status comes back
    on its own connection. A child running another copy of the package is refused and starts
    a zygote of its own (which, its TMPDIR too long for a socket path, serves it alone)."""
    import json

    ref = [sys.executable, "-m", "pytest_specenergy.refserver", "--device", "cpu"]
    ours = zygote_module.zygote_for(ref, dict(os.environ))
    assert ours is not None and ours.alive and os.environ[zygote_module.SHARED]

    def client(env: dict[str, str]) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, str(tmp_path / "logs")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    shared = client(dict(os.environ))
    assert shared == {
        "own": False,
        "zygote": ours.pid,
        "listens": ours.shared,
        "package": zygote_module.__file__,
        "forked_by": ours.pid,
        "exit": 0,
        "tokens": 4,
    }
    long_tmp = tmp_path / ("t" * 110)  # AF_UNIX paths end at 108 bytes
    long_tmp.mkdir()
    other = tmp_path / "other"
    shutil.copytree(
        Path(zygote_module.__file__).parents[1],
        other / "pytest_specenergy",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    alone = client({**os.environ, "PYTHONPATH": str(other), "TMPDIR": str(long_tmp)})
    assert alone["own"] and alone["zygote"] == alone["forked_by"] != ours.pid and alone["exit"] == 0
    assert (
        alone["listens"] is None
        and alone["tokens"] == 4
        and alone["package"].startswith(str(other))
    )
    # Its zygote exits with it and removes the folder made for the socket it could not bind.
    deadline = time.monotonic() + 10
    while list(long_tmp.glob("specenergy-zygote-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(long_tmp.glob("specenergy-zygote-*")) == []


def test_only_a_cpu_reference_server_of_this_interpreter_is_forked(monkeypatch):
    running = SimpleNamespace(alive=True)  # stands for the process's zygote: none is started
    monkeypatch.setattr(zygote_module, "_zygote", running)
    monkeypatch.setattr(zygote_module, "_zygote_failed", False)
    ref = [sys.executable, "-m", "pytest_specenergy.refserver", "--model", "tiny:dense"]
    assert zygote_module.zygote_for([*ref, "--device", "cpu"], {}) is running
    assert zygote_module.zygote_for([*ref, "--device", "cuda:0"], {}) is None
    assert zygote_module.zygote_for([*ref, "--device", "cpu"], {zygote_module.SWITCH: "0"}) is None
    assert zygote_module.zygote_for(["/other/python", *ref[1:], "--device", "cpu"], {}) is None
    assert zygote_module.zygote_for([sys.executable, "-m", "sglang.launch_server"], {}) is None
