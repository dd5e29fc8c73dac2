"""The ``nvml`` meter: GPU board energy counters, cross-checked by sampled power (how GPUs are
resolved and why short windows are refused: ``docs/report.md``)."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Mapping

import pytest_specenergy.meters.devices as gpu_info
from pytest_specenergy.engines.watchdog import proc_stats
from pytest_specenergy.meters.base import EnergyWindow
from pytest_specenergy.meters.base import EngineHandle
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.sampler import PowerSampler

CONTAMINATION_POLICIES = ("warn", "fail", "ignore")


class GpuContaminationWarning(UserWarning):
    """Another process used a measured GPU during the window."""


class PowerGapWarning(UserWarning):
    """The energy counter and the integrated power samples disagree beyond the tolerance."""


def resolve_devices(
    nvml: gpu_info.Nvml, visible: str | None, device_order: str | None = None
) -> list[gpu_info.Gpu]:
    """The GPUs a process with this ``CUDA_VISIBLE_DEVICES`` uses (unset = all of them)."""
    devices = nvml.gpus()
    count = len(devices)
    if count == 0:
        raise MeterError("NVML sees no GPU on this machine; the nvml meter needs one")
    if visible is None:
        return devices
    entries = [e.strip() for e in visible.split(",")]
    if not any(entries):
        raise MeterError("CUDA_VISIBLE_DEVICES is empty, so the engine sees no GPU to measure")
    chosen: list[gpu_info.Gpu] = []
    by_index = False
    for entry in entries:
        if entry.upper().startswith("MIG"):
            raise MeterError(
                f"CUDA_VISIBLE_DEVICES names the MIG slice {entry}; NVML cannot measure the "
                "energy of a MIG slice, only of a whole GPU. Give the engine whole GPUs (indices "
                "or GPU- UUIDs)"
            )
        if entry.upper().startswith("GPU-"):
            # CUDA accepts any unique UUID prefix.
            matches = [d for d in devices if d.uuid.lower().startswith(entry.lower())]
            if len(matches) != 1:
                raise MeterError(
                    f"CUDA_VISIBLE_DEVICES entry {entry} matches {len(matches)} GPUs; known UUIDs: "
                    f"{', '.join(d.uuid for d in devices)}"
                )
            device = matches[0]
        else:
            try:
                index = int(entry)
            except ValueError:
                raise MeterError(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} is neither a GPU index nor a GPU- UUID"
                ) from None
            if not 0 <= index < count:
                raise MeterError(
                    f"CUDA_VISIBLE_DEVICES entry {index} is out of range: NVML sees {count} "
                    f"GPU(s), indices 0-{count - 1}"
                )
            device, by_index = devices[index], True
        if device in chosen:
            raise MeterError(f"CUDA_VISIBLE_DEVICES lists GPU {device.uuid} twice ({visible})")
        chosen.append(device)
    if by_index and device_order != "PCI_BUS_ID" and len({d.name for d in devices}) > 1:
        # CUDA numbers fastest-first by default, NVML by PCI bus: on mixed boards they differ.
        raise MeterError(
            "CUDA_VISIBLE_DEVICES uses indices on a machine with different GPU models, where "
            "CUDA's default order is not NVML's; set CUDA_DEVICE_ORDER=PCI_BUS_ID or name the "
            "GPUs by UUID (GPU-...)"
        )
    return chosen


def engine_gpu_memory(environ: Mapping[str, str] | None = None) -> int | None:
    """Total memory, in bytes, of the first GPU an engine started with ``environ`` (default:
    this process's) uses; None when NVML cannot tell (no NVML, no GPU, a MIG slice): GPU
    residency is then not guessed."""
    environ = os.environ if environ is None else environ
    try:
        with gpu_info.Nvml() as nvml:
            visible = environ.get("CUDA_VISIBLE_DEVICES")
            gpu = resolve_devices(nvml, visible, environ.get("CUDA_DEVICE_ORDER"))[0]
            return gpu.memory_total()
    except Exception:  # noqa: BLE001 - not known, whatever the reason: residency says so
        return None


def pid_tree(root: int) -> set[int]:
    """``root`` and all its descendants, from ``/proc`` (just ``{root}`` elsewhere)."""
    children: dict[int, list[int]] = {}
    for pid, fields in proc_stats():
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


def pid_exists(pid: int) -> bool:
    """Whether ``pid`` is a process in this PID namespace."""
    try:
        os.kill(pid, 0)
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:  # ProcessLookupError among them
        return False
    return True


@dataclass
class _Window:
    devices: list[gpu_info.Gpu]
    visible: str | None
    engine_pid: int | None
    start_mj: list[int]
    t0: float
    sampler: PowerSampler
    before: list[gpu_info.GpuFacts]
    masks: list[int | None]
    processes: dict[int, set[int]]
    closed: bool = False


class NvmlMeter:
    """Measured energy of the GPUs an engine uses (the :class:`Meter` protocol)."""

    kind = "nvml"
    label = "measured (nvml)"

    def __init__(
        self,
        *,
        nvml_module: Any = None,
        min_window_s: float = 5.0,
        sample_hz: float = 20.0,
        contamination: str = "warn",
        max_power_gap: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        process_tree: Callable[[int], set[int]] = pid_tree,
        process_exists: Callable[[int], bool] = pid_exists,
        own_pids: Callable[[], Iterable[int]] | None = None,
    ) -> None:
        if contamination not in CONTAMINATION_POLICIES:
            raise ValueError(
                f"contamination={contamination!r}; expected one of "
                f"{', '.join(CONTAMINATION_POLICIES)}"
            )
        if min_window_s <= 0:
            raise ValueError(f"min_window_s={min_window_s} must be positive")
        self.min_window_s = float(min_window_s)
        self.sample_hz = float(sample_hz)
        if self.sample_hz < 10.0:
            raise ValueError(f"sample_hz={sample_hz}: the power cross-check needs >= 10 Hz")
        self.contamination = contamination
        self.max_power_gap = max_power_gap
        self._clock = clock
        self._process_tree = process_tree
        self._process_exists = process_exists
        #: The pids of every engine the plugin runs (the pool's live servers): resident sibling
        #: engines idle beside the measured one are the plugin's own processes, not contamination.
        self.own_pids = own_pids
        self._nvml = gpu_info.Nvml(nvml_module)
        self._closed = False
        try:
            if self._nvml.count() == 0:
                raise MeterError("NVML started but sees no GPU; the nvml meter needs one")
        except MeterError:
            self.close()
            raise
        self._driver = self._nvml.driver()

    @classmethod
    def open(cls, **kwargs: Any) -> NvmlMeter:
        """The meter, or :class:`MeterError` saying why NVML cannot measure here."""
        return cls(**kwargs)

    def describe(self) -> dict[str, Any]:
        """The machine: driver, NVML version, every GPU's facts, and the meter's settings."""
        gpus = [asdict(gpu.facts(self._driver)) for gpu in self._nvml.gpus()]
        return {
            "kind": self.kind,
            "label": self.label,
            "driver": self._driver,
            "nvml_version": self._nvml.version(),
            "gpus": gpus,
            "min_window_s": self.min_window_s,
            "sample_hz": self.sample_hz,
            "contamination": self.contamination,
        }

    def start(self, engine: EngineHandle) -> _Window:
        """Read every counter of the engine's GPUs and start the power sampler."""
        if self._closed:
            raise MeterError("the nvml meter was closed; open a new one")
        env: Mapping[str, str] = getattr(engine, "env", None) or os.environ
        visible = env.get("CUDA_VISIBLE_DEVICES")
        devices = resolve_devices(self._nvml, visible, env.get("CUDA_DEVICE_ORDER"))
        pid = getattr(engine, "pid", None)
        if pid is None:
            pid = getattr(getattr(engine, "process", None), "pid", None)
        pid = int(pid) if isinstance(pid, int) else None
        processes = {d.index: d.processes() for d in devices}
        if self.contamination == "fail":
            self._contamination(devices, pid, processes, at_start=True)
        before = [d.facts(self._driver) for d in devices]
        masks = [d.clock_events() for d in devices]
        sampler = PowerSampler(devices, self.sample_hz, self._clock)
        start_mj = [d.energy_mj() for d in devices]
        t0 = self._clock()
        sampler.start()
        return _Window(devices, visible, pid, start_mj, t0, sampler, before, masks, processes)

    def stop(self, token: _Window) -> EnergyWindow:
        """Close the window: counter deltas, checks, and the facts of every GPU."""
        if token.closed:
            raise MeterError("this nvml window was already stopped")
        token.closed = True
        sampled = token.sampler.stop()
        end_mj = [d.energy_mj() for d in token.devices]
        seconds = self._clock() - token.t0
        deltas = [end - start for start, end in zip(token.start_mj, end_mj)]
        for device, start, end in zip(token.devices, token.start_mj, end_mj):
            if end < start:
                raise MeterError(
                    f"the energy counter of GPU {device.index} ({device.uuid}) went backwards "
                    f"({start} -> {end} mJ): the driver was reloaded or the GPU reset during the "
                    "window; the window is discarded, run it again"
                )
        if seconds < self.min_window_s:
            raise MeterError(
                f"energy window too short: {seconds:.2f} s < min_window_s {self.min_window_s:g} "
                "s; the board counter updates about every 100 ms and its sensor is only accurate "
                "over several seconds - repeat the workload until the window is long enough"
            )
        if not any(deltas):
            raise MeterError(
                f"the energy counters did not advance over {seconds:.1f} s on "
                f"{', '.join(d.uuid for d in token.devices)}; the counter is stuck or unsupported"
            )
        joules = sum(deltas) / 1000.0
        gap = (sampled.joules - joules) / joules
        if abs(gap) > self.max_power_gap:
            warnings.warn(
                PowerGapWarning(
                    f"sampled power integrates to {sampled.joules:.1f} J but the energy counter "
                    f"says {joules:.1f} J ({gap:+.1%}, tolerance {self.max_power_gap:.0%}); the "
                    "window is suspect"
                ),
                stacklevel=2,
            )
        processes = {
            d.index: d.processes() | token.processes.get(d.index, set()) for d in token.devices
        }
        contamination = self._contamination(token.devices, token.engine_pid, processes)
        gpus = []
        for i, device in enumerate(token.devices):
            before, after = asdict(token.before[i]), asdict(device.facts(self._driver))
            mask = (token.masks[i] or 0) | (device.clock_events() or 0)
            reasons = gpu_info.decode_clock_events(mask)
            gpus.append(
                {
                    **before,
                    "energy_j": deltas[i] / 1000.0,
                    "sampled_energy_j": sampled.joules_per_gpu[i],
                    **{
                        key: {"before": before[key], "after": after[key]}
                        for key in ("sm_clock_mhz", "mem_clock_mhz", "temperature_c")
                    },
                    "throttle_reasons": reasons,
                    "slowed_down": bool(gpu_info.SLOWDOWN_REASONS & set(reasons)),
                }
            )
        details = {
            "gpus": gpus,
            "driver": self._driver,
            "cuda_visible_devices": token.visible,
            "power_gap": gap,
            "sampler": {
                "source": sampled.source,
                "hz_requested": sampled.hz_requested,
                "hz_achieved": sampled.hz_achieved,
                "samples": sampled.samples,
                "energy_j": sampled.joules,
                "errors": sampled.errors,
            },
            "contamination": contamination,
        }
        return EnergyWindow(joules=joules, seconds=seconds, source=self.label, details=details)

    def _contamination(
        self,
        devices: list[gpu_info.Gpu],
        pid: int | None,
        processes: dict[int, set[int]],
        at_start: bool = False,
    ) -> dict[str, Any]:
        """Other processes on the engine's GPUs, and what the policy does about them."""
        listed = {p for pids in processes.values() for p in pids}
        report: dict[str, Any] = {
            "policy": self.contamination,
            "engine_pid": pid,
            "other_processes": [],
            "status": "clean",
        }
        if pid is None:
            report["status"] = "unchecked: the engine handle has no pid"
            return report
        ours = self._process_tree(pid)
        siblings: set[int] = set()
        for other in self.own_pids() if self.own_pids is not None else ():
            if other is not None and int(other) != pid:
                siblings |= self._process_tree(int(other))
        siblings -= ours
        if siblings & listed:
            # Their idle power is in the window, in both arms alike (each arm's window has the other
            # resident): reported, not contamination.
            report["resident_engines"] = sorted(siblings & listed)
        ours |= siblings
        if listed and not listed & ours and not any(map(self._process_exists, listed)):
            # NVML reports host PIDs; inside a container's own PID namespace none of them exists
            # here, so the engine's processes cannot be told from anyone else's.
            report.update(status="unattributable", other_processes=sorted(listed))
            if self.contamination != "ignore" and not at_start:
                warnings.warn(
                    GpuContaminationWarning(
                        f"NVML lists processes {sorted(listed)} on the measured GPUs but none "
                        f"belongs to the engine (pid {pid}); in a container without the host PID "
                        "namespace they cannot be told apart - run with --pid=host to enable "
                        "this check"
                    ),
                    stacklevel=3,
                )
            return report
        others = [
            {"pid": p, "gpu": d.uuid, "this_pytest": p == os.getpid()}
            for d in devices
            for p in sorted(processes.get(d.index, set()) - ours)
        ]
        if not others:
            return report
        report.update(status="contaminated", other_processes=others)
        listing = ", ".join(f"pid {o['pid']} on {o['gpu']}" for o in others)
        message = (
            f"other processes use the measured GPU(s) during the window: {listing}; their energy "
            "is counted too. Free the GPU, or set the contamination policy to 'ignore' if this "
            "is expected"
        )
        if self.contamination == "fail":
            raise MeterError(message)
        if self.contamination == "warn" and not at_start:
            warnings.warn(GpuContaminationWarning(message), stacklevel=3)
        return report

    def close(self) -> None:
        """Shut NVML down (once)."""
        if not self._closed:
            self._closed = True
            self._nvml.close()
