"""Every report of an interrupted run says so first, and so does the gate's coverage (issue 42
item 5; audit 3, T34: the HTML and Markdown never said a run was interrupted)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pytest_specenergy.document import CoverageFacts
from pytest_specenergy.document import RunDocument
from pytest_specenergy.report.html import render_html
from pytest_specenergy.report.markdown import render_markdown
from pytest_specenergy.report.rows import INTERRUPTED

RUN = Path(__file__).resolve().parents[2] / "data" / "report" / "run.json"


def _run(**changes) -> RunDocument:
    return dataclasses.replace(RunDocument.from_dict(json.loads(RUN.read_text())), **changes)


def test_an_interrupted_run_says_so_in_every_report():
    cut = _run(interrupted=True)
    markdown = render_markdown(cut)
    assert markdown.startswith(f"> **{INTERRUPTED}**")
    assert "interrupted" in render_markdown(cut, []).splitlines()[0]
    page = render_html(cut, plots=False)
    assert '<p class="notice">This run was interrupted' in page
    whole = _run()
    assert "interrupted" not in render_markdown(whole) and 'class="notice"' not in render_html(
        whole, plots=False
    )


def test_reports_name_the_baseline_cases_a_run_did_not_measure():
    coverage = CoverageFacts(
        baseline="main.json",
        measured=1,
        unmeasured=("t.py::test_b[x]",),
        policy="fail",
        failed=True,
    )
    run = _run(coverage=(coverage,))
    said = "1 baseline case(s) of main.json were not measured by this run"
    assert said in render_markdown(run) and said in render_html(run, plots=False)
    # ... and the run document keeps it.
    again = RunDocument.from_dict(json.loads(json.dumps(run.as_dict())))
    assert again.coverage == (coverage,)
