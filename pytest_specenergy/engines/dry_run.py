"""``--specenergy-dry-run``: each matched pair's two server commands and what differs."""

from __future__ import annotations

import shlex
from typing import Any
from typing import Iterable

from pytest_specenergy.engines.argv import describe_pair_difference
from pytest_specenergy.engines.backends import get_backend
from pytest_specenergy.engines.base import EngineBackend
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig


def show_dry_run(cases: Iterable[Any], reporter: Any) -> str | None:
    """Print the dry run (through pytest's terminal reporter, or stdout under
    ``-p no:terminal``); return why it fails when a command was refused, else None."""
    text = render_dry_run(cases)
    if reporter is None:
        print(text)
    else:
        reporter.write_sep("=", "specenergy dry run")
        reporter.write_line(text)
    # A dry run with a refused or unbuildable command fails: a CI step checking the suite's commands
    # must not go green.
    refused = [
        line
        for line in text.splitlines()
        if "# REFUSED:" in line or ": cannot build the command:" in line
    ]
    if not refused:
        return None
    return (
        f"specenergy dry run: {len(refused)} engine command(s) refused or not buildable "
        f"(see above), first: {refused[0].strip()}"
    )


def render_dry_run(cases: Iterable[Any]) -> str:
    """One block per distinct speculative engine, listing the cases it serves; ``cases`` are taken
    by their shape (``id``, ``spec_config()``, ``baseline_config()``), since engines sit below
    :mod:`pytest_specenergy.cases`."""
    cases = list(cases)
    groups: dict[object, list[Any]] = {}
    for case in cases:
        groups.setdefault(case.spec_config(), []).append(case)
    blocks = []
    for config, members in groups.items():
        ids = ", ".join(sorted({c.id for c in members}))
        blocks.append("\n".join([f"cases: {ids}", *dry_run_lines(config)]))
    if not blocks:
        return "no spec_pair cases collected"
    return (
        "\n\n".join(blocks) + f"\n\n{len(groups)} speculative engines, "
        f"{len({c.baseline_config() for c in cases})} baseline twins; nothing was started"
    )


def dry_run_lines(
    config: EngineConfig,
    backend: EngineBackend | None = None,
    host: str = "127.0.0.1",
    port: int = 30000,
) -> list[str]:
    """Human-readable launch lines for ``config`` and (if speculative) its baseline twin, for any
    backend with ``command()``/``environment()``; refusals become lines too."""
    backend = backend or get_backend(config.engine)
    lines = [f"# {config.label()} on the {backend.name} engine"]
    lines += [f"# {note}" for note in backend.dry_run_notes(config)]
    try:
        backend.check(config)
    except EngineConfigError as exc:
        lines.append(f"# REFUSED: {exc}")
    arms = (
        [("speculative", config), ("baseline", config.twin())]
        if config.is_speculative
        else [("baseline", config)]
    )
    argvs: dict[str, list[str]] = {}
    for arm, arm_config in arms:
        try:
            argv = backend.command(arm_config, host, port)
            env = backend.environment(arm_config)
        except EngineConfigError as exc:
            lines.append(f"{arm}: cannot build the command: {exc}")
            continue
        argvs[arm] = argv
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        lines.append(f"{arm}: {prefix + ' ' if prefix else ''}{shlex.join(argv)}")
    if len(argvs) == 2:
        diff = describe_pair_difference(argvs["speculative"], argvs["baseline"])
        lines += [f"# differs: {line}" for line in diff] or ["# differs: nothing"]
    return lines
