"""What a finished session writes: the ``--specenergy-json`` file, the run history, the queued
golden baselines. Each is written on its own: one that cannot be (read-only folder, full disk) fails
the session, not the others."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from pytest_specenergy.document import RunDocument
    from pytest_specenergy.gate.gatekeeper import Gatekeeper
    from pytest_specenergy.options import SpecEnergyConfig


@dataclass(frozen=True)
class Written:
    """What was written, and why each output that was not could not be."""

    json: Path | None = None
    saved: tuple[Path, ...] = ()
    goldens: tuple[Path, ...] = ()
    failures: tuple[str, ...] = ()


def unwritable_outputs(config: SpecEnergyConfig) -> list[str]:
    """Why each output this session will write could not be written, or would replace a baseline
    or a stored run, checked before anything runs."""
    outputs, problems = [], []
    if config.json:
        problems += _json_replaces(config)
        outputs.append(("--specenergy-json", Path(config.json).parent))
    if config.save or config.autosave:
        outputs.append(("--specenergy-storage", Path(config.storage)))
    if config.golden:
        outputs.append(("--specenergy-baselines", Path(config.baselines)))
    if not outputs:
        return problems
    # loaded only when a session writes something
    from pytest_specenergy.atomic import too_full
    from pytest_specenergy.atomic import unwritable

    return problems + [
        f"{option} {folder}: {why}"
        for option, folder in outputs
        if (why := unwritable(folder) or too_full(folder))
    ]


def _json_replaces(config: SpecEnergyConfig) -> list[str]:
    """Why writing ``--specenergy-json`` would replace a baseline: the compare file, a run of the
    history (the one a compare name resolves to included), or a golden baseline."""
    from pytest_specenergy.gate.storage import RunStore
    from pytest_specenergy.gate.storage import stored_run_problem

    target = Path(str(config.json))
    fix = "write the JSON to another path"
    if config.compare and Path(config.compare).is_file():
        if Path(config.compare).resolve() == target.resolve():
            return [
                f"--specenergy-json {config.json} is the --specenergy-compare baseline: writing "
                f"it would replace the baseline; {fix}"
            ]
    stored = stored_run_problem(target, RunStore(config.storage))
    if stored:
        return [f"--specenergy-json: {stored}: writing it would replace that run; {fix}"]
    baselines = Path(config.baselines).resolve() if config.baselines else None
    if baselines is not None and target.is_file() and baselines in target.resolve().parents:
        return [
            f"--specenergy-json {config.json} is a golden baseline in {config.baselines}: "
            f"writing it would replace that baseline; {fix}"
        ]
    return []


def write_outputs(
    document: RunDocument, config: SpecEnergyConfig, gate: Gatekeeper, hook: Any
) -> Written:
    """Write every output of ``document``; the ``pytest_specenergy_update_json`` hook sees the
    JSON first, and what it adds is kept in the file and in the history."""
    from pytest_specenergy.atomic import write_json_atomic
    from pytest_specenergy.document import DocumentError
    from pytest_specenergy.document import RunDocument
    from pytest_specenergy.gate.storage import StorageError

    failures: list[str] = []
    data = document.as_dict()
    hook.pytest_specenergy_update_json(data=data)
    try:
        document = RunDocument.from_dict(data, "the document after pytest_specenergy_update_json")
    except DocumentError as exc:
        failures.append(f"a pytest_specenergy_update_json hook broke the run document: {exc}")
    json_path = None
    if config.json:
        try:
            write_json_atomic(config.json, data)
            json_path = config.json
        except OSError as exc:
            failures.append(
                f"--specenergy-json {config.json}: cannot be written ({exc.strerror or exc})"
            )
    saved = []
    if config.save or config.autosave:
        for key in sorted({r.machine_key for r in document.results if r.machine_key}):
            try:
                saved.append(gate.runs.save(document.on(key), config.save))
            except (OSError, StorageError) as exc:
                failures.append(
                    f"the run could not be saved in {gate.runs.root}: "
                    f"{getattr(exc, 'strerror', None) or exc}"
                )
    goldens: list[Path] = []
    if config.golden:  # the goldens no test used are the gate's coverage (gate/coverage.py)
        goldens, golden_failures = gate.goldens.flush()
        failures += golden_failures
    return Written(json_path, tuple(saved), tuple(goldens), tuple(failures))
