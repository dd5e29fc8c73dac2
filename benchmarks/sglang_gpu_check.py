"""GPU check of the SGLang path: both arms, ngram and a draft model, measured with NVML - the first
day's runbook.

The first thing to run on a GPU runner with SGLang and your own checkpoints: one command, the
models passed by path (or hub id), a printed table, and one JSON (``--facts``, default
``sglang-gpu-check.json``) with every fact issue 37 depends on and whether it held: the doctor's
findings (driver against torch's CUDA, torch, ``import sglang`` and its kernels, NVML), the suite's
planned GPU minutes against ``--budget-minutes`` (15; each order's run is refused at collection
beyond its share), and per order (``--orders resident blocked``: both arms resident on the GPU,
then one at a time) and case: the arms' KV pools (each engine's ``max_total_num_tokens``), the twin
check, retractions, every window's decode time, contamination of the windows, and the engines'
start-up phases. A fact the run document does not carry is "unknown", never "held". Exit 1 when
a fact failed. It writes a small suite (one target,
``ngram`` and ``draft_model`` drafters, optionally ``eagle3``, batch 1 and 16, the code corpus)
and runs it through pytest with ``--specenergy-engine=sglang --specenergy-meter=nvml``, so every
part of the plugin runs for real: launcher, the pinned twin, ``/flush_cache?timeout=``,
counters, step records, the steady-state window whose close aborts every request in flight,
the resolved-configuration twin check between the two live servers, NVML energy and every
validity check. It then prints, per case and arm, J/token, accept length, mean running batch,
and which checks held or tripped, and exits with pytest's status.

Usage (GPU runner; SGLang installed in the interpreter running this, or pass --python):

    PYTHONPATH=. python benchmarks/sglang_gpu_check.py \\
        --model /models/Qwen3-8B --draft-model /models/Qwen3-0.6B \\
        [--eagle3 /models/qwen3-8b-eagle3] [--python /path/to/sglang/python] \\
        [--max-total-tokens 32768] [--engine-option load_format=dummy ...] \\
        [--max-new-tokens 256] [--repeats 3] [--json OUT.json] [--dry-run]

``--max-total-tokens`` pins one KV pool in both arms (default 32768): SGLang 0.5.23 sizes a
STANDALONE/EAGLE engine's pool with the draft's layers too, so unpinned the speculative arm
holds fewer tokens and the twin check fails, saying so. ``--engine-option KEY=VALUE`` passes
any SGLang ``ServerArgs`` field to both arms (``load_format=dummy`` with a checkpoint folder of
only ``config.json`` and the tokenizer measures real shapes without weights).
``--dry-run`` prints both arms' command lines and exits, needing neither GPU nor SGLang.

Exits 2, saying every reason, when NVML sees no GPU or SGLang cannot be found (never a silent
skip); it never reports a GPU figure it did not measure.

**Without SGLang: ``--engine reference``.** The same script, suite shape and table on the repo's
own reference server (HF transformers, eager) with ``random:`` models: seeded random weights of
a dense Qwen3 shape, built on the GPU, nothing downloaded (energy depends on shapes, not
weights). For a GPU machine with torch, transformers and nvidia-ml-py but no SGLang (and no
network), one command::

    PYTHONPATH=. python benchmarks/sglang_gpu_check.py --engine reference

runs ``random:qwen3-4b`` against ``ngram`` and a ``random:qwen3-0.6b`` draft model
(``--model``/``--draft-model`` take any ``random:SHAPE[:layers=N,hidden=N,mlp=N,vocab=N]``, a
``tiny:*`` model or a local checkpoint; a draft needs the target's vocabulary) on
``--device auto`` (CUDA; with no CUDA device it exits 2 rather than fall back to the CPU), with
NVML, at batch 1 and 8 over a pool of 3x the largest batch (24 prompts), 64 new tokens. Its
accept lengths are whatever random weights give (a random model tends to repeat itself, which
ngram exploits; a random draft agrees with a random target by chance): the run checks the path -
engine, NVML, window, checks - not a drafter's worth. The CPU check of this path (modeled meter,
cut-down shapes; ``benchmarks/results/sglang_gpu_check_cpu_check.txt`` has its output and time)::

    PYTHONPATH=. python benchmarks/sglang_gpu_check.py --engine reference --device cpu \\
        --batches 1 2 --prompts 12 --max-new-tokens 32 --repeats 1

``--device cpu`` defaults the models to cut-down shapes
(``random:qwen3-4b:layers=1,hidden=256,mlp=512,vocab=1024`` and the 0.6B one alike) and the meter
to ``modeled:h200``, whose figures are labelled modeled in the table. This path has not yet run
on a GPU: no GPU was lent to the session that wrote it, so there is no CUDA table in
``benchmarks/results/`` yet; on a GPU, record the output there as ``sglang_gpu_check_<gpu>.txt``.
SGLang-only options (``--eagle3``, ``--engine-option``, ``--python``, ``--attention-backend``,
``--max-total-tokens``) do not apply to it; the first two are refused.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_gpu_check_facts import doctor_facts  # noqa: E402
from sglang_gpu_check_facts import fact  # noqa: E402
from sglang_gpu_check_facts import plan_facts  # noqa: E402
from sglang_gpu_check_facts import run_facts  # noqa: E402
from sglang_gpu_check_facts import summary  # noqa: E402

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [
    pytest.mark.model({model!r}, engine="sglang", dtype="bfloat16", max_running_requests=16,
                      resident={resident!r}, **{options!r}),
    pytest.mark.corpus("code"),
    pytest.mark.generation(max_new_tokens={max_new_tokens}, prompts={prompts}),
]


@pytest.mark.drafter(
    Drafter("ngram", num_draft_tokens=8),{drafters}
)
@pytest.mark.batch({batches})
def test_sglang_gpu(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent(min_common_prefix=32)  # bf16 twins may drift late; early tokens must match
"""

