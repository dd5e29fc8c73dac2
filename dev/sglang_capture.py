"""Capture real SGLang payloads from a CPU server (baseline arm, no speculative decoding).

    python dev/sglang_capture.py OUT_DIR --python .sglang-envs/0.5.23/bin/python [--keep-model DIR]

Starts ``python -m sglang.launch_server`` from an environment made by ``dev/sglang_env.sh`` on a
tiny random Llama (``dev/sglang_tiny_model.py``, made from a seed in a temp dir), on
``--device cpu`` with the torch_native attention backend, and sends what the plugin sends:

* ``generate_text_batch``: a ``text`` batch with ``rid``s, greedy, ``ignore_eos`` (a window);
* ``generate_prefill_batch``: the same with ``max_new_tokens=1`` (the prefill-only window);
* ``generate_input_ids_logprob``: an ``input_ids`` batch with ``return_logprob``,
  ``top_logprobs_num=2`` and ``logprob_start_len=0``;
* ``generate_prompt_token_ids``: ``max_new_tokens=0`` with ``return_prompt_token_ids``;
* ``generate_continuation_logprob``: the coherence request, ``max_new_tokens=0``,
  ``return_logprob`` and ``logprob_start_len=len(prompt)-1``;
* ``server_info_before`` / ``server_info_after`` (``GET /server_info`` around the text batch,
  ``SGLANG_RECORD_STEP_TIME=1``), ``get_server_info`` (the deprecated alias);
* ``flush_cache`` (``POST /flush_cache``: status, content type and body);
* ``health`` while starting and once up.

Each is written to ``OUT_DIR/<name>.json`` with its request as ``OUT_DIR/<name>.request.json``;
``OUT_DIR/capture.json`` has the command line, environment, versions and timings (launch to
healthy, each request's latency, tokens/s, the server's resident memory, shutdown time). The
server is stopped with SIGTERM to the leader only (SGLang's graceful path), then the group is
killed if it is still there after 30 s. Only the standard library is used here; it may run under
any Python 3.10+.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from typing import Callable

HERE = Path(__file__).resolve().parent
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a land far away, there lived a",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(
    base: str, method: str, path: str, body: Any = None, timeout: float = 120.0
) -> tuple[int, str, str, float]:
    """(status, content type, body text, seconds)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json"} if data else {},
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
            return (
                resp.status,
                resp.headers.get("Content-Type", ""),
                text,
                time.monotonic() - started,
            )
    except urllib.error.HTTPError as exc:
        return (
            exc.code,
            exc.headers.get("Content-Type", ""),
            exc.read().decode(),
            time.monotonic() - started,
        )


