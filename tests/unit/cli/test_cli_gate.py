"""``specenergy compare`` by pytest's gate rules (issue 42 items 1, 2, 4; audit 3 T30, T31, T32,
N37): its exit status is not 0 where pytest's gate would fail, and outputs never replace a run."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_cli import KEY
from test_cli import document
from test_cli import record
from test_cli import run_cli
from test_cli import save

from pytest_specenergy.document import Check
from pytest_specenergy.gate.storage import RunStore

CAPPED = Check("concurrency-below-batch", "fail", "the speculative arm ran 2.0 of 4 rows")


def _failed(rec):
    return dataclasses.replace(rec, checks=(CAPPED,))


def test_a_baseline_case_whose_checks_failed_is_refused_by_name(tmp_path, capsys):
    # T32: the nightly ran capped, so a PR costing more read as an improvement against it.
    save(tmp_path, "main", document(_failed(record(1, 9.0)), record(4, 7.0)))
    save(tmp_path, "pr", document(record(1, 6.0), record(4, 7.0)))
    assert run_cli(tmp_path, "compare", "main", "pr", "--incomparable", "warn") == 1
    out = capsys.readouterr().out
    assert "x incomparable  test_x.py::test_drafter[code-ngram-b1]" in out
    assert "refused: the baseline record's own fail-closed checks failed" in out
    assert "concurrency-below-batch" in out and "1 refused" in out
    # The current run's own broken case is refused the same way.
    save(tmp_path, "pr2", document(_failed(record(1, 5.0)), record(4, 7.0)))
    save(tmp_path, "good", document(record(1, 5.0), record(4, 7.0)))
    assert run_cli(tmp_path, "compare", "good", "pr2") == 1
    assert "refused: the current record's own fail-closed checks failed" in capsys.readouterr().out


def test_incomparable_empty_and_missing_baselines_exit_1_as_in_pytest(tmp_path, capsys):
    current = tmp_path / "cur.json"
    current.write_text(json.dumps(document(record(1, 5.0)).as_dict()))
    # N37/T30: a baseline whose samples are empty is incomparable: exit 1 (was 0).
    empty_samples = record(1, 5.0)
    empty_samples = dataclasses.replace(
        empty_samples, speculative=dataclasses.replace(empty_samples.speculative, samples=())
    )
    nosamples = tmp_path / "nosamples.json"
    nosamples.write_text(json.dumps(document(empty_samples).as_dict()))
    assert run_cli(tmp_path, "compare", str(nosamples), str(current)) == 1
    assert "1 incomparable (--incomparable=fail)" in capsys.readouterr().out
    assert run_cli(tmp_path, "compare", str(nosamples), str(current), "--incomparable=warn") == 0
    # A baseline with no results: every case has no baseline: exit 1 (was 0, even with --strict).
    noresults = tmp_path / "noresults.json"
    noresults.write_text(json.dumps({**document(record(1, 5.0)).as_dict(), "results": []}))
    assert run_cli(tmp_path, "compare", str(noresults), str(current)) == 1
    assert "1 without baseline (--missing-baseline=fail)" in capsys.readouterr().out
    assert run_cli(tmp_path, "compare", str(noresults), str(current), "--strict") == 1
    args = ("--missing-baseline=warn",)
    assert run_cli(tmp_path, "compare", str(noresults), str(current), *args) == 0
    # A current run that measured nothing compared nothing.
    assert run_cli(tmp_path, "compare", str(current), str(noresults), "--unmeasured=warn") == 1
    assert "holds no results: nothing was compared" in capsys.readouterr().out


def test_baseline_cases_the_current_run_lacks_are_listed_and_fail_under_ci(
    tmp_path, capsys, monkeypatch
):
    # T31: a -k, a deleted or renamed test shrank the gate silently ("0 regressed of 1 cases").
    save(tmp_path, "main", document(record(1, 5.0), record(4, 7.0)))
    save(tmp_path, "pr", document(record(1, 5.0)))
    assert run_cli(tmp_path, "compare", "main", "pr") == 0  # a developer's -k: listed, warned
    out = capsys.readouterr().out
    assert "1 of 2 baseline case(s)" in out and "  - test_x.py::test_drafter[code-ngram-b4]" in out
    monkeypatch.setenv("CI", "true")
    assert run_cli(tmp_path, "compare", "main", "pr") == 1
    assert "exit status 1: 1 baseline case(s) not measured" in capsys.readouterr().out
    glob = "test_x.py::test_drafter[[]code-ngram-b4]"
    assert run_cli(tmp_path, "compare", "main", "pr", "--unmeasured-ok", glob) == 0
    assert "declared by --unmeasured-ok" in capsys.readouterr().out
    monkeypatch.delenv("CI")
    assert run_cli(tmp_path, "compare", "main", "pr", "--strict") == 1
    assert run_cli(tmp_path, "compare", "main", "pr", "--unmeasured=fail") == 1


def test_the_command_refuses_a_storage_url(tmp_path, capsys):
    # 4g/T37: merge --storage http://x wrote ./http:/x/.
    run = tmp_path / "run.json"
    run.write_text(json.dumps(document(record(1, 5.0)).as_dict()))
    for command in (
        ["merge", str(run), "--output", str(tmp_path / "m.json"), "--save", "m"],
        ["history"],
        ["compare", str(run), str(run)],
    ):
        with pytest.raises(SystemExit) as stopped:
            main_args = [*command, "--storage", "http://x"]
            from pytest_specenergy.cli.main import main

            main(main_args)
        assert stopped.value.code == 2
        assert "only local directories" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists() and not any(tmp_path.glob("http*"))


def test_outputs_never_replace_a_stored_run(tmp_path, capsys):
    # T47: report --markdown <a stored run> overwrote the history.
    first = save(tmp_path, "main", document(record(1, 5.0)))
    second = save(tmp_path, "pr", document(record(1, 5.0)))
    before = first.read_bytes()
    assert run_cli(tmp_path, "report", str(second), "--markdown", str(first)) == 2
    assert "is a run in the history" in capsys.readouterr().err
    assert run_cli(tmp_path, "merge", str(second), "--output", str(first)) == 2
    assert "is a run in the history" in capsys.readouterr().err
    assert first.read_bytes() == before
    # The HTML written first is not left behind when the Markdown output is refused.
    html = tmp_path / "r.html"
    assert run_cli(tmp_path, "report", "pr", "--html", str(html), "--markdown", str(first)) == 2
    assert not html.exists()


def test_merge_keeps_an_interrupted_shard_marked(tmp_path, capsys):
    # T33: a shard saved by an interrupted session was laundered into a complete "main".
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(document(record(1, 5.0)).as_dict()))
    cut = dataclasses.replace(document(record(4, 7.0)), interrupted=True)
    b.write_text(json.dumps(cut.as_dict()))
    out = tmp_path / "merged.json"
    assert run_cli(tmp_path, "merge", str(a), str(b), "--output", str(out), "--save", "main") == 0
    assert json.loads(out.read_text())["interrupted"] is True
    [saved] = RunStore(tmp_path / ".specenergy").list(KEY)
    assert json.loads(saved.path.read_text())["interrupted"] is True
    # ... so no reference selects it.
    assert run_cli(tmp_path, "compare", "main", str(a)) == 2
    assert "interrupted" in capsys.readouterr().err


def test_merge_refuses_a_bad_run_name_before_writing_anything(tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(document(record(1, 5.0)).as_dict()))
    out = tmp_path / "m.json"
    assert run_cli(tmp_path, "merge", str(a), "--output", str(out), "--save", "../../etc/x") == 2
    assert "contains" in capsys.readouterr().err and not out.exists()
