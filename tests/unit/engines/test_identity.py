"""The server answering on the engine's port is the one started (issue #12 item 5).

Fault-audit probe 1e: a foreign server answering /health on the picked port became "the
engine", and both arms measured it. Each test puts a foreign HTTP server (a thread of this
process, so never in the engine's process group) where the engine should be.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading

import pytest
from fake_engine import FakeBackend

from pytest_specenergy.engines import identity
from pytest_specenergy.engines import launch
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.launch import EngineIdentityError
from pytest_specenergy.engines.launch import EngineStartError
from pytest_specenergy.engines.launch import ServerProcess

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
CONFIG = EngineConfig(engine="fake", model="tiny:dense")


@pytest.fixture
def foreign():
    """Start a foreign engine answering /health and /server_info; yields a starter."""
    servers = []

    def start(info):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - stdlib name
                body = json.dumps(info if self.path.startswith("/server_info") else "OK").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_port_taken_before_the_launch_is_refused_naming_what_answers(
    tmp_path, foreign, monkeypatch
):
    port = foreign({"model_path": "tiny:hybrid", "pid": os.getpid()})
    monkeypatch.setattr(launch, "free_port", lambda host="127.0.0.1": port)
    server = ServerProcess(
        CONFIG, FakeBackend(info={"model_path": "tiny:dense", "pid": True}), tmp_path
    )
    try:
        with pytest.raises(EngineStartError) as info:
            server.start()
    finally:
        server.stop()
    text = str(info.value)
    assert f"ports {port}, {port}" in text and "already in use" in text
    assert "model 'tiny:hybrid'" in text and f"pid {os.getpid()}" in text
    assert server.pid is None  # nothing was started


@pytest.mark.parametrize("reports_pid", [True, False], ids=["pid-reported", "sglang-no-pid"])
def test_a_foreign_server_winning_the_port_race_is_not_adopted(
    tmp_path, foreign, monkeypatch, reports_pid
):
    # The foreign server takes the port between our check and our engine's bind (forced here:
    # the check says free), and answers /health before our engine gives up on the bind.
    foreign_info = {"model_path": "tiny:hybrid", **({"pid": os.getpid()} if reports_pid else {})}
    port = foreign(foreign_info)
    monkeypatch.setattr(launch, "free_port", lambda host="127.0.0.1": port)
    monkeypatch.setattr(launch, "port_in_use", lambda host, port: False)
    server = ServerProcess(
        CONFIG, FakeBackend(bind_delay=3, info={"model_path": "tiny:dense"}), tmp_path
    )
    try:
        with pytest.raises(EngineIdentityError) as info:
            server.start()
        assert server.pid is None  # start() stopped our own engine itself
    finally:
        server.stop()
    text = str(info.value)
    assert f"a foreign server answers on 127.0.0.1:{port}" in text
    if reports_pid:
        assert f"reports pid {os.getpid()} (model 'tiny:hybrid')" in text
    else:
        assert "holds the listening socket" in text
    assert str(server.log_path) in text


def test_a_port_lost_to_a_foreign_server_is_given_up_for_a_fresh_one(
    tmp_path, foreign, monkeypatch
):
    # CI once lost a start this way: another server answered /health on the picked port
    # before our engine bound it. The identity check catches it; the launch moves on.
    taken = foreign({"model_path": "tiny:hybrid", "pid": os.getpid()})
    picks = iter([taken])
    real_free_port = launch.free_port
    monkeypatch.setattr(
        launch, "free_port", lambda host="127.0.0.1": next(picks, None) or real_free_port(host)
    )
    monkeypatch.setattr(launch, "port_in_use", lambda host, port: False)
    server = ServerProcess(
        CONFIG, FakeBackend(bind_delay=1, info={"model_path": "tiny:dense", "pid": True}), tmp_path
    )
    try:
        server.start()
        assert server.port != taken
        assert server.identity and server.identity.startswith("pid ")
    finally:
        server.stop()


def test_free_port_never_hands_out_a_port_twice_in_one_process(monkeypatch):
    # Engines started side by side each pick a port before either binds: a kernel that
    # offers the same free port twice must not put both engines on it.
    offered = iter([41001, 41001, 41002])

    class Probe:
        def __init__(self, *args):
            self.port = next(offered)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(launch, "_HANDED_OUT", set())
    monkeypatch.setattr(launch.socket, "socket", Probe)
    assert [launch.free_port(), launch.free_port()] == [41001, 41002]


def test_a_server_of_the_wrong_model_is_refused(tmp_path):
    server = ServerProcess(
        CONFIG, FakeBackend(info={"model_path": "tiny:hybrid", "pid": True}), tmp_path
    )
    try:
        with pytest.raises(
            EngineIdentityError, match="model 'tiny:dense' expected, server reports 'tiny:hybrid'"
        ):
            server.start()
    finally:
        server.stop()


def test_our_own_server_passes_by_pid_or_by_port(tmp_path):
    by_pid = ServerProcess(
        CONFIG, FakeBackend(info={"model_path": "tiny:dense", "pid": True}), tmp_path
    )
    by_port = ServerProcess(CONFIG, FakeBackend(info={"model_path": "tiny:dense"}), tmp_path)
    try:
        by_pid.start()
        by_port.start()
        assert by_pid.identity.startswith("pid ") and f"group {by_pid.pid}" in by_pid.identity
        assert by_port.identity.startswith(f"port {by_port.port} held by pid")
        assert by_pid.describe()["identity"] == by_pid.identity
    finally:
        by_pid.stop()
        by_port.stop()


NGRAM = Drafter("ngram", num_draft_tokens=4)


@pytest.mark.parametrize(
    "config, info, problem",
    [
        (CONFIG, {"model_path": "tiny:dense", "speculative_algorithm": None}, None),
        (CONFIG, {"engine": "fake"}, None),  # facts the server does not report pass
        (CONFIG, {"model_path": "Qwen/Qwen3-8B"}, "model 'tiny:dense' expected"),
        (
            CONFIG,
            {"model_path": "tiny:dense", "speculative_algorithm": "NGRAM"},
            "no drafter expected (baseline arm), server runs 'NGRAM'",
        ),
        (
            EngineConfig(engine="x", model="tiny:dense", drafter=NGRAM),
            {"model_path": "tiny:dense", "speculative_algorithm": None},
            "drafter 'ngram' expected, server runs none",
        ),
        (
            EngineConfig(
                engine="x",
                model="tiny:dense",
                drafter=Drafter("draft_model", draft_model="tiny:draft"),
            ),
            {
                "model_path": "tiny:dense",
                "speculative_algorithm": "DRAFT_MODEL",
                "speculative_draft_model_path": "tiny:other",
            },
            "draft model 'tiny:draft' expected, server reports 'tiny:other'",
        ),
    ],
)
def test_config_mismatches(config, info, problem):
    found = identity.config_mismatches(config, info)
    assert found == [] if problem is None else any(problem in p for p in found)


def test_listening_socket_holders_are_found_through_proc():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        inodes = identity.listening_inodes(port)
        assert str(os.fstat(sock.fileno()).st_ino) in inodes
        assert os.getpid() in identity.socket_holders(inodes, os.getpgrp())
        assert identity.port_in_use("127.0.0.1", port)
    assert not identity.port_in_use("127.0.0.1", port)
