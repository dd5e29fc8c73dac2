"""A finished session's outputs: each written on its own, so one that fails never costs another."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.gatekeeper import Gatekeeper
from pytest_specenergy.gate.storage import GoldenStore
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.outputs import write_outputs

KEY = "modeled-h200-cpu-reference-0.1.0"
ARM = {"source": "modeled (h200)", "samples": []}


class Hook:
    """The ``pytest_specenergy_update_json`` hook a conftest may implement."""

    def __init__(self, change=None):
        self.change = change

    def pytest_specenergy_update_json(self, data):
        if self.change:
            self.change(data)


def _document() -> RunDocument:
    record = CaseRecord.from_dict(
        {
            "case_id": "code-ngram-b1",
            "nodeid": "t.py::t[code-ngram-b1]",
            "machine_key": KEY,
            "baseline": ARM,
            "speculative": ARM,
        }
    )
    return RunDocument.build([record], meters={}, engine_starts=1)


def _config(tmp_path: Path, **changes):
    values = {"json": tmp_path / "run.json", "save": "main", "autosave": False, "golden": None}
    return SimpleNamespace(**{**values, **changes})


def _gate(tmp_path: Path) -> Gatekeeper:
    return Gatekeeper(
        runs=RunStore(tmp_path / ".specenergy"), goldens=GoldenStore(tmp_path / "goldens")
    )


def test_every_output_is_written_and_what_the_hook_adds_is_kept(tmp_path):
    written = write_outputs(
        _document(), _config(tmp_path), _gate(tmp_path), Hook(lambda data: data.update(ci_job="42"))
    )
    assert written.failures == ()
    assert json.loads((tmp_path / "run.json").read_text())["ci_job"] == "42"
    [saved] = written.saved
    assert RunStore().load(saved).extra == {"ci_job": "42"}


def test_an_unwritable_json_file_does_not_lose_the_saved_run(tmp_path):
    if os.geteuid() == 0:
        # a parent that is a file: unwritable for root too
        blocked = tmp_path / "a-file" / "run.json"
        (tmp_path / "a-file").write_text("")
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        blocked = tmp_path / "ro" / "run.json"
    written = write_outputs(_document(), _config(tmp_path, json=blocked), _gate(tmp_path), Hook())
    assert written.json is None and len(written.saved) == 1
    assert "--specenergy-json" in written.failures[0] and "cannot be written" in written.failures[0]


def test_a_hook_that_breaks_the_document_is_reported(tmp_path):
    written = write_outputs(
        _document(),
        _config(tmp_path),
        _gate(tmp_path),
        Hook(lambda data: data.update(engine_starts="many")),
    )
    assert any(
        "pytest_specenergy_update_json hook broke the run document" in f for f in written.failures
    )


@pytest.mark.parametrize("save", [None, "main"])
def test_no_save_no_history(tmp_path, save):
    written = write_outputs(
        _document(), _config(tmp_path, save=save, json=None), _gate(tmp_path), Hook()
    )
    assert len(written.saved) == (1 if save else 0) and written.json is None


def test_outputs_that_cannot_be_written_are_found_before_anything_runs(tmp_path):
    from pytest_specenergy.outputs import unwritable_outputs

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = _config(
        tmp_path,
        json=blocker / "run.json",
        storage=blocker / "history",
        save="main",
        autosave=False,
        golden="check",
        baselines=tmp_path / "goldens",
        compare=None,
    )
    problems = unwritable_outputs(config)
    assert (
        len(problems) == 2
        and "--specenergy-json" in problems[0]
        and "is not a folder" in problems[0]
    )
    assert problems[1].startswith("--specenergy-storage")
    fine = _config(
        tmp_path,
        json=tmp_path / "new" / "run.json",
        storage=tmp_path / ".specenergy",
        save="main",
        autosave=False,
        golden=None,
        baselines=None,
        compare=None,
    )
    assert unwritable_outputs(fine) == [] and not (tmp_path / "new").exists()
    baseline = tmp_path / "main.json"
    baseline.write_text("{}")
    same = _config(
        tmp_path, json=baseline, compare=str(baseline), save=None, autosave=False, golden=None
    )
    assert "would replace the baseline" in unwritable_outputs(same)[0]
