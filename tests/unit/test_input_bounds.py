"""Every input bounded or checked where it enters, as the options already are (issue 42 item 5;
audit 3, N8/T28, T16, T22, T36): the marker's prompt pool, a huge file named like a run, non-string
list items of an SGLang option, residency's memory share."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_specenergy.cases.case import MAX_POOL
from pytest_specenergy.cases.markers import CaseDefaults
from pytest_specenergy.cases.markers import MarkerError
from pytest_specenergy.cases.markers import build_cases
from pytest_specenergy.engines import sglang_args as sa
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.sglang_residency import decide
from pytest_specenergy.engines.sglang_residency import weights_bytes
from pytest_specenergy.gate.storage import MAX_RUN_FILE_BYTES
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.gate.storage import StorageError
from pytest_specenergy.gate.storage import load_run

KEY = "modeled-h200-cpu-reference-0.1.0"


def _closest(**generation):
    marks = {
        "model": (["tiny:dense"], {}),
        "corpus": (["code"], {}),
        "drafter": (["ngram"], {}),
        "batch": ([1], {}),
        "generation": ([], generation),
    }

    def closest(name):
        args, kwargs = marks.get(name, (None, None))
        return None if args is None else SimpleNamespace(args=tuple(args), kwargs=kwargs)

    return closest


def test_the_markers_prompt_pool_is_bounded_as_the_options(monkeypatch):
    # N8/T28: generation(prompts=10**23) started both engines, then grew to a MemoryError.
    [case] = build_cases("t.py::t", _closest(prompts=MAX_POOL), CaseDefaults())
    assert case.generation.prompts == MAX_POOL
    for huge in (MAX_POOL + 1, 99999999999999999999999):
        with pytest.raises(MarkerError, match=rf"expected a prompt count from 1 to {MAX_POOL}"):
            build_cases("t.py::t", _closest(prompts=huge), CaseDefaults())


def test_a_huge_file_named_like_a_run_is_refused_unread(tmp_path):
    # T22: a 1.5 GB file named like the newest run was read whole (3.1 GB of memory).
    folder = tmp_path / KEY
    folder.mkdir()
    huge = folder / "0001_main_20261201_100000.json"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_RUN_FILE_BYTES + 1)  # sparse: nothing to read but its size
    with pytest.raises(StorageError, match=r"is 268435457 bytes; .* at most 256 MiB, so it is not"):
        load_run(huge)
    store = RunStore(tmp_path)
    assert store.find(KEY, "last") == huge  # resolved without reading it; then refused on load
    with pytest.raises(StorageError, match="not read"):
        store.load(store.find(KEY, "main"))


def _sglang(**options):
    return EngineConfig(
        engine="sglang",
        model="Qwen/Qwen3-8B",
        drafter=Drafter("ngram"),
        dtype="bf16",
        device="cuda",
        options=EngineConfig.freeze_options(
            {"sglang_version": "0.5.23", "python": "/py", **options}
        ),
    )


def test_non_string_list_items_of_an_sglang_option_never_become_flags():
    # T36: Path("--host"), Path("0.0.0.0") in a list moved the engine off loopback.
    facts = sa.facts_for(sa.parse_version("0.5.23"))
    for value in (
        [Path("x"), Path("--host"), Path("0.0.0.0")],
        ("x", "--host"),
        Path("--host"),
    ):
        with pytest.raises(EngineConfigError, match="would read as another flag"):
            sa.translate_options({"chat_template": value}, facts)
    # Negative numbers and ordinary paths stay values.
    assert sa.translate_options({"chat_template": Path("t.jinja")}, facts)
    assert sa.translate_options({"cuda_graph_bs": [1, 2, -1]}, facts)


@pytest.mark.parametrize("fraction", [float("nan"), float("inf"), "abc", 0, 1.5, True])
def test_residency_refuses_a_memory_share_that_is_no_share(fraction):
    # T16: mem_fraction_static=nan was resident with a "nan share"; 'abc' a raw ValueError.
    arms = [_sglang(mem_fraction_static=fraction).twin(), _sglang(mem_fraction_static=fraction)]
    decision = decide(arms, 2, 141 * 2**30, frozenset({"sleep_on_idle"}))
    assert not decision.resident and decision.refused
    assert "expected a number between 0 and 1" in decision.refused
    facts = sa.facts_for(sa.parse_version("0.5.23"))
    with pytest.raises(EngineConfigError, match="mem_fraction_static"):
        sa.translate_options({"mem_fraction_static": fraction}, facts)
    assert decide([_sglang(mem_fraction_static=0.4)] * 2, 2, None, None).refused is None


@pytest.mark.parametrize("weights", [float("inf"), 1e300, float("nan"), -1])
def test_declared_weights_are_a_finite_size(weights):
    with pytest.raises(EngineConfigError, match="expected a positive number of GiB"):
        weights_bytes(_sglang(weights_gb=weights))


@pytest.mark.parametrize(
    "flags, message",
    [(["--port", "70000"], "expected a port from 0 to 65535"), (["--threads", "-1"], ">= 0")],
)
def test_the_reference_server_refuses_flags_it_cannot_serve_with(flags, message):
    # T45: --port 70000 was a raw OverflowError from bind(); --threads -1 started a server.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest_specenergy.refserver", "--model", "tiny:dense", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs (a full disk, for real), where this machine lets a test mount one."""
    import subprocess

    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def test_an_output_on_a_full_disk_is_refused_at_start(full_disk):
    # N15/T17: storage on a full disk was found after the last case, and the run was lost.
    from pytest_specenergy.atomic import too_full
    from pytest_specenergy.preflight import log_dir_problem

    assert "bytes free on its file system" in too_full(full_disk / "store")
    assert "--specenergy-log-dir" in log_dir_problem(full_disk / "logs")
    assert too_full(full_disk.parent) is None
