"""The ``specenergy`` command: report, compare, history, merge, predict, fetch-model, doctor. Runs are named as
``--specenergy-compare`` names them: a PATH, or last/NAME/NNNN in the history folder (how:
``docs/report.md``)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from tabulate import tabulate

import pytest_specenergy.gate.storage as storage
from pytest_specenergy.atomic import write_json_atomic
from pytest_specenergy.atomic import write_text_atomic
from pytest_specenergy.cli.compare import add_compare_parser
from pytest_specenergy.cli.fetch import add_fetch_parser
from pytest_specenergy.cli.predict import add_predict_parser
from pytest_specenergy.cli.predict import checked_number
from pytest_specenergy.cli.runs import CliError
from pytest_specenergy.cli.runs import history_of
from pytest_specenergy.cli.runs import limits_of
from pytest_specenergy.cli.runs import output_path
from pytest_specenergy.cli.runs import plan_for
from pytest_specenergy.cli.runs import resolve_run
from pytest_specenergy.document import DocumentError
from pytest_specenergy.gate.baseline import compare_runs
from pytest_specenergy.gate.history import detect_history_steps
from pytest_specenergy.gate.latency import LATENCY_LIMIT
from pytest_specenergy.gate.latency import compare_latency
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.merge import MergeError
from pytest_specenergy.gate.merge import merge_documents
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.options import add_cli_options
from pytest_specenergy.options import storage_folder


def cmd_report(args: argparse.Namespace) -> int:
    """Render a run (optionally against a baseline and with its history) as HTML / Markdown."""
    if not args.html and not args.markdown:
        raise CliError("report needs --html OUT.html and/or --markdown OUT.md")
    store = RunStore(args.storage)
    run, path = resolve_run(args.run, store, args.machine_key)
    comparisons, baseline_path, inputs = None, None, [path]
    if args.baseline:
        baseline, baseline_path = resolve_run(args.baseline, store, args.machine_key)
        inputs.append(baseline_path)
    # Every output checked before anything is written: one refused never leaves the other behind.
    html_out = output_path(args.html, store, *inputs) if args.html else None
    markdown_out = output_path(args.markdown, store, *inputs) if args.markdown else None
    if args.baseline:
        # The gate's own comparison, so a report shows exactly the verdicts a test would get
        # (a record whose checks failed refused), latency targets included.
        plan = plan_for(args, run)
        comparisons = compare_runs(baseline, run, limits_of(args), args.alpha, plan=plan)
        if args.latency_target:
            comparisons += compare_latency(
                baseline.results,
                run.results,
                args.latency_target,
                parse_fail_expr(LATENCY_LIMIT),
                plan,
            )
    if html_out is not None:
        from pytest_specenergy.report.html import render_html

        history = [
            d
            for d in history_of(store, run.machine_key or args.machine_key, path)
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
        write_text_atomic(html_out, html)
        print(f"specenergy: wrote {args.html}")
    if markdown_out is not None:
        from pytest_specenergy.report.markdown import render_markdown

        write_text_atomic(markdown_out, render_markdown(run, comparisons))
        print(f"specenergy: wrote {args.markdown}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """Step detection over the stored runs of one machine key."""
    documents = history_of(RunStore(args.storage), args.machine_key)
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
    """Merge shards of one run (several CI machines) into one run file; a shard saved by an
    interrupted session makes the merged run interrupted, which no reference selects."""
    store = RunStore(args.storage)
    if args.save:
        storage.validate_run_name(args.save)  # refused before the merged file is written
    shards = [resolve_run(ref, store, args.machine_key) for ref in args.shards]
    out = output_path(args.output, store, *(path for _, path in shards))
    merged = merge_documents([doc for doc, _ in shards], [str(path) for _, path in shards])
    write_json_atomic(out, merged.as_dict())
    print(
        f"specenergy: merged {len(shards)} shards ({len(merged.results)} results) into "
        f"{args.output}" + (" (interrupted: a shard was)" if merged.interrupted else "")
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

    add_compare_parser(sub, common)

    history = sub.add_parser("history", parents=[common], help="detect steps across stored runs")
    history.add_argument(
        "storage_dir", nargs="?", type=storage_folder, help="history folder (same as --storage)"
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
