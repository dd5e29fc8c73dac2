"""A small fake of NVIDIA's ``nvidia-ml-py`` (module ``pynvml``), for unit tests only.

It exists because NVML cannot run here: there is no NVIDIA driver or GPU on CI machines, yet
the nvml meter and ``specenergy doctor`` must be tested through every branch. Names, constants,
error codes and the ``NVMLError`` subclass scheme mirror nvidia-ml-py 13.x (``NVMLError(code)``
returns the subclass for that code, e.g. ``NVMLError_NotSupported``). Simulated GPUs have a
power draw you set and an energy counter that integrates it over a clock you control.

It is injected explicitly - ``NvmlMeter(nvml_module=FakeNvml([...]))`` - never installed as
``pynvml``.
"""

from __future__ import annotations

import string
import sys
import threading
import time
from dataclasses import dataclass
from dataclasses import field
from types import SimpleNamespace
from typing import Any
from typing import Callable

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_UNSIGNED_INT = 1

nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSwThermalSlowdown = 0x20


class NVMLError(Exception):
    """Base NVML error; ``NVMLError(code)`` returns the subclass registered for ``code``."""

    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return f"NVML error {self.value}"


def _make_error_classes() -> None:
    # Same naming rule as nvidia-ml-py: NVML_ERROR_NOT_SUPPORTED -> NVMLError_NotSupported.
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace(
            "_", ""
        )
        code = getattr(module, name)

        def new(cls: type, *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        klass = type(class_name, (NVMLError,), {"__new__": new})
        setattr(module, class_name, klass)
        NVMLError._valClassMapping[code] = klass


_make_error_classes()


@dataclass
class FakeGpu:
    """One simulated GPU. ``power_w`` may be changed at any time with :meth:`set_power`."""

    uuid: str
    name: str = "NVIDIA H200"
    power_w: float = 300.0
    #: The counter reads this factor times the true energy (1.2 = counter 20 % high).
    counter_scale: float = 1.0
    energy_supported: bool = True
    instant_power_supported: bool = True
    temperature_c: float = 40.0
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 3201
    max_sm_clock_mhz: int = 1980
    power_limit_mw: int = 700_000
    throttle_mask: int = 0
    persistence: int = NVML_FEATURE_ENABLED
    mig_mode: int = NVML_DEVICE_MIG_DISABLE
    processes: list[int] = field(default_factory=list)
    # mJ since the (simulated) driver load: real counters are large, so a reset goes backwards.
    _energy_mj: float = 123_456_789.0
    _last_t: float | None = None


class FakeNvml:
    """A module-like object: the NVML functions the plugin calls, over simulated GPUs."""

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        driver: str = "570.124.06",
        clock: Callable[[], float] = time.monotonic,
        missing: tuple[str, ...] = (),
    ) -> None:
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver = driver
        self.clock = clock
        self.initialized = 0
        self._lock = threading.Lock()
        module = sys.modules[__name__]
        for name in dir(module):
            if name.startswith(("NVML", "nvml")) and not callable(getattr(self, name, None)):
                setattr(self, name, getattr(module, name))
        for name in missing:  # simulate an older driver without these functions
            setattr(self, name, None)

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if value is None and name.startswith("nvml"):
            raise AttributeError(name)
        return value

    # -- simulation controls --------------------------------------------------------------
    def _advance(self, gpu: FakeGpu) -> None:
        now = self.clock()
        if gpu._last_t is not None:
            gpu._energy_mj += gpu.power_w * (now - gpu._last_t) * 1000.0
        gpu._last_t = now

    def set_power(self, index: int, watts: float) -> None:
        """Change a GPU's draw from now on (energy so far is kept)."""
        with self._lock:
            self._advance(self.gpus[index])
            self.gpus[index].power_w = watts

    def reset_counter(self, index: int) -> None:
        """Simulate a driver reload: the energy counter restarts from zero."""
        with self._lock:
            self._advance(self.gpus[index])
            self.gpus[index]._energy_mj = 0.0

    # -- NVML API ---------------------------------------------------------------------------
    def _check(self) -> None:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> FakeGpu:
        self._check()
        if not isinstance(handle, FakeGpu):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1
        with self._lock:
            for gpu in self.gpus:
                self._advance(gpu)

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check()
        return "13." + self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if not gpu.energy_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            self._advance(gpu)
            return int(gpu._energy_mj * gpu.counter_scale)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._gpu(handle).power_w * 1000)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[Any]:
        gpu = self._gpu(handle)
        out = []
        for fid in field_ids:
            fid = fid[0] if isinstance(fid, tuple) else fid
            ok = fid == NVML_FI_DEV_POWER_INSTANT and gpu.instant_power_supported
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=0,
                    timestamp=int(self.clock() * 1e6),
                    latencyUsec=0,
                    valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                    nvmlReturn=NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                    value=SimpleNamespace(uiVal=int(gpu.power_w * 1000) if ok else 0),
                )
            )
        return out

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        return int(self._gpu(handle).temperature_c)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        return gpu.mem_clock_mhz if clock_type == NVML_CLOCK_MEM else gpu.sm_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        return self._gpu(handle).max_sm_clock_mhz

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return self._gpu(handle).persistence

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return [self._gpu(handle).mig_mode, self._gpu(handle).mig_mode]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle).throttle_mask

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [
            SimpleNamespace(
                pid=p, usedGpuMemory=1 << 30, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
            for p in self._gpu(handle).processes
        ]


def h200s(count: int = 1, **kwargs: Any) -> list[FakeGpu]:
    """``count`` identical H200s with distinct UUIDs."""
    return [FakeGpu(uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}", **kwargs) for i in range(count)]
