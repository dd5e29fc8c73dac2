"""The test-only SGLang CPU overlay (``tests/sglang_overlay/``): each op against SGLang's own
reference, where it loads and where it refuses, and that the plugin never depends on it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from sglang_envs import ENV_ROOT
from sglang_envs import NEWEST
from sglang_envs import OLDEST
from sglang_envs import REPO
from sglang_envs import _locked
from sglang_envs import sglang_python

OVERLAY = REPO / "tests" / "sglang_overlay"
CHECK = OVERLAY / "reference_check.py"
sys.path.insert(0, str(OVERLAY))
import specenergy_sglang_overlay as overlay  # noqa: E402


def _sources_key() -> str:
    """A hash of every overlay source and the check: the cached answer is reused only while all
    of them are unchanged."""
    digest = hashlib.sha256(NEWEST.encode())
    for path in sorted(OVERLAY.rglob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:20]


@pytest.fixture(scope="module")
def reference_report() -> dict[str, Any]:
    """``reference_check.py``'s report, run once in the 0.5.23 environment (Triton's interpreter
    runs SGLang's kernels on the CPU; about 15 s of CPU) and cached on disk by source hash."""
    python = sglang_python(NEWEST)
    cache = ENV_ROOT / "worker-cache" / f"overlay-{_sources_key()}.json"
    with _locked(cache.with_suffix(".lock")):
        if not cache.exists():
            env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
            env.pop("SGLANG_USE_CPU_ENGINE", None)  # SGLang's GPU-side Triton kernels are wanted
            done = subprocess.run(
                [str(python), str(CHECK)], capture_output=True, text=True, timeout=600, env=env
            )
            if done.returncode != 0:
                pytest.fail(f"reference_check.py failed:\n{done.stderr[-4000:]}", pytrace=False)
            json.loads(done.stdout)  # a truncated answer must not be cached
            cache.write_text(done.stdout)
    return json.loads(cache.read_text())


def test_every_op_matches_sglangs_own_reference_on_random_inputs(reference_report):
    ops = reference_report["ops"]
    assert set(ops) == set(overlay.OPS) | {"TorchNativeAttnBackend TARGET_VERIFY"}, ops
    for name, result in ops.items():
        assert result["mismatches"] == 0, (name, result)
        # every case made SGLang's kernel write something (the attention: a real tree, not only
        # chains, in some cases): equal outputs are not two no-ops
        assert result["cases"] >= 10 and result["changed"] >= 3, (name, result)


def test_the_reference_check_catches_a_broken_op(reference_report):
    # Each op with one plausible bug (reference_check.py's mutants) must be reported.
    mutants = reference_report["mutants"]
    assert set(overlay.OPS) <= set(mutants), mutants
    assert {"TARGET_VERIFY causal-only", "TARGET_VERIFY short-prefix"} <= set(mutants)
    assert all(mismatches > 0 for mismatches in mutants.values()), mutants


def test_activation_puts_the_ops_where_sglang_reads_them(reference_report):
    activation = reference_report["activation"]
    assert activation["ops_installed"] == dict.fromkeys(overlay.OPS, True), activation
    assert activation["forward_extend_patched"] is True, activation
    assert "sglang_standins" in activation["standin"], activation


def test_it_loads_only_into_a_speculative_server_and_its_children():
    spec = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--speculative-algorithm"]
    assert overlay.wanted([*spec, "NGRAM"], {})
    assert overlay.wanted(
        ["python", "-m", "sglang.launch_server", "--speculative-algorithm=NGRAM"], {}
    )
    assert not overlay.wanted(["python", "-m", "sglang.launch_server", "--model-path", "m"], {})
    assert not overlay.wanted(["python", "-m", "pip", "--speculative-algorithm", "x"], {})
    # the plugin's watchdog holds the server's command line after "--"; it is not the server
    watchdog = ["python", "-m", "pytest_specenergy.engines.watchdog", "--parent", "1", "--"]
    assert not overlay.wanted([*watchdog, *spec, "NGRAM"], {})
    # a child process (the scheduler) inherits the flag its server set
    assert overlay.wanted(["python", "-c", "spawn_main()"], {overlay.ACTIVE_ENV: "1"})
    assert not overlay.wanted(["python", "-c", "spawn_main()"], {})


def test_it_refuses_any_other_sglang_release():
    overlay.check_version("0.5.23")
    for other in ("0.5.22", "0.5.24", "0.6.0", "0.5.23.post1"):
        with pytest.raises(overlay.OverlayRefused, match=f"refuses SGLang {other}"):
            overlay.check_version(other)


def test_a_process_of_another_release_exits_with_the_reason():
    # Real SGLang 0.5.9 (the parser environment), the overlay on the path and activated: the
    # interpreter must stop at start-up, saying why, not run half-patched.
    python = sglang_python(OLDEST)
    env = dict(os.environ, PYTHONPATH=str(OVERLAY), **{overlay.ACTIVE_ENV: "1"})
    done = subprocess.run(
        [str(python), "-c", "print('ran')"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode != 0 and "ran" not in done.stdout, done
    assert "refused to load" in done.stderr and "refuses SGLang 0.5.9" in done.stderr, done.stderr
    # the same process without the activation runs: the overlay on the path alone changes nothing
    env.pop(overlay.ACTIVE_ENV)
    plain = subprocess.run(
        [str(python), "-c", "print('ran')"], capture_output=True, text=True, env=env, timeout=120
    )
    assert plain.returncode == 0 and plain.stdout.strip() == "ran", plain


def test_the_plugin_never_imports_the_overlay():
    package = REPO / "pytest_specenergy"
    for path in package.rglob("*.py"):
        text = path.read_text()
        for name in ("specenergy_sglang_overlay", "sglang_overlay"):
            assert name not in text, f"{path.relative_to(REPO)} names {name}"