REFERENCE_SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [
    pytest.mark.model({model!r}, engine="reference", device={device!r}, max_running_requests={running}),
    pytest.mark.corpus("code"),
    pytest.mark.generation(max_new_tokens={max_new_tokens}, prompts={prompts}),
]


@pytest.mark.drafter(
    Drafter("ngram", num_draft_tokens=8),
    Drafter("draft_model", draft_model={draft!r}, num_draft_tokens=4, id="draft"),
)
@pytest.mark.batch({batches})
def test_reference_gpu(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent(min_common_prefix={prefix})  # bf16 on CUDA may drift late; early tokens must match
"""

#: The reference path's models per device: full shapes on a GPU, cut-down ones for the CPU check.
REFERENCE_MODELS = {
    "cuda": ("random:qwen3-4b", "random:qwen3-0.6b"),
    "cpu": (
        "random:qwen3-4b:layers=1,hidden=256,mlp=512,vocab=1024",
        "random:qwen3-0.6b:layers=1,hidden=256,mlp=512,vocab=1024",
    ),
}


def _sglang_reason(python: str) -> str | None:
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return (
        None
        if done.returncode == 0
        else f"SGLang is not importable by {python}: {done.stderr.strip()[-300:]}"
    )


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    return None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device"


def _gpu_reason() -> str | None:
    from pytest_specenergy.meters.devices import nvml_gpu_count

    try:
        return None if nvml_gpu_count() else "NVML sees no GPU"
    except Exception as exc:  # no library or no driver: NVML raises its own error types
        return f"no NVIDIA GPU is usable here ({exc})"


def _table(document: dict) -> list[str]:
    """Per case and arm what was measured, and per case which checks held."""
    gpus = [
        f"{g.get('name')} {g.get('uuid')}"
        for m in (document.get("machines") or {}).values()
        for g in (m.get("gpus") or [])
        if isinstance(g, dict)
    ]
    rows = [
        f"GPU: {', '.join(dict.fromkeys(gpus)) or 'not recorded'}; meters: "
        f"{', '.join(str(m.get('label', k)) for k, m in (document.get('meters') or {}).items()) or '-'}; "
        f"engine starts: {document.get('engine_starts', '?')}",
        f"{'case':<48} {'arm':<12} {'J/token':>9} {'accept':>7} {'mean bs':>8}  checks",
    ]
    for result in document.get("results", []):
        tripped = [c for c in result.get("checks", []) if isinstance(c, dict)]
        checks = (
            "all held"
            if not tripped
            else ", ".join(f"{c.get('name')} ({c.get('severity', '?')})" for c in tripped)
        )
        for arm in ("baseline", "speculative"):
            record = result.get(arm) or {}
            ept, accept = record.get("energy_per_token"), record.get("accept_length")
            running = (record.get("concurrency") or {}).get("mean_running")
            rows.append(
                f"{result.get('case_id', '?'):<48} {arm:<12} "
                f"{'-' if ept is None else f'{ept:.4f}':>9} "
                f"{'-' if accept is None else f'{accept:.2f}':>7} "
                f"{'-' if running is None else f'{running:.1f}':>8}  "
                f"{checks if arm == 'speculative' else ''}"
            )
        saving = result.get("energy_saving")
        rows.append(f"{'':<48} {'saving':<12} {'-' if saving is None else f'{saving:+.1%}':>9}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        choices=("sglang", "reference"),
        default="sglang",
        help="sglang (default), or reference: the repo's HF-transformers server with random: "
        "shapes, for a GPU machine without SGLang",
    )
    parser.add_argument(
        "--model",
        help="target checkpoint dir or hub id (required with sglang; reference: "
        "default random:qwen3-4b, cut down on --device cpu)",
    )
    parser.add_argument(
        "--draft-model",
        help="draft checkpoint (same tokenizer; required with sglang; "
        "reference: default random:qwen3-0.6b, cut down on --device cpu)",
    )
    parser.add_argument(
        "--eagle3", help="an EAGLE3 head for the target: adds an eagle3 drafter (sglang)"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter with SGLang")
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="reference engine: auto (CUDA; exits 2 without it), cuda, or cpu (the CPU check)",
    )
    parser.add_argument("--meter", help="default nvml; modeled:h200 with --device cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--orders",
        nargs="+",
        choices=("resident", "blocked"),
        default=["resident", "blocked"],
        help="sglang: run the suite with both arms resident on the GPU, one at a time, or both",
    )
    parser.add_argument(
        "--blocked-batches",
        type=int,
        nargs="+",
        default=[16],
        help="sglang: batches of the blocked order's run, NGRAM alone (default 16: every arm "
        "switch restarts an engine, so one drafter at one batch keeps the check within budget)",
    )
    parser.add_argument(
        "--facts",
        type=Path,
        default=Path("sglang-gpu-check.json"),
        help="the one JSON of every fact the first day depends on, and which held",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=15.0,
        help="modeled GPU minutes the whole check may take (each order's run may use what the "
        "earlier plans left; refused at collection beyond)",
    )
    parser.add_argument(
        "--prompts", type=int, help="prompt pool (default: 48; reference: 3 x the largest batch)"
    )
    parser.add_argument("--max-new-tokens", type=int, help="default: 128 sglang, 64 reference")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--attention-backend", default="flashinfer")
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=32768,
        help="KV pool pinned in every arm (0: leave it to the plugin's plan); 32768 holds 16 "
        "requests of 2,048 tokens and fits both arms resident on an H100 with a draft model",
    )
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a ServerArgs field for both arms (JSON value or plain string)",
    )
    parser.add_argument("--json", type=Path, help="where to keep the run document")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print both arms' command lines and exit (no GPU needed)",
    )
    args = parser.parse_args(argv)
    if args.engine == "reference":
        return _reference(parser, args)
    if not args.model or not args.draft_model:
        parser.error(
            "--engine sglang needs --model and --draft-model (checkpoint paths or hub ids)"
        )
    options: dict = {"attention_backend": args.attention_backend}
    if args.max_total_tokens:
        options["max_total_tokens"] = args.max_total_tokens
    for item in args.engine_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--engine-option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    if args.python != sys.executable:
        options["python"] = args.python
    meter = args.meter or "nvml"
    if args.dry_run:
        options.setdefault("sglang_version", "0.5.23")
    else:
        reasons = [r for r in (_gpu_reason(), _sglang_reason(args.python)) if r]
        if reasons:
            for reason in reasons:
                print(f"sglang_gpu_check: cannot run: {reason}", file=sys.stderr)
            print(
                "sglang_gpu_check: SGLang: pip install -e '.[sglang]', or --python an "
                "interpreter that has it; on a GPU machine without SGLang, --engine reference "
                "runs the same check on the reference server with random: shapes",
                file=sys.stderr,
            )
            # The doctor's findings say why, in the one JSON too.
            facts = doctor_facts(_doctor()) + [fact("a GPU and SGLang to run on", False, reasons)]
            _write_facts(args.facts, facts, 2)
            return 2
    eagle3 = (
        ""
        if not args.eagle3
        else f"\n    Drafter('eagle3', draft_model={args.eagle3!r}, "
        "num_steps=3, num_draft_tokens=3, id='eagle3'),"
    )
    if args.dry_run:
        suite = _sglang_suite(args, options, eagle3, None, args.batches)
        return _run(suite, args, "sglang", meter)
    facts = doctor_facts(_doctor())
    status, planned = 0, 0.0
    for order in args.orders:
        # Each run may take what the earlier ones' plans left of the budget.
        budget = max(args.budget_minutes - planned, 0.1)
        batches = args.batches if order == "resident" else args.blocked_batches
        resident = order == "resident"
        suite = _sglang_suite(args, options, eagle3, resident, batches, drafters=resident)
        code, document, plan = _run(suite, args, "sglang", meter, budget=budget, order=order)
        status = status or code
        total = _plan_total(plan)
        planned += total or 0.0
        facts += plan_facts(plan, budget, total) + run_facts(order, document)
    return _write_facts(args.facts, facts, status)


def _sglang_suite(
    args: argparse.Namespace,
    options: dict,
    eagle3: str,
    resident: bool | None,
    batches: list[int],
    drafters: bool = True,
) -> str:
    """The check's suite; ``drafters`` False: NGRAM alone (the blocked order's run)."""
    draft = f"\n    Drafter('draft_model', draft_model={args.draft_model!r}, num_draft_tokens=4, id='draft'),"
    return SUITE.format(
        model=args.model,
        drafters=(draft + eagle3) if drafters else "",
        options=options,
        resident=resident,
        max_new_tokens=args.max_new_tokens or 128,
        prompts=args.prompts or 48,
        batches=", ".join(map(str, batches)),
    )


def _doctor() -> list[dict]:
    """``specenergy doctor``'s findings on this machine (its NVML, torch, SGLang)."""
    from dataclasses import asdict

    from pytest_specenergy.cli.doctor import run_checks

    return [asdict(f) for f in run_checks()]


