"""The reference backend's command line: CPU threads per server."""

from __future__ import annotations

from pytest_specenergy.engines.argv import describe_pair_difference
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.refserver import ReferenceBackend


def _threads(model: str, device: str) -> str | None:
    argv = ReferenceBackend().command(
        EngineConfig(engine="reference", model=model, device=device), "127.0.0.1", 1
    )
    return argv[argv.index("--threads") + 1] if "--threads" in argv else None


def test_tiny_models_on_cpu_run_one_thread_and_checkpoints_split_the_cores(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert _threads("tiny:hybrid", "cpu") == "1"
    assert _threads("/ckpt", "cpu") is None
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert _threads("/ckpt", "cpu") == "4"
    assert _threads("tiny:dense", "cuda") is None


def test_the_baseline_twin_runs_only_the_faults_that_reach_a_non_speculative_engine():
    from pytest_specenergy.engines.drafters import Drafter
    from pytest_specenergy.refserver.faults import FAULTS

    spec = EngineConfig(
        engine="reference", model="tiny:hybrid", drafter=Drafter("ngram"), faults=tuple(FAULTS)
    )
    base = ReferenceBackend().command(spec.twin(), "127.0.0.1", 1)
    # it perturbs the target
    assert [base[i + 1] for i, a in enumerate(base) if a == "--fault"] == ["numerical-noise"]
    # The dry run calls the faults the twin lacks speculative, not a broken pair.
    differs = describe_pair_difference(ReferenceBackend().command(spec, "127.0.0.1", 1), base)
    assert differs and not [line for line in differs if line.startswith("MISMATCH")], differs
    # A speculative-only fault leaves the twin the healthy case's own: the two share one baseline
    # engine and arm.
    healthy = EngineConfig(engine="reference", model="tiny:hybrid", drafter=Drafter("ngram"))
    assert (
        EngineConfig(
            engine="reference",
            model="tiny:hybrid",
            drafter=Drafter("ngram"),
            faults=("partial-accept-state",),
        ).twin()
        == healthy.twin()
    )


def test_cpu_servers_wait_passively_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    backend = ReferenceBackend()
    cpu = EngineConfig(engine="reference", model="/ckpt", device="cpu")
    assert backend.environment(cpu)["OMP_WAIT_POLICY"] == "PASSIVE"
    gpu = EngineConfig(engine="reference", model="/ckpt", device="cuda")
    assert "OMP_WAIT_POLICY" not in backend.environment(gpu)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert "OMP_WAIT_POLICY" not in backend.environment(cpu)  # os.environ's value stands


def test_the_aa_control_runs_a_second_process_of_the_baseline_engine():
    """Issue 41 item 6: ``Drafter("none")`` was refused on the reference engine, so the CPU path
    had no noise floor. Its "speculative" engine is its own config (a second process), started
    with the baseline's command line."""
    from pytest_specenergy.engines.drafters import Drafter

    spec = EngineConfig(engine="reference", model="tiny:dense", drafter=Drafter("none"))
    ReferenceBackend().check(spec)
    assert spec != spec.twin()
    command = ReferenceBackend().command
    assert command(spec, "127.0.0.1", 1) == command(spec.twin(), "127.0.0.1", 1)
