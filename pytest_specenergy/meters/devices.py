"""The one module that touches NVML: loading, device facts, GPU counts, errors (who goes through it
and how missing calls are feature-detected: ``docs/report.md``)."""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from pytest_specenergy.meters.base import MeterError

# NVML "clocks event" (throttle) reason bits, as documented for nvmlClocksEventReasons.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "GpuIdle"),
    (0x2, "ApplicationsClocksSetting"),
    (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"),
    (0x10, "SyncBoost"),
    (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
)
#: Reasons that mean the board slowed itself down: energy per token is not comparable.
SLOWDOWN_REASONS = frozenset(
    {"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"}
)

_ADVICE = {
    "LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 was not found: this machine has no NVIDIA driver, or "
    "the container was started without the GPU runtime (docker --gpus all)",
    "DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded (nvidia-smi fails too)",
    "NO_PERMISSION": "no permission to open the GPU device files (/dev/nvidia*)",
    "LIB_RM_VERSION_MISMATCH": "the NVML library and the kernel driver differ in version (driver "
    "upgraded without a reboot); reboot or reload the driver",
    "GPU_IS_LOST": "a GPU fell off the bus; the machine needs attention before measuring",
}


@dataclass(frozen=True)
class GpuFacts:
    """What one GPU is and how it is set up; recorded with every result."""

    index: int
    uuid: str
    name: str
    driver: str | None
    power_limit_w: float | None
    default_power_limit_w: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    temperature_c: float | None
    persistence_mode: bool | None
    mig_enabled: bool | None
    energy_counter: bool


def nvml_reason(nvml: Any, exc: BaseException) -> str:
    """A sentence saying what an NVML failure means and what to do about it."""
    # ``NOT_SUPPORTED`` for an NVMLError with that code; the class name otherwise.
    value = getattr(exc, "value", None)
    codes = (
        n.removeprefix("NVML_ERROR_")
        for n in dir(nvml)
        if n.startswith("NVML_ERROR_") and getattr(nvml, n) == value
    )
    name = next(codes, type(exc).__name__)
    return _ADVICE.get(name, f"NVML error {name}: {exc}")


#: The member of NVML's value union that a field value's ``valueType`` names.
_UNION_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def _import_nvml() -> Any:
    try:
        import pynvml as nvml  # type: ignore[import-not-found]
    except ImportError:
        raise MeterError(
            "nvidia-ml-py is not installed, so NVML cannot be read; install it with pip install "
            "'pytest-specenergy[nvml]' (never the deprecated 'pynvml' package)"
        ) from None
    if not hasattr(nvml, "_nvmlGetFunctionPointer"):
        raise MeterError(
            "the 'pynvml' module here is not NVIDIA's nvidia-ml-py binding; uninstall pynvml and "
            "pip install nvidia-ml-py"
        )
    return nvml


def text(value: Any) -> str:
    """NVML strings are ``str`` in nvidia-ml-py but ``bytes`` in old bindings."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _milliwatts(value: Any) -> float | None:
    return None if value is None else float(value) / 1000.0


class Nvml:
    """An open NVML library, the one object that calls ``pynvml`` (Zeus's ``nvidia.py``): every
    vendor call is a method here or on :class:`Gpu`. One :meth:`close` (or ``with``) ends the one
    init."""

    def __init__(self, module: Any = None) -> None:
        self.lib = module if module is not None else _import_nvml()
        try:
            self.lib.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError or an OSError from ctypes
            raise MeterError(f"NVML could not start: {nvml_reason(self.lib, exc)}") from exc
        self._open = True

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def call(self, function: str, *args: Any, what: str = "") -> Any:
        """``pynvml.<function>(*args)``; a failure is a :class:`MeterError` saying ``what`` failed."""
        try:
            return getattr(self.lib, function)(*args)
        except Exception as exc:  # noqa: BLE001 - NVMLError, or the binding lacks the function
            raise MeterError(f"{what or function} failed: {nvml_reason(self.lib, exc)}") from exc

    def optional(self, function: str | tuple[str, ...], *args: Any) -> Any:
        """``pynvml.<function>(*args)``, or None if an older driver lacks it or the board refuses
        it; given several names, the first that answers."""
        for name in (function,) if isinstance(function, str) else function:
            # absent, NOT_SUPPORTED, FUNCTION_NOT_FOUND, DEPRECATED...
            with contextlib.suppress(Exception):
                value = getattr(self.lib, name)(*args)
                if value is not None:
                    return value
        return None

    def constant(self, name: str, default: int) -> Any:
        """An NVML constant (``NVML_CLOCK_SM``...), with its documented value as the fallback."""
        return getattr(self.lib, name, default)

    def count(self) -> int:
        """How many GPUs NVML sees."""
        return int(self.call("nvmlDeviceGetCount", what="NVML could not count GPUs"))

    def gpus(self) -> list[Gpu]:
        """Every GPU, in NVML (PCI bus) order."""
        return [Gpu(self, i) for i in range(self.count())]

    def driver(self) -> str | None:
        """The kernel driver version, e.g. ``570.124.06``."""
        value = self.optional("nvmlSystemGetDriverVersion")
        return None if value is None else text(value)

    def version(self) -> str | None:
        """The NVML library version."""
        value = self.optional("nvmlSystemGetNVMLVersion")
        return None if value is None else text(value)

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._open:
            self._open = False
            self.optional("nvmlShutdown")


class Gpu:
    """One GPU of an open :class:`Nvml`: its identity, counters and facts, each a method."""

    def __init__(self, nvml: Nvml, index: int) -> None:
        self.nvml, self.index = nvml, index
        self.handle = nvml.call(
            "nvmlDeviceGetHandleByIndex", index, what=f"NVML could not open GPU {index}"
        )
        self.uuid = text(
            nvml.call("nvmlDeviceGetUUID", self.handle, what=f"reading GPU {index}'s UUID")
        )
        self.name = text(nvml.optional("nvmlDeviceGetName", self.handle) or "?")

    def __repr__(self) -> str:
        return f"Gpu({self.index}, {self.uuid!r}, {self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Gpu) and other.uuid == self.uuid

    def __hash__(self) -> int:
        return hash(self.uuid)

    def energy_mj(self) -> int:
        """The total-energy counter, mJ since the driver loaded; a board without one is an error."""
        try:
            return int(self.nvml.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception as exc:  # noqa: BLE001
            raise MeterError(
                f"GPU {self.index} {self.name} ({self.uuid}) has no readable total-energy "
                f"counter: {nvml_reason(self.nvml.lib, exc)}; it needs a Volta or newer GPU with "
                "a driver that supports nvmlDeviceGetTotalEnergyConsumption"
            ) from exc

    def processes(self) -> set[int]:
        """PIDs of the compute processes NVML lists on this GPU (host PIDs)."""
        procs = self.nvml.optional("nvmlDeviceGetComputeRunningProcesses", self.handle)
        return {int(p.pid) for p in procs or []}

    def memory_total(self) -> int | None:
        """The GPU's total memory in bytes, or None where NVML does not say (a MIG slice)."""
        info = self.nvml.optional("nvmlDeviceGetMemoryInfo", self.handle)
        total = getattr(info, "total", None)  # an nvmlMemory_t struct; None when unsupported
        return int(total) if total else None

    def clock_events(self) -> int | None:
        """The current clocks-event (throttle) bitmask, or None if unreadable."""
        value = self.nvml.optional(
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            self.handle,
        )
        return None if value is None else int(value)

    def temperature_c(self) -> float | None:
        """GPU core temperature; the ``V`` call first (the old one is deprecated in CUDA 13)."""
        sensor = self.nvml.constant("NVML_TEMPERATURE_GPU", 0)
        value = self.nvml.optional(
            ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), self.handle, sensor
        )
        return None if value is None else float(value)

    def power_reader(self) -> tuple[Any, str]:
        """A function giving this GPU's power in W now, and what it reads: the instantaneous field
        where the driver has it (``NVML_FI_DEV_POWER_INSTANT``), else the 1-second average of
        ``nvmlDeviceGetPowerUsage``."""
        lib, field = self.nvml.lib, getattr(self.nvml.lib, "NVML_FI_DEV_POWER_INSTANT", None)

        def instant() -> float:
            value = lib.nvmlDeviceGetFieldValues(self.handle, [field])[0]
            if value.nvmlReturn != getattr(lib, "NVML_SUCCESS", 0):
                raise RuntimeError(f"NVML field {field} returned {value.nvmlReturn}")
            # mW
            return (
                float(getattr(value.value, _UNION_MEMBER.get(int(value.valueType), "uiVal")))
                / 1000.0
            )

        if field is not None and hasattr(lib, "nvmlDeviceGetFieldValues"):
            with contextlib.suppress(Exception):  # the field is not supported on this board/driver
                instant()
                return instant, "instant"
        return (lambda: float(lib.nvmlDeviceGetPowerUsage(self.handle)) / 1000.0), "average"

    def facts(self, driver: str | None) -> GpuFacts:
        """Facts about this GPU now (clocks and temperature change; read them per window)."""
        nvml, handle = self.nvml, self.handle
        limit = nvml.optional(
            ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"), handle
        )
        persistence = nvml.optional("nvmlDeviceGetPersistenceMode", handle)
        mig = nvml.optional("nvmlDeviceGetMigMode", handle)
        sm, mem = nvml.constant("NVML_CLOCK_SM", 1), nvml.constant("NVML_CLOCK_MEM", 2)
        return GpuFacts(
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            driver=driver,
            power_limit_w=_milliwatts(limit),
            default_power_limit_w=_milliwatts(
                nvml.optional("nvmlDeviceGetPowerManagementDefaultLimit", handle)
            ),
            sm_clock_mhz=nvml.optional("nvmlDeviceGetClockInfo", handle, sm),
            mem_clock_mhz=nvml.optional("nvmlDeviceGetClockInfo", handle, mem),
            max_sm_clock_mhz=nvml.optional("nvmlDeviceGetMaxClockInfo", handle, sm),
            temperature_c=self.temperature_c(),
            persistence_mode=None
            if persistence is None
            else persistence == nvml.constant("NVML_FEATURE_ENABLED", 1),
            mig_enabled=None if not mig else mig[0] == nvml.constant("NVML_DEVICE_MIG_ENABLE", 1),
            energy_counter=nvml.optional("nvmlDeviceGetTotalEnergyConsumption", handle) is not None,
        )


def decode_clock_events(mask: int | None) -> list[str]:
    """Reason names set in ``mask``; unknown bits as hex."""
    if not mask:
        return []
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in CLOCK_EVENT_REASONS)
    return names + ([hex(rest)] if rest else [])


def nvml_gpu_count() -> int:
    """How many GPUs NVML sees; raises :class:`MeterError` when NVML cannot start."""
    with Nvml() as nvml:
        return nvml.count()


def gpu_path_unavailable() -> str | None:
    """None when SGLang is importable and NVML sees a GPU; else the reason, ready to show."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (pip install 'pytest-specenergy[sglang]')"
    try:
        count = nvml_gpu_count()
    except Exception as exc:  # no library or no driver: NVML raises its own error types
        return f"no NVIDIA GPU is usable here ({exc})"
    return None if count else "NVML sees no GPU"
