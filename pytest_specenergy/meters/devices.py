"""The one module that touches NVML: loading, device facts, GPU counts, errors.

The meter (:mod:`.nvml`), ``specenergy doctor``, the xdist GPU pinning and
:func:`gpu_path_unavailable` all go through it, as Zeus keeps ``pynvml`` in one file.

``nvidia-ml-py`` (module ``pynvml``) is imported lazily so the plugin works without it; every
NVML call that can be missing on an older driver or unsupported on a board is feature-detected
(NVIDIA's NVML API reference lists which queries each architecture supports).
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

from pytest_specenergy.meters.base import MeterError

# NVML "clocks event" (throttle) reason bits, as documented for nvmlClocksEventReasons.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "GpuIdle"), (0x2, "ApplicationsClocksSetting"), (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"), (0x10, "SyncBoost"), (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"), (0x80, "HwPowerBrakeSlowdown"), (0x100, "DisplayClockSetting"),
)
#: Reasons that mean the board slowed itself down: energy per token is not comparable.
SLOWDOWN_REASONS = frozenset({"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown",
                              "HwPowerBrakeSlowdown"})

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

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def error_name(nvml: Any, exc: BaseException) -> str:
    """``NOT_SUPPORTED`` for an NVMLError with that code; the class name otherwise."""
    value = getattr(exc, "value", None)
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == value:
            return name[len("NVML_ERROR_"):]
    return type(exc).__name__


def nvml_reason(nvml: Any, exc: BaseException) -> str:
    """A sentence saying what an NVML failure means and what to do about it."""
    name = error_name(nvml, exc)
    return _ADVICE.get(name, f"NVML error {name}: {exc}")


def load_nvml(nvml_module: Any = None) -> Any:
    """Import (unless given) and initialise NVML; raise :class:`MeterError` with the reason.

    The caller owns one ``nvmlShutdown()`` for each successful call.
    """
    nvml = nvml_module
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found,no-redef]
        except ImportError:
            raise MeterError(
                "nvidia-ml-py is not installed, so NVML cannot be read; install it with "
                "pip install 'pytest-specenergy[nvml]' (never the deprecated 'pynvml' package)"
            ) from None
        if not hasattr(nvml, "_nvmlGetFunctionPointer"):
            raise MeterError(
                "the 'pynvml' module here is not NVIDIA's nvidia-ml-py binding; uninstall "
                "pynvml and pip install nvidia-ml-py")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError or an OSError from ctypes
        raise MeterError(f"NVML could not start: {nvml_reason(nvml, exc)}") from exc
    return nvml


def safe(nvml: Any, function: str, *args: Any) -> Any:
    """``nvml.<function>(*args)``, or None if the driver lacks or refuses it."""
    fn = getattr(nvml, function, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NOT_SUPPORTED, FUNCTION_NOT_FOUND, DEPRECATED...
        return None


def text(value: Any) -> str:
    """NVML strings are ``str`` in nvidia-ml-py but ``bytes`` in old bindings."""
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_version(nvml: Any) -> str | None:
    """The kernel driver version, e.g. ``570.124.06``."""
    value = safe(nvml, "nvmlSystemGetDriverVersion")
    return None if value is None else text(value)


def temperature_c(nvml: Any, handle: Any) -> float | None:
    """GPU core temperature; the ``V`` call first (the old one is deprecated in CUDA 13)."""
    sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
    value = safe(nvml, "nvmlDeviceGetTemperatureV", handle, sensor)
    if value is None:
        value = safe(nvml, "nvmlDeviceGetTemperature", handle, sensor)
    return None if value is None else float(value)


def clock_event_mask(nvml: Any, handle: Any) -> int | None:
    """The current clocks-event (throttle) bitmask, or None if unreadable."""
    value = safe(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if value is None:
        value = safe(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return None if value is None else int(value)


def decode_clock_events(mask: int | None) -> list[str]:
    """Reason names set in ``mask``; unknown bits as hex."""
    if not mask:
        return []
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in CLOCK_EVENT_REASONS)
    return names + ([hex(rest)] if rest else [])


def _milliwatts(value: Any) -> float | None:
    return None if value is None else float(value) / 1000.0


def read_facts(nvml: Any, handle: Any, index: int, driver: str | None) -> GpuFacts:
    """Facts about one GPU now (clocks and temperature change; read them per window)."""
    limit = safe(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    if limit is None:
        limit = safe(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
    persistence = safe(nvml, "nvmlDeviceGetPersistenceMode", handle)
    mig = safe(nvml, "nvmlDeviceGetMigMode", handle)
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    mem = getattr(nvml, "NVML_CLOCK_MEM", 2)
    return GpuFacts(
        index=index,
        uuid=text(safe(nvml, "nvmlDeviceGetUUID", handle) or "?"),
        name=text(safe(nvml, "nvmlDeviceGetName", handle) or "?"),
        driver=driver,
        power_limit_w=_milliwatts(limit),
        default_power_limit_w=_milliwatts(safe(nvml, "nvmlDeviceGetPowerManagementDefaultLimit",
                                               handle)),
        sm_clock_mhz=safe(nvml, "nvmlDeviceGetClockInfo", handle, sm),
        mem_clock_mhz=safe(nvml, "nvmlDeviceGetClockInfo", handle, mem),
        max_sm_clock_mhz=safe(nvml, "nvmlDeviceGetMaxClockInfo", handle, sm),
        temperature_c=temperature_c(nvml, handle),
        persistence_mode=None if persistence is None else persistence == getattr(
            nvml, "NVML_FEATURE_ENABLED", 1),
        mig_enabled=None if not mig else mig[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1),
        energy_counter=safe(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle) is not None,
    )


def list_gpus(nvml_module: Any = None) -> list[GpuFacts]:
    """Facts for every GPU NVML sees; raise :class:`MeterError` when NVML cannot start."""
    nvml = load_nvml(nvml_module)
    try:
        driver = driver_version(nvml)
        count = int(nvml.nvmlDeviceGetCount())
        return [read_facts(nvml, nvml.nvmlDeviceGetHandleByIndex(i), i, driver)
                for i in range(count)]
    except MeterError:
        raise
    except Exception as exc:  # noqa: BLE001 - an NVMLError while enumerating
        raise MeterError(f"NVML could not list GPUs: {nvml_reason(nvml, exc)}") from exc
    finally:
        safe(nvml, "nvmlShutdown")

def nvml_gpu_count() -> int:
    """How many GPUs NVML sees; raises :class:`MeterError` when NVML cannot start."""
    nvml = load_nvml()
    try:
        return int(nvml.nvmlDeviceGetCount())
    finally:
        safe(nvml, "nvmlShutdown")


def gpu_path_unavailable() -> str | None:
    """None when SGLang is importable and NVML sees a GPU; else the reason, ready to show."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (pip install 'pytest-specenergy[sglang]')"
    try:
        count = nvml_gpu_count()
    except Exception as exc:  # no library or no driver: NVML raises its own error types
        return f"no NVIDIA GPU is usable here ({exc})"
    return None if count else "NVML sees no GPU"
