"""pytest-xdist: one GPU per worker, or no measurement; ``--specenergy-xdist``'s modes:
docs/engines.md."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING
from typing import Any

import pytest

if TYPE_CHECKING:
    from pytest_specenergy.document import CaseRecord

#: The worker output that hands a worker's count of spec_pair tests it refused to measure to the
#: controller.
SKIPPED_KEY = "specenergy_xdist_skipped"
OFF_REASON = (
    "specenergy: energy is not measured under pytest-xdist with --specenergy-xdist=off (workers "
    "would share a GPU); use --specenergy-xdist=per-gpu (one GPU per worker) or run without -n"
)


def is_worker(config: pytest.Config) -> bool:
    """True inside an xdist worker process."""
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    """True in the process that hands tests to xdist workers."""
    return (
        not is_worker(config)
        and bool(getattr(config.option, "numprocesses", None))
        and getattr(config.option, "dist", "no") != "no"
    )


def interrupt_on_sigterm() -> Any:
    """On the xdist controller (it runs no engine, so no pool handler): SIGTERM or SIGHUP interrupts
    the session like Ctrl-C, so what workers reported is still written, marked interrupted. Returns
    the replaced SIGTERM handler (None: ignored or set)."""
    replaced = None
    for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is None:
            continue
        previous = signal.getsignal(signum)
        if previous not in (signal.SIG_DFL, None):
            continue  # ignored, or someone else handles it: leave it
        signal.signal(signum, _interrupt)
        if signum == signal.SIGTERM:
            replaced = previous
    return replaced


def _interrupt(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received by the xdist controller")


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
    index = int(config.workerinput["workerid"].lstrip("gw") or 0)  # type: ignore[attr-defined]
    gpus = visible_gpus()
    if not gpus:
        return None
    count = int(config.workerinput.get("workercount", len(gpus)))  # type: ignore[attr-defined]
    if count > len(gpus):
        raise pytest.UsageError(
            f"--specenergy-xdist=per-gpu needs one GPU per worker: {count} workers but only "
            f"{len(gpus)} GPU(s) visible ({', '.join(gpus)}); use -n {len(gpus)}"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index]
    return gpus[index]


#: The record a test settled, for :class:`RecordCourier` to put on its report.
RECORD_KEY = pytest.StashKey["CaseRecord"]()
RECORD_ATTRIBUTE = "specenergy_record"


class RecordCourier:
    """Each test's record travels to the controller (``records``) on its own report (xdist
    serializes a report's attributes), not in one bundle at the worker's end: a worker killed later
    loses none of the tests it finished."""

    def __init__(self, config: pytest.Config, records: list[CaseRecord]) -> None:
        self.worker, self.records = is_worker(config), records

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        """On a worker: the call phase's report carries the record its test settled."""
        report = yield
        record = item.stash.get(RECORD_KEY, None)
        if self.worker and call.when == "call" and record is not None:
            setattr(report, RECORD_ATTRIBUTE, record.as_dict())
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """On the controller: read a worker's record back through the document's reader."""
        data = getattr(report, RECORD_ATTRIBUTE, None)
        if data is not None and not self.worker:
            from pytest_specenergy.document import CaseRecord

            self.records.append(
                CaseRecord.from_dict(data, f"the record of {report.nodeid} from its xdist worker")
            )
