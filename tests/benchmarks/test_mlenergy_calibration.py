"""benchmarks/mlenergy_calibration.py: the presets are the fit to ML.ENERGY's measured H100 runs,
every fitted run lies within 25%, and predict keeps the paper's four s.9 crossovers (issue 41,
item 5)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import mlenergy_calibration as cal  # noqa: E402  (a benchmark script, not a package)

from pytest_specenergy.meters.roofline import PRESETS  # noqa: E402


def test_the_package_presets_are_the_fit_and_the_script_passes(capsys) -> None:
    assert cal.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "OK: pytest_specenergy/meters/calibration.py matches this fit" in out
    assert "MOVED" not in out.split("after:")[1]


def test_every_published_batch_up_to_256_is_within_25_percent() -> None:
    runs = [r for r in cal.load_runs() if r.task == cal.FIT_TASK]
    assert {r.model.split("/")[-1] for r in runs} == {"Qwen3-8B", "Llama-3.1-8B-Instruct"}
    assert sorted({r.batch for r in runs}) == [8, 16, 32, 64, 96, 128, 192, 256]
    for run in runs:
        ratio = run.joules_per_token / cal.price_run(run, PRESETS["h100"]).joules_per_token
        assert 1 / 1.25 <= ratio <= 1.25, (run.model, run.batch, ratio)
        # The uncalibrated presets were 1.5-2.1x optimistic on the same runs.
        before = (
            run.joules_per_token / cal.price_run(run, cal.UNCALIBRATED["h100"]).joules_per_token
        )
        assert before > 1.45, (run.model, run.batch, before)


def test_a_steady_state_step_reads_the_weights_once() -> None:
    run = next(r for r in cal.load_runs() if r.batch == 64 and r.task == cal.FIT_TASK)
    work = cal.step_work(run)
    shape = run.shape
    # Layer weights + lm_head once (the untied embedding table is not read whole), plus one
    # embedding row per token: the rows decoded and the prompts prefilled in the step.
    tokens = run.rows + run.rows / run.output_tokens * cal.PROMPT_TOKENS
    weights = (shape.num_params - shape.embed_params + tokens * shape.hidden) * shape.dtype_bytes
    assert math.isclose(work.weight_bytes, weights, rel_tol=1e-6)
    # Every row reads its context's K and V and writes one token's; prefills write their prompts'.
    assert (
        work.kv_bytes > run.rows * (run.context(cal.PROMPT_TOKENS) + 1) * shape.kv_bytes_per_token
    )
