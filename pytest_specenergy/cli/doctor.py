"""``specenergy doctor``: can this machine run the GPU path (SGLang + NVML)? One line per check, OK
/ WARN / FAIL, each failure with its fix (which fail: ``docs/report.md``)."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any
from typing import Callable
from typing import Mapping
from typing import TextIO

from pytest_specenergy.cli.doctor_stack import FAIL
from pytest_specenergy.cli.doctor_stack import OK
from pytest_specenergy.cli.doctor_stack import WARN
from pytest_specenergy.cli.doctor_stack import Finding
from pytest_specenergy.cli.doctor_stack import check_kernels
from pytest_specenergy.cli.doctor_stack import check_sglang_import
from pytest_specenergy.cli.doctor_stack import check_torch
from pytest_specenergy.engines import sglang_args as sa
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.devices import Nvml
from pytest_specenergy.meters.nvml import resolve_devices

#: Where the doctor's injectable parts come from (tests pass fakes of what cannot exist here).
_UNSET: Any = object()


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_nvml(nvml_module: Any = None) -> tuple[Finding, Nvml | None]:
    """NVML loads and starts; returns the open library (or None) for the other checks."""
    try:
        nvml = Nvml(nvml_module)
    except MeterError as exc:
        return Finding(
            "nvml",
            FAIL,
            str(exc),
            "run on a machine with an NVIDIA GPU and driver, with nvidia-ml-py "
            "installed (pip install 'pytest-specenergy[nvml]')",
        ), None
    binding = (
        "injected module"
        if nvml_module is not None
        else f"nvidia-ml-py {_dist_version('nvidia-ml-py') or '?'}"
    )
    return Finding("nvml", OK, f"{binding}, driver {nvml.driver() or '?'}"), nvml


def check_gpus(nvml: Nvml) -> list[Finding]:
    """One line per GPU: name, UUID, power limit, clocks, persistence, MIG."""
    try:
        gpus = nvml.gpus()
    except MeterError as exc:
        return [Finding("gpus", FAIL, str(exc))]
    if not gpus:
        return [
            Finding(
                "gpus", FAIL, "NVML sees no GPU", "check nvidia-smi and the container's GPU runtime"
            )
        ]
    checks = []
    driver = nvml.driver()
    for index, gpu in enumerate(gpus):
        facts = gpu.facts(driver)
        persistence = {True: "on", False: "off", None: "?"}[facts.persistence_mode]
        detail = (
            f"{facts.name} {facts.uuid}, power limit {_num(facts.power_limit_w, 'W')} (default "
            f"{_num(facts.default_power_limit_w, 'W')}), SM {_num(facts.sm_clock_mhz, 'MHz')} "
            f"(max {_num(facts.max_sm_clock_mhz, 'MHz')}), memory "
            f"{_num(facts.mem_clock_mhz, 'MHz')}, {_num(facts.temperature_c, 'C')}, persistence "
            f"{persistence}"
        )
        status, fix = OK, ""
        if facts.persistence_mode is False:
            status, fix = (
                WARN,
                (
                    "enable persistence (nvidia-persistenced, or nvidia-smi -pm 1) so the driver "
                    "keeps state between engine starts"
                ),
            )
        if facts.mig_enabled:
            status, fix = (
                WARN,
                "MIG is on: NVML measures the whole GPU, not a slice; disable MIG for energy runs",
            )
        if (
            facts.power_limit_w
            and facts.default_power_limit_w
            and facts.power_limit_w < facts.default_power_limit_w
        ):
            status, fix = WARN, "the power limit is below the default; results are not comparable"
        checks.append(Finding(f"gpu {index}", status, detail, fix))
    return checks


def _num(value: Any, unit: str) -> str:
    return "?" if value is None else f"{value:g} {unit}"


def check_energy_counter(
    nvml: Nvml, interval_s: float = 0.5, sleep: Callable[[float], None] = time.sleep
) -> list[Finding]:
    """Read every GPU's total-energy counter twice, ``interval_s`` apart."""
    gpus = nvml.gpus()
    first: list[int | MeterError] = []
    for gpu in gpus:
        try:
            first.append(gpu.energy_mj())
        except MeterError as exc:
            first.append(exc)
    sleep(interval_s)
    checks = []
    for index, (gpu, before) in enumerate(zip(gpus, first)):
        name = f"energy counter {index}"
        fix = "use a Volta or newer data-center GPU and a driver that supports it"
        if isinstance(before, MeterError):
            checks.append(Finding(name, FAIL, f"unreadable: {before}", fix))
            continue
        try:
            after = gpu.energy_mj()
        except MeterError as exc:
            checks.append(Finding(name, FAIL, f"second read failed: {exc}"))
            continue
        delta = after - before
        if delta < 0:
            checks.append(
                Finding(
                    name,
                    FAIL,
                    f"went backwards ({before} -> {after} mJ)",
                    "the driver reloaded or the GPU reset; check dmesg",
                )
            )
        elif delta == 0:
            checks.append(
                Finding(
                    name,
                    WARN,
                    f"did not advance in {interval_s:g} s (it ticks about every 100 ms)",
                    "if it stays flat the counter is stuck",
                )
            )
        else:
            checks.append(
                Finding(
                    name,
                    OK,
                    f"{after} mJ, +{delta} mJ in {interval_s:g} s "
                    f"(~{delta / 1000.0 / interval_s:.0f} W)",
                )
            )
    return checks


