"""benchmarks/sglang_gpu_check.py --engine reference: the GPU check without SGLang, run here on CPU.

End to end with the smallest shapes (about 20 s on 2 cores): the same script, suite and table
as the SGLang path, through pytest and the plugin, on the reference server with ``random:``
models and the modeled meter. The CUDA path itself needs a GPU and is not run here.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALLEST = "random:qwen3-0.6b:layers=1,hidden=64,mlp=128,vocab=512"


def test_the_reference_path_runs_end_to_end_on_cpu_and_prints_the_table(
    sglang_gpu_check, tmp_path, capfd
):
    out = tmp_path / "run.json"
    code = sglang_gpu_check.main(
        [
            "--engine",
            "reference",
            "--device",
            "cpu",
            "--model",
            SMALLEST,
            "--draft-model",
            SMALLEST,
            "--batches",
            "1",
            "--prompts",
            "4",
            "--max-new-tokens",
            "8",
            "--repeats",
            "1",
            "--json",
            str(out),
        ]
    )
    captured = capfd.readouterr()
    assert code == 0, captured.out[-3000:] + captured.err[-3000:]
    assert "reference engine (HF transformers, eager) on cpu" in captured.err
    table = captured.out[captured.out.index("GPU: ") :]
    assert "meters: modeled (h200" in table  # the modeled meter, labelled as such: no GPU figure
    for case in ("code-ngram-b1", "code-draft-b1"):
        assert any(line.startswith(case) and "speculative" in line for line in table.splitlines())
    assert "(fail)" not in table
    document = json.loads(out.read_text())
    assert {r["case_id"] for r in document["results"]} == {"code-ngram-b1", "code-draft-b1"}
    assert all(
        r["baseline"]["energy_per_token"] > 0 and r["speculative"]["accept_length"] >= 1
        for r in document["results"]
    )


def test_sglang_asked_for_but_not_installed_fails_saying_so(sglang_gpu_check, tmp_path, capfd):
    python = tmp_path / "python-without-sglang"
    python.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'sglang'\" >&2\nexit 1\n"
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    code = sglang_gpu_check.main(["--model", "m", "--draft-model", "d", "--python", str(python)])
    captured = capfd.readouterr()
    assert code == 2 and "GPU: " not in captured.out  # no table, no figure
    assert f"cannot run: SGLang is not importable by {python}" in captured.err
    assert "No module named 'sglang'" in captured.err and "--engine reference" in captured.err


def test_device_auto_without_cuda_refuses_rather_than_fall_back_to_the_cpu(
    sglang_gpu_check, monkeypatch, capfd
):
    monkeypatch.setattr(sglang_gpu_check, "_cuda_reason", lambda: "torch 2.x sees no CUDA device")
    assert sglang_gpu_check.main(["--engine", "reference"]) == 2
    err = capfd.readouterr().err
    assert (
        "--device auto wants CUDA and torch 2.x sees no CUDA device" in err
        and "--device cpu" in err
    )


def test_cuda_without_nvml_refuses(sglang_gpu_check, monkeypatch, capfd):
    monkeypatch.setattr(sglang_gpu_check, "_cuda_reason", lambda: None)
    monkeypatch.setattr(sglang_gpu_check, "_gpu_reason", lambda: "NVML sees no GPU")
    assert sglang_gpu_check.main(["--engine", "reference", "--device", "cuda"]) == 2
    assert "cannot run: NVML sees no GPU" in capfd.readouterr().err


# sglang needs both models
@pytest.mark.parametrize(
    "argv",
    [
        ["--engine", "reference", "--eagle3", "head"],
        ["--engine", "reference", "--engine-option", "load_format=dummy"],
        ["--model", "m"],
    ],
)
def test_options_that_do_not_apply_are_refused(sglang_gpu_check, argv):
    with pytest.raises(SystemExit):
        sglang_gpu_check.main(argv)


def test_dry_run_prints_the_reference_arms_with_random_shapes(sglang_gpu_check, capfd):
    code = sglang_gpu_check.main(
        ["--engine", "reference", "--device", "cpu", "--dry-run", "--batches", "1"]
    )
    out = capfd.readouterr().out
    assert code == 0, out
    assert "random:qwen3-4b:layers=1" in out and "random:qwen3-0.6b:layers=1" in out


def test_the_cpu_check_output_is_kept_with_its_command():
    text = (ROOT / "benchmarks" / "results" / "sglang_gpu_check_cpu_check.txt").read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any("sglang_gpu_check.py --engine reference --device cpu" in line for line in header)
    assert "meters: modeled" in text and "no gpu" in header[0].lower()
