"""pytest-xdist: one GPU per worker, or no measurement at all.

Energy cannot be measured on a GPU that another worker is using. ``--specenergy-xdist=per-gpu``
(the default) pins worker ``gwN`` to one GPU through ``CUDA_VISIBLE_DEVICES`` before any engine
starts (on a CPU machine each worker simply runs its own reference servers; more workers than
GPUs is a usage error); results travel to the controller as JSON in ``workeroutput`` and are
merged into one table and one file. With ``off``, spec_pair tests fail under xdist (never skip:
a gate that measured nothing must not pass), and the summary says so once.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING
from typing import Any

import pytest

if TYPE_CHECKING:
    from pytest_specenergy.document import CaseRecord

WORKER_OUTPUT_KEY = "specenergy_records"
SKIPPED_KEY = "specenergy_xdist_skipped"
SKIP_REASON = ("specenergy: energy is not measured under pytest-xdist with --specenergy-xdist=off "
               "(workers would share a GPU); use --specenergy-xdist=per-gpu (one GPU per worker) or run "
               "without -n")


def is_worker(config: pytest.Config) -> bool:
    """True inside an xdist worker process."""
    return hasattr(config, "workerinput")


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` entries, else NVML's count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    try:
        from pytest_specenergy.meters.devices import nvml_gpu_count

        return [str(i) for i in range(nvml_gpu_count())]
    except Exception:  # no library, no driver: NVML raises its own error types
        return []


def pin_worker(config: pytest.Config) -> str | None:
    """Pin this worker to one GPU; returns the device it got (None on a CPU machine)."""
    worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
    index = int(worker.lstrip("gw") or 0)
    gpus = visible_gpus()
    if not gpus:
        return None
    count = int(config.workerinput.get("workercount", len(gpus)))  # type: ignore[attr-defined]
    if count > len(gpus):
        raise pytest.UsageError(
            f"--specenergy-xdist=per-gpu needs one GPU per worker: {count} workers but only "
            f"{len(gpus)} GPU(s) visible ({', '.join(gpus)}); use -n {len(gpus)}")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index]
    return gpus[index]


def ship(config: pytest.Config, records: list[CaseRecord], skipped: int) -> None:
    """Worker side: hand this worker's records (and its xdist-skipped count) to the controller."""
    payload = json.dumps([r.as_dict() for r in records], default=str)
    config.workeroutput[WORKER_OUTPUT_KEY] = payload  # type: ignore[attr-defined]
    config.workeroutput[SKIPPED_KEY] = skipped  # type: ignore[attr-defined]


def receive(node: Any) -> tuple[list[CaseRecord], int]:
    """Controller side: the records a finished worker shipped, and how many it skipped."""
    from pytest_specenergy.document import CaseRecord

    output = getattr(node, "workeroutput", {})
    payload = json.loads(output.get(WORKER_OUTPUT_KEY) or "[]")
    worker = getattr(node, "gateway", None)
    records = [CaseRecord.from_dict(r, f"the records of xdist worker {getattr(worker, 'id', '?')}: [{i}]")
               for i, r in enumerate(payload)]
    return records, int(output.get(SKIPPED_KEY, 0))
