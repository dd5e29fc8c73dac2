"""A stand-in engine for the supervision tests, and their helpers.

As a script, ``python fake_engine.py PORT SPEC`` is the server.

``SPEC`` is JSON: ``info`` (the /server_info payload; ``"pid": true`` there is replaced by
this process's pid), ``bind_delay`` (seconds before binding), ``post`` (``ok``, ``crash``:
SIGKILL itself mid-request, ``hang``: never answer), ``grandchild`` (a file to write the pid
of a sleeping child to, proving the whole process group is stopped). The server uses the
standard library only; the backend takes the plugin's backend defaults.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pytest_specenergy.engines.base import BackendDefaults

FAKE_ENGINE = Path(__file__).resolve()
#: The plugin's source tree, for child processes that import it.
ROOT = Path(__file__).resolve().parents[3]


class FakeBackend(BackendDefaults):
    """A backend whose server is ``fake_engine.py`` with a JSON ``spec`` (see that file)."""

    name = "fake"
    startup_timeout_s = 20.0

    def __init__(self, **spec: Any) -> None:
        self.spec = spec

    def check(self, config: Any) -> None:
        pass

    def command(self, config: Any, host: str, port: int) -> list[str]:
        return [sys.executable, str(FAKE_ENGINE), str(port), json.dumps(self.spec)]

    def environment(self, config: Any) -> dict[str, str]:
        return {}

    def drafters(self) -> tuple[str, ...]:
        return ()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids of process group ``pgid``."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(name))
    return members


def wait_gone(pgid: int, within_s: float) -> float:
    """Seconds until group ``pgid`` has no live member; fails after ``within_s``."""
    started = time.monotonic()
    while group_members(pgid):
        if time.monotonic() - started > within_s:
            import pytest

            pytest.fail(f"process group {pgid} still has {group_members(pgid)} after {within_s} s")
        time.sleep(0.05)
    return time.monotonic() - started


def main() -> None:
    port, spec = int(sys.argv[1]), json.loads(sys.argv[2])
    info = dict(spec.get("info") or {})
    if info.get("pid") is True:
        info["pid"] = os.getpid()
    if spec.get("grandchild"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(spec["grandchild"], "w") as handle:
            handle.write(str(child.pid))
    time.sleep(float(spec.get("bind_delay", 0)))

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, payload: object) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self._answer(info if self.path.startswith("/server_info") else "OK")

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            mode = spec.get("post", "ok")
            if mode == "crash":
                print("fake engine: CUDA error: an illegal memory access", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "hang":
                print("fake engine: stuck in a collective", flush=True)
                time.sleep(600)
            self._answer([{"text": "x", "meta_info": {}}])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"fake engine ready on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