def _plan_total(lines: list[str]) -> float | None:
    """The worst-case total of a printed plan (``total: A ..., B if every ...``)."""
    for line in lines:
        if line.startswith("total: ") and " if every" in line:
            return float(line.split(", ")[1].split(" ")[0])
    return None


def _write_facts(path: Path, facts: list[dict], status: int) -> int:
    """The one JSON, the held/failed lines, and the exit status (1 when a fact failed)."""
    record = {"summary": summary(facts), "facts": facts}
    path.write_text(json.dumps(record, indent=2, default=str))
    for item in facts:
        mark = {True: "held", False: "FAILED", None: "unknown"}[item["held"]]
        print(f"[{mark:^7}] {item['fact']}")
    print(f"sglang_gpu_check: wrote {path}: {json.dumps(record['summary'])}")
    return status or (1 if record["summary"]["failed"] else 0)


def _reference(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The reference server's path: the same suite shape and table, random: models, no SGLang."""
    for flag, given in (("--eagle3", args.eagle3), ("--engine-option", args.engine_option)):
        if given:
            parser.error(
                f"{flag} is for --engine sglang; the reference server runs ngram and draft_model"
            )
    device = args.device
    if device == "auto":
        reason = _cuda_reason()
        if reason and not args.dry_run:
            print(
                f"sglang_gpu_check: cannot run: --device auto wants CUDA and {reason}; --device "
                "cpu runs the CPU check (cut-down shapes, modeled meter)",
                file=sys.stderr,
            )
            return 2
        device = "cuda"
    meter = args.meter or ("modeled:h200" if device == "cpu" else "nvml")
    if not args.dry_run:
        reasons = [
            r
            for r in (
                (_cuda_reason() if device == "cuda" else None),
                (_gpu_reason() if meter == "nvml" else None),
            )
            if r
        ]
        if reasons:
            for reason in reasons:
                print(f"sglang_gpu_check: cannot run: {reason}", file=sys.stderr)
            return 2
    model, draft = REFERENCE_MODELS[device]
    max_new_tokens = args.max_new_tokens or 64
    suite = REFERENCE_SUITE.format(
        model=args.model or model,
        draft=args.draft_model or draft,
        device=device,
        running=max(16, max(args.batches)),
        max_new_tokens=max_new_tokens,
        prompts=args.prompts or 3 * max(args.batches),
        batches=", ".join(map(str, args.batches)),
        prefix=min(32, max_new_tokens),
    )
    print(
        f"sglang_gpu_check: reference engine (HF transformers, eager) on {device}, target "
        f"{args.model or model}, draft {args.draft_model or draft}, meter {meter}",
        file=sys.stderr,
    )
    return _run(suite, args, "reference", meter)


def _run(
    suite_text: str,
    args: argparse.Namespace,
    engine: str,
    meter: str,
    budget: float | None = None,
    order: str | None = None,
) -> Any:
    """Run the suite through pytest and print the table: pytest's exit status, or with ``order``
    (exit status, run document, plan lines)."""
    with tempfile.TemporaryDirectory(prefix="sglang-gpu-check-") as tmp:
        suite = Path(tmp) / "test_sglang_gpu_check.py"
        suite.write_text(suite_text)
        out = args.json or Path(tmp) / "run.json"
        if order is not None:
            out = out.with_name(f"{out.stem}-{order}{out.suffix}")
        if args.dry_run:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    str(suite),
                    "-p",
                    "no:cacheprovider",
                    f"--specenergy-engine={engine}",
                    "--specenergy-dry-run",
                    "-q",
                ],
                cwd=tmp,
            )
            return done.returncode
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(suite),
                "-p",
                "no:cacheprovider",
                f"--specenergy-engine={engine}",
                f"--specenergy-meter={meter}",
                f"--specenergy-repeats={args.repeats}",
                f"--specenergy-json={out}",
                *([f"--specenergy-budget={budget:g}"] if budget else []),
                "-rA",
            ],
            cwd=tmp,
            capture_output=order is not None,
            text=True,
        )
        document = json.loads(out.read_text()) if out.exists() else None
        if order is not None:
            print(done.stdout[-20000:], end="")
            print(done.stderr[-5000:], end="", file=sys.stderr)
        if document is not None:
            print("\n".join(_table(document)))
        else:
            print("sglang_gpu_check: pytest wrote no run document", file=sys.stderr)
    if order is None:
        return done.returncode
    plan = [
        line
        for line in (done.stdout or "").splitlines()
        if line.startswith(("specenergy plan", "total: "))
    ]
    return done.returncode, document, plan


if __name__ == "__main__":
    sys.exit(main())