def check_visible_devices(nvml: Nvml, env: Mapping[str, str]) -> Finding:
    """Which GPUs a server started from this environment would be measured on."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    try:
        devices = resolve_devices(nvml, visible, env.get("CUDA_DEVICE_ORDER"))
    except MeterError as exc:
        return Finding("CUDA_VISIBLE_DEVICES", FAIL, str(exc))
    shown = "unset (all GPUs)" if visible is None else repr(visible)
    measured = ", ".join(f"{d.index}:{d.uuid}" for d in devices)
    return Finding("CUDA_VISIBLE_DEVICES", OK, f"{shown} -> measures {measured}")


def check_sglang(version_text: str | None) -> list[Finding]:
    """SGLang's version and the known problems of that release."""
    if version_text is None:
        return [
            Finding(
                "sglang",
                WARN,
                "not installed in this Python",
                f"install {sa.EXTRA_REQUIREMENT} where the servers run (pip install "
                "'pytest-specenergy[sglang]': Python 3.11-3.13, glibc >= 2.34), or point the "
                "engine option python= at an interpreter that has it",
            )
        ]
    try:
        version = sa.parse_version(version_text)
    except Exception as exc:  # noqa: BLE001 - EngineConfigError
        return [Finding("sglang", FAIL, str(exc))]
    shown = sa.format_version(version)
    if version < sa.MIN_VERSION:
        return [
            Finding(
                "sglang",
                FAIL,
                f"{shown} is older than {sa.format_version(sa.MIN_VERSION)}",
                "upgrade sglang",
            )
        ]
    facts = sa.facts_for(version)
    checks = [
        Finding("sglang", OK, f"{version_text}; algorithms {', '.join(sorted(facts.algorithms))}")
    ]
    if version > sa.NEWEST_READ:
        checks.append(
            Finding(
                "sglang",
                WARN,
                f"newer than {sa.format_version(sa.NEWEST_READ)}, the newest release "
                "this plugin was checked against",
                "check the dry-run command lines (specenergy dry runs) before trusting it",
            )
        )
    if not facts.ngram_commits_hybrid_state:
        checks.append(
            Finding(
                "sglang ngram",
                WARN,
                f"{shown} corrupts hybrid (Mamba/GDN) models under NGRAM: no "
                "state commit after verify (fixed by PR #26351 in 0.5.14); the plugin refuses that "
                "combination",
                "upgrade to sglang>=0.5.14",
            )
        )
    if not facts.shutdown_waits_for_gpu:
        checks.append(
            Finding(
                "sglang shutdown",
                WARN,
                f"{shown} does not wait for GPU memory release on shutdown "
                "(PR #23213, in 0.5.12), so the next engine can run out of memory at start-up",
                "upgrade to sglang>=0.5.12",
            )
        )
    flag = sa.flag_for(facts.cuda_graph_max_bs_field)
    if flag.endswith("bs"):
        note = "--cuda-graph-max-bs (renamed --cuda-graph-max-bs-decode in 0.5.14)"
    elif facts.legacy_cuda_graph_alias:
        note = f"{flag}; --cuda-graph-max-bs is a deprecated alias"
    else:
        note = f"{flag}; --cuda-graph-max-bs is an argparse error since 0.5.23"
    checks.append(
        Finding(
            "sglang cuda graphs",
            OK,
            f"batch cap flag {note}; the plugin translates either spelling in engine options",
        )
    )
    return checks


