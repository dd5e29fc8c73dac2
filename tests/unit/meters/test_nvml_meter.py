"""The nvml meter against a fake NVML (no GPU here), plus the real module's "no driver" path."""

from __future__ import annotations

import sys
import time
import types
import warnings
from typing import Any

import pytest

from pytest_specenergy.meters import devices as gpu_info
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.devices import Nvml
from pytest_specenergy.meters.nvml import GpuContaminationWarning
from pytest_specenergy.meters.nvml import NvmlMeter
from pytest_specenergy.meters.nvml import PowerGapWarning
from pytest_specenergy.meters.nvml import pid_exists
from pytest_specenergy.meters.nvml import pid_tree
from pytest_specenergy.meters.nvml import resolve_devices
from pytest_specenergy.meters.sampler import SOURCE_AVERAGE
from pytest_specenergy.meters.sampler import SOURCE_INSTANT
from pytest_specenergy.meters.sampler import PowerSampler
from pytest_specenergy.meters.sampler import integrate_trapezoid

try:
    from tests.fakes import fake_pynvml as fake
except ImportError:  # tests/ itself on sys.path (pytest's rootdir-less import mode)
    from fakes import fake_pynvml as fake  # type: ignore[no-redef]


class Clock:
    """A clock the test moves by hand, shared by the fake GPUs and the meter."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Engine:
    """The EngineHandle view a meter needs."""

    def __init__(self, env: dict[str, str] | None = None, pid: int | None = 100) -> None:
        self.env = env or {}
        self.pid = pid
        self.config = None


ENGINE_TREE = {100, 101}  # the engine and its scheduler child


def make(gpus: list[fake.FakeGpu], **kwargs: Any) -> tuple[NvmlMeter, fake.FakeNvml, Clock]:
    clock = Clock()
    nvml = fake.FakeNvml(gpus, clock=clock)
    kwargs.setdefault("process_tree", lambda pid: set(ENGINE_TREE))
    kwargs.setdefault("process_exists", lambda pid: True)  # one PID namespace, like a bare host
    return NvmlMeter(nvml_module=nvml, clock=clock, **kwargs), nvml, clock


def measure(meter: NvmlMeter, clock: Clock, seconds: float = 10.0, engine: Engine | None = None):
    token = meter.start(engine or Engine())
    clock.advance(seconds)
    return meter.stop(token)


def test_protocol_attributes_and_defaults():
    meter, nvml, _ = make(fake.h200s(1))
    assert (meter.kind, meter.label, meter.min_window_s) == ("nvml", "measured (nvml)", 5.0)
    assert meter.sample_hz == 20.0 and meter.contamination == "warn"
    meter.close()
    assert nvml.initialized == 0


def test_energy_is_summed_over_every_gpu_of_the_engine():
    gpus = fake.h200s(2)
    gpus[1].power_w = 500.0
    meter, _, clock = make(gpus)
    window = measure(meter, clock, 10.0)
    assert window.joules == pytest.approx(8000.0)
    assert window.seconds == pytest.approx(10.0)
    assert window.source == "measured (nvml)"
    per_gpu = [g["energy_j"] for g in window.details["gpus"]]
    assert per_gpu == pytest.approx([3000.0, 5000.0])
    assert [g["uuid"] for g in window.details["gpus"]] == [g.uuid for g in gpus]
    assert window.details["power_gap"] == pytest.approx(0.0, abs=1e-6)
    assert window.details["sampler"]["source"] == SOURCE_INSTANT


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", [1]),
        ("1,0", [1, 0]),
        ("GPU-00000001-aaaa-bbbb-cccc-000000000001", [1]),
        ("GPU-00000001", [1]),
        ("GPU-00000002,0", [2, 0]),
        (None, [0, 1, 2]),
    ],
)
def test_cuda_visible_devices_by_index_and_uuid(visible, expected):
    gpus = fake.h200s(3)
    for i, gpu in enumerate(gpus):
        gpu.power_w = 100.0 * (i + 1)
    meter, _, clock = make(gpus)
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    window = measure(meter, clock, 10.0, Engine(env))
    assert [g["index"] for g in window.details["gpus"]] == expected
    assert window.joules == pytest.approx(sum(1000.0 * (i + 1) for i in expected))


@pytest.mark.parametrize(
    ("visible", "message"),
    [
        ("MIG-1b2c3d4e-0000-1111-2222-333333333333", "MIG slice"),
        ("3", "out of range"),
        ("", "empty"),
        ("GPU-0000000", "matches 2 GPUs"),
        ("GPU-ffff", "matches 0 GPUs"),
        ("0,0", "twice"),
        ("first", "neither a GPU index"),
    ],
)
def test_bad_cuda_visible_devices_is_refused(visible, message):
    meter, _, _ = make(fake.h200s(2))
    with pytest.raises(MeterError, match=message):
        meter.start(Engine({"CUDA_VISIBLE_DEVICES": visible}))


def test_indices_on_mixed_gpus_need_pci_bus_order():
    gpus = [fake.FakeGpu("GPU-a", name="NVIDIA H100"), fake.FakeGpu("GPU-b", name="NVIDIA L4")]
    nvml = Nvml(fake.FakeNvml(gpus))
    with pytest.raises(MeterError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        resolve_devices(nvml, "1")
    assert [d.uuid for d in resolve_devices(nvml, "1", "PCI_BUS_ID")] == ["GPU-b"]
    assert [d.uuid for d in resolve_devices(nvml, "GPU-b")] == ["GPU-b"]


def test_counter_reset_is_detected():
    meter, nvml, clock = make(fake.h200s(2))
    token = meter.start(Engine())
    clock.advance(6.0)
    nvml.reset_counter(1)
    clock.advance(6.0)
    with pytest.raises(MeterError, match=r"GPU 1 .* went backwards .*driver was reloaded"):
        meter.stop(token)


def test_too_short_window_fails_with_reason_never_zero():
    meter, _, clock = make(fake.h200s(1))
    with pytest.raises(MeterError, match=r"too short: 2.00 s < min_window_s 5 s"):
        measure(meter, clock, 2.0)
    idle, _, clock = make(fake.h200s(1, power_w=0.0))
    with pytest.raises(MeterError, match="did not advance"):
        measure(idle, clock, 10.0)


def test_a_window_stops_once():
    meter, _, clock = make(fake.h200s(1))
    token = meter.start(Engine())
    clock.advance(6.0)
    meter.stop(token)
    with pytest.raises(MeterError, match="already stopped"):
        meter.stop(token)


def test_sampler_gap_is_reported_and_warned_beyond_tolerance():
    # The counter reads 25 % high: sampled power integrates to 1/1.25 of it.
    meter, _, clock = make(fake.h200s(1, counter_scale=1.25), max_power_gap=0.1)
    with pytest.warns(PowerGapWarning, match=r"-20.0%"):
        window = measure(meter, clock, 10.0)
    assert window.details["power_gap"] == pytest.approx(-0.2, abs=1e-3)
    assert window.joules == pytest.approx(3750.0)
    assert window.details["sampler"]["energy_j"] == pytest.approx(3000.0)
    quiet, _, clock = make(fake.h200s(1, counter_scale=1.05), max_power_gap=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measure(quiet, clock).details["power_gap"] == pytest.approx(-1 / 21, abs=1e-3)


def test_sampler_thread_really_samples_at_the_requested_rate():
    nvml = fake.FakeNvml(fake.h200s(1, power_w=250.0))
    meter = NvmlMeter(
        nvml_module=nvml,
        min_window_s=0.3,
        sample_hz=50.0,
        process_tree=lambda pid: set(ENGINE_TREE),
    )
    token = meter.start(Engine())
    time.sleep(0.4)
    window = meter.stop(token)
    sampler = window.details["sampler"]
    assert sampler["samples"] >= 5 and sampler["hz_requested"] == 50.0
    assert window.joules == pytest.approx(250.0 * window.seconds, rel=0.05)
    assert abs(window.details["power_gap"]) < 0.05


def test_sampler_falls_back_to_average_power_and_rejects_slow_rates():
    nvml = Nvml(fake.FakeNvml(fake.h200s(1, instant_power_supported=False)))
    assert PowerSampler(nvml.gpus()).source == SOURCE_AVERAGE
    with pytest.raises(ValueError, match=">= 10 Hz"):
        PowerSampler(nvml.gpus(), hz=5.0)
    with pytest.raises(ValueError, match=">= 10 Hz"):
        NvmlMeter(nvml_module=fake.FakeNvml(fake.h200s(1)), sample_hz=2.0)


def test_integrate_trapezoid():
    assert integrate_trapezoid([0.0, 1.0, 2.0], [0.0, 100.0, 100.0]) == pytest.approx(150.0)
    assert integrate_trapezoid([5.0], [300.0]) == 0.0
    with pytest.raises(ValueError):
        integrate_trapezoid([0.0, 1.0], [1.0])


def test_device_facts_are_recorded_per_window():
    gpus = fake.h200s(1, throttle_mask=0x24)
    meter, _, clock = make(gpus)
    token = meter.start(Engine())
    clock.advance(6.0)
    gpus[0].temperature_c = 71.0
    gpus[0].sm_clock_mhz = 1755
    window = meter.stop(token)
    (gpu,) = window.details["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["driver"] == "570.124.06"
    assert gpu["power_limit_w"] == 700.0
    assert gpu["temperature_c"] == {"before": 40.0, "after": 71.0}
    assert gpu["sm_clock_mhz"] == {"before": 1980, "after": 1755}
    assert gpu["mem_clock_mhz"] == {"before": 3201, "after": 3201}
    assert gpu["throttle_reasons"] == ["SwPowerCap", "SwThermalSlowdown"]
    assert gpu["slowed_down"] is True
    assert window.details["cuda_visible_devices"] is None


def test_describe_names_the_machine():
    meter, _, _ = make(fake.h200s(2))
    facts = meter.describe()
    assert facts["driver"] == "570.124.06" and facts["kind"] == "nvml"
    assert [g["uuid"] for g in facts["gpus"]] == [g.uuid for g in fake.h200s(2)]
    assert all(g["energy_counter"] and g["persistence_mode"] for g in facts["gpus"])


def test_contamination_warn_records_other_processes():
    gpus = fake.h200s(1, processes=[100, 101, 4242])
    meter, _, clock = make(gpus)
    with pytest.warns(GpuContaminationWarning, match="pid 4242"):
        window = measure(meter, clock)
    report = window.details["contamination"]
    assert report["status"] == "contaminated" and report["engine_pid"] == 100
    assert [p["pid"] for p in report["other_processes"]] == [4242]


def test_contamination_fail_refuses_at_start_and_at_stop():
    meter, _, _ = make(fake.h200s(1, processes=[100, 4242]), contamination="fail")
    with pytest.raises(MeterError, match="pid 4242"):
        meter.start(Engine())
    gpus = fake.h200s(1, processes=[100])
    meter, _, clock = make(gpus, contamination="fail")
    token = meter.start(Engine())
    gpus[0].processes.append(5151)  # someone starts a job mid-window
    clock.advance(6.0)
    with pytest.raises(MeterError, match="pid 5151"):
        meter.stop(token)


def test_contamination_ignore_and_clean():
    meter, _, clock = make(fake.h200s(1, processes=[100, 4242]), contamination="ignore")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measure(meter, clock).details["contamination"]["status"] == "contaminated"
        clean, _, clock = make(fake.h200s(1, processes=[100, 101]), contamination="fail")
        assert measure(clean, clock).details["contamination"]["status"] == "clean"
    with pytest.raises(ValueError, match="warn, fail, ignore"):
        NvmlMeter(nvml_module=fake.FakeNvml(fake.h200s(1)), contamination="maybe")


def test_processes_that_cannot_be_attributed_warn_but_do_not_fail():
    # A container PID namespace: NVML shows host pids, none of them the engine's.
    meter, _, clock = make(
        fake.h200s(1, processes=[987654]), contamination="fail", process_exists=lambda pid: False
    )
    with pytest.warns(GpuContaminationWarning, match="--pid=host"):
        window = measure(meter, clock)
    assert window.details["contamination"]["status"] == "unattributable"


def test_a_foreign_process_is_contamination_even_when_the_engine_is_not_listed():
    # Seen on a real H200: NVML listed only the other job, whose pid exists here.
    meter, _, clock = make(fake.h200s(1, processes=[4242]), contamination="fail")
    with pytest.raises(MeterError, match="pid 4242"):
        measure(meter, clock)


def test_pid_helpers_on_this_machine():
    import os
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert {os.getpid(), child.pid} <= pid_tree(os.getpid())
        assert pid_exists(child.pid) and pid_exists(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert not pid_exists(child.pid)


def test_no_pid_leaves_contamination_unchecked():
    meter, _, clock = make(fake.h200s(1, processes=[4242]))
    window = measure(meter, clock, engine=Engine(pid=None))
    assert window.details["contamination"]["status"].startswith("unchecked")


def test_gpu_without_energy_counter_is_refused():
    meter, _, _ = make(fake.h200s(1, energy_supported=False))
    with pytest.raises(
        MeterError, match=r"no readable total-energy counter: NVML error NOT_SUPPORTED"
    ):
        meter.start(Engine())


def test_no_gpu_is_a_meter_error():
    with pytest.raises(MeterError, match="sees no GPU"):
        NvmlMeter.open(nvml_module=fake.FakeNvml([]))
    with pytest.raises(MeterError, match="no NVIDIA driver"):
        NvmlMeter.open(nvml_module=fake.FakeNvml(init_error=fake.NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(MeterError, match="kernel driver is not loaded"):
        NvmlMeter.open(nvml_module=fake.FakeNvml(init_error=fake.NVML_ERROR_DRIVER_NOT_LOADED))


def test_without_nvidia_ml_py_open_is_a_meter_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(MeterError, match="nvidia-ml-py is not installed"):
        NvmlMeter.open()
    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    with pytest.raises(MeterError, match="not NVIDIA's nvidia-ml-py"):
        NvmlMeter.open()


def test_real_nvml_without_a_driver_is_a_meter_error():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    with pytest.raises(MeterError, match="NVML could not start"):
        NvmlMeter.open()
    with pytest.raises(MeterError):
        Nvml()


def test_gpu_facts_and_missing_functions():
    nvml = fake.FakeNvml(
        fake.h200s(2), missing=("nvmlDeviceGetTemperatureV", "nvmlDeviceGetPersistenceMode")
    )
    with Nvml(nvml) as session:
        gpus = [gpu.facts(session.driver()) for gpu in session.gpus()]
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].temperature_c is None and gpus[0].persistence_mode is None
    assert gpus[0].energy_counter is True and gpus[0].mig_enabled is False
    assert nvml.initialized == 0
    assert gpu_info.decode_clock_events(0x1 | 0x200) == ["GpuIdle", "0x200"]


def test_fake_mirrors_the_real_binding():
    pynvml = pytest.importorskip("pynvml")
    for name in dir(fake):
        if name.startswith(("NVML_", "nvmlClocksEventReason")):
            assert getattr(pynvml, name) == getattr(fake, name), name
        if name.startswith("NVMLError_"):
            assert hasattr(pynvml, name), name
    assert (
        type(fake.NVMLError(fake.NVML_ERROR_NOT_SUPPORTED)).__name__
        == type(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)).__name__
    )
    for name in dir(fake.FakeNvml):
        if name.startswith("nvml"):
            assert callable(getattr(pynvml, name, None)), name


def test_resident_sibling_engines_are_the_plugins_own_processes():
    """Issue 37 item 3: the idle resident twin (pid 200, its scheduler 201) beside the measured
    engine is no contamination, even under contamination="fail"; a stranger still is."""
    trees = {100: {100, 101}, 200: {200, 201}}
    gpus = fake.h200s(1, processes=[100, 101, 200, 201])
    meter, _, clock = make(
        gpus,
        contamination="fail",
        process_tree=lambda pid: set(trees.get(pid, {pid})),
        own_pids=lambda: [100, 200],
    )
    window = measure(meter, clock)
    report = window.details["contamination"]
    assert report["status"] == "clean" and report["resident_engines"] == [200, 201]
    gpus[0].processes.append(4242)
    with pytest.raises(MeterError, match="pid 4242"):
        measure(meter, clock)
    # Without the pool's pids (nobody wired them) the sibling is someone else's.
    alone, _, clock = make(
        fake.h200s(1, processes=[100, 200]), process_tree=lambda pid: set(trees.get(pid, {pid}))
    )
    with pytest.warns(GpuContaminationWarning, match="pid 200"):
        measure(alone, clock)
