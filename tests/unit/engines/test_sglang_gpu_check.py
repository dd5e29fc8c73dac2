"""benchmarks/sglang_gpu_check.py as a GPU runner's user meets it, short of the GPU itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _checkpoint(path: Path) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    return str(path)


def test_dry_run_prints_both_arms_with_the_kv_pool_pinned(sglang_gpu_check, tmp_path, capfd):
    target, draft = _checkpoint(tmp_path / "target"), _checkpoint(tmp_path / "draft")
    code = sglang_gpu_check.main(
        [
            "--model",
            target,
            "--draft-model",
            draft,
            "--eagle3",
            draft,
            "--dry-run",
            "--engine-option",
            "load_format=dummy",
        ]
    )
    out = capfd.readouterr().out
    assert code == 0, out
    for algorithm in ("NGRAM", "STANDALONE", "EAGLE3"):
        assert f"--speculative-algorithm {algorithm}" in out
    baselines = [line for line in out.splitlines() if line.startswith("baseline:")]
    assert baselines and all(
        "--max-total-tokens 32768" in line and "--load-format dummy" in line for line in baselines
    )
    assert "MISMATCH" not in out


def test_a_bad_engine_option_is_refused(sglang_gpu_check, tmp_path):
    with pytest.raises(SystemExit):
        sglang_gpu_check.main(
            ["--model", "m", "--draft-model", "d", "--engine-option", "novalue", "--dry-run"]
        )


def test_the_table_says_which_checks_held(sglang_gpu_check):
    document = {
        "engine_starts": 3,
        "meters": {"nvml": {"label": "nvml"}},
        "machines": {"k": {"gpus": [{"name": "NVIDIA H200", "uuid": "GPU-1"}]}},
        "results": [
            {
                "case_id": "code-ngram-b1",
                "checks": [],
                "energy_saving": 0.12,
                "baseline": {"energy_per_token": 0.5},
                "speculative": {"energy_per_token": 0.44, "accept_length": 2.5},
            },
            {
                "case_id": "code-draft-b8",
                "energy_saving": -0.1,
                "checks": [{"name": "twin-differs", "severity": "fail"}],
                "baseline": {},
                "speculative": {},
            },
        ],
    }
    text = "\n".join(sglang_gpu_check._table(document))
    assert "NVIDIA H200 GPU-1" in text and "engine starts: 3" in text
    assert "all held" in text and "twin-differs (fail)" in text and "+12.0%" in text


def test_the_runbook_reads_the_plans_total_and_writes_one_json(sglang_gpu_check, tmp_path, capsys):
    lines = ["specenergy plan: ...", "total: 4.2 GPU minutes at the first look, 6.1 if every gated"]
    assert sglang_gpu_check._plan_total(lines) == 6.1
    assert sglang_gpu_check._plan_total(["specenergy plan: no GPU case collected"]) is None
    facts = [
        {"fact": "a", "held": True, "detail": 1},
        {"fact": "b", "held": None, "detail": "not read"},
    ]
    out = tmp_path / "facts.json"
    assert sglang_gpu_check._write_facts(out, facts, 0) == 0
    record = json.loads(out.read_text())
    assert record["summary"] == {"held": 1, "failed": [], "unknown": ["b"]}
    assert "[ held  ] a" in capsys.readouterr().out
    assert sglang_gpu_check._write_facts(out, [{"fact": "c", "held": False, "detail": 0}], 0) == 1


def test_without_a_gpu_it_exits_2_and_the_json_says_why_with_the_doctors_findings(
    sglang_gpu_check, tmp_path
):
    if sglang_gpu_check._gpu_reason() is None:
        pytest.skip("this machine has a GPU: the check would run")
    out = tmp_path / "facts.json"
    code = sglang_gpu_check.main(["--model", "m", "--draft-model", "d", "--facts", str(out)])
    assert code == 2
    record = json.loads(out.read_text())
    names = {f["fact"]: f for f in record["facts"]}
    assert names["a GPU and SGLang to run on"]["held"] is False
    doctor = names["doctor passes (driver, torch CUDA, sglang, kernels, NVML)"]
    assert doctor["held"] is False and any(line.startswith("nvml:") for line in doctor["detail"])
