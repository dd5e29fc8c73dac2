"""What every ``specenergy`` subcommand shares: runs named as ``--specenergy-compare`` names them (a
PATH, or last/NAME/NNNN in the history), output paths checked before anything is written, and the
gate's limits and sequential plan from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pytest_specenergy.atomic import unwritable
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.limits import limits_for
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.settings import DEFAULT_CAP
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.gate.storage import StorageError
from pytest_specenergy.gate.storage import stored_run_problem


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def machine_key_of(store: RunStore, wanted: str | None) -> str:
    """The machine key a history reference is looked up under: ``wanted``, else the only one."""
    if wanted:
        return wanted
    keys = store.machine_keys()
    if len(keys) == 1:
        return keys[0]
    if not keys:
        raise CliError(f"no runs stored in {store.root}; pass a run file PATH or --storage")
    raise CliError(
        f"{store.root} holds runs of several machine keys ({', '.join(keys)}); "
        f"choose one with --machine-key"
    )


def resolve_run(ref: str, store: RunStore, machine_key: str | None) -> tuple[RunDocument, Path]:
    """Load a run named by PATH or by last/NAME/NNNN in the history; an interrupted run is said to
    be one."""
    path = Path(ref)
    if not path.is_file():
        path = store.find(machine_key_of(store, machine_key), ref)
    document = store.load(path)
    if document.interrupted:
        print(
            f"specenergy: {path} was saved by an interrupted session: its results are incomplete",
            file=sys.stderr,
        )
    return document, path


def history_of(
    store: RunStore, machine_key: str | None, upto: Path | None = None
) -> list[RunDocument]:
    """The readable runs of one machine key, oldest first, up to ``upto``; a bad file is named on
    stderr and skipped."""
    try:
        key = machine_key_of(store, machine_key)
    except CliError:
        return []
    documents = []
    for run in store.list(key):
        try:
            documents.append(store.load(run.path))
        except StorageError as exc:
            print(f"specenergy: skipping {exc}", file=sys.stderr)
        if upto is not None and run.path.resolve() == upto.resolve():
            break
    return documents


def output_path(path: str, store: RunStore, *inputs: Path) -> Path:
    """An output path checked before anything is written: none of the input files (a report must
    never replace its run), no run the history holds, in a folder that can be written."""
    out = Path(path)
    for given in inputs:
        if out.resolve() == given.resolve():
            raise CliError(f"{path} is the run file being read; write the output to another path")
    stored = stored_run_problem(out, store)
    if stored:
        raise CliError(f"{stored}: writing it would replace that run; write to another path")
    if out.is_dir():
        raise CliError(f"{path} is a folder; expected a file path")
    why = unwritable(out.parent)
    if why:
        raise CliError(f"{path}: {why}")
    return out


def limits_of(args: argparse.Namespace) -> list[Any]:
    """The gate's limits: ``--fail`` expressions over the defaults."""
    return limits_for([parse_fail_expr(t) for t in args.fail or ()])


def plan_for(args: argparse.Namespace, run: RunDocument) -> Any:
    """The gate's sequential plan as the session that measured ``run`` had it (first look at the
    fewest repeats of any case, then every 2 more up to ``--max-repeats``), so a report shows the
    verdicts the plugin gave."""
    started = min((len(r.speculative.samples) for r in run.results), default=3)
    try:
        return gate_plan(args.alpha, max(2, started), args.max_repeats or DEFAULT_CAP)
    except ValueError as exc:
        raise CliError(f"--max-repeats={args.max_repeats}: {exc}") from None
