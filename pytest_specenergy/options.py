"""Options: ``--specenergy-*`` on the command line, ``specenergy_*`` in ini files; marker > command
line > ini > default. :class:`SpecEnergyConfig` is built once per session and frozen: nothing
downstream reads pytest options."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

from pytest_specenergy.cases.case import MAX_POOL
from pytest_specenergy.engines.base import ENGINES
from pytest_specenergy.gate.settings import DEFAULT_ALPHA
from pytest_specenergy.gate.settings import DEFAULT_CAP
from pytest_specenergy.gate.settings import DEFAULT_GOLDEN_FOLDER
from pytest_specenergy.gate.settings import DEFAULT_LIMITS
from pytest_specenergy.gate.settings import DEFAULT_STORAGE
from pytest_specenergy.gate.settings import UNMEASURED_POLICIES
from pytest_specenergy.gate.settings import StorageError
from pytest_specenergy.gate.settings import storage_path
from pytest_specenergy.measure.removal import DRAFT_REMOVAL_MODES
from pytest_specenergy.refserver.faults import FAULTS  # torch-free: the names only
from pytest_specenergy.refserver.faults import TARGET_FAULTS

# The gate's defaults come from gate.settings, without the gate: gate.limits (the fail-expression
# parser) and gate.storage load when an option value needs them (issue 24, item 8).

# MAX_POOL (the largest prompt pool an option or marker may ask for) is the cases' own bound.


@dataclass(frozen=True)
class _Option:
    """One option (``--specenergy-NAME``, ini ``specenergy_NAME``); ``resolve`` makes the parsed
    value the config's."""

    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str
    action: str | None = None
    metavar: str = "EXPR"  # for repeatable options
    resolve: Callable[[Any, Path], Any] | None = None

    @property
    def dest(self) -> str:
        return "specenergy_" + self.name.replace("-", "_")


def _opt(
    name: str, default: Any, help: str, parse: Callable[[str], Any] = str, **kwargs: Any
) -> Any:
    """A :class:`SpecEnergyConfig` field declared by its option."""
    return field(metadata={"option": _Option(name, default, help, parse, **kwargs)})


def _or_none(value: Any, rootdir: Path) -> Any:
    return value or None


def _number(
    name: str, cast: Callable[[str], Any], ok: Callable[[Any], bool], expected: str
) -> Callable[[str], Any]:
    """A parser of a number that satisfies ``ok``; anything else is a ValueError saying what is
    expected. It is called ``name``: argparse names a ``type=`` in its error (``invalid _probability
    value``)."""

    def parse(text: str) -> Any:
        with contextlib.suppress(ValueError):
            value = cast(text)
            if ok(value):
                return value
        raise ValueError(f"expected {expected}, got {text!r}")

    parse.__name__ = name
    return parse


