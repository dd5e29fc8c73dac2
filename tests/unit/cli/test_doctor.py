"""``specenergy doctor``: readable, non-zero here (no GPU); zero on a healthy (fake) GPU."""

from __future__ import annotations

import io
import json

import pytest

from pytest_specenergy.cli import doctor
from pytest_specenergy.cli.doctor import FAIL
from pytest_specenergy.cli.doctor import OK
from pytest_specenergy.cli.doctor import WARN
from pytest_specenergy.meters.devices import Nvml

try:
    from tests.fakes import fake_pynvml as fake
except ImportError:  # tests/ itself on sys.path
    from fakes import fake_pynvml as fake  # type: ignore[no-redef]


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(argv: list[str], gpus: list[fake.FakeGpu] | None = None, **kwargs):
    clock = Clock()
    nvml = None if gpus is None else fake.FakeNvml(gpus, clock=clock, **kwargs)
    out = io.StringIO()
    code = doctor.main(argv, nvml_module=nvml, out=out, sleep=clock.sleep)
    return code, out.getvalue()


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # noqa: BLE001
        return False


def test_here_without_a_gpu_exits_non_zero_with_readable_lines():
    if _nvml_works():
        pytest.skip("this machine has a working NVML")
    code, text = run([])
    assert code == 1
    lines = text.splitlines()
    assert lines[0].startswith("specenergy doctor:")
    assert any(line.startswith("[FAIL] nvml: NVML could not start") for line in lines)
    assert "       fix: run on a machine with an NVIDIA GPU" in text
    assert lines[-1].startswith("doctor: 3 FAIL") and "exit 1" in lines[-1]
    for name in ("sglang", "torch", "transformers"):
        assert any(line[7:].startswith(name) for line in lines), name


def test_healthy_fake_gpu_exits_zero():
    code, text = run(["--sglang-version", "0.5.23"], fake.h200s(2))
    assert code == 0, text
    assert "[ OK ] nvml: injected module, driver 570.124.06" in text
    assert "[ OK ] gpu 1: NVIDIA H200 GPU-00000001" in text and "persistence on" in text
    assert "[ OK ] energy counter 0:" in text and "(~300 W)" in text
    assert "[ OK ] CUDA_VISIBLE_DEVICES:" in text
    assert "sglang ngram" not in text and "sglang shutdown" not in text
    assert text.splitlines()[-1].startswith("doctor: GPU runs can work here")


def test_energy_counter_unsupported_fails():
    code, text = run(["--sglang-version", "0.5.23"], fake.h200s(1, energy_supported=False))
    assert code == 1
    assert (
        "[FAIL] energy counter 0: unreadable: GPU 0 " in text and "NVML error NOT_SUPPORTED" in text
    )


def test_flat_counter_warns():
    code, text = run(["--sglang-version", "0.5.23"], fake.h200s(1, power_w=0.0))
    assert code == 0
    assert "[WARN] energy counter 0: did not advance" in text


def test_no_gpu_fails():
    code, text = run([], [])
    assert code == 1 and "[FAIL] gpus: NVML sees no GPU" in text


def test_old_sglang_warnings_and_refusal():
    code, text = run(["--sglang-version", "0.5.9"], fake.h200s(1))
    assert code == 0
    assert "[WARN] sglang ngram:" in text and "PR #26351" in text
    assert "[WARN] sglang shutdown:" in text and "PR #23213" in text
    assert "--cuda-graph-max-bs (renamed --cuda-graph-max-bs-decode in 0.5.14)" in text
    code, text = run(["--sglang-version", "0.5.8"], fake.h200s(1))
    assert code == 1 and "[FAIL] sglang: 0.5.8 is older than 0.5.9" in text


def test_cuda_graph_flag_notes():
    (check,) = [c for c in doctor.check_sglang("0.5.14") if c.name == "sglang cuda graphs"]
    assert "deprecated alias" in check.detail
    (check,) = [c for c in doctor.check_sglang("0.5.23") if c.name == "sglang cuda graphs"]
    assert "argparse error" in check.detail
    assert doctor.check_sglang(None)[0].status == WARN


def test_mig_visible_devices_fail():
    nvml = fake.FakeNvml(fake.h200s(1), clock=Clock())
    checks = doctor.run_checks(
        nvml, "0.5.23", env={"CUDA_VISIBLE_DEVICES": "MIG-abc"}, sleep=lambda s: None
    )
    (visible,) = [c for c in checks if c.name == "CUDA_VISIBLE_DEVICES"]
    assert visible.status == FAIL and "MIG slice" in visible.detail


def test_persistence_off_and_low_power_limit_warn():
    code, text = run(
        ["--sglang-version", "0.5.23"], fake.h200s(1, persistence=fake.NVML_FEATURE_DISABLED)
    )
    assert code == 0 and "[WARN] gpu 0:" in text and "persistence" in text
    gpu = fake.h200s(1)[0]
    nvml = fake.FakeNvml([gpu])
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda handle: 400_000  # capped below the default
    (check,) = doctor.check_gpus(Nvml(nvml))
    assert check.status == WARN and "below the default" in check.fix


def test_json_output():
    clock = Clock()
    out = io.StringIO()
    code = doctor.main(
        ["--json", "--sglang-version", "0.5.23"],
        nvml_module=fake.FakeNvml(fake.h200s(1), clock=clock),
        out=out,
        sleep=clock.sleep,
    )
    data = json.loads(out.getvalue())
    assert code == 0 and data["ok"] is True
    assert {c["status"] for c in data["checks"]} <= {OK, WARN}
    assert data["checks"][0] == {
        "name": "nvml",
        "status": OK,
        "detail": "injected module, driver 570.124.06",
        "fix": "",
    }


def test_doctor_help_prints_doctors_own_help_and_exits_0(capsys):
    from pytest_specenergy.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["doctor", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: specenergy doctor") and "--json" in out
