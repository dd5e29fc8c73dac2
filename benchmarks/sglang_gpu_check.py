"""GPU check of the SGLang path: both arms, ngram and a draft model, measured with NVML.

For the day a runner with an NVIDIA GPU and SGLang is available. It writes a small suite
(one target, ``ngram`` and ``draft_model`` drafters, batch 1 and 8, the code corpus) and runs
it through pytest with ``--specenergy-engine=sglang --specenergy-meter=nvml``, so every part of
the plugin runs for real: launcher, the pinned twin, ``/flush_cache``, counters, step records,
the steady-state window ending with ``/abort_request``, the resolved-configuration twin check,
NVML energy and the checks. It then prints, per case and arm, J/token, accept length, mean
running batch and the checks that tripped, and exits with pytest's status.

Usage (GPU runner; SGLang installed in the interpreter running this, or pass --python):

    PYTHONPATH=. python benchmarks/sglang_gpu_check.py \\
        --model Qwen/Qwen3-8B --draft-model Qwen/Qwen3-0.6B [--python /path/to/sglang/python] \\
        [--max-new-tokens 256] [--repeats 3] [--json OUT.json]

Exits 2, saying why, when NVML sees no GPU or SGLang cannot be found; it never reports a
GPU figure it did not measure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [
    pytest.mark.model({model!r}, engine="sglang", dtype="bfloat16", max_running_requests=16,
                      **{options!r}),
    pytest.mark.corpus("code"),
    pytest.mark.generation(max_new_tokens={max_new_tokens}, prompts=48),
]


@pytest.mark.drafter(
    Drafter("ngram", num_draft_tokens=8),
    Drafter("draft_model", draft_model={draft!r}, num_draft_tokens=4, id="draft"),
)
@pytest.mark.batch(1, 8)
def test_sglang_gpu(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent(min_common_prefix=32)  # bf16 twins may drift late; early tokens must match
"""


def _sglang_reason(python: str) -> str | None:
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return None if done.returncode == 0 else f"SGLang is not importable by {python}: {done.stderr.strip()[-300:]}"


def _gpu_reason() -> str | None:
    from pytest_specenergy.meters.devices import nvml_gpu_count

    try:
        return None if nvml_gpu_count() else "NVML sees no GPU"
    except Exception as exc:  # no library or no driver: NVML raises its own error types
        return f"no NVIDIA GPU is usable here ({exc})"


def _table(document: dict) -> list[str]:
    rows = [f"{'case':<48} {'arm':<12} {'J/token':>9} {'accept':>7} {'mean bs':>8}  checks"]
    for result in document.get("results", []):
        checks = ", ".join(c["name"] for c in result.get("checks", [])) or "-"
        for arm in ("baseline", "speculative"):
            record = result.get(arm) or {}
            ept, accept = record.get("energy_per_token"), record.get("accept_length")
            running = (record.get("concurrency") or {}).get("mean_running")
            rows.append(f"{result.get('case_id', '?'):<48} {arm:<12} "
                        f"{'-' if ept is None else f'{ept:.4f}':>9} "
                        f"{'-' if accept is None else f'{accept:.2f}':>7} "
                        f"{'-' if running is None else f'{running:.1f}':>8}  {checks if arm == 'speculative' else ''}")
        saving = result.get("energy_saving")
        rows.append(f"{'':<48} {'saving':<12} {'-' if saving is None else f'{saving:+.1%}':>9}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="target checkpoint dir or hub id")
    parser.add_argument("--draft-model", required=True, help="draft checkpoint (same tokenizer)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with SGLang")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention-backend", default="flashinfer")
    parser.add_argument("--json", type=Path, help="where to keep the run document")
    args = parser.parse_args(argv)
    for reason in (_gpu_reason(), _sglang_reason(args.python)):
        if reason:
            print(f"sglang_gpu_check: cannot run: {reason}", file=sys.stderr)
            return 2
    options = {"attention_backend": args.attention_backend}
    if args.python != sys.executable:
        options["python"] = args.python
    with tempfile.TemporaryDirectory(prefix="sglang-gpu-check-") as tmp:
        suite = Path(tmp) / "test_sglang_gpu_check.py"
        suite.write_text(SUITE.format(model=args.model, draft=args.draft_model, options=options,
                                      max_new_tokens=args.max_new_tokens))
        out = args.json or Path(tmp) / "run.json"
        done = subprocess.run([sys.executable, "-m", "pytest", str(suite), "-p", "no:cacheprovider",
                               "--specenergy-engine=sglang", "--specenergy-meter=nvml",
                               f"--specenergy-repeats={args.repeats}", f"--specenergy-json={out}",
                               "-rA"], cwd=tmp)
        if out.exists():
            print("\n".join(_table(json.loads(out.read_text()))))
        else:
            print("sglang_gpu_check: pytest wrote no run document", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
