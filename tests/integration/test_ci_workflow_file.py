"""example_suites/ci_gate/specenergy-gate.yml as a team would run it, read and checked: SGLang
pinned, the history kept durably, pull requests gated by in-job A/B, the nightly failing on a
detected step, pull requests from forks never on the self-hosted GPU runner, and each job's planned
GPU minutes within its budget and its budget within its timeout."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_specenergy.engines import sglang_args as sa

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "example_suites" / "ci_gate" / "specenergy-gate.yml"
#: Minutes a job spends outside the suite: install, doctor, checkpoint fetch, reports.
SETUP_MINUTES = 20


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _runs(job: dict) -> list[tuple[dict, str]]:
    return [(step, step["run"]) for step in job["steps"] if "run" in step]


def _pytest_step(job: dict) -> tuple[dict, str]:
    [found] = [(s, r) for s, r in _runs(job) if r.lstrip().startswith(".venv/bin/pytest")]
    return found


def test_sglang_is_pinned_to_the_release_the_plugin_parses(workflow):
    pin = workflow["env"]["SGLANG"]
    assert pin == f"sglang=={sa.format_version(sa.NEWEST_READ)}"
    for job in workflow["jobs"].values():
        installs = [r for _, r in _runs(job) if "pip install" in r]
        assert installs and all('"$SGLANG"' in r for r in installs), installs


def test_the_history_is_kept_on_a_branch_not_only_in_a_runner_cache(workflow):
    text = WORKFLOW.read_text()
    assert "actions/cache" not in text
    nightly = workflow["jobs"]["nightly"]
    runs = "\n".join(r for _, r in _runs(nightly))
    assert "git clone --quiet --branch specenergy-history" in runs
    assert "HEAD:specenergy-history" in runs and "git push" in runs
    assert nightly["permissions"] == {"contents": "write"}
    assert workflow["permissions"] == {"contents": "read"}


def test_pull_requests_are_gated_by_in_job_ab_not_a_stored_run(workflow):
    step, run = _pytest_step(workflow["jobs"]["gate"])
    assert step["env"]["SPECENERGY_AB"] == "1"
    assert "--specenergy-compare=" not in run and "--specenergy-compare-fail=energy:5%" in run
    # With SPECENERGY_AB=1 every collected case carries a reference arm (ids "-vs-").
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "example_suites/ci_gate",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--specenergy-sglang-version=0.5.23",
            "--specenergy-dry-run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "SPECENERGY_AB": "1"},
    )
    ids = [line for line in done.stdout.splitlines() if "::test_" in line]
    assert len(ids) == 6 and all("-vs-" in i for i in ids), done.stdout[-2000:]


def test_the_nightly_fails_on_a_detected_step(workflow):
    steps = workflow["jobs"]["nightly"]["steps"]
    [step] = [s for s in steps if "specenergy history" in s.get("run", "")]
    assert "--fail-on-step" in step["run"]
    assert not step.get("continue-on-error") and step.get("if") in (None, "success()")
    # It runs after the history is pushed: a step found is kept in the history too.
    order = [s.get("name", "") for s in steps]
    assert order.index("Push the run history") < order.index(step["name"])


def test_pull_requests_from_forks_never_run_on_the_self_hosted_runner(workflow):
    assert "pull_request_target" not in workflow[True]  # yaml reads "on" as True
    for name, job in workflow["jobs"].items():
        if "self-hosted" not in job["runs-on"]:
            continue
        guard = job.get("if", "")
        runs_on_prs = "github.event_name != 'pull_request'" not in guard
        if runs_on_prs:
            assert "github.event.pull_request.head.repo.full_name == github.repository" in guard, (
                name
            )


def _plan_total(command: str, env: dict[str, str], hf_cache: Path) -> float:
    """The plan's worst-case total of a workflow pytest/specenergy-plan command, run here."""
    argv = shlex.split(command.replace("\\\n", " "))
    args = [
        a
        for a in argv[1:]
        if not a.startswith(("--specenergy-json", "--junitxml", "--specenergy-log-dir"))
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--specenergy-plan",
            "--specenergy-sglang-version=0.5.23",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env, "HF_HUB_CACHE": str(hf_cache)},
    )
    totals = [line for line in done.stdout.splitlines() if line.startswith("total: ")]
    assert len(totals) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    total = totals[0]
    return float(re.search(r", ([\d.]+) if every", total).group(1))


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory) -> Path:
    """The runner's Hugging Face cache after the workflow's fetch step: the checkpoints' configs
    (what the residency decision reads; the weights' size comes from weights_gb=)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from pool_capacity import CHECKPOINTS
    finally:
        sys.path.pop(0)
    root = tmp_path_factory.mktemp("hf")
    for repo, name in (
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("Tengyunw/qwen3_8b_eagle3", "qwen3-8b-eagle3"),
    ):
        folder = root / ("models--" + repo.replace("/", "--")) / "snapshots" / "a"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(CHECKPOINTS[name][0]))
    return root


@pytest.mark.parametrize("job", ["gate", "nightly"])
def test_each_jobs_plan_fits_its_budget_and_the_budget_its_timeout(workflow, hf_cache, job):
    step, run = _pytest_step(workflow["jobs"][job])
    budget = float(re.search(r"--specenergy-budget=([\d.]+)", run).group(1))
    worst = _plan_total(run, step.get("env", {}), hf_cache)
    timeout = workflow["jobs"][job]["timeout-minutes"]
    assert worst <= budget, (job, worst, budget)
    assert budget + SETUP_MINUTES <= timeout, (job, budget, timeout)
    # The plan step prints the same plan, with the same budget.
    [plan] = [r for _, r in _runs(workflow["jobs"][job]) if "specenergy plan" in r]
    assert f"--specenergy-budget={budget:g}" in plan


def test_the_nightly_saves_main_only_when_its_checks_held(workflow):
    # Issue 42 item 1 (audit 3, T32): a nightly whose checks failed must never become main.
    steps = workflow["jobs"]["nightly"]["steps"]
    step, run = _pytest_step(workflow["jobs"]["nightly"])
    assert "--specenergy-save=main" in run and "--specenergy-checks=warn" not in run
    assert not step.get("continue-on-error") and step.get("if") in (None, "success()")
    [push] = [s for s in steps if s.get("name") == "Push the run history"]
    assert push.get("if") == "success()" and not push.get("continue-on-error")
    order = [s.get("name", "") for s in steps]
    assert order.index(step["name"]) < order.index("Push the run history")
