"""benchmarks/engine_setup.py times both ways of each cost and says whether their tensors agree,
so a build or prefill that changed a value prints NO and exits non-zero."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import engine_setup  # noqa: E402  (a benchmark script, not a package)

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_both_costs_are_timed_both_ways_and_agree(capsys) -> None:
    assert engine_setup.main(["--models", "tiny:hybrid", "--tokens", "64", "--rounds", "1"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [r.split()[1] for r in rows] == ["build", "prefill"], rows
    assert all(r.endswith("yes") for r in rows), rows


def test_a_build_that_changes_a_tensor_says_no(monkeypatch, capsys) -> None:
    from pytest_specenergy.refserver import tiny_models

    construct = tiny_models._construct

    def off_by_one(cls_name, config):  # a buffer no seed overwrites, changed
        model = construct(cls_name, config)
        model.model.rotary_emb.inv_freq += 1
        return model

    monkeypatch.setattr(tiny_models, "_construct", off_by_one)
    # A draft: built only, so no corrupted model reaches load_model's per-process cache.
    assert engine_setup.main(["--models", "tiny:dense-draft", "--rounds", "1"]) == 1
    [build] = capsys.readouterr().out.splitlines()[1:]
    assert build.split()[1] == "build" and build.endswith("NO"), build
