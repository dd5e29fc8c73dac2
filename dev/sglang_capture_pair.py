"""Capture what two real SGLang CPU servers of one config answer, through the plugin itself.

    PYTHONPATH=. .venv/bin/python dev/sglang_capture_pair.py OUT_DIR \
        --python .sglang-envs/0.5.23/bin/python --model .sglang-envs/tiny-models/target

Starts two servers from the *same* :class:`EngineConfig` with the plugin's own
``EnginePool``/``ServerProcess`` (the live suite's config: ``--device cpu``, torch_native,
float32, ``max_running_requests=4``), and writes:

* ``server_info_a.json`` / ``server_info_b.json``: both ``GET /server_info`` answers (the twin
  check's ignore list is derived from how they differ);
* ``generate_abort_queued.json``: 6 requests on a server that admits 4, ``abort_all`` after 2 s -
  the two queued ones get SGLang's waiting-queue abort answer (no ``prompt_tokens``);
* ``abort_race.json``: one request sent, then the window's close 0 ms later, ``TRIALS`` times
  with a one-shot ``abort_all`` (the old close) and ``TRIALS`` times with
  :func:`~pytest_specenergy.engines.client.abort_until_answered` (the new one): completion tokens,
  finish reason and seconds of each.

Needs ``SGLANG_USE_CPU_ENGINE=1`` (set here) and an environment from ``dev/sglang_env.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pytest_specenergy.engines.client import abort_until_answered
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.sglang import SGLangBackend

TRIALS = 3
RACE_TOKENS = 160


def live_config(model: str, python: str, **extra: Any) -> EngineConfig:
    """The live suite's engine config (tests/sglang/pair_suite.py)."""
    options = {
        "python": python,
        "sglang_version": "0.5.23",
        "attention_backend": "torch_native",
        "sleep_on_idle": True,
        "max_total_tokens": 16384,
        **extra,
    }
    return EngineConfig(
        engine="sglang",
        model=model,
        dtype="float32",
        device="cpu",
        max_running_requests=4,
        options=tuple(sorted(options.items())),
    )


def send(client: Any, rid: str, tokens: int, box: dict[str, Any]) -> threading.Thread:
    """One ``/generate`` of ``tokens`` greedy tokens in a thread; its answer lands in ``box``."""

    def call() -> None:
        started = time.perf_counter()
        try:
            [answer] = client.generate(
                text=["def fibonacci(n):"],
                rids=[rid],
                sampling_params={"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True},
            )
            meta = answer["meta_info"]
            box[rid] = {
                "completion_tokens": meta.get("completion_tokens"),
                "finish": (meta.get("finish_reason") or {}).get("type"),
                "seconds": round(time.perf_counter() - started, 3),
            }
        except Exception as exc:  # noqa: BLE001 - recorded, the capture goes on
            box[rid] = {"error": f"{type(exc).__name__}: {exc}"}

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def race(client: Any, new_close: bool, trial: int) -> dict[str, Any]:
    """Send one request and close the window 0 ms later, the old way or the new."""
    box: dict[str, Any] = {}
    rid = f"race-{'new' if new_close else 'old'}-{trial}"
    thread = send(client, rid, RACE_TOKENS, box)
    if new_close:
        rounds = abort_until_answered(client, lambda: set() if rid in box else {rid})
    else:
        client.abort()
        rounds = 0
    thread.join(600)
    return {**box[rid], "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    config = live_config(str(Path(args.model).resolve()), str(Path(args.python).absolute()))
    logs = Path(tempfile.mkdtemp(prefix="sglang-pair-"))
    backend = SGLangBackend()
    backend.check(config)
    a = ServerProcess(config, backend, logs / "a")
    b = ServerProcess(config, backend, logs / "b")
    timings: dict[str, Any] = {}
    try:
        for name, server in (("a", a), ("b", b)):
            started = time.perf_counter()
            server.start()
            timings[f"start_{name}_s"] = round(time.perf_counter() - started, 1)
            (args.out / f"server_info_{name}.json").write_text(
                json.dumps(server.client.server_info(), indent=1, sort_keys=True)
            )
        b.stop()
        # Six requests on a server admitting four, then abort_all: two are still queued.
        box: dict[str, Any] = {}
        answers: list[Any] = [None] * 6

        def one(i: int) -> None:
            answers[i] = a.client.generate(
                text=[f"Count: {i}, "],
                rids=[f"queued-{i}"],
                sampling_params={"max_new_tokens": 600, "temperature": 0.0, "ignore_eos": True},
            )[0]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        a.client.abort()
        for thread in threads:
            thread.join(120)
        (args.out / "generate_abort_queued.json").write_text(json.dumps(answers, indent=1))
        a.client.flush_cache()
        results = {
            "old_one_shot_abort_all": [race(a.client, False, i) for i in range(TRIALS)],
            "new_abort_until_answered": [race(a.client, True, i) for i in range(TRIALS)],
            "max_new_tokens": RACE_TOKENS,
            **timings,
            **box,
        }
        (args.out / "abort_race.json").write_text(json.dumps(results, indent=1))
        print(json.dumps(results, indent=1))
    finally:
        a.stop()
        b.stop()


if __name__ == "__main__":
    main()
