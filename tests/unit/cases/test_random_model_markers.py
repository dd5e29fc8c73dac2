"""random:SHAPE models in the model and drafter markers (the reference server builds them itself).

Before, the marker's path check refused every ``random:`` name as "no such model directory", so
the reference server's random models (README: for GPU calibration) were reachable only by
scripts that built cases by hand, never through a suite's markers.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_specenergy.cases.markers import CaseDefaults
from pytest_specenergy.cases.markers import MarkerError
from pytest_specenergy.cases.markers import build_cases
from pytest_specenergy.engines.drafters import Drafter

TARGET = "random:qwen3-4b:layers=1,vocab=1024"
DRAFT = "random:qwen3-0.6b:layers=1,vocab=1024"


def lookup(**marks):
    """A ``get_closest_marker`` stand-in (as in test_build_cases.py): name -> args and kwargs."""

    def closest(name):
        value = marks.get(name)
        if value is None:
            return None
        args, kwargs = value if isinstance(value, tuple) else (value, {})
        return SimpleNamespace(args=tuple(args), kwargs=dict(kwargs))

    return closest


def test_random_target_and_draft_reach_the_reference_case(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder of that name exists: the name is not a path
    closest = lookup(
        model=[TARGET],
        drafter=[Drafter("draft_model", draft_model=DRAFT, id="draft")],
        batch=[1],
        corpus=["code"],
    )
    (case,) = build_cases("t.py::test", closest, CaseDefaults())
    assert case.model == TARGET and case.drafter.draft_model == DRAFT and case.engine == "reference"


def test_random_models_are_refused_on_sglang_saying_so():
    closest = lookup(
        model=([TARGET], {"engine": "sglang"}), drafter=["ngram"], batch=[1], corpus=["code"]
    )
    with pytest.raises(
        MarkerError, match="random: models run only on the reference engine, not sglang"
    ):
        build_cases("t.py::test", closest, CaseDefaults())


def test_a_missing_directory_names_random_models_among_the_choices(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    closest = lookup(model=["models/none"], drafter=["ngram"], batch=[1], corpus=["code"])
    with pytest.raises(
        MarkerError,
        match=r"expected an existing checkpoint directory, a built-in checkpoint \(smollm2-135m\), "
        r"random:SHAPE or one of tiny:",
    ):
        build_cases("t.py::test", closest, CaseDefaults())
