"""The ``specenergy`` command: report, compare, history, merge, predict, fetch-model, doctor. Runs are named as
``--specenergy-compare`` names them: a PATH, or last/NAME/NNNN in the history folder (how:
``docs/design/meters-report-cli.md``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from typing import Sequence

from tabulate import tabulate

import pytest_specenergy.gate.storage as storage
from pytest_specenergy.atomic import write_json_atomic
from pytest_specenergy.atomic import write_text_atomic
from pytest_specenergy.cli.fetch import add_fetch_parser
from pytest_specenergy.cli.predict import add_predict_parser
from pytest_specenergy.cli.predict import checked_number
from pytest_specenergy.document import DocumentError
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import compare_documents
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.history import detect_history_steps
from pytest_specenergy.gate.latency import LATENCY_LIMIT
from pytest_specenergy.gate.latency import compare_latency
from pytest_specenergy.gate.limits import limits_for
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.merge import MergeError
from pytest_specenergy.gate.merge import merge_documents
from pytest_specenergy.gate.settings import DEFAULT_CAP
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.options import add_cli_options


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def _machine_key(store: RunStore, wanted: str | None) -> str:
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
        path = store.find(_machine_key(store, machine_key), ref)
    document = store.load(path)
    if document.interrupted:
        print(
            f"specenergy: {path} was saved by an interrupted session: its results are incomplete",
            file=sys.stderr,
        )
    return document, path


def _history(
    store: RunStore, machine_key: str | None, upto: Path | None = None
) -> list[RunDocument]:
    try:
        key = _machine_key(store, machine_key)
    except CliError:
        return []
    documents = []
    for run in store.list(key):
        try:
            documents.append(store.load(run.path))
        except storage.StorageError as exc:
            print(f"specenergy: skipping {exc}", file=sys.stderr)
        if upto is not None and run.path.resolve() == upto.resolve():
            break
    return documents


def _output(path: str, *inputs: Path) -> Path:
    """An output path that is none of the input files (a report must never replace its run)."""
    out = Path(path)
    for given in inputs:
        if out.resolve() == given.resolve():
            raise CliError(f"{path} is the run file being read; write the report to another path")
    return out


def cmd_report(args: argparse.Namespace) -> int:
    """Render a run (optionally against a baseline and with its history) as HTML / Markdown."""
    if not args.html and not args.markdown:
        raise CliError("report needs --html OUT.html and/or --markdown OUT.md")
    store = RunStore(args.storage)
    run, path = resolve_run(args.run, store, args.machine_key)
    comparisons, baseline_path, inputs = None, None, [path]
    if args.baseline:
        # The gate's own comparison, so a report shows exactly the verdicts a test would get,
        # latency targets included.
        baseline, baseline_path = resolve_run(args.baseline, store, args.machine_key)
        inputs.append(baseline_path)
        plan = _plan(args, run)
        comparisons = compare_documents(baseline, run, _limits(args), args.alpha, plan=plan)
        if args.latency_target:
            comparisons += compare_latency(
                baseline.results,
                run.results,
                args.latency_target,
                parse_fail_expr(LATENCY_LIMIT),
                plan,
            )
    if args.html:
        from pytest_specenergy.report.html import render_html

        out = _output(args.html, *inputs)
        history = [
            d
            for d in _history(store, run.machine_key or args.machine_key, path)
            if d.datetime != run.datetime
        ]
        html = render_html(
            run,
            comparisons,
            history=history,
            latency_targets_ms=tuple(args.latency_target or (25.0, 10.0)),
            title=args.title or f"specenergy report: {path.name}",
            plots=False if args.no_plots else None,
            baseline_label=str(baseline_path or ""),
        )
        write_text_atomic(out, html)
        print(f"specenergy: wrote {args.html}")
    if args.markdown:
        from pytest_specenergy.report.markdown import render_markdown

        write_text_atomic(_output(args.markdown, *inputs), render_markdown(run, comparisons))
        print(f"specenergy: wrote {args.markdown}")
    return 0


def _limits(args: argparse.Namespace) -> list[Any]:
    return limits_for([parse_fail_expr(t) for t in args.fail or ()])


def _plan(args: argparse.Namespace, run: RunDocument) -> Any:
    """The gate's sequential plan as the session that measured ``run`` had it (first look at the
    fewest repeats of any case, then every 2 more up to ``--max-repeats``), so a report shows the
    verdicts the plugin gave."""
    started = min((len(r.speculative.samples) for r in run.results), default=3)
    try:
        return gate_plan(args.alpha, max(2, started), args.max_repeats or DEFAULT_CAP)
    except ValueError as exc:
        raise CliError(f"--max-repeats={args.max_repeats}: {exc}") from None


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare run B (current) with run A (baseline); exit 1 on any regression."""
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
    comparisons = compare_documents(
        base, current, _limits(args), args.alpha, plan=_plan(args, current)
    )
    rows = []
    for comparison in sorted(comparisons, key=lambda c: c.verdict.rank):
        deciding = [r for r in comparison.rows if r.verdict is comparison.verdict] or list(
            comparison.rows
        )
        detail = "; ".join(r.describe() for r in deciding) or "; ".join(comparison.reasons)
        rows.append(
            (f"{comparison.verdict.mark} {comparison.verdict.value}", comparison.case_id, detail)
        )
    print(f"baseline: {base_path}")
    print(
        tabulate(
            rows, headers=("verdict", "case", "detail"), tablefmt="simple", disable_numparse=True
        )
    )
    regressed = sum(c.verdict is Verdict.REGRESSED for c in comparisons)
    blocked = sum(c.verdict is Verdict.INCOMPARABLE for c in comparisons) if args.strict else 0
    print(f"{regressed} regressed of {len(comparisons)} cases")
    return 1 if regressed or blocked else 0


