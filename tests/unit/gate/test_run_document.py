"""The typed run document: built by measurement, read back through one validating reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_compare import ab_record
from test_compare import record

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import DocumentError
from pytest_specenergy.document import MachineInfo
from pytest_specenergy.document import RunDocument


def test_a_record_reads_back_equal_to_what_was_written():
    for fields in (
        record([1.0, 1.01, 0.99]),
        ab_record([0.5, 0.51, 0.49], [0.5, 0.5, 0.5], [2.0] * 3),
    ):
        typed = CaseRecord.from_dict(fields)
        assert CaseRecord.from_dict(json.loads(json.dumps(typed.as_dict()))) == typed
    typed = CaseRecord.from_dict(record([1.0, 1.0, 1.0]))
    assert typed.speculative.samples[0].energy_per_token == 1.0 and typed.baseline.arm == "baseline"
    assert (typed.model, typed.batch, typed.corpus_name, typed.drafter_id) == (
        "tiny:dense",
        4,
        "code",
        "ngram",
    )


def test_fields_it_does_not_know_are_kept_and_written_back():
    data = {**record([1.0]), "ci_job": "42"}
    data["speculative"]["gpu_note"] = "warm"
    typed = CaseRecord.from_dict(data)
    assert typed.extra == {"ci_job": "42"} and typed.speculative.extra == {"gpu_note": "warm"}
    out = typed.as_dict()
    assert out["ci_job"] == "42" and out["speculative"]["gpu_note"] == "warm"


def test_a_refusal_names_the_file_the_record_and_the_field():
    data = {"results": [record([1.0])]}
    data["results"][0]["speculative"]["samples"][0]["tbt_ms"] = "fast"
    with pytest.raises(
        DocumentError,
        match=r"^run\.json: results\[0\] \(code-ngram-b4\)\.speculative\.samples\[0\]: "
        r"'tbt_ms' is 'fast', expected a finite number or null$",
    ):
        RunDocument.from_dict(data, "run.json")
    with pytest.raises(DocumentError, match=r"lacks its 'speculative' arm"):
        CaseRecord.from_dict({"case_id": "c", "baseline": {"samples": []}})
    with pytest.raises(
        DocumentError, match=r"checks\[0\]: 'severity' is 'loud', expected 'fail' or 'warn'"
    ):
        CaseRecord.from_dict({**record([1.0]), "checks": [{"name": "x", "severity": "loud"}]})


def test_a_built_document_names_its_one_machine_key_and_splits_by_key():
    a = CaseRecord.from_dict({**record([1.0]), "nodeid": "t::a", "machine_key": "key-a"})
    b = CaseRecord.from_dict({**record([1.0]), "nodeid": "t::b", "machine_key": "key-b"})
    one = RunDocument.build(
        [a], meters={}, engine_starts=1, machines={"key-a": MachineInfo(meter={"kind": "x"})}
    )
    assert one.machine_key == "key-a" and one.machine_info.meter.kind == "x"
    both = RunDocument.build([a, b], meters={}, engine_starts=2, host=MachineInfo(node="ci"))
    assert both.machine_key is None and both.machine_info.node == "ci"
    assert [r.nodeid for r in both.on("key-b").results] == ["t::b"] and both.on(
        "key-b"
    ).machine_key == "key-b"
    assert "interrupted" not in both.as_dict()


def test_a_run_names_the_commit_it_measured(tmp_path):
    import subprocess

    from pytest_specenergy.gate.machine import source_commit

    assert source_commit(tmp_path) is None  # not a git checkout
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("1")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    commit = source_commit(tmp_path)
    assert len(commit.sha) == 40 and commit.dirty is False
    (tmp_path / "f").write_text("2")
    assert source_commit(tmp_path).dirty is True
    doc = RunDocument.build([], meters={}, engine_starts=0, commit=commit)
    assert RunDocument.from_dict(json.loads(json.dumps(doc.as_dict()))).commit == commit


@pytest.mark.parametrize("name", ["written-by-24ea08c.json", "written-by-24ea08c-compared.json"])
def test_a_document_written_before_the_typed_parts_reads_back_and_writes_the_same_json(name):
    """Quickstart runs written by 24ea08c, the last plugin whose nested parts were plain mappings
    (one with a stored-baseline comparison, FDR and latency targets): read through the typed
    loader and written again, every key and value comes back as it was."""
    path = Path(__file__).parents[2] / "data" / "report" / name
    data = json.loads(path.read_text())
    document = RunDocument.from_dict(data, name)
    assert json.loads(json.dumps(document.as_dict())) == data
    record = document.results[0]
    assert record.speculative.concurrency.mean_running == 1.0
    assert record.speculative.samples[0].window.full.concurrency.steps_by_running
    assert record.case.corpus.name == "code" and record.equivalence.exact_fraction == 1.0
