"""``specenergy doctor`` fails where a run would fail: SGLang installed but ``import sglang`` or its
kernel package failing, torch without CUDA, a driver older than torch's CUDA needs.

SGLang installs are real ones made in a temporary folder (a package and its ``dist-info``, read
by the real ``importlib``): one whose import fails, one whose kernel package fails to load as
``sgl_kernel`` does without a driver. torch is this machine's real CPU build, or, for the CUDA
builds that cannot exist here, a small fake holding only what the doctor reads
(``__version__``, ``version.cuda``, ``cuda.is_available()``, ``cuda.device_count()``). NVML is
``tests/fakes/fake_pynvml`` with the driver version under test.
"""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest

from pytest_specenergy.cli import doctor
from pytest_specenergy.cli.doctor_stack import FAIL
from pytest_specenergy.cli.doctor_stack import OK
from pytest_specenergy.cli.doctor_stack import check_driver
from pytest_specenergy.cli.doctor_stack import kernel_requirement

try:
    from tests.fakes import fake_pynvml as fake
except ImportError:  # tests/ itself on sys.path
    from fakes import fake_pynvml as fake  # type: ignore[no-redef]

KERNEL_MISSING_DRIVER = (
    "raise OSError('libcuda.so.1: cannot open shared object file: No such file or directory')\n"
)


def cuda_torch(cuda: str, available: bool, version: str = "2.14.1") -> SimpleNamespace:
    """A CUDA build of torch as the doctor sees it (none can be installed here)."""
    return SimpleNamespace(
        __version__=f"{version}+cu{cuda.replace('.', '')}",
        version=SimpleNamespace(cuda=cuda),
        cuda=SimpleNamespace(
            is_available=lambda: available, device_count=lambda: 1 if available else 0
        ),
    )


@pytest.fixture
def install(tmp_path, monkeypatch):
    """Install a real (tiny) ``sglang`` 0.5.23 distribution, and a kernel package, on sys.path."""

    def make(sglang_init: str = "", kernel_init: str | None = "") -> None:
        (tmp_path / "sglang").mkdir()
        (tmp_path / "sglang" / "__init__.py").write_text(sglang_init)
        info = tmp_path / "sglang-0.5.23.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n"
            "Requires-Dist: torch==2.14.1\nRequires-Dist: sglang-kernel==0.4.10\n"
            "Requires-Dist: pytest; extra == 'test'\n"
        )
        if kernel_init is not None:
            (tmp_path / "sgl_kernel").mkdir()
            (tmp_path / "sgl_kernel" / "__init__.py").write_text(kernel_init)
        monkeypatch.syspath_prepend(str(tmp_path))
        for name in ("sglang", "sgl_kernel"):
            monkeypatch.delitem(sys.modules, name, raising=False)

    return make


def run(driver: str = "580.95.05", **kwargs):
    nvml = fake.FakeNvml(fake.h200s(1), driver=driver)
    checks = doctor.run_checks(nvml, interval_s=0.01, sleep=lambda s: None, **kwargs)
    return {c.name: c for c in checks}, checks


def test_a_healthy_stack_passes(install):
    install()
    found, checks = run(torch_module=cuda_torch("13.0", True))
    assert found["sglang import"].status == OK and found["sglang kernels"].status == OK
    assert "sglang-kernel==0.4.10" in found["sglang kernels"].detail
    assert found["torch"].status == OK and found["driver"].status == OK
    assert not [c for c in checks if c.status == FAIL]


def test_import_sglang_failing_is_a_fail_naming_the_error(install):
    install(sglang_init="import a_module_sglang_needs_but_nobody_installed\n")
    found, _ = run(torch_module=cuda_torch("13.0", True))
    check = found["sglang import"]
    assert check.status == FAIL and "ModuleNotFoundError" in check.detail
    assert "a_module_sglang_needs_but_nobody_installed" in check.detail
    assert "sglang>=0.5.23,<0.6" in check.fix


def test_the_kernel_package_failing_to_load_is_a_fail(install):
    install(kernel_init=KERNEL_MISSING_DRIVER)
    found, _ = run(torch_module=cuda_torch("13.0", True))
    check = found["sglang kernels"]
    assert check.status == FAIL and "libcuda.so.1" in check.detail
    assert "sglang-kernel==0.4.10" in check.detail and "CUDA-only" in check.fix
    install_missing = found["sglang import"]
    assert install_missing.status == OK


def test_a_missing_kernel_package_is_a_fail(install):
    install(kernel_init=None)
    found, _ = run(torch_module=cuda_torch("13.0", True))
    assert found["sglang kernels"].status == FAIL
    assert "No module named 'sgl_kernel'" in found["sglang kernels"].detail


def test_sglang_with_this_machines_cpu_torch_fails(install):
    install()
    found, _ = run()  # the real torch here: the CPU build
    check = found["torch"]
    assert check.status == FAIL and "(a CPU build)" in check.detail
    assert "SGLang 0.5.23 cannot start an engine here" in check.detail
    assert "driver" not in found  # a CPU build needs no driver


def test_a_driver_older_than_torchs_cuda_fails_naming_the_driver_it_needs(install):
    install()
    found, _ = run(driver="570.124.06", torch_module=cuda_torch("13.0", False))
    assert found["torch"].status == FAIL and "built for CUDA 13.0" in found["torch"].detail
    check = found["driver"]
    assert check.status == FAIL and "570.124.06 is older than 580.65.06" in check.detail
    assert "upgrade the NVIDIA driver to >= 580.65.06" in check.fix


def test_the_same_driver_runs_a_cuda_12_build():
    assert check_driver("2.13.0", "12.8", "570.124.06").status == OK
    assert check_driver("2.13.0", "12.8", "520.61.05").status == FAIL
    assert check_driver("2.14.1", "13.0", "580.65.06").status == OK
    assert check_driver("2.14.1", "13.0", None).status == FAIL  # no driver readable
    assert check_driver("2.14.1", "14.0", "600.1").status == "WARN"


def test_without_sglang_a_cpu_torch_stays_a_warning():
    found, _ = run(installed=None)
    assert found["torch"].status == "WARN"
    assert "sglang import" not in found and "sglang kernels" not in found


def test_main_exits_1_on_a_broken_stack_and_prints_the_fix(install):
    install(kernel_init=KERNEL_MISSING_DRIVER)
    out = io.StringIO()
    code = doctor.main([], nvml_module=fake.FakeNvml(fake.h200s(1)), out=out, sleep=lambda s: None)
    text = out.getvalue()
    assert code == 1
    assert "[FAIL] sglang kernels:" in text and "[FAIL] torch:" in text
    assert "       fix: install sglang-kernel==0.4.10 on the GPU runner" in text


def test_the_kernel_requirement_is_read_from_sglangs_metadata():
    assert (
        kernel_requirement(lambda name: ["torch==2.13.0", "sgl-kernel==0.3.21", "x; extra == 'y'"])
        == "sgl-kernel==0.3.21"
    )
    assert kernel_requirement(lambda name: ["sglang-kernel>=0.4; extra == 'gpu'"]) is None