def check_transformers() -> Finding:
    """transformers, which the reference engine needs."""
    version = _dist_version("transformers")
    if version is None:
        return Finding(
            "transformers", WARN, "not installed", "pip install 'pytest-specenergy[reference]'"
        )
    return Finding("transformers", OK, version)


def run_checks(
    nvml_module: Any = None,
    sglang_version: str | None = None,
    env: Mapping[str, str] | None = None,
    interval_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    *,
    installed: Any = _UNSET,
    torch_module: Any = None,
    import_module: Callable[[str], Any] = importlib.import_module,
    requires: Callable[[str], Any] = importlib.metadata.requires,
) -> list[Finding]:
    """Every check, in the order printed. ``installed``: the SGLang version installed here (default:
    its distribution's); ``sglang_version`` only changes which release's facts are shown."""
    env = os.environ if env is None else env
    installed = sa.installed_version() if installed is _UNSET else installed
    nvml_check, nvml = check_nvml(nvml_module)
    checks = [nvml_check]
    driver = None
    if nvml is None:
        checks += [
            Finding(name, FAIL, "not checked: NVML unavailable")
            for name in ("gpus", "energy counter")
        ]
    else:
        try:
            driver = nvml.driver()
            checks += check_gpus(nvml)
            if not any(c.status == FAIL for c in checks):
                checks += check_energy_counter(nvml, interval_s, sleep)
                checks.append(check_visible_devices(nvml, env))
        finally:
            nvml.close()
    stack = [
        check_sglang_import(installed, import_module),
        check_kernels(installed, requires, import_module),
    ]
    return [
        *checks,
        *check_sglang(sglang_version or installed),
        *(finding for finding in stack if finding is not None),
        *check_torch(installed, torch_module, driver),
        check_transformers(),
    ]


def main(
    argv: list[str] | None = None,
    *,
    nvml_module: Any = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run the checks and print them; 0 when a GPU run can work here, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="specenergy doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-version", help="check as if this SGLang version were installed")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="seconds between the two energy-counter reads (default 0.5)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    checks = run_checks(nvml_module, args.sglang_version, interval_s=args.interval, sleep=sleep)
    failed = [c for c in checks if c.status == FAIL]
    if args.json:
        json.dump({"ok": not failed, "checks": [asdict(c) for c in checks]}, out, indent=2)
        out.write("\n")
        return 1 if failed else 0
    out.write("specenergy doctor: can this machine run the GPU path (SGLang + NVML)?\n")
    for check in checks:  # ``[ OK ] name: detail``, and a ``fix:`` line for a problem
        out.write(f"[{check.status:^4}] {check.name}: {check.detail}\n")
        if check.fix and check.status != OK:
            out.write(f"       fix: {check.fix}\n")
    warned = sum(c.status == WARN for c in checks)
    if failed:
        out.write(
            f"doctor: {len(failed)} FAIL, {warned} WARN - GPU runs cannot work here (exit 1). CPU "
            "runs (reference engine, modeled meter) need none of this.\n"
        )
        return 1
    out.write(f"doctor: GPU runs can work here ({warned} WARN).\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