def group_rss_mib(pgid: int) -> tuple[float, list[str]]:
    """Resident memory of every process in the group, MiB, and their names."""
    total, names = 0, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:  # field 5: pgrp
                continue
            status = Path(f"/proc/{entry}/status").read_text()
            rss = next(
                int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
            )
            total += rss
            names.append(Path(f"/proc/{entry}/comm").read_text().strip())
        except (OSError, ValueError, StopIteration):
            continue
    return total / 1024, names


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_healthy(
    proc: subprocess.Popen[bytes],
    base: str,
    deadline: float,
    log_path: Path,
    save: Callable[[str, Any, int, str, str, float], Any],
) -> list[int]:
    """Poll ``/health`` until it answers 200, saving each new status it answers on the way (SGLang
    answers 503 while it loads); the statuses seen, in order."""
    health_codes: list[int] = []
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"capture: server exited with {proc.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            raise SystemExit("capture: not healthy before the start-up timeout")
        try:
            status, ctype, text, secs = request(base, "GET", "/health", timeout=5)
        except (OSError, urllib.error.URLError):
            time.sleep(0.5)
            continue
        if not health_codes or health_codes[-1] != status:
            health_codes.append(status)
            save(f"health_{status}", None, status, ctype, text, secs)
        if status == 200:
            return health_codes
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", required=True, help="the SGLang environment's python")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--keep-model", type=Path, help="write the tiny model here, not a temp dir")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-record-step-time",
        action="store_true",
        help="leave SGLANG_RECORD_STEP_TIME unset (server_info without step_time_dict)",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    python = str(Path(args.python).absolute())  # a venv python must keep its path (no resolve)

    tmp = Path(tempfile.mkdtemp(prefix="sglang-capture-"))
    model = args.keep_model or tmp / "tiny-llama"
    t0 = time.monotonic()
    subprocess.run(
        [python, str(HERE / "sglang_tiny_model.py"), str(model)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    model_s = time.monotonic() - t0
    version = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m; print(m.version('sglang'), "
            "m.version('torch'), m.version('transformers'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # The plugin's own CPU command line shape (engines/sglang.py) with CPU-only engine options.
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--tp-size",
        "1",
        "--random-seed",
        "0",
        "--attention-backend",
        "torch_native",
        "--max-running-requests",
        "8",
        "--mem-fraction-static",
        "0.8",
        "--cuda-graph-max-bs-decode",
        "8",
        "--disable-radix-cache",
        "--decode-log-interval",
        "1",
        "--device",
        "cpu",
        "--max-total-tokens",
        "16384",
        "--sleep-on-idle",
    ]
    standin_log = out / "standin_log.jsonl"
    standin_log.write_text("")
    env = dict(
        os.environ,
        SGLANG_USE_CPU_ENGINE="1",
        SPECENERGY_STANDIN_LOG=str(standin_log.absolute()),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    if args.no_record_step_time:
        env.pop("SGLANG_RECORD_STEP_TIME", None)
    else:
        env["SGLANG_RECORD_STEP_TIME"] = "1"
    env_shown = {
        k: env[k]
        for k in (
            "SGLANG_RECORD_STEP_TIME",
            "SGLANG_USE_CPU_ENGINE",
            "SPECENERGY_STANDIN_LOG",
            "HF_HUB_OFFLINE",
        )
        if k in env
    }
    log_path = out / "server.log"
    record: dict[str, Any] = {
        "sglang": version[0],
        "torch": version[1],
        "transformers": version[2],
        "command": shlex.join(cmd),
        "env": env_shown,
        "model": "tiny random Llama, seed 0 "
        "(dev/sglang_tiny_model.py): 2 layers, hidden 64, 4 heads / 2 KV heads, vocab 320",
        "tiny_model_s": round(model_s, 2),
        "requests": {},
    }
    print("capture:", shlex.join(cmd), flush=True)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "w") as log:
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    pgid = proc.pid
    payloads: dict[str, Any] = {}

    def save(name: str, body: Any, status: int, ctype: str, text: str, seconds: float) -> Any:
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = None
        if body is not None:
            (out / f"{name}.request.json").write_text(json.dumps(body, indent=1) + "\n")
        if parsed is not None:
            (out / f"{name}.json").write_text(json.dumps(parsed, indent=1) + "\n")
        else:
            (out / f"{name}.json").write_text(
                json.dumps({"status": status, "content_type": ctype, "body": text}, indent=1) + "\n"
            )
        record["requests"][name] = {
            "status": status,
            "content_type": ctype,
            "seconds": round(seconds, 3),
        }
        payloads[name] = parsed
        return parsed

    try:
        health_codes = wait_healthy(proc, base, started + args.startup_timeout, log_path, save)
        record["launch_to_healthy_s"] = round(time.monotonic() - started, 2)
        record["load_average_1m_at_healthy"] = os.getloadavg()[0]
        record["health_codes_seen"] = health_codes
        record["rss_mib_idle"], record["processes"] = group_rss_mib(pgid)
        print(f"capture: healthy after {record['launch_to_healthy_s']} s", flush=True)

        st, ct, tx, s = request(base, "GET", "/get_model_info")
        save("get_model_info", None, st, ct, tx, s)
        st, ct, tx, s = request(base, "POST", "/flush_cache")
        save("flush_cache", None, st, ct, tx, s)
        st, ct, tx, s = request(base, "GET", "/server_info")
        save("server_info_before", None, st, ct, tx, s)

        n = args.max_new_tokens
        body = {
            "text": PROMPTS,
            "rid": [f"se-{i}" for i in range(len(PROMPTS))],
            "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
        }
        st, ct, tx, s = request(base, "POST", "/generate", body)
        answers = save("generate_text_batch", body, st, ct, tx, s)
        tokens = sum(a["meta_info"]["completion_tokens"] for a in answers)
        record["text_batch"] = {
            "requests": len(PROMPTS),
            "completion_tokens": tokens,
            "seconds": round(s, 3),
            "tokens_per_s": round(tokens / s, 1),
        }
        record["rss_mib_after_batch"], _ = group_rss_mib(pgid)
        st, ct, tx, s = request(base, "GET", "/server_info")
        save("server_info_after", None, st, ct, tx, s)
        st, ct, tx, s = request(base, "GET", "/get_server_info")
        save("get_server_info", None, st, ct, tx, s)

        body = {
            "text": PROMPTS,
            "rid": [f"se-p{i}" for i in range(len(PROMPTS))],
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True},
        }
        save("generate_prefill_batch", body, *request(base, "POST", "/generate", body))

        ids = [a["output_ids"][:12] for a in answers]  # real token ids of this tokenizer
        prompt_ids = [[0] + [3 + b for b in p.encode()][:24] for p in PROMPTS]
        body = {
            "input_ids": prompt_ids,
            "rid": [f"se-l{i}" for i in range(len(PROMPTS))],
            "sampling_params": {"max_new_tokens": 8, "temperature": 0.0},
            "return_logprob": True,
            "top_logprobs_num": 2,
            "logprob_start_len": 0,
        }
        save("generate_input_ids_logprob", body, *request(base, "POST", "/generate", body))

        body = {
            "text": PROMPTS[:2],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_prompt_token_ids": True,
        }
        got = save("generate_prompt_token_ids", body, *request(base, "POST", "/generate", body))
        prompt0 = (
            list(got[0]["prompt_token_ids"])
            if got and "prompt_token_ids" in got[0]
            else prompt_ids[0]
        )
        cont = ids[0][:8]
        body = {
            "input_ids": [prompt0 + cont],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": len(prompt0) - 1,
        }
        save("generate_continuation_logprob", body, *request(base, "POST", "/generate", body))

        st, ct, tx, s = request(base, "POST", "/flush_cache?timeout=5")
        save("flush_cache_timeout", None, st, ct, tx, s)
        record["rss_mib_end"], _ = group_rss_mib(pgid)
    finally:
        stop_started = time.monotonic()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # leader only: SGLang's graceful shutdown
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        while group_alive(pgid) and time.monotonic() - stop_started < 30:
            time.sleep(0.2)
        leftover = group_alive(pgid)
        if leftover:
            os.killpg(pgid, signal.SIGKILL)
        record["shutdown_s"] = round(time.monotonic() - stop_started, 2)
        # CPU time of the whole server tree (its children are reaped by the leader): a figure
        # that, unlike the wall times above, does not depend on what else the machine runs.
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        record["server_cpu_s"] = round(
            cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime, 1
        )
        record["load_average_1m_at_end"] = os.getloadavg()[0]
        record["shutdown_leftover_killed"] = leftover
        record["leader_exit_code"] = proc.returncode
        events = [json.loads(line) for line in standin_log.read_text().splitlines() if line]
        record["standin_imports"] = sorted({e["name"] for e in events if e["event"] == "import"})
        record["standin_calls"] = [e["name"] for e in events if e["event"] == "call"]
        (out / "capture.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "requests"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
