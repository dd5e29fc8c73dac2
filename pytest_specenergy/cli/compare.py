"""``specenergy compare BASELINE CURRENT``: every case of the current run against the baseline's, by
pytest's gate rules, with its exit status: 1 on a regression, an incomparable case, a case
without a baseline (an empty baseline's every case), a baseline or current record whose own checks
failed, a current run with no results, and (under CI, or ``--unmeasured=fail``) baseline cases the
current run did not measure; ``--strict`` adds inconclusive cases and unmeasured ones anywhere."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any
from typing import Sequence

from tabulate import tabulate

from pytest_specenergy.cli.runs import CliError
from pytest_specenergy.cli.runs import limits_of
from pytest_specenergy.cli.runs import plan_for
from pytest_specenergy.cli.runs import resolve_run
from pytest_specenergy.gate.baseline import compare_runs
from pytest_specenergy.gate.baseline import is_refused
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.coverage import coverage_lines
from pytest_specenergy.gate.coverage import coverage_of
from pytest_specenergy.gate.coverage import resolve_policy
from pytest_specenergy.gate.settings import UNMEASURED_POLICIES
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.options import add_cli_options

#: Each policy option of the command: the verdict it decides, its default (pytest's), and what it
#: is called in the exit line.
_POLICIES = (
    (
        "incomparable",
        Verdict.INCOMPARABLE,
        "fail",
        "an incomparable case (another machine key, meter or engine version; figures missing)",
    ),
    (
        "missing_baseline",
        Verdict.NO_BASELINE,
        "fail",
        "a case the baseline lacks (of an empty baseline: every case)",
    ),
    ("inconclusive", Verdict.INCONCLUSIVE, "warn", "a case still inconclusive at the repeat cap"),
)


def failures(comparisons: Sequence[CaseComparison], args: argparse.Namespace) -> list[str]:
    """Why the comparisons fail the command (empty: they pass): regressions always, a refused
    record always, the other verdicts by their policy (``--strict``: all fail)."""
    counts = Counter(c.verdict for c in comparisons)
    refused = sum(is_refused(c) for c in comparisons)
    found = [f"{counts[Verdict.REGRESSED]} regressed"] if counts[Verdict.REGRESSED] else []
    if refused:
        found.append(f"{refused} refused (a record whose own checks failed)")
    for option, verdict, _, _ in _POLICIES:
        number = counts[verdict] - (refused if verdict is Verdict.INCOMPARABLE else 0)
        policy = "fail" if args.strict else getattr(args, option)
        if number and policy == "fail":
            flag = "--strict" if args.strict else f"--{option.replace('_', '-')}=fail"
            found.append(f"{number} {verdict.label} ({flag})")
    return found


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare run B (current) with run A (baseline); the exit status as pytest's gate decides."""
    store = RunStore(args.storage)
    base, base_path = resolve_run(args.baseline, store, args.machine_key)
    current, current_path = resolve_run(args.current, store, args.machine_key)
    if base_path.resolve() == current_path.resolve():
        raise CliError(
            f"{args.baseline!r} and {args.current!r} are the same run ({base_path}); a run "
            "compared with itself shows nothing"
        )
    if base.interrupted:
        raise CliError(
            f"the baseline {base_path} was saved by an interrupted session; compare with a "
            "complete run"
        )
    comparisons = compare_runs(
        base, current, limits_of(args), args.alpha, plan=plan_for(args, current)
    )
    print(f"baseline: {base_path}")
    print(_table(comparisons))
    coverage = coverage_of(
        (r.key for r in base.results),
        (r.key for r in current.results),
        baseline=str(base_path),
        machine_key=base.machine_key,
        accept=args.unmeasured_ok or (),
        policy="fail" if args.strict else resolve_policy(args.unmeasured),
    )
    for line in coverage_lines(coverage, "--unmeasured"):
        print(line)
    regressed = sum(c.verdict is Verdict.REGRESSED for c in comparisons)
    print(f"{regressed} regressed of {len(comparisons)} cases")
    found = failures(comparisons, args)
    if not current.results:
        found.append(f"the current run {current_path} holds no results: nothing was compared")
    if coverage.failed:
        found.append(f"{len(coverage.unmeasured)} baseline case(s) not measured")
    if found:
        print(f"exit status 1: {'; '.join(found)}")
    return 1 if found else 0


def _table(comparisons: Sequence[CaseComparison]) -> str:
    rows = []
    for comparison in sorted(comparisons, key=lambda c: c.verdict.rank):
        deciding = [r for r in comparison.rows if r.verdict is comparison.verdict] or list(
            comparison.rows
        )
        detail = "; ".join(r.describe() for r in deciding) or "; ".join(comparison.reasons)
        verdict = comparison.verdict
        rows.append((f"{verdict.mark} {verdict.word}", comparison.case_id, detail))
    return tabulate(
        rows, headers=("verdict", "case", "detail"), tablefmt="simple", disable_numparse=True
    )


def add_compare_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``compare`` subcommand and its options (the policies as pytest's, same defaults)."""
    compare = sub.add_parser(
        "compare",
        parents=[common],
        help="compare two runs; exit 1 where pytest's gate would fail",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    compare.add_argument("baseline", help="baseline run (PATH, last, NAME or NNNN)")
    compare.add_argument("current", help="current run (PATH, last, NAME or NNNN)")
    add_cli_options(compare, storage=False, gate=True)
    for option, _, default, what in _POLICIES:
        flag = option.replace("_", "-")
        compare.add_argument(
            f"--{flag}",
            choices=("fail", "warn"),
            default=default,
            help=f"what {what} does: fail (exit 1) or warn (default {default}, as "
            f"--specenergy-{flag})",
        )
    compare.add_argument(
        "--unmeasured",
        choices=UNMEASURED_POLICIES,
        default="auto",
        help="what baseline cases the current run lacks do: fail (exit 1), warn, or auto (fail "
        "where the CI variable is set, else warn; the default, as --specenergy-unmeasured); each "
        "is listed either way",
    )
    compare.add_argument(
        "--unmeasured-ok",
        action="append",
        metavar="GLOB",
        help="a glob of baseline case ids the current run may lack (repeatable)",
    )
    compare.add_argument(
        "--strict",
        action="store_true",
        help="every verdict but unchanged and improved fails, inconclusive and unmeasured "
        "cases included",
    )
    compare.set_defaults(func=cmd_compare)
