"""The specenergy command on run documents built from the real result classes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.cli.main import main
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.document import RunDocument
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult

KEY = "modeled-h200-cpu-reference-0.1.0"
CORPUS = load_corpus("code")


def record(batch: int, spec_joules: float, source: str = "modeled (h200)", nodeid_suffix: str = ""):
    case = Case.of(
        engine="reference", model="tiny:dense", drafter=Drafter("ngram"), batch=batch, corpus=CORPUS
    )

    def run(arm, joules):
        samples = tuple(
            RepeatSample(
                joules * f,
                1.0,
                100,
                5.0,
                40 if arm == "speculative" else None,
                60 if arm == "speculative" else None,
                320 if arm == "speculative" else None,
            )
            for f in (1.0, 1.01, 0.99)
        )
        return RunResult.measured(
            arm,
            {
                "engine": "reference",
                "version": "reference-0.1.0",
                "config": {"engine": "reference", "options": {}},
            },
            source,
            samples,
            ((1, 2, 3),),
            ("length",),
            9 if arm == "speculative" else 1,
        )

    pair = PairResult(case, case.id, run("baseline", 10.0), run("speculative", spec_joules))
    return pair.record(f"test_x.py::test_drafter[{case.id}]{nodeid_suffix}", KEY)


def document(*records):
    doc = RunDocument.build(records, meters={}, engine_starts=2)
    assert doc.machine_key == KEY
    return doc


def save(tmp_path, name, doc):
    return RunStore(tmp_path / ".specenergy").save(doc, name)


def run_cli(tmp_path, *args):
    return main(
        [*args, "--storage", str(tmp_path / ".specenergy")] if args[0] != "doctor" else list(args)
    )


def test_compare_exits_1_on_regression_and_0_otherwise(tmp_path, capsys):
    save(tmp_path, "main", document(record(1, 5.0), record(4, 7.0)))
    save(tmp_path, "same", document(record(1, 5.0), record(4, 7.0)))
    save(tmp_path, "worse", document(record(1, 6.0), record(4, 7.0)))
    assert run_cli(tmp_path, "compare", "main", "same", "--fail", "energy:5%") == 0
    assert run_cli(tmp_path, "compare", "main", "worse", "--fail", "energy:5%") == 1
    out = capsys.readouterr().out
    assert "+ regressed  test_x.py::test_drafter[code-ngram-b1]" in out
    assert "1 regressed of 2 cases" in out


def test_compare_refuses_bad_expressions_and_missing_runs(tmp_path, capsys):
    save(tmp_path, "main", document(record(1, 5.0)))
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "compare", "main", "main", "--fail", "energy:fast")
    assert run_cli(tmp_path, "compare", "main", "nosuchrun") == 2
    assert "no run 'nosuchrun'" in capsys.readouterr().err


def test_history_finds_a_sustained_step(tmp_path, capsys):
    for joules in (5.0, 5.0, 5.0, 6.5, 6.5, 6.5):
        save(tmp_path, "nightly", document(record(1, joules)))
    assert run_cli(tmp_path, "history", "--metric", "energy_per_token") == 0
    out = capsys.readouterr().out
    assert "6 runs" in out
    assert "code-ngram-b1  energy_per_token  0003" in out and "+30.0%" in out


def test_history_without_steps(tmp_path, capsys):
    for joules in (5.0, 5.02, 4.98, 5.01):
        save(tmp_path, "nightly", document(record(1, joules)))
    assert run_cli(tmp_path, "history") == 0
    assert "no steps detected" in capsys.readouterr().out


def test_merge_joins_shards_and_refuses_incomparable_ones(tmp_path, capsys):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(document(record(1, 5.0)).as_dict()))
    b.write_text(json.dumps(document(record(4, 7.0)).as_dict()))
    out = tmp_path / "merged.json"
    assert (
        run_cli(tmp_path, "merge", str(a), str(b), "--output", str(out), "--save", "nightly") == 0
    )
    merged = RunStore().load(out)
    assert [r.case_id for r in merged.results] == ["code-ngram-b1", "code-ngram-b4"]
    assert RunStore(tmp_path / ".specenergy").list(KEY)[-1].name == "nightly"
    assert run_cli(tmp_path, "merge", str(a), str(a), "--output", str(tmp_path / "dup.json")) == 2
    assert "was also measured in" in capsys.readouterr().err
    other = {**document(record(4, 7.0, source="modeled (h100)")).as_dict(), "machine_key": KEY}
    c = tmp_path / "c.json"
    c.write_text(json.dumps(other))
    assert run_cli(tmp_path, "merge", str(a), str(c), "--output", str(tmp_path / "x.json")) == 2
    assert "measured differently" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_report_writes_html_and_markdown(tmp_path, capsys):
    save(tmp_path, "main", document(record(1, 5.0), record(4, 7.0)))
    save(tmp_path, "pr", document(record(1, 6.0), record(4, 7.0)))
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    assert (
        run_cli(
            tmp_path,
            "report",
            "pr",
            "--baseline",
            "main",
            "--html",
            str(html),
            "--markdown",
            str(md),
            "--latency-target",
            "25",
            "--no-plots",
        )
        == 0
    )
    assert "<html" in html.read_text()
    text = md.read_text()
    # The regression is listed; the unchanged case is counted in the header, not listed.
    assert "code-ngram-b1" in text and "code-ngram-b4" not in text
    assert "**2 regressed**" in text and "1 unchanged" in text  # the case and the latency target
    assert run_cli(tmp_path, "report", "pr") == 2
    assert "needs --html" in capsys.readouterr().err


def test_doctor_runs_and_says_why_it_cannot_measure_here(capsys):
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert "specenergy doctor" in out
    assert code in (0, 1)


def test_a_report_never_replaces_the_run_it_reads(tmp_path, capsys):
    path = save(tmp_path, "main", document(record(1, 5.0)))
    before = path.read_bytes()
    assert run_cli(tmp_path, "report", str(path), "--markdown", str(path)) == 2
    assert "is the run file being read" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_compare_refuses_a_run_with_itself_and_an_interrupted_baseline(tmp_path, capsys):
    save(tmp_path, "main", document(record(1, 5.0)))
    assert run_cli(tmp_path, "compare", "main", "last") == 2
    assert "are the same run" in capsys.readouterr().err
    cut = RunStore(tmp_path / ".specenergy").save(
        dataclasses.replace(document(record(1, 5.0)), interrupted=True), "cut"
    )
    assert run_cli(tmp_path, "compare", str(cut), "main") == 2
    err = capsys.readouterr().err
    assert "saved by an interrupted session: its results are incomplete" in err
    assert "compare with a complete run" in err


def test_one_limit_keeps_the_other_defaults(tmp_path, capsys):
    # energy:5% alone used to replace every default: a 15% accept-length drop went unreported.
    save(tmp_path, "main", document(record(1, 5.0)))
    worse = record(1, 5.0)
    worse = dataclasses.replace(
        worse,
        speculative=dataclasses.replace(
            worse.speculative,
            samples=tuple(
                dataclasses.replace(s, correct_drafts=36) for s in worse.speculative.samples
            ),
        ),
    )
    save(tmp_path, "pr", document(worse))
    assert run_cli(tmp_path, "compare", "main", "pr", "--fail", "energy:5%") == 1
    assert "accept_length" in capsys.readouterr().out


def test_history_says_which_runs_an_interrupted_session_saved(tmp_path, capsys):
    save(tmp_path, "nightly", document(record(1, 5.0)))
    RunStore(tmp_path / ".specenergy").save(
        dataclasses.replace(document(record(1, 5.0)), interrupted=True), "cut"
    )
    assert run_cli(tmp_path, "history") == 0
    assert "of which 1 saved by an interrupted session (incomplete): cut" in capsys.readouterr().out


def test_report_refuses_a_latency_target_that_is_no_time(tmp_path, capsys):
    save(tmp_path, "main", document(record(1, 5.0)))
    with pytest.raises(SystemExit):
        run_cli(
            tmp_path,
            "report",
            "main",
            "--markdown",
            str(tmp_path / "r.md"),
            "--latency-target",
            "-5",
        )
    assert "'-5' is not a time between tokens in ms > 0" in capsys.readouterr().err
