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

from pytest_specenergy.engines.base import ENGINES
from pytest_specenergy.gate.limits import DEFAULT_ALPHA
from pytest_specenergy.gate.limits import DEFAULT_LIMITS
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.measure.removal import DRAFT_REMOVAL_MODES

METER_CHOICES = ("auto", "nvml", "modeled:h100", "modeled:h200")


@dataclass(frozen=True)
class _Option:
    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str
    action: str | None = None
    metavar: str = "EXPR"  # for repeatable options


def _number(text: str, cast: Callable[[str], Any], ok: Callable[[Any], bool], expected: str) -> Any:
    """``text`` as a number that satisfies ``ok``, else a ValueError saying what is expected."""
    try:
        value = cast(text)
    except ValueError:
        raise ValueError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise ValueError(f"expected {expected}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def _positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a number of seconds > 0")


def _milliseconds(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a time between tokens in ms > 0, e.g. 25")


def _seconds_or_zero(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < float("inf"), "a number of seconds >= 0")


def _probability(text: str) -> float:
    return _number(text, float, lambda v: 0.0 < v < 1.0, "a significance level between 0 and 1 (e.g. 0.01)")


def _faults(text: str) -> str:
    from pytest_specenergy.refserver.faults import FAULTS  # torch-free: the names only

    unknown = [f.strip() for f in text.split(",") if f.strip() and f.strip() not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault {', '.join(unknown)}; expected one of {', '.join(FAULTS)}")
    return text


def _run_name(text: str) -> str:
    from pytest_specenergy.gate.storage import InvalidRunName
    from pytest_specenergy.gate.storage import validate_run_name

    try:
        return validate_run_name(text)
    except InvalidRunName as exc:
        raise ValueError(str(exc)) from None


def _non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def _warmup(text: str) -> str | int:
    return "auto" if text == "auto" else _non_negative_int(text)


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _validated(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` that checks a value early but keeps the text for later parsing."""
    def check(text: str) -> str:
        parse(text)
        return text

    return check


def _fail_expr(text: str) -> Any:
    return parse_fail_expr(text)


def _meter(text: str) -> str:
    if text in METER_CHOICES or text.startswith("modeled:"):
        return text
    raise ValueError(f"expected one of {', '.join(METER_CHOICES)} (or modeled:<gpu>), got {text!r}")


# Declared once, used by the plugin (``--specenergy-NAME``) and by the ``specenergy`` command
# (``--NAME``, see :func:`add_cli_options`), as pytest-benchmark shares its option declarations.
STORAGE = _Option("storage", ".specenergy", "folder of the run history (runs keyed by machine)")
COMPARE_FAIL = _Option("compare-fail", "", "a regression limit METRIC[:STAT]:LIMIT, e.g. energy:5% "
                       "or accept_length:0.1 (repeatable; ini: one per line; default: "
                       + ", ".join(DEFAULT_LIMITS) + ")",
                       parse=_fail_expr, action="append")
ALPHA = _Option("alpha", DEFAULT_ALPHA, "total level of the sequential gate: P(REGRESSED) is at most "
                "ALPHA for a true change exactly at the limit, over all looks (0.1% at each interim "
                "look, the rest at the cap), and lower for any change inside it", _probability)
MAX_REPEATS = _Option("max-repeats", 0, "repeat cap of the sequential gate (default 11). Stopping "
                      "rule: the gate looks after --specenergy-repeats repeats and every 2 more "
                      "up to the cap; it stops at the first look where the change's confidence "
                      "interval lies beyond the limit (REGRESSED), inside it (unchanged) or beyond "
                      "it on the better side (IMPROVED); otherwise it re-measures every arm up to "
                      "the next look. Still INCONCLUSIVE at the cap: --specenergy-inconclusive "
                      "decides", _non_negative_int)


def _fdr_level(text: str) -> float:
    return _number(text, float, lambda v: 0.0 < v < 1.0, "a false-discovery rate between 0 and 1 "
                   "(e.g. 0.05)")


FDR = _Option("fdr", "", "control the false-discovery rate across the suite's gated comparisons "
              "at level Q (Benjamini-Hochberg on each comparison's sequential p-value; off by "
              "default): p <= Q/N fails at once, p > Q passes, anything between passes with a "
              "'pending FDR' warning and is decided at session end (exit status 1 when it fails)",
              _fdr_level)

OPTIONS: tuple[_Option, ...] = (
    _Option("engine", "reference", "engine for cases whose model marker names none: "
            "reference (HF transformers server, CPU or GPU) or sglang", _choice(ENGINES)),
    _Option("meter", "auto", "energy meter: nvml (GPU board counter, measured), modeled:<gpu> "
            "(roofline model of the reference server's work trace; presets h100, h200), or auto "
            "(nvml for engines on a GPU, else modeled:h200)", _meter),
    _Option("repeats", 3, "measured repeats per arm; every per-repeat sample is kept", _positive_int),
    _Option("warmup", "auto", "discarded warm-up runs per arm before measuring; auto = 1 with a "
            "measured meter, 0 with a modeled one (it charges the work trace, which a warm-up "
            "does not change)", _warmup),
    _Option("pool", "", "prompts per pool for cases whose generation marker names none "
            "(default: the corpus's first 96, the paper's pool); every batch point and both arms "
            "draw from it, and a pool needs a few times the batch to hold a steady state",
            _positive_int),
    _Option("latency-target", "", "a time-between-tokens target in ms (repeatable): per model and "
            "corpus, the lowest-energy tested configuration (batch x drafter, baseline included) whose "
            "mean TBT meets it is reported; with --specenergy-compare, a target whose best "
            "configuration got more than 5% costlier (or that nothing meets any more) fails the "
            "session, naming both configurations", _milliseconds, action="append", metavar="MS"),
    _Option("draft-removal", "auto", "measure where decode energy goes by draft removal: a "
            "verify-only replay of the recorded drafts (same verify steps, no draft passes) in every "
            "repeat cycle; draft_share = 1 - replay J/token / speculative J/token. auto: under a board "
            "meter (nvml) for reference-engine drafters with draft passes (the modeled meter prices the "
            "split itself); on: every speculative case, any meter (reference engine only); off: never",
            _choice(DRAFT_REMOVAL_MODES)),
    _Option("cooldown", 0.0, "seconds to pause before every measured repeat; repeats alternate "
            "the arms (baseline, speculative, ...) so drift falls on both", _seconds_or_zero),
    _Option("device", "auto", "device for the reference server: auto, cpu or cuda",
            _choice(("auto", "cpu", "cuda"))),
    _Option("startup-timeout", 300.0, "seconds to wait for an engine to answer /health", _positive_float),
    _Option("request-timeout", 300.0, "seconds one request may take before the case fails with the "
            "engine's log tail (a hung engine no longer stalls the session)", _positive_float),
    _Option("log-dir", "", "folder for engine logs (default: .specenergy/logs under the rootdir)"),
    _Option("json", "", "write every sample, case, engine and meter description to this JSON file"),
    _Option("checks", "fail", "what a tripped fail-closed validity check does after the test "
            "body (no verify steps, inconsistent counters, incoherent text...): fail or warn",
            _choice(("fail", "warn"))),
    _Option("fault", "", "comma-separated reference-server fault switches injected into every "
            "reference engine (skip-state-rollback, wrong-accept-count, stale-draft-cache, "
            "accept-off-by-one): they "
            "exist so a suite can prove its checks catch each bug class", _faults),
    STORAGE,
    _Option("save", "", "save this run in the history under NAME (e.g. main)", _run_name),
    _Option("autosave", False, "save this run in the history under the name 'auto'",
            action="store_true"),
    _Option("compare", "", "compare each case with a stored run: last, NAME, NNNN or PATH"),
    COMPARE_FAIL,
    ALPHA,
    MAX_REPEATS,
    FDR,
    _Option("inconclusive", "warn", "what a case still INCONCLUSIVE at the cap does: fail, "
            "warn or xfail", _choice(("fail", "warn", "xfail"))),
    _Option("incomparable", "warn", "what a case whose baseline ran on another machine key, "
            "meter, engine version or CUDA-graph setting does: fail, warn or skip",
            _choice(("fail", "warn", "skip"))),
    _Option("missing-baseline", "warn", "what a case without a baseline does: fail, warn or skip",
            _choice(("fail", "warn", "skip"))),
    _Option("baselines", "specenergy_baselines", "folder of committed golden baselines, one "
            "file per test, under a folder per machine key"),
    _Option("golden", "", "use committed golden baselines: check (missing ones are created and "
            "fail), update (also rewrite mismatching ones, failing them), regen-all (rewrite all, "
            "pass), new-only (write missing ones only)",
            _choice(("check", "update", "regen-all", "new-only"))),
    _Option("xdist", "off", "under pytest-xdist: per-gpu (one GPU per worker, pinned by "
            "CUDA_VISIBLE_DEVICES; on CPU each worker runs its own servers) or off (spec_pair "
            "tests are skipped and the summary says so once)", _choice(("per-gpu", "off"))),
    _Option("sglang-version", "", "build SGLang command lines for this version instead of the "
            "installed one (for --specenergy-dry-run on a machine without SGLang)"),
    _Option("dry-run", False, "collect the cases and print each matched pair's two server "
            "commands and what differs; start nothing", action="store_true"),
)


def add_options(parser: pytest.Parser) -> None:
    """Register every option on the command line and in ini files."""
    group = parser.getgroup("specenergy", "energy regression testing for speculative decoding")
    for opt in OPTIONS:
        dest = "specenergy_" + opt.name.replace("-", "_")
        cli_help = opt.help.replace("%", "%%")  # argparse %-formats help texts
        if opt.action == "append":
            group.addoption(f"--specenergy-{opt.name}", action="append", dest=dest, default=None,
                            metavar=opt.metavar, type=_validated(opt.parse), help=cli_help)
            parser.addini(dest, opt.help, type="linelist", default=[])
        elif opt.action:
            group.addoption(f"--specenergy-{opt.name}", action=opt.action, dest=dest,
                            default=None, help=cli_help)
            parser.addini(dest, opt.help, type="bool", default=opt.default)
        else:
            group.addoption(f"--specenergy-{opt.name}", dest=dest, default=None,
                            metavar=opt.name.upper().replace("-", "_"),
                            help=cli_help + ("" if opt.default in ("", 0) or "default" in opt.help
                                             else f" (default: {opt.default!r})"))
            parser.addini(dest, opt.help, default=None)


def _under(root: Path, path: str) -> Path:
    expanded = Path(os.path.expanduser(str(path)))
    return expanded if expanded.is_absolute() else root / expanded


@dataclass(frozen=True)
class SpecEnergyConfig:
    """The resolved session options."""

    engine: str
    meter: str
    repeats: int
    warmup: int | None  # None: auto
    cooldown: float
    draft_removal: str
    pool: int | None
    latency_targets: tuple[float, ...]
    device: str
    startup_timeout: float
    request_timeout: float
    log_dir: Path
    json: Path | None
    checks: str
    faults: tuple[str, ...]
    storage: Path
    save: str | None
    autosave: bool
    compare: str | None
    compare_fail: tuple[Any, ...]
    alpha: float
    max_repeats: int
    fdr: float | None
    inconclusive: str
    incomparable: str
    missing_baseline: str
    baselines: Path
    golden: str | None
    xdist: str
    sglang_version: str | None
    dry_run: bool
    rootdir: Path

    def case_defaults(self) -> Any:
        """What the markers take from the options (as plain values)."""
        from pytest_specenergy.cases.markers import CaseDefaults

        return CaseDefaults(engine=self.engine, device=self.device, faults=self.faults,
                            sglang_version=self.sglang_version, pool=self.pool)

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
            if opt.action == "append":
                items = raw or []
                try:
                    values[dest] = tuple(opt.parse(str(item)) for item in items)
                except ValueError as exc:
                    raise pytest.UsageError(f"{where}: {exc}") from None
                continue
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
            warmup=None if values["specenergy_warmup"] == "auto" else values["specenergy_warmup"],
            cooldown=values["specenergy_cooldown"],
            draft_removal=values["specenergy_draft_removal"],
            latency_targets=tuple(values["specenergy_latency_target"]),
            pool=values["specenergy_pool"] or None,
            device=values["specenergy_device"],
            startup_timeout=values["specenergy_startup_timeout"],
            request_timeout=values["specenergy_request_timeout"],
            log_dir=Path(os.path.expanduser(str(log_dir))),
            json=Path(json_path) if json_path else None,
            checks=values["specenergy_checks"],
            faults=tuple(f.strip() for f in str(values["specenergy_fault"]).split(",") if f.strip()),
            storage=_under(rootdir, values["specenergy_storage"]),
            save=values["specenergy_save"] or None,
            autosave=values["specenergy_autosave"],
            compare=values["specenergy_compare"] or None,
            compare_fail=values["specenergy_compare_fail"],
            alpha=values["specenergy_alpha"],
            max_repeats=_cap(values["specenergy_max_repeats"], values["specenergy_repeats"]),
            fdr=values["specenergy_fdr"] or None,
            inconclusive=values["specenergy_inconclusive"],
            incomparable=values["specenergy_incomparable"],
            missing_baseline=values["specenergy_missing_baseline"],
            baselines=_under(rootdir, values["specenergy_baselines"]),
            golden=values["specenergy_golden"] or None,
            xdist=values["specenergy_xdist"],
            sglang_version=values["specenergy_sglang_version"] or None,
            dry_run=values["specenergy_dry_run"],
            rootdir=rootdir,
        )


#: The sequential plan's default cap (``gate.compare.DEFAULT_CAP``; not imported from there
#: because that module pulls numpy into every pytest start).
DEFAULT_CAP = 11


def _cap(max_repeats: int, repeats: int) -> int:
    """The sequential plan's repeat cap (default 11), checked: the plan must be buildable."""
    cap = max_repeats or max(DEFAULT_CAP, repeats)
    if cap < repeats:
        raise pytest.UsageError(f"--specenergy-max-repeats: the cap ({cap}) must be at least "
                                f"--specenergy-repeats ({repeats})")
    if not max_repeats:
        return cap  # the default plan is valid
    from pytest_specenergy.gate.compare import gate_plan

    try:
        gate_plan(DEFAULT_ALPHA, repeats, cap)
    except ValueError as exc:
        raise pytest.UsageError(f"--specenergy-max-repeats={cap}: {exc}") from None
    return cap


def add_cli_options(parser: Any, *, storage: bool = True, gate: bool = False) -> None:
    """The shared options on an argparse parser of the ``specenergy`` command: ``--storage``
    and, with ``gate``, ``--fail`` (the plugin's ``--specenergy-compare-fail``), ``--alpha`` and
    ``--max-repeats`` (the sequential plan's cap);
    same defaults and help texts as the plugin's."""
    if storage:
        parser.add_argument("--storage", type=Path, default=Path(STORAGE.default),
                            help=STORAGE.help + f" (default {STORAGE.default})")
    if gate:
        parser.add_argument("--fail", action="append", metavar="EXPR", type=_validated(COMPARE_FAIL.parse),
                            help=COMPARE_FAIL.help.replace("%", "%%"))
        parser.add_argument("--alpha", type=ALPHA.parse, default=ALPHA.default,
                            help=(ALPHA.help + f" (default {ALPHA.default})").replace("%", "%%"))
        parser.add_argument("--max-repeats", type=_non_negative_int, default=0,
                            help=MAX_REPEATS.help.replace("--specenergy-repeats repeats",
                                                          "3 repeats").replace("%", "%%"))

