"""Options: ``--specenergy-*`` on the command line, ``specenergy_*`` in ini files.

Precedence is marker > command line > ini > default. :class:`SpecEnergyConfig` is built
once per session from the pytest config and is frozen, so nothing downstream reads pytest
options directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

ENGINES = ("reference", "sglang")
METER_CHOICES = ("auto", "nvml", "modeled:h100", "modeled:h200")


@dataclass(frozen=True)
class _Option:
    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str
    action: str | None = None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected an integer >= 0, got {text!r}")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _meter(text: str) -> str:
    if text in METER_CHOICES or text.startswith("modeled:"):
        return text
    raise ValueError(f"expected one of {', '.join(METER_CHOICES)} (or modeled:<gpu>), got {text!r}")


OPTIONS: tuple[_Option, ...] = (
    _Option("engine", "reference", "engine for cases whose model marker names none: "
            "reference (HF transformers server, CPU or GPU) or sglang", _choice(ENGINES)),
    _Option("meter", "auto", "energy meter: nvml (GPU board counter, measured), modeled:<gpu> "
            "(roofline model of the reference server's work trace; presets h100, h200), or auto "
            "(nvml for engines on a GPU, else modeled:h200)", _meter),
    _Option("repeats", 3, "measured repeats per arm; every per-repeat sample is kept", _positive_int),
    _Option("warmup", 1, "discarded warm-up runs per arm before measuring", _non_negative_int),
    _Option("device", "auto", "device for the reference server: auto, cpu or cuda",
            _choice(("auto", "cpu", "cuda"))),
    _Option("startup-timeout", 300.0, "seconds to wait for an engine to answer /health", float),
    _Option("log-dir", "", "folder for engine logs (default: .specenergy/logs under the rootdir)"),
    _Option("json", "", "write every sample, case, engine and meter description to this JSON file"),
    _Option("checks", "fail", "what a tripped fail-closed validity check does after the test "
            "body (no verify steps, inconsistent counters, incoherent text...): fail or warn",
            _choice(("fail", "warn"))),
    _Option("fault", "", "comma-separated reference-server fault switches injected into every "
            "reference engine (skip-state-rollback, wrong-accept-count, stale-draft-cache): they "
            "exist so a suite can prove its checks catch each bug class"),
    _Option("dry-run", False, "collect the cases and print each matched pair's two server "
            "commands and what differs; start nothing", action="store_true"),
)


def add_options(parser: pytest.Parser) -> None:
    """Register every option on the command line and in ini files."""
    group = parser.getgroup("specenergy", "energy regression testing for speculative decoding")
    for opt in OPTIONS:
        dest = "specenergy_" + opt.name.replace("-", "_")
        if opt.action:
            group.addoption(f"--specenergy-{opt.name}", action=opt.action, dest=dest,
                            default=None, help=opt.help)
            parser.addini(dest, opt.help, type="bool", default=opt.default)
        else:
            group.addoption(f"--specenergy-{opt.name}", dest=dest, default=None,
                            metavar=opt.name.upper().replace("-", "_"),
                            help=f"{opt.help} (default: {opt.default!r})")
            parser.addini(dest, opt.help, default=None)


@dataclass(frozen=True)
class SpecEnergyConfig:
    """The resolved session options."""

    engine: str
    meter: str
    repeats: int
    warmup: int
    device: str
    startup_timeout: float
    log_dir: Path
    json: Path | None
    checks: str
    faults: tuple[str, ...]
    dry_run: bool
    rootdir: Path

    @classmethod
    def from_pytest_config(cls, config: pytest.Config) -> SpecEnergyConfig:
        """Resolve every option (command line > ini > default), with a clear usage error."""
        values: dict[str, Any] = {}
        for opt in OPTIONS:
            dest = "specenergy_" + opt.name.replace("-", "_")
            raw = config.getoption(dest)
            where = f"--specenergy-{opt.name}"
            if raw is None:
                raw = config.getini(dest)
                where = f"ini option {dest}"
            if raw is None or raw == "":
                values[dest] = opt.default
                continue
            if opt.action:
                values[dest] = bool(raw)
                continue
            try:
                values[dest] = opt.parse(str(raw))
            except ValueError as exc:
                raise pytest.UsageError(f"{where}: {exc}") from None
        rootdir = Path(config.rootpath)
        log_dir = values["specenergy_log_dir"] or rootdir / ".specenergy" / "logs"
        json_path = values["specenergy_json"]
        return cls(
            engine=values["specenergy_engine"],
            meter=values["specenergy_meter"],
            repeats=values["specenergy_repeats"],
            warmup=values["specenergy_warmup"],
            device=values["specenergy_device"],
            startup_timeout=values["specenergy_startup_timeout"],
            log_dir=Path(os.path.expanduser(str(log_dir))),
            json=Path(json_path) if json_path else None,
            checks=values["specenergy_checks"],
            faults=tuple(f.strip() for f in str(values["specenergy_fault"]).split(",") if f.strip()),
            dry_run=values["specenergy_dry_run"],
            rootdir=rootdir,
        )
