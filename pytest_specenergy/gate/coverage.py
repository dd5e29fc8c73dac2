"""The gate's coverage as part of its verdict: every baseline case the current run did not measure
(a ``-k``, a skip, a deleted, renamed or re-parametrized test) is listed, and by default in CI it
fails the session; ``--specenergy-unmeasured-ok=GLOB`` declares the ones a run may leave out.
Without it a pull request that drops a gated case shrinks the gate with no signal (audit 3, T31:
"1 passed, 3 deselected ... 1 unchanged", exit status 0)."""

from __future__ import annotations

import os
from fnmatch import fnmatchcase
from typing import Iterable
from typing import Mapping
from typing import Sequence

from pytest_specenergy.document import CoverageFacts
from pytest_specenergy.gate.settings import UNMEASURED_POLICIES
from pytest_specenergy.gate.verdict import Section

# ``--specenergy-unmeasured``: auto fails under CI (the ``CI`` variable every CI service sets) and
# warns elsewhere, where a developer's ``-k`` is routine.
_FALSE = ("", "0", "false", "no", "off")


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this runs under CI: the ``CI`` variable is set to anything but 0/false/no/off."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in _FALSE


def resolve_policy(policy: str, environ: Mapping[str, str] | None = None) -> str:
    """``fail`` or ``warn``: ``auto`` is ``fail`` under CI (:func:`in_ci`), else ``warn``."""
    if policy not in UNMEASURED_POLICIES:
        raise ValueError(
            f"unknown unmeasured policy {policy!r}; expected one of {', '.join(UNMEASURED_POLICIES)}"
        )
    if policy != "auto":
        return policy
    return "fail" if in_ci(environ) else "warn"


def coverage_of(
    baseline_keys: Iterable[str],
    measured_keys: Iterable[str],
    *,
    baseline: str,
    machine_key: str | None = None,
    accept: Sequence[str] = (),
    policy: str = "fail",
) -> CoverageFacts:
    """Which of ``baseline_keys`` (case keys: node ids) ``measured_keys`` lacks; those matching a
    glob of ``accept`` are accepted; the rest fail the session under ``policy`` ``fail``."""
    stored, measured = set(baseline_keys), set(measured_keys)
    missing = sorted(stored - measured)
    accepted = [key for key in missing if any(fnmatchcase(key, glob) for glob in accept)]
    unmeasured = tuple(key for key in missing if key not in accepted)
    return CoverageFacts(
        baseline=baseline,
        machine_key=machine_key,
        measured=len(stored & measured),
        unmeasured=unmeasured,
        accepted=tuple(accepted),
        policy=policy,
        failed=policy == "fail" and bool(unmeasured),
    )


def coverage_lines(coverage: CoverageFacts, option: str = "--specenergy-unmeasured") -> list[str]:
    """What a summary says of one baseline's coverage: nothing when every case was measured."""
    lines: list[str] = []
    total = coverage.measured + len(coverage.unmeasured) + len(coverage.accepted)
    if coverage.unmeasured:
        lines.append(
            f"{len(coverage.unmeasured)} of {total} baseline case(s) in {coverage.baseline} were "
            "not measured by this run (deselected, skipped, deleted or renamed):"
        )
        lines += [f"  - {key}" for key in coverage.unmeasured]
    if coverage.accepted:
        lines.append(
            f"{len(coverage.accepted)} baseline case(s) not measured, declared by "
            f"{option}-ok: {', '.join(coverage.accepted)}"
        )
    if coverage.failed:
        lines.append(
            f"exit status 1 ({option}={coverage.policy}): the gate covered fewer cases than its "
            f"baseline holds; measure them, or declare those this run may leave out with "
            f"{option}-ok=GLOB"
        )
    elif coverage.unmeasured:
        lines.append(
            f"not failing ({option}={coverage.policy}); under CI (the CI variable set) the default "
            "auto fails"
        )
    return lines


def coverage_section(
    coverages: Sequence[CoverageFacts], option: str = "--specenergy-unmeasured"
) -> Section | None:
    """The summary's coverage block, or None when every baseline case was measured."""
    lines = [line for coverage in coverages for line in coverage_lines(coverage, option)]
    if not lines:
        return None
    return Section("specenergy coverage", tuple(lines), any(c.failed for c in coverages))
