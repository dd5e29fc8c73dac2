"""Real SGLang for tests/sglang/: environments, tiny checkpoints, the conformance worker.

Every environment comes from ``dev/sglang_env.sh`` (the real ``sglang`` wheel without its
dependencies, CPU torch, the import-only stand-ins), cached under ``.sglang-envs/`` in the
repository root and rebuilt only when its stamp differs; ``dev/test.sh`` builds them in the
background while the other tests run and runs this folder once they are ready (a plain ``pytest
tests`` builds a missing one in the first test that needs it). Set ``SPECENERGY_SGLANG_ENVS`` to use
environments elsewhere. ``SPECENERGY_SKIP_SGLANG=1`` skips this folder, saying so on every test (for
a machine that cannot install SGLang); otherwise a failed build fails the tests.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_ROOT = Path(os.environ.get("SPECENERGY_SGLANG_ENVS", REPO / ".sglang-envs"))
WORKER = Path(__file__).resolve().parent / "sglang_worker.py"
#: The newest and the oldest release the plugin supports (engines/sglang_args.py MIN_VERSION).
NEWEST, OLDEST = "0.5.23", "0.5.9"
SKIP_REASON = (
    "SPECENERGY_SKIP_SGLANG=1: the real-SGLang tests (conformance against SGLang's "
    "own parser, the live CPU baseline arm) did not run"
)


@functools.lru_cache(maxsize=None)
def _build(version: str) -> tuple[Path, str | None]:
    dest = ENV_ROOT / version
    done = subprocess.run(
        ["bash", str(REPO / "dev" / "sglang_env.sh"), version, str(dest)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # kept, so that one failed build is not retried by every test
        return dest, (
            f"dev/sglang_env.sh {version} {dest} failed (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-4000:]}"
        )
    return dest / "bin" / "python", None


def sglang_python(version: str) -> Path:
    """The Python of ``version``'s environment, built by ``dev/sglang_env.sh`` if its stamp is
    missing or stale (the script holds a lock, so xdist workers wait for one build). Checked
    once per process; a failed build fails every test that needs it, with the script's output."""
    python, error = _build(version)
    if error:
        pytest.fail(error, pytrace=False)
    return python


def serve_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of a live SGLang CPU server started by the plugin under test: SGLang's
    CPU engine (sglang-audit.md part (c)), no hub access, and one OpenMP thread per process.

    Without the last, each server's scheduler took both cores' threads; with three or four
    servers and the other xdist worker on 2 cores, their OpenMP threads spun against each
    other, and one of two identical A/A engines read up to 11x the other's stand-in energy.
    Interleaved, with and without (the git log): the pair test 108-135 s against 134-164 s, and
    the A/A samples' J/token within 1.5-1.7x against 6.5-8.3x."""
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def tiny_models() -> tuple[str, str]:
    """A 2-layer random Llama target and a 1-layer draft (local paths: SGLang's resolution reads
    their ``config.json``), made once from a seed and kept beside the environments."""
    out = ENV_ROOT / "tiny-models"
    paths = (out / "target", out / "draft")
    with _locked(ENV_ROOT / "tiny-models.lock"):
        if not all((p / "config.json").exists() for p in paths):
            py = sglang_python(NEWEST)
            for path, layers in zip(paths, (2, 1)):
                subprocess.run(
                    [
                        str(py),
                        str(REPO / "dev" / "sglang_tiny_model.py"),
                        str(path),
                        "--layers",
                        str(layers),
                    ],
                    check=True,
                    capture_output=True,
                )
    return str(paths[0]), str(paths[1])


class _locked:
    """An exclusive ``flock`` on ``path`` for the ``with`` block (xdist workers share files)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "w")
        fcntl.flock(self.fh, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def run_worker(
    version: str, mode: str, items: list[dict[str, Any]], timeout: float = 600
) -> dict[str, dict[str, Any]]:
    """``items`` through SGLang ``version``'s own code (``sglang_worker.py`` MODE); id -> result.

    The answer is cached on disk, keyed by the worker's source, the release and the items, so
    that two xdist workers (and reruns) do not repeat a 10-20 s SGLang import and resolution.
    """
    py = sglang_python(version)
    key = hashlib.sha256(
        json.dumps([WORKER.read_text(), version, mode, items], sort_keys=True).encode()
    ).hexdigest()[:20]
    cache = ENV_ROOT / "worker-cache" / f"{version}-{mode}-{key}.json"
    with _locked(cache.with_suffix(".lock")):
        if not cache.exists():
            done = subprocess.run(
                [str(py), str(WORKER), "--worker", mode],
                input=json.dumps(items),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if done.returncode != 0:
                pytest.fail(
                    f"SGLang {version} worker ({mode}) failed with exit "
                    f"{done.returncode}:\n{done.stderr[-4000:]}",
                    pytrace=False,
                )
            json.loads(done.stdout)  # a truncated answer must not be cached
            cache.write_text(done.stdout)
        results = json.loads(cache.read_text())
    return {r["id"]: r for r in results}


def group_left(pgid: int, settle_s: float) -> list[str]:
    """Processes of group ``pgid`` still running (zombies waiting for init are not running), as
    "pid state name"; polled for up to ``settle_s``. The live session's own oracle (read from
    ``/proc`` here, not with the plugin's code under test); its inner test modules import it too."""
    deadline = time.monotonic() + settle_s
    while True:
        left = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            name, rest = (
                stat[stat.index("(") + 1 : stat.rindex(")")],
                stat[stat.rindex(")") + 2 :].split(),
            )
            if int(rest[2]) == pgid and rest[0] != "Z":
                left.append(f"{entry} {rest[0]} {name}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