def cmd_history(args: argparse.Namespace) -> int:
    """Step detection over the stored runs of one machine key."""
    documents = _history(RunStore(args.storage), args.machine_key)
    if not documents:
        raise CliError(f"no runs stored in {args.storage}; pass the history folder with --storage")
    if len(documents) < 2:  # the first nightly: nothing to detect a step against yet
        print(f"1 run in {args.storage}: a step needs at least two; nothing to compare yet")
        return 0
    steps = detect_history_steps(documents, args.metric, args.threshold)
    print(f"{len(documents)} runs in {args.storage}")
    cut = [d.label for d in documents if d.interrupted]
    if cut:
        print(f"of which {len(cut)} saved by an interrupted session (incomplete): {', '.join(cut)}")
    if not steps:
        print("no steps detected")
        return 0
    print(
        tabulate(
            [
                (
                    s.case_id,
                    s.metric,
                    s.run,
                    f"{s.before:.4g}",
                    f"{s.after:.4g}",
                    f"{s.change:+.1%}",
                )
                for s in steps
            ],
            headers=("case", "metric", "from run", "before", "after", "change"),
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    return 1 if args.fail_on_step else 0


def cmd_merge(args: argparse.Namespace) -> int:
    """Merge shards of one run (several CI machines) into one run file."""
    store = RunStore(args.storage)
    shards = [resolve_run(ref, store, args.machine_key) for ref in args.shards]
    merged = merge_documents([doc for doc, _ in shards], [str(path) for _, path in shards])
    write_json_atomic(_output(args.output, *(path for _, path in shards)), merged.as_dict())
    print(
        f"specenergy: merged {len(shards)} shards ({len(merged.results)} results) into "
        f"{args.output}"
    )
    if args.save:
        print(f"specenergy: saved {store.save(merged, args.save)}")
    return 0


_milliseconds = checked_number(
    float, lambda v: 0 < v < float("inf"), "a time between tokens in ms > 0, e.g. 25"
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also what ``--help`` prints)."""
    parser = argparse.ArgumentParser(
        prog="specenergy",
        description="Report, compare, merge and check pytest-specenergy runs; predict savings; "
        "fetch the built-in real model.",
    )
    common = argparse.ArgumentParser(add_help=False)
    add_cli_options(common)
    common.add_argument(
        "--machine-key", help="machine key of the runs (default: the only one stored)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    report = sub.add_parser("report", parents=[common], help="render a run as HTML and/or Markdown")
    report.add_argument("run", help="run file PATH, or last/NAME/NNNN in the history")
    report.add_argument("--baseline", help="run to compare with (PATH, last, NAME or NNNN)")
    report.add_argument("--html", help="write a self-contained HTML report here")
    report.add_argument(
        "--markdown", help="write a Markdown summary here (CI step summary, PR comment)"
    )
    add_cli_options(report, storage=False, gate=True)
    report.add_argument(
        "--latency-target",
        type=_milliseconds,
        action="append",
        default=[],
        metavar="MS",
        help="time-between-tokens target in ms (repeatable), e.g. 25",
    )
    report.add_argument("--title", help="report title")
    report.add_argument("--no-plots", action="store_true", help="tables only")
    report.set_defaults(func=cmd_report)

    compare = sub.add_parser(
        "compare", parents=[common], help="compare two runs; exit 1 on regression"
    )
    compare.add_argument("baseline", help="baseline run (PATH, last, NAME or NNNN)")
    compare.add_argument("current", help="current run (PATH, last, NAME or NNNN)")
    add_cli_options(compare, storage=False, gate=True)
    compare.add_argument("--strict", action="store_true", help="also exit 1 on incomparable cases")
    compare.set_defaults(func=cmd_compare)

    history = sub.add_parser("history", parents=[common], help="detect steps across stored runs")
    history.add_argument(
        "storage_dir", nargs="?", type=Path, help="history folder (same as --storage)"
    )
    history.add_argument(
        "--metric",
        action="append",
        default=[],
        help="metric to scan (repeatable; default "
        "energy_per_token, accept_length, energy_saving, tbt_ms)",
    )
    history.add_argument(
        "--threshold", type=float, default=0.05, help="smallest step, relative (default 0.05 = 5%%)"
    )
    history.add_argument("--fail-on-step", action="store_true", help="exit 1 when a step is found")
    history.set_defaults(func=cmd_history)

    merge = sub.add_parser("merge", parents=[common], help="merge CI shards into one run")
    merge.add_argument("shards", nargs="+", help="shard run files (PATH) or history references")
    merge.add_argument("--output", required=True, help="merged run file to write")
    merge.add_argument("--save", metavar="NAME", help="also save the merged run in the history")
    merge.set_defaults(func=cmd_merge)

    add_predict_parser(sub)
    add_fetch_parser(sub)

    # Listed for --help only: main() hands ``plan ...`` and ``doctor ...`` on before parsing.
    sub.add_parser(
        "plan",
        help="print a suite's modeled GPU minutes per case and in total (pytest args follow)",
        add_help=False,
    )
    sub.add_parser(
        "faults",
        help="rerun a suite under each reference-server fault: which tests catch which, and at what "
        "size a missed fault is caught (pytest args follow --)",
        add_help=False,
    )
    sub.add_parser(
        "doctor",
        help="check a GPU runner: NVML, energy counter, GPUs, sglang, torch",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specenergy`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        # doctor parses its own arguments, --help included: argparse's REMAINDER would refuse an
        # option (``--help``, ``--json``) as the first thing after the subcommand.
        from pytest_specenergy.cli.doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv[:1] == ["plan"]:
        from pytest_specenergy.cli.plan import main as plan_main

        return plan_main(argv[1:])
    if argv[:1] == ["faults"]:
        from pytest_specenergy.cli.faults import main as faults_main

        return faults_main(argv[1:])
    args = build_parser().parse_args(argv)
    if getattr(args, "storage_dir", None):
        args.storage = args.storage_dir
    if getattr(args, "metric", None) == []:
        args.metric = ["energy_per_token", "accept_length", "energy_saving", "tbt_ms"]
    try:
        return int(args.func(args))
    except (CliError, storage.StorageError, MergeError, DocumentError) as exc:
        print(f"specenergy {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
