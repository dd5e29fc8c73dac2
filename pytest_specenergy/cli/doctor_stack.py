"""``specenergy doctor``'s checks of the serving stack in this Python: ``import sglang``, its kernel
package, torch's CUDA and the NVIDIA driver torch's CUDA needs. Where SGLang is installed, each is
a FAIL when an engine start would fail, naming the fix: a run must not find it after the first
start timed out."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from dataclasses import dataclass
from typing import Any
from typing import Callable

from pytest_specenergy.engines import sglang_args as sa

OK, WARN, FAIL = "OK", "WARN", "FAIL"

#: The oldest NVIDIA Linux driver that runs a program built with each CUDA major release (minor
#: version compatibility: a 12.x build runs on any driver of the 12 family's first, 525.60.13; a
#: 13.x build needs the r580 family). NVIDIA's CUDA compatibility guide, "Minor Version
#: Compatibility", table 2; torch's pip wheels carry their CUDA runtime, so this is all they ask.
MIN_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
#: Distributions that ship SGLang's compiled kernels (import name ``sgl_kernel``): ``sgl-kernel``
#: up to 0.5.1x, ``sglang-kernel`` after; the installed sglang's own requirements name which.
KERNEL_DISTS = ("sgl-kernel", "sglang-kernel")
KERNEL_MODULE = "sgl_kernel"


@dataclass(frozen=True)
class Finding:
    """The outcome of one check: status, what was found, and how to fix a problem."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _version(text: str | None) -> tuple[int, ...] | None:
    numbers = re.findall(r"\d+", text or "")
    return tuple(int(n) for n in numbers) if numbers else None


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"


def check_sglang_import(
    installed: str | None, import_module: Callable[[str], Any] = importlib.import_module
) -> Finding | None:
    """``import sglang`` where its distribution is installed (None where it is not): a broken
    install (a missing dependency, a wheel for another Python) fails every engine start."""
    if installed is None:
        return None
    try:
        import_module("sglang")
    except Exception as exc:  # noqa: BLE001 - any failure of the import is the finding
        return Finding(
            "sglang import",
            FAIL,
            f"sglang {installed} is installed but 'import sglang' fails: {_error(exc)}",
            f"reinstall it where the servers run (pip install --force-reinstall "
            f"'{sa.EXTRA_REQUIREMENT}'; Python 3.11-3.13, glibc >= 2.34)",
        )
    return Finding("sglang import", OK, f"import sglang ({installed}) works")


def kernel_requirement(
    requires: Callable[[str], list[str] | None] = importlib.metadata.requires,
) -> str | None:
    """The kernel distribution the installed sglang requires (``sglang-kernel==0.4.10``), from its
    metadata; None when it names none (or is not installed)."""
    try:
        lines = requires("sglang") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in lines:
        requirement, _, marker = line.partition(";")
        name = re.match(r"\s*([A-Za-z0-9_.-]+)", requirement)
        if name and name.group(1).lower().replace("_", "-") in KERNEL_DISTS:
            if "extra ==" not in marker:
                return requirement.strip()
    return None


def check_kernels(
    installed: str | None,
    requires: Callable[[str], list[str] | None] = importlib.metadata.requires,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> Finding | None:
    """SGLang's kernel package imports (None without SGLang): its wheels are CUDA-only, so it is
    missing on a CPU install and fails to load without a usable driver."""
    if installed is None:
        return None
    wanted = kernel_requirement(requires) or "sglang-kernel"
    try:
        module = import_module(KERNEL_MODULE)
    except Exception as exc:  # noqa: BLE001 - ImportError, OSError (libcuda), anything
        return Finding(
            "sglang kernels",
            FAIL,
            f"'import {KERNEL_MODULE}' ({wanted}, which sglang {installed} requires) fails: "
            f"{_error(exc)}",
            f"install {wanted} on the GPU runner (its wheels are CUDA-only: manylinux x86_64 or "
            "aarch64) with an NVIDIA driver that loads it; see the torch and driver lines",
        )
    where = getattr(module, "__file__", None) or "?"
    return Finding("sglang kernels", OK, f"import {KERNEL_MODULE} works ({wanted}; {where})")


def check_torch(
    sglang_installed: str | None, torch_module: Any = None, driver: str | None = None
) -> list[Finding]:
    """torch, its CUDA build and device count; with SGLang installed a torch that sees no CUDA is
    a FAIL (every engine start would fail), and so is a driver older than torch's CUDA needs."""
    if torch_module is None:
        try:
            import torch as torch_module
        except ImportError:
            status = FAIL if sglang_installed else WARN
            return [
                Finding("torch", status, "not installed", "pip install torch (CUDA build) there")
            ]
    version = torch_module.__version__
    cuda = getattr(torch_module.version, "cuda", None)
    findings = [] if cuda is None else [check_driver(version, cuda, driver)]
    if torch_module.cuda.is_available():
        shown = f"{version}, CUDA {cuda}, {torch_module.cuda.device_count()} device(s)"
        return [Finding("torch", OK, shown), *findings]
    why = " (a CPU build)" if cuda is None else f" (built for CUDA {cuda})"
    status = FAIL if sglang_installed else WARN
    fix = (
        "install a CUDA build of torch (the one sglang pins)"
        if cuda is None
        else "see the driver line; check the container's GPU runtime (nvidia-smi in it)"
    )
    shown = f"{version} sees no CUDA device{why}"
    if sglang_installed:
        shown += f": SGLang {sglang_installed} cannot start an engine here"
    return [Finding("torch", status, shown, fix), *findings]


def check_driver(torch_version: str, cuda: str, driver: str | None) -> Finding:
    """Whether the NVIDIA driver (NVML's) is new enough for the CUDA torch was built for."""
    cuda_version = _version(cuda)
    needed = MIN_DRIVER.get(cuda_version[0]) if cuda_version else None
    have = _version(driver)
    family = needed.split(".")[0] if needed else ""
    if needed is None:
        return Finding(
            "driver",
            WARN,
            f"torch {torch_version} is built for CUDA {cuda}, whose driver requirement this "
            "doctor does not know",
            "check NVIDIA's CUDA compatibility table",
        )
    if have is None:
        return Finding(
            "driver",
            FAIL,
            f"torch {torch_version} is built for CUDA {cuda} (driver >= {needed}), and "
            "no NVIDIA driver version could be read (NVML)",
            "install the NVIDIA driver (and nvidia-ml-py) on the runner",
        )
    if have < _version(needed):
        return Finding(
            "driver",
            FAIL,
            f"driver {driver} is older than {needed}, which torch {torch_version}'s "
            f"CUDA {cuda} needs: torch sees no GPU and every engine start fails",
            f"upgrade the NVIDIA driver to >= {needed} (the r{family} family or newer),"
            f" or use a torch built for an older CUDA (and an SGLang release that pins it)",
        )
    return Finding("driver", OK, f"{driver} runs torch {torch_version}'s CUDA {cuda} (>= {needed})")
