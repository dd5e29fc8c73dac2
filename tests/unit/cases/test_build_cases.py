"""Markers to cases, with a fake marker lookup (no pytest session)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from pytest_specenergy.cases.markers import CaseDefaults
from pytest_specenergy.cases.markers import MarkerError
from pytest_specenergy.cases.markers import build_cases


def lookup(**marks):
    """A ``get_closest_marker`` stand-in: name -> a mark with ``args`` and ``kwargs``."""

    def closest(name):
        value = marks.get(name)
        if value is None:
            return None
        args, kwargs = (
            value
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict)
            else (value, {})
        )
        return SimpleNamespace(args=tuple(args), kwargs=dict(kwargs))

    return closest


def test_the_matrix_expands_in_a_stable_order_with_readable_ids():
    closest = lookup(
        model=["tiny:dense"], drafter=["ngram"], batch=[1, 4], corpus=["code", "conversation"]
    )
    cases = build_cases("t.py::test", closest, CaseDefaults())
    assert [c.id for c in cases] == [
        "code-ngram-b1",
        "code-ngram-b4",
        "conversation-ngram-b1",
        "conversation-ngram-b4",
    ]
    assert all(c.engine == "reference" for c in cases)


def test_option_defaults_reach_the_case():
    closest = lookup(model=["tiny:dense"], drafter=["ngram"], batch=[2], corpus=["code"])
    (case,) = build_cases("t.py::test", closest, CaseDefaults(faults=("accept-off-by-one",)))
    assert "accept-off-by-one" in case.spec_config().faults


@pytest.mark.parametrize(
    "marks, expected",
    [
        (
            {"model": ["tiny:dense"], "drafter": ["ngram"], "batch": [0], "corpus": ["code"]},
            "batch",
        ),
        ({"model": ["tiny:dense"], "drafter": ["ngram"], "batch": [1], "corpus": ["nope"]}, "nope"),
        (
            {"model": ["tiny:dense"], "drafter": ["eagle3"], "batch": [1], "corpus": ["code"]},
            "eagle3",
        ),
        (
            {
                "model": (["tiny:dense"], {"engine": "vllm"}),
                "drafter": ["ngram"],
                "batch": [1],
                "corpus": ["code"],
            },
            "vllm",
        ),
    ],
)
def test_bad_values_name_the_test_and_the_marker(marks, expected):
    with pytest.raises(MarkerError) as info:
        build_cases("t.py::test_bad", lookup(**marks), CaseDefaults())
    assert "t.py::test_bad" in str(info.value) and expected in str(info.value)


def test_a_relative_model_path_is_checked_where_the_engine_resolves_it(tmp_path, monkeypatch):
    # The engine process inherits the working directory: a path that exists only under another
    # folder (the rootdir of a run started from a subfolder) is refused at collection, not at start.
    (tmp_path / "models" / "mine").mkdir(parents=True)
    (tmp_path / "sub").mkdir()
    closest = lookup(model=["models/mine"], drafter=["ngram"], batch=[1], corpus=["code"])
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(
        MarkerError, match=r"no such model directory .*sub/models/mine \(relative to the working"
    ):
        build_cases("t.py::test", closest, CaseDefaults())
    monkeypatch.chdir(tmp_path)
    assert [c.model for c in build_cases("t.py::test", closest, CaseDefaults())] == ["models/mine"]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"dtype": "fp8"}, "model(dtype='fp8'): the reference engine takes one of auto, float64"),
        ({"device": "gpu"}, "model(device='gpu'): expected auto, cpu, cuda or cuda:N"),
    ],
)
def test_bad_dtype_and_device_are_collection_errors(kwargs, fragment):
    closest = lookup(model=(["tiny:dense"], kwargs), drafter=["ngram"], batch=[1], corpus=["code"])
    with pytest.raises(MarkerError, match=re.escape(fragment)):
        build_cases("t.py::test", closest, CaseDefaults())


def test_with_modeled_energy_the_default_pool_is_sized_for_a_cpu_minute():
    closest = lookup(model=["tiny:dense"], drafter=["ngram"], batch=[1, 8], corpus=["code"])
    modeled = build_cases("t.py::test", closest, CaseDefaults(modeled=True))
    # 3 per request in flight at batch 8, one pool
    assert {c.generation.prompts for c in modeled} == {24}
    # 96
    assert {c.generation.prompts for c in build_cases("t.py::test", closest, CaseDefaults())} == {
        None
    }
    assert {
        c.generation.prompts
        for c in build_cases("t.py::test", closest, CaseDefaults(modeled=True, pool=40))
    } == {40}
    small = lookup(model=["tiny:dense"], drafter=["ngram"], batch=[1], corpus=["code"])
    assert build_cases("t.py::test", small, CaseDefaults(modeled=True))[0].generation.prompts == 12
    declared = lookup(
        model=["tiny:dense"],
        drafter=["ngram"],
        batch=[1],
        corpus=["code"],
        generation=([], {"prompts": 64}),
    )
    assert (
        build_cases("t.py::test", declared, CaseDefaults(modeled=True))[0].generation.prompts == 64
    )


def test_the_size_option_beats_the_generation_marker():
    """``--specenergy-size`` (what ``specenergy faults`` grows a test by) sets every case's pool
    and max_new_tokens, whatever its generation marker says."""
    closest = lookup(
        model=["tiny:dense"],
        drafter=["ngram"],
        batch=[2],
        corpus=["code"],
        generation=((), {"max_new_tokens": 40, "prompts": 8, "ignore_eos": True}),
    )
    (case,) = build_cases("t.py::test", closest, CaseDefaults(size=(16, 64)))
    assert (case.generation.prompts, case.generation.max_new_tokens) == (16, 64)
    assert case.generation.ignore_eos is True
    (plain,) = build_cases("t.py::test", closest, CaseDefaults())
    assert (plain.generation.prompts, plain.generation.max_new_tokens) == (8, 40)


@pytest.mark.parametrize("text", ["16", "16x", "0x64", "16x0", "axb", "5000x8"])
def test_a_bad_size_names_what_is_expected(text):
    from pytest_specenergy.options import _size

    with pytest.raises(ValueError, match="expected PROMPTSxTOKENS"):
        _size(text)
