"""Capture what a real SGLang NGRAM engine and its twin answer on this CPU, through the plugin.

    PYTHONPATH=. .venv/bin/python dev/sglang_capture_spec.py OUT_DIR \
        --python .sglang-envs/0.5.23/bin/python --model .sglang-envs/tiny-models/target

Starts the live session's two engines (``tests/sglang/test_sglang_live.py``: ``--device cpu``,
torch_native, float32, ``max_running_requests=4``, a 4096-token pool,
``schedule_conservativeness=0.1``) with the plugin's own ``ServerProcess``: the NGRAM engine
(``Drafter("ngram", num_draft_tokens=4)``), which runs on this CPU with the test-only overlay of
``tests/sglang_overlay/`` (put on ``PYTHONPATH`` here; SGLang's scheduler, NGRAM worker, counters
and HTTP layer are its own), and its twin (the same config without the drafter). Writes:

* ``generate_spec_batch.json`` (the NGRAM engine) and ``generate_twin_batch.json`` (the twin):
  the four prompts of ``dev/sglang_capture.py``, greedy, 48 tokens each, EOS honoured (the plugin's
  default), and the first prompt again with ``max_new_tokens=1`` (it finishes in its prefill, so
  no verify step runs); one batched ``/generate``, answers in input order. The NGRAM trie is
  empty before it (a fresh engine);
* ``server_info_spec_before.json`` / ``server_info_spec_after.json``: ``GET /server_info`` of the
  NGRAM engine around that batch (``step_time_dict``, ``avg_spec_accept_length``);
* ``generate_retraction_spec.json`` / ``generate_retraction_twin.json``: on each engine, six
  prompts of 1000 tokens for 450 tokens each, sent at once (the live retraction case's shape);
  SGLang admits three, which overflow the pool, so it retracts one; when the first finishes, the
  plugin's window close (``abort_until_answered``) aborts the others, running and queued (a
  retracted request is answered from the waiting queue, without ``prompt_tokens``);
* ``capture.json``: the command lines, environment, versions, timings, and whether each engine
  logged a retraction (SGLang's "KV cache pool is full. Retract requests.").

Needs ``SGLANG_USE_CPU_ENGINE=1`` (set here) and an environment from ``dev/sglang_env.sh``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sglang_capture import PROMPTS
from sglang_capture_pair import live_config

from pytest_specenergy import Drafter
from pytest_specenergy.cases.corpora.loader import load_corpus
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.measure.arm import abort_until_answered

REPO = Path(__file__).resolve().parents[1]
OVERLAY = REPO / "tests" / "sglang_overlay"
#: The live session's pool and admission (tests/sglang/spec_suite.py).
POOL_TOKENS = 4096
CONSERVATIVENESS = 0.1
BATCH_TOKENS = 48
#: The retraction: the live case's shape (tests/sglang/spec_suite.py says why these).
LONG_PROMPT_CHARS, LONG_SLICES, LONG_TOKENS = 1000, (0, 1, 2, 3, 5, 6), 450


def configs(model: str, python: str) -> dict[str, EngineConfig]:
    """The NGRAM engine's config and its twin's."""
    twin = live_config(
        model,
        python,
        max_total_tokens=POOL_TOKENS,
        schedule_conservativeness=CONSERVATIVENESS,
    )
    ngram = dataclasses.replace(twin, drafter=Drafter("ngram", num_draft_tokens=4))
    return {"spec": ngram, "twin": twin}


def batch(client: Any) -> list[dict[str, Any]]:
    """The capture batch: four prompts for ``BATCH_TOKENS`` tokens and one finished in prefill."""
    params = {"max_new_tokens": BATCH_TOKENS, "temperature": 0.0}
    return client.generate(
        text=[*PROMPTS, PROMPTS[0]],
        rids=[f"spec-{i}" for i in range(len(PROMPTS))] + ["spec-prefill"],
        sampling_params=[params] * len(PROMPTS) + [{**params, "max_new_tokens": 1}],
    )


def retraction(client: Any) -> list[dict[str, Any]]:
    """Six long requests at once, closed by the plugin's window close when the first finishes."""
    text = "\n\n".join(load_corpus("code").prompts)
    prompts = [text[i * LONG_PROMPT_CHARS : (i + 1) * LONG_PROMPT_CHARS] for i in LONG_SLICES]
    answers: list[Any] = [None] * len(prompts)

    def one(i: int) -> None:
        [answers[i]] = client.generate(
            text=[prompts[i]],
            rids=[f"long-{i}"],
            sampling_params={"max_new_tokens": LONG_TOKENS, "temperature": 0.0},
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    while all(a is None for a in answers):
        time.sleep(0.005)
    abort_until_answered(client, lambda: {f"long-{i}" for i, a in enumerate(answers) if a is None})
    for thread in threads:
        thread.join(120)
    return answers


def write(out: Path, name: str, value: Any) -> None:
    (out / f"{name}.json").write_text(json.dumps(value, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        SGLANG_USE_CPU_ENGINE="1",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(OVERLAY), os.environ.get("PYTHONPATH")) if p),
    )
    python = str(Path(args.python).absolute())  # a venv python must keep its path (no resolve)
    logs = Path(tempfile.mkdtemp(prefix="sglang-spec-"))
    backend = SGLangBackend()
    servers = {
        name: ServerProcess(config, backend, logs / name)
        for name, config in configs(str(Path(args.model).resolve()), python).items()
    }
    record: dict[str, Any] = {"argv": {}, "start_s": {}, "retracted": {}}
    record["env"] = {k: os.environ[k] for k in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH")}
    try:
        for name, server in servers.items():
            started = time.perf_counter()
            server.start()
            record["start_s"][name] = round(time.perf_counter() - started, 1)
            record["argv"][name] = server.argv
        spec = servers["spec"].client
        write(args.out, "server_info_spec_before", spec.server_info())
        started = time.perf_counter()
        write(args.out, "generate_spec_batch", batch(spec))
        record["spec_batch_s"] = round(time.perf_counter() - started, 2)
        write(args.out, "server_info_spec_after", spec.server_info())
        write(args.out, "generate_twin_batch", batch(servers["twin"].client))
        for name, server in servers.items():
            server.client.flush_cache()
            write(args.out, f"generate_retraction_{name}", retraction(server.client))
        record["version"] = servers["spec"].server_info.get("version")
    finally:
        for name, server in servers.items():
            server.stop()
            log = Path(server.log_path).read_text(errors="replace")
            found = re.findall(r"KV cache pool is full\. Retract requests\. [^\n]*", log)
            record["retracted"][name] = found
    write(args.out, "capture", record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    sys.exit(main())