_positive_int = _number("_positive_int", int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _number("_non_negative_int", int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number(
    "_positive_float", float, lambda v: 0 < v < math.inf, "a number of seconds > 0"
)
_milliseconds = _number(
    "_milliseconds", float, lambda v: 0 < v < math.inf, "a time between tokens in ms > 0, e.g. 25"
)
_seconds_or_zero = _number(
    "_seconds_or_zero", float, lambda v: 0 <= v < math.inf, "a number of seconds >= 0"
)
_probability = _number(
    "_probability", float, lambda v: 0 < v < 1, "a significance level between 0 and 1 (e.g. 0.01)"
)
_fdr_level = _number(
    "_fdr_level", float, lambda v: 0 < v < 1, "a false-discovery rate between 0 and 1 (e.g. 0.05)"
)
_minutes = _number(
    "_minutes", float, lambda v: 0 < v < math.inf, "a number of GPU minutes > 0, e.g. 90"
)
_pool = _number("_pool", int, lambda v: 1 <= v <= MAX_POOL, f"a prompt count from 1 to {MAX_POOL}")


def _size(text: str) -> tuple[int, int]:
    """``PROMPTSxTOKENS`` (``16x64``): a prompt pool and ``max_new_tokens`` for every case."""
    prompts, sep, tokens = text.lower().partition("x")
    with contextlib.suppress(ValueError):
        size = (int(prompts), int(tokens))
        if sep and 1 <= size[0] <= MAX_POOL and size[1] >= 1:
            return size
    raise ValueError(
        f"expected PROMPTSxTOKENS, a pool of 1 to {MAX_POOL} prompts and max_new_tokens >= 1 "
        f"(e.g. 16x64), got {text!r}"
    )


def _faults(text: str) -> str:
    unknown = [f.strip() for f in text.split(",") if f.strip() and f.strip() not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault {', '.join(unknown)}; expected one of {', '.join(FAULTS)}")
    return text


_faults.choices = tuple(FAULTS)  # type: ignore[attr-defined]


def _run_name(text: str) -> str:
    # its InvalidRunName is a ValueError
    from pytest_specenergy.gate.storage import validate_run_name

    return validate_run_name(text)


def _warmup(text: str) -> str | int:
    return "auto" if text == "auto" else _non_negative_int(text)


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    parse.choices = choices  # type: ignore[attr-defined]  # what help_drift checks the help against
    return parse


def _validated(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` that checks a value early but keeps the text for later parsing."""

    def check(text: str) -> str:
        parse(text)
        return text

    return check


def _fail_expr(text: str) -> Any:
    from pytest_specenergy.gate.limits import parse_fail_expr

    return parse_fail_expr(text)


def _meter(text: str) -> str:
    # The meters package owns its kinds' grammar (modeled:<gpu>[:<shape>]); torch- and numpy-free.
    from pytest_specenergy.meters import check_meter_kind

    return check_meter_kind(text)


def storage_folder(text: str) -> Path:
    """``--storage`` of the ``specenergy`` command: a local folder (PATH or file://PATH); a URL is
    refused as ``--specenergy-storage`` refuses it (an argparse ``type=``)."""
    import argparse

    try:
        return storage_path(text)
    except StorageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _storage(text: str) -> str:
    try:
        storage_path(text)  # a URL: only local folders are supported
    except StorageError as exc:
        raise ValueError(str(exc)) from None
    return text


# Declared once, used by the plugin (``--specenergy-NAME``) and by the ``specenergy`` command
# (``--NAME``, see :func:`add_cli_options`), as pytest-benchmark shares its option declarations.
STORAGE = _Option(
    "storage",
    DEFAULT_STORAGE,
    "folder of the run history (runs keyed by machine; a local PATH or file://PATH)",
    _storage,
    resolve=lambda value, root: _under(root, str(storage_path(value))),
)
COMPARE_FAIL = _Option(
    "compare-fail",
    "",
    "a regression limit METRIC[:STAT]:LIMIT, e.g. energy:5% "
    "or accept_length:0.1 (repeatable; ini: one per line); each replaces only its own "
    "metric's default, the other defaults still apply (defaults: "
    + ", ".join(DEFAULT_LIMITS)
    + ")",
    parse=_fail_expr,
    action="append",
    resolve=lambda value, root: tuple(value),
)
ALPHA = _Option(
    "alpha",
    DEFAULT_ALPHA,
    "total level of the sequential gate: P(REGRESSED) is at most "
    "ALPHA for a true change exactly at the limit, over all looks (0.1% at each interim "
    "look, the rest at the cap), and lower for any change inside it",
    _probability,
)
MAX_REPEATS = _Option(
    "max-repeats",
    0,
    "repeat cap of the sequential gate (default 11). Stopping rule: the gate looks after "
    "--specenergy-repeats repeats and every 2 more up to the cap; it stops at the first look "
    "where the change's confidence interval lies beyond the limit (REGRESSED), inside it "
    "(unchanged) or beyond it on the better side (IMPROVED); otherwise it re-measures every arm "
    "up to the next look. Still INCONCLUSIVE at the cap: --specenergy-inconclusive decides",
    _non_negative_int,
)
FDR = _Option(
    "fdr",
    "",
    "control the false-discovery rate across the suite's gated comparisons at level Q "
    "(Benjamini-Hochberg on each comparison's sequential p-value; off by default): p <= Q/N "
    "fails at once, p > Q passes, anything between passes with a 'pending FDR' warning and is "
    "decided at session end (exit status 1 when it fails)",
    _fdr_level,
    resolve=_or_none,
)

INCONCLUSIVE = _Option(
    "inconclusive",
    "warn",
    "what a case still INCONCLUSIVE at the cap does: fail, warn or xfail",
    _choice(("fail", "warn", "xfail")),
)
INCOMPARABLE = _Option(
    "incomparable",
    "fail",
    "what a case whose baseline cannot be compared with it "
    "(another machine key, meter, engine version or CUDA-graph setting, or figures "
    "missing) does: fail, warn or skip; a baseline whose own fail-closed checks failed when it "
    "was measured always fails",
    _choice(("fail", "warn", "skip")),
)
MISSING_BASELINE = _Option(
    "missing-baseline",
    "fail",
    "what a case without a baseline does (the compare "
    "run does not exist, or holds no result for the test): fail, warn (e.g. for a "
    "test added in this change) or skip; under fail a compare run that does not exist stops the "
    "session at start, before anything is measured",
    _choice(("fail", "warn", "skip")),
)
UNMEASURED = _Option(
    "unmeasured",
    "auto",
    "what the baseline's cases this run did not measure do (a -k, a skip, a deleted, renamed or "
    "re-parametrized test; every one is listed either way): fail (exit status 1), warn, or auto "
    "(fail under CI, where the CI variable is set, else warn)",
    _choice(UNMEASURED_POLICIES),
)
UNMEASURED_OK = _Option(
    "unmeasured-ok",
    "",
    "a glob of baseline case ids (pytest node ids, e.g. 'tests/energy/test_old.py::*') this run "
    "may leave unmeasured without failing (repeatable; ini: one per line); they are listed as "
    "declared",
    action="append",
    metavar="GLOB",
    resolve=lambda value, root: tuple(value),
)


def _under(root: Path, path: str) -> Path:
    expanded = Path(os.path.expanduser(str(path)))
    return expanded if expanded.is_absolute() else root / expanded


def _nvml_unavailable() -> bool:
    """True where NVML cannot start (no NVIDIA driver or library); why it looks first:
    docs/report.md."""
    if sys.platform.startswith("win") or "pynvml" in sys.modules:
        return False
    if sys.platform.startswith("linux") and not os.path.exists("/proc/driver/nvidia"):
        return True  # no NVIDIA kernel driver loaded (containers see the host's): no GPU for NVML
    import ctypes  # deferred: needed only for this probe

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return True
    return False


@dataclass(frozen=True)
class SpecEnergyConfig:
    """The resolved session options, frozen; each field is declared by its option: the one table of
    options."""

    engine: str = _opt(
        "engine",
        "reference",
        "engine for cases whose model marker names none: "
        "reference (HF transformers server, CPU or GPU) or sglang",
        _choice(ENGINES),
    )
    meter: str = _opt(
        "meter",
        "auto",
        "energy meter: nvml (GPU board counter, measured), modeled:<gpu> "
        "(roofline model of the reference server's work trace; presets h100, h200; "
        "modeled:<gpu>:<shape> prices every target step as that shape, e.g. modeled:h200:qwen3-4b), "
        "or auto (nvml for engines on a GPU, else modeled:h200)",
        _meter,
    )
    repeats: int = _opt(
        "repeats", 3, "measured repeats per arm; every per-repeat sample is kept", _positive_int
    )
    save_repeats: int = _opt(
        "save-repeats",
        15,
        "measured repeats per arm of a run saved to the history "
        "(--specenergy-save, --specenergy-autosave) unless --specenergy-repeats is given: a "
        "stored run's repeats bound the power of every comparison made against it "
        "(15: 84% at a true +10% under energy:5% at 3% noise)",
        _positive_int,
    )
    warmup: int | None = _opt(
        "warmup",
        "auto",
        "discarded warm-up runs per arm before measuring; auto = 1 "
        "with a measured meter, 0 with a modeled one (it charges the work trace, which a "
        "warm-up does not change)",
        _warmup,
        resolve=lambda value, root: None if value == "auto" else value,
    )
    pool: int | None = _opt(
        "pool",
        "",
        "prompts per pool for cases whose generation marker names none "
        "(default: the corpus's first 96, the paper's pool, under a board meter; with modeled "
        "energy 3 per request in flight, at least 12, sized for a CPU minute; at most "
        f"{MAX_POOL}); every batch point and both arms draw from it, a pool larger than its "
        "corpus repeats prompts, and a pool needs a few times the batch to hold a steady state",
        _pool,
        resolve=_or_none,
    )
    size: tuple[int, int] | None = _opt(
        "size",
        "",
        "PROMPTSxTOKENS: the prompt pool and max_new_tokens of every case, over its generation "
        "marker (specenergy faults uses it to find the size at which a test catches a fault)",
        _size,
        resolve=_or_none,
    )
    latency_targets: tuple[float, ...] = _opt(
        "latency-target",
        "",
        "a time-between-tokens target in ms (repeatable): per model and corpus, the "
        "lowest-energy tested configuration (batch x drafter, baseline included) whose mean TBT "
        "meets it is reported; with --specenergy-compare, a target whose best configuration got "
        "costlier beyond the gate's energy limit (the sequential rule on its J/token, "
        "energy_per_token:5%), or that nothing meets any more, fails the session, naming both "
        "configurations",
        _milliseconds,
        action="append",
        metavar="MS",
        resolve=lambda value, root: tuple(value),
    )
    draft_removal: str = _opt(
        "draft-removal",
        "auto",
        "measure where decode energy goes by draft removal: a verify-only replay of the recorded "
        "drafts (same verify steps, no draft passes) in every repeat cycle; draft_share = 1 - "
        "replay J/token / speculative J/token. auto: under a board meter (nvml) for "
        "reference-engine drafters with draft passes (the modeled meter prices the split "
        "itself); on: every speculative case, any meter (reference engine only); off: never",
        _choice(DRAFT_REMOVAL_MODES),
    )
    cooldown: float = _opt(
        "cooldown",
        0.0,
        "seconds to pause before every measured repeat; repeats alternate the "
        "arms (baseline, speculative, ...) so drift falls on both",
        _seconds_or_zero,
    )
    device: str = _opt(
        "device",
        "auto",
        "device for the reference server: auto, cpu or cuda",
        _choice(("auto", "cpu", "cuda")),
    )
    startup_timeout: float = _opt(
        "startup-timeout", 300.0, "seconds to wait for an engine to answer /health", _positive_float
    )
    request_timeout: float = _opt(
        "request-timeout",
        300.0,
        "seconds one request may take before the case fails "
        "with the engine's log tail (a hung engine no longer stalls the session)",
        _positive_float,
    )
    log_dir: Path = _opt(
        "log-dir",
        "",
        "folder for engine logs (default: .specenergy/logs under the rootdir)",
        resolve=lambda value, root: (
            Path(os.path.expanduser(str(value))) if value else root / DEFAULT_STORAGE / "logs"
        ),
    )
    json: Path | None = _opt(
        "json",
        "",
        "write every sample, case, engine and meter description to this JSON file",
        resolve=lambda value, root: Path(value) if value else None,
    )
    checks: str = _opt(
        "checks",
        "fail",
        "what a tripped fail-closed validity check does after the test body (no "
        "verify steps, inconsistent counters, incoherent text...): fail or warn",
        _choice(("fail", "warn")),
    )
    faults: tuple[str, ...] = _opt(
        "fault",
        "",
        "comma-separated reference-server fault switches injected into every reference engine ("
        + ", ".join(FAULTS)
        + f"; only {', '.join(sorted(TARGET_FAULTS))} into the baseline twins, the rest act in "
        "speculation alone): "
        "they exist so a suite can prove its checks catch each bug class",
        _faults,
        resolve=lambda value, root: tuple(f.strip() for f in str(value).split(",") if f.strip()),
    )
    storage: Path = field(metadata={"option": STORAGE})
    save: str | None = _opt(
        "save",
        "",
        "save this run in the history under NAME (e.g. main)",
        _run_name,
        resolve=_or_none,
    )
    autosave: bool = _opt(
        "autosave", False, "save this run in the history under the name 'auto'", action="store_true"
    )
    compare: str | None = _opt(
        "compare",
        "",
        "compare each case with a stored run: last, NAME, NNNN or PATH",
        resolve=_or_none,
    )
    compare_fail: tuple[Any, ...] = field(metadata={"option": COMPARE_FAIL})
    alpha: float = field(metadata={"option": ALPHA})
    max_repeats: int = field(metadata={"option": MAX_REPEATS})
    fdr: float | None = field(metadata={"option": FDR})
    inconclusive: str = field(metadata={"option": INCONCLUSIVE})
    incomparable: str = field(metadata={"option": INCOMPARABLE})
    missing_baseline: str = field(metadata={"option": MISSING_BASELINE})
    unmeasured: str = field(metadata={"option": UNMEASURED})
    unmeasured_ok: tuple[str, ...] = field(metadata={"option": UNMEASURED_OK})
    baselines: Path = _opt(
        "baselines",
        DEFAULT_GOLDEN_FOLDER,
        "folder of committed golden baselines, one file per test, under a folder per machine key",
        resolve=lambda value, root: _under(root, value),
    )
    golden: str | None = _opt(
        "golden",
        "",
        "use committed golden baselines: check (missing ones are created and "
        "fail), update (also rewrite mismatching ones, failing them), regen-all (rewrite all, "
        "pass), new-only (write missing ones only)",
        _choice(("check", "update", "regen-all", "new-only")),
        resolve=_or_none,
    )
    xdist: str = _opt(
        "xdist",
        "per-gpu",
        "under pytest-xdist: per-gpu (one GPU per worker, pinned by CUDA_VISIBLE_DEVICES; more "
        "workers than GPUs is a usage error; on CPU each worker runs its own servers) or off "
        "(spec_pair tests fail unmeasured, and the summary says so once)",
        _choice(("per-gpu", "off")),
    )
    sglang_version: str | None = _opt(
        "sglang-version",
        "",
        "build SGLang command lines for this version instead "
        "of the installed one (for --specenergy-dry-run on a machine without SGLang)",
        resolve=_or_none,
    )
    dry_run: bool = _opt(
        "dry-run",
        False,
        "collect the cases and print each matched pair's two server commands and "
        "what differs; start nothing; exit 4 when a command is refused or cannot be built",
        action="store_true",
    )
    plan: bool = _opt(
        "plan",
        False,
        "print each collected case's modeled GPU minutes and the total (engine starts, warm-up, "
        "windows, prefill twins, repeats at the first look and at the gate's cap; a saved run's "
        "save repeats) priced as the modeled meter prices work on --specenergy-plan-gpu, and run "
        "nothing (specenergy plan does the same)",
        action="store_true",
    )
    budget: float | None = _opt(
        "budget",
        "",
        "refuse the suite at collection when its modeled GPU minutes (every gated case at the "
        "gate's cap) exceed MINUTES, naming the costliest cases and what to change",
        _minutes,
        resolve=_or_none,
    )
    plan_gpu: str = _opt(
        "plan-gpu",
        "h200",
        "the GPU whose modeled roofline and memory price --specenergy-plan and "
        "--specenergy-budget: h100 or h200",
        _choice(("h100", "h200")),
    )
    rootdir: Path = Path(".")
    #: ``--specenergy-repeats`` (or its ini key) was given: a saved run measures that many, not
    #: ``save_repeats``; the default nightly flow (save, then compare) gets the power.
    repeats_set: bool = False
    #: pytest's ``-v`` count: 1 or more shows every table column and per-repeat progress.
    verbose: int = 0

    def case_defaults(self) -> Any:
        """What the markers take from the options (as plain values)."""
        from pytest_specenergy.cases.markers import CaseDefaults

        return CaseDefaults(**{f.name: getattr(self, f.name) for f in fields(CaseDefaults)})

    @functools.cached_property
    def modeled(self) -> bool:
        """Whether energy will be modeled: ``modeled:<gpu>``, or ``auto`` (reference server) where
        NVML sees no GPU."""
        if self.meter.startswith("modeled"):
            return True
        if self.meter != "auto" or self.engine != "reference" or self.device == "cuda":
            return False
        if _nvml_unavailable():
            return True  # what nvml_gpu_count() would find, without loading nvidia-ml-py to find it
        # Deferred (with nvidia-ml-py, a large module): only the auto meter asks.
        from pytest_specenergy.meters.devices import nvml_gpu_count

        try:
            return nvml_gpu_count() == 0
        except Exception:  # noqa: BLE001 - no library, no driver: NVML raises its own types
            return True

    @property
    def measured_repeats(self) -> int:
        """Repeats per arm measured first: ``save_repeats`` for a run saved to the history, else
        ``repeats``."""
        saving = bool(self.save or self.autosave)
        return (
            max(self.repeats, self.save_repeats)
            if saving and not self.repeats_set
            else self.repeats
        )

    def header(self) -> str:
        """The session header line: the measurement options and what is compared."""
        gate = (f" compare={self.compare}" if self.compare else "") + (
            f" golden={self.golden}" if self.golden else ""
        )
        return (
            f"specenergy: engine={self.engine} meter={self.meter} repeats={self.measured_repeats} "
            f"warmup={'auto' if self.warmup is None else self.warmup}{gate}"
        )

    def pair_measurer(
        self,
        meter_factory: Callable[[str, Any], Any],
        progress: Callable[[int, str], None] | None = None,
    ) -> Any:
        """The ``PairMeasurer`` these options ask for; ``meter_factory``: the
        ``pytest_specenergy_make_meter`` hook."""
        from pytest_specenergy.engines.pool import EnginePool
        from pytest_specenergy.measure.pairs import PairMeasurer

        pool = EnginePool(
            self.log_dir,
            self.startup_timeout,
            request_timeout_s=self.request_timeout,
            progress=progress,
        )
        return PairMeasurer(
            log_dir=self.log_dir,
            startup_timeout=self.startup_timeout,
            meter=self.meter,
            repeats=self.measured_repeats,
            warmup=self.warmup,
            meter_factory=meter_factory,
            pool=pool,
            cooldown_s=self.cooldown,
            draft_removal=self.draft_removal,
            progress=progress,
        )

    def gatekeeper(self, gated_comparisons: int, preloaded: Any = None) -> Any:
        """The ``Gatekeeper`` these options ask for; ``gated_comparisons``: the collected ones (the
        FDR's N); ``preloaded``: compare runs already read (path -> document)."""
        from pytest_specenergy.gate.compare import gate_plan
        from pytest_specenergy.gate.fdr import fdr_plan
        from pytest_specenergy.gate.gatekeeper import Gatekeeper
        from pytest_specenergy.gate.gatekeeper import GatePolicies
        from pytest_specenergy.gate.storage import GoldenStore
        from pytest_specenergy.gate.storage import RunStore

        plan, n = gate_plan(self.alpha, self.repeats, self.max_repeats), max(1, gated_comparisons)
        if self.fdr:  # REGRESSED early only where BH fails the case whatever the others show
            plan = fdr_plan(plan, self.fdr, n)
        return Gatekeeper(
            runs=RunStore(self.storage),
            goldens=GoldenStore(self.baselines),
            compare=self.compare,
            golden=self.golden,
            alpha=self.alpha,
            plan=plan,
            policies=GatePolicies(self.inconclusive, self.incomparable, self.missing_baseline),
            fdr=(self.fdr, n) if self.fdr else None,
            preloaded=preloaded,
        )

    @classmethod
    def from_pytest_config(cls, config: pytest.Config) -> SpecEnergyConfig:
        """Resolve every option (command line > ini > default), with a clear usage error."""
        rootdir = Path(config.rootpath)
        values = {
            f.name: _resolved(f.metadata["option"], config, rootdir)
            for f in fields(cls)
            if "option" in f.metadata
        }
        values["max_repeats"] = _cap(values["max_repeats"], values["repeats"])
        repeats_set = config.getoption("specenergy_repeats") is not None or config.getini(
            "specenergy_repeats"
        ) not in (None, "")
        return cls(
            **values,
            rootdir=rootdir,
            verbose=max(0, int(getattr(config.option, "verbose", 0) or 0)),
            repeats_set=repeats_set,
        )


def help_drift(options: Any = None) -> list[str]:
    """Each choice an option's parser accepts (its ``choices``, the fault list, the modeled meter's
    GPU presets) that its ``--help`` text does not name: empty when every help text is true to the
    code."""
    import re

    from pytest_specenergy.meters.roofline import PRESETS

    drift = []
    for opt in OPTIONS if options is None else options:
        choices = list(getattr(opt.parse, "choices", ()))
        if opt.parse is _meter:
            choices = ["auto", "nvml", *sorted(PRESETS)]
        for choice in choices:
            if not re.search(rf"(?<![\w-]){re.escape(choice)}(?![\w-])", opt.help):
                drift.append(f"--specenergy-{opt.name}: the help does not name {choice!r}")
    return drift


#: Every option, in ``--help`` order.
OPTIONS: tuple[_Option, ...] = tuple(
    f.metadata["option"] for f in fields(SpecEnergyConfig) if "option" in f.metadata
)


def _resolved(opt: _Option, config: pytest.Config, rootdir: Path) -> Any:
    """One option's value: command line > ini > default, parsed, then resolved."""
    raw = config.getoption(opt.dest)
    where = f"--specenergy-{opt.name}"
    if raw is None:
        raw, where = config.getini(opt.dest), f"ini option {opt.dest}"
    try:
        if opt.action == "append":
            value: Any = tuple(opt.parse(str(item)) for item in raw or [])
        elif raw is None or raw == "":
            value = opt.default
        elif opt.action:
            value = bool(raw)
        else:
            value = opt.parse(str(raw))
    except ValueError as exc:
        raise pytest.UsageError(f"{where}: {exc}") from None
    return opt.resolve(value, rootdir) if opt.resolve else value


def add_options(parser: pytest.Parser) -> None:
    """Register every option on the command line and in ini files."""
    group = parser.getgroup("specenergy", "energy regression testing for speculative decoding")
    for opt in OPTIONS:
        cli_help = opt.help.replace("%", "%%")  # argparse %-formats help texts
        flag = f"--specenergy-{opt.name}"
        if opt.action == "append":
            group.addoption(
                flag,
                action="append",
                dest=opt.dest,
                default=None,
                metavar=opt.metavar,
                type=_validated(opt.parse),
                help=cli_help,
            )
            parser.addini(opt.dest, opt.help, type="linelist", default=[])
        elif opt.action:
            group.addoption(flag, action=opt.action, dest=opt.dest, default=None, help=cli_help)
            parser.addini(opt.dest, opt.help, type="bool", default=opt.default)
        else:
            shown = (
                ""
                if opt.default in ("", 0) or "default" in opt.help
                else f" (default: {opt.default!r})"
            )
            group.addoption(
                flag,
                dest=opt.dest,
                default=None,
                metavar=opt.name.upper().replace("-", "_"),
                help=cli_help + shown,
            )
            parser.addini(opt.dest, opt.help, default=None)


def _cap(max_repeats: int, repeats: int) -> int:
    """The sequential plan's repeat cap (default 11), checked: the plan must be buildable."""
    cap = max_repeats or max(DEFAULT_CAP, repeats)
    if cap < repeats:
        raise pytest.UsageError(
            f"--specenergy-max-repeats: the cap ({cap}) must be at least "
            f"--specenergy-repeats ({repeats})"
        )
    if not max_repeats:
        return cap  # the default plan is valid
    from pytest_specenergy.gate.compare import gate_plan

    try:
        gate_plan(DEFAULT_ALPHA, repeats, cap)
    except ValueError as exc:
        raise pytest.UsageError(f"--specenergy-max-repeats={cap}: {exc}") from None
    return cap


def add_cli_options(parser: Any, *, storage: bool = True, gate: bool = False) -> None:
    """``--storage`` and, with ``gate``, ``--fail`` (``--specenergy-compare-fail``), ``--alpha`` and
    ``--max-repeats`` on an argparse parser of the ``specenergy`` command, with the plugin's
    defaults and help texts."""
    if storage:
        parser.add_argument(
            "--storage",
            type=storage_folder,
            default=Path(STORAGE.default),
            help=STORAGE.help + f" (default {STORAGE.default})",
        )
    if gate:
        parser.add_argument(
            "--fail",
            action="append",
            metavar="EXPR",
            type=_validated(COMPARE_FAIL.parse),
            help=COMPARE_FAIL.help.replace("%", "%%"),
        )
        parser.add_argument(
            "--alpha",
            type=ALPHA.parse,
            default=ALPHA.default,
            help=(ALPHA.help + f" (default {ALPHA.default})").replace("%", "%%"),
        )
        parser.add_argument(
            "--max-repeats",
            type=_non_negative_int,
            default=0,
            help=MAX_REPEATS.help.replace("--specenergy-repeats repeats", "3 repeats").replace(
                "%", "%%"
            ),
        )
