"""Issue 22 item 1: a case whose arms ran in blocked order (one engine at a time on one GPU) says
so in the terminal table and the Markdown summary, beside the gate's drift allowance."""

from __future__ import annotations

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.report.markdown import _comparison
from pytest_specenergy.report.terminal import table_row


def _record(order: dict, ratio: float = 0.6) -> CaseRecord:
    def arm(values):
        return {
            "source": "s",
            "samples": [
                {"decode_joules": v, "decode_seconds": 1.0, "decode_tokens": 1} for v in values
            ],
        }

    return CaseRecord.from_dict(
        {
            "case_id": "c",
            "source": "s",
            "baseline": arm([1.0, 1.01, 0.99]),
            "speculative": arm([ratio, ratio * 1.01, ratio * 0.99]),
            "order": order,
            "nodeid": "t",
            "machine_key": "k",
        }
    )


def test_the_terminal_and_markdown_say_blocked_order():
    blocked, interleaved = _record({"interleaved": False}), _record({"interleaved": True})
    assert table_row(blocked)["test"] == "c (blocked order)"
    assert table_row(interleaved)["test"] == "c"
    comparison = compare_case(
        _record({"interleaved": True}),
        _record({"interleaved": False}, 0.9),
        [parse_fail_expr("energy_ratio:5%")],
    )
    text = _comparison(RunDocument(results=(_record({"interleaved": False}, 0.9),)), [comparison])
    assert f"| {comparison.case_id} (blocked order) |" in text and "*blocked order*" in text
    assert (
        "blocked order" in comparison.rows[0].method
        and "block drift allowance 3.0%" in comparison.rows[0].note
    )
