"""What a session checks before it measures anything (issue 40 item 4, "fail before measuring"): the
``--specenergy-compare`` run exists and can be read, the engines the suite declares can start here
(their extra is installed), the engine log folder can be written. Each problem is one usage error
naming what is wrong and what would be right; before, a mistyped baseline was found after the whole
suite had measured, and a missing ``[reference]`` extra gave a 40-line traceback per test."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Iterable

if TYPE_CHECKING:
    from pytest_specenergy.cases.case import Case
    from pytest_specenergy.document import RunDocument
    from pytest_specenergy.options import SpecEnergyConfig

#: Per engine: the ``pytest-specenergy[...]`` extra that installs what its servers import, and the
#: top-level modules it installs.
ENGINE_EXTRAS = {
    "reference": ("reference", ("torch", "transformers", "safetensors", "tokenizers")),
    "sglang": ("sglang", ("sglang",)),
}
#: The meter option's modules: ``--specenergy-meter=nvml`` reads the board counter via pynvml.
METER_EXTRAS = {"nvml": ("nvml", ("pynvml",))}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, a broken entry
        return False


def _looks_like_path(ref: str) -> bool:
    return ref.endswith(".json") or "/" in ref or "\\" in ref


def compare_problem(config: SpecEnergyConfig) -> tuple[str | None, dict[Path, RunDocument]]:
    """(Why ``--specenergy-compare`` names no usable run, or None; the runs it names, read once).
    A missing run stops the session under ``--specenergy-missing-baseline=fail`` only (warn and
    skip keep their meaning per case); one that cannot be read, or a PATH to an interrupted run,
    stops it whatever that policy says, as it would fail every case."""
    from pytest_specenergy.gate.storage import RunNotFound
    from pytest_specenergy.gate.storage import RunStore
    from pytest_specenergy.gate.storage import StorageError
    from pytest_specenergy.gate.storage import load_run

    ref = str(config.compare or "").strip()
    if not ref or config.golden:  # golden mode judges against the committed files
        return None, {}
    flag = f"--specenergy-compare={ref}"
    store = RunStore(config.storage)
    paths: list[Path] = []
    if _looks_like_path(ref):
        if Path(ref).is_file():
            paths.append(Path(ref))
        elif config.missing_baseline == "fail":
            return (
                f"{flag}: no such file; expected an existing run file PATH, or last, NAME or NNNN "
                f"in the history {store.root}",
                {},
            )
    else:
        why = []
        for key in store.machine_keys():
            try:
                paths.append(store.find(key, ref))
            except RunNotFound as exc:
                why.append(str(exc))
        if not paths and config.missing_baseline == "fail":
            detail = "; ".join(why) or (
                f"no saved runs in {store.root}; save one first with --specenergy-save=NAME, or "
                "pass --specenergy-storage"
            )
            return f"{flag}: {detail} (nothing was measured)", {}
    loaded = {}
    for path in paths:
        try:
            document = load_run(path)
        except StorageError as exc:
            return f"{flag}: the baseline run cannot be read: {exc}", {}
        if document.interrupted:
            return (
                f"{flag}: the baseline run {path} was saved by an interrupted session; compare "
                "with a complete run",
                {},
            )
        loaded[path] = document
    return None, loaded


def missing_extras(cases: Iterable[Case], meter: str = "auto") -> list[str]:
    """Each engine (and meter) the planned ``cases`` need whose extra is not installed in this
    Python, with the install command; an SGLang engine run by another interpreter (the engine
    option ``python=``) or built for a dry run (``sglang_version=``) is not checked here."""
    needed: dict[str, str] = {}
    for case in cases:
        configs = [case.baseline_config(), case.spec_config(), case.reference_config()]
        for config in (c for c in configs if c is not None):
            if config.engine == "sglang" and (
                config.option("python") is not None or config.option("sglang_version") is not None
            ):
                continue
            needed.setdefault(config.engine, case.id)
    problems = []
    for engine, example in sorted(needed.items()):
        extra, modules = ENGINE_EXTRAS.get(engine, ("", ()))
        absent = [m for m in modules if not _installed(m)]
        if absent:
            problems.append(
                f"the {engine} engine (case {example}, and any other on it) needs "
                f"{', '.join(absent)}, which this Python ({_python()}) does not have; install "
                f"the extra: pip install 'pytest-specenergy[{extra}]'"
            )
    if meter in METER_EXTRAS:
        extra, modules = METER_EXTRAS[meter]
        absent = [m for m in modules if not _installed(m)]
        if absent:
            problems.append(
                f"--specenergy-meter={meter} needs {', '.join(absent)}; install the extra: "
                f"pip install 'pytest-specenergy[{extra}]'"
            )
    return problems


def _python() -> str:
    import sys

    return sys.executable


def log_dir_problem(log_dir: Path) -> str | None:
    """Why engine logs cannot be written in ``log_dir``: not a folder, read-only, or (nearly) full;
    found before an engine starts instead of as an ``OSError`` in every case (audit 3, T43)."""
    from pytest_specenergy.atomic import too_full
    from pytest_specenergy.atomic import unwritable

    why = unwritable(log_dir) or too_full(log_dir)
    return f"--specenergy-log-dir {log_dir}: {why}" if why else None


def start_problems(config: SpecEnergyConfig, cases: list[Case]) -> list[str]:
    """Everything wrong with measuring ``cases`` here, found at collection's end, before the first
    engine starts."""
    if not cases:
        return []
    problems = missing_extras(cases, config.meter)
    log = log_dir_problem(Path(config.log_dir))
    return problems + ([log] if log else [])
