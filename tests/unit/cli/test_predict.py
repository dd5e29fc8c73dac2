"""``specenergy predict``: the balance-point table before anything runs."""

from __future__ import annotations

import argparse
import json

import pytest

from pytest_specenergy.cli.predict import add_predict_parser
from pytest_specenergy.cli.predict import cmd_predict


def run(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="specenergy")
    add_predict_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["predict", *argv])
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def table_rows(text: str) -> dict[int, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0].isdigit():
            rows[int(cells[0])] = cells
    return rows


@pytest.mark.parametrize(
    ("verified", "gpu", "first_compute_bound"),
    [
        (16, "h200", 16),
        (16, "h100", 32),
        (7, "h200", 32),
        (7, "h100", None),
    ],
)
def test_table_flags_the_papers_crossovers(capsys, verified, gpu, first_compute_bound):
    code, out, _ = run(
        capsys,
        "--shape",
        "qwen3-4b",
        "--verified",
        str(verified),
        "--context",
        "260",
        "--gpu",
        gpu,
        "--accept-length",
        "3",
    )
    assert code == 0
    rows = table_rows(out)
    assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64]
    flagged = [b for b, cells in rows.items() if cells[2] == "yes"]
    assert (flagged[0] if flagged else None) == first_compute_bound
    assert f"balance point {163 if gpu == 'h200' else 316} FLOP/byte" in out
    assert "Qwen3-4B" in out and "modeled" in out
    # The figures say which measurements their constants were fitted to.
    assert "constants fitted to mlenergy-v3-h100@0cd52da" in out


def test_without_an_accept_length_only_the_break_even_is_shown(capsys):
    code, out, _ = run(capsys, "--shape", "qwen3-8b", "--verified", "5", "--batches", "1", "8")
    assert code == 0
    rows = table_rows(out)
    assert sorted(rows) == [1, 8]
    assert rows[1][5] == "-"  # saving
    assert float(rows[1][6]) == pytest.approx(1.0, abs=0.1)  # break-even T: verify ~ a decode step


def test_json_output(capsys):
    code, out, _ = run(
        capsys,
        "--shape",
        "qwen3-4b",
        "--verified",
        "16",
        "--gpu",
        "h200",
        "--accept-length",
        "3",
        "--json",
    )
    assert code == 0
    rows = json.loads(out)
    assert [r["batch"] for r in rows] == [1, 2, 4, 8, 16, 32, 64]
    assert [r["compute_bound"] for r in rows] == [False] * 4 + [True] * 3
    assert rows[0]["saving"] > rows[-1]["saving"]


def test_draft_shape_and_cuda_graphs_change_the_prediction(capsys):
    base = run(
        capsys, "--shape", "qwen3-8b", "--verified", "4", "--accept-length", "2.5", "--json"
    )[1]
    drafted = run(
        capsys,
        "--shape",
        "qwen3-8b",
        "--verified",
        "4",
        "--accept-length",
        "2.5",
        "--json",
        "--draft-shape",
        "qwen3-0.6b",
        "--draft-passes",
        "3",
        "--draft-tokens",
        "1",
    )[1]
    eager = run(
        capsys,
        "--shape",
        "qwen3-8b",
        "--verified",
        "4",
        "--accept-length",
        "2.5",
        "--json",
        "--draft-shape",
        "qwen3-0.6b",
        "--draft-passes",
        "3",
        "--draft-tokens",
        "1",
        "--no-cuda-graph",
    )[1]
    base, drafted, eager = json.loads(base)[0], json.loads(drafted)[0], json.loads(eager)[0]
    assert base["saving"] > drafted["saving"] > eager["saving"]


def test_unknown_shape_is_a_clear_error_listing_the_shapes(capsys):
    with pytest.raises(SystemExit) as exc:
        run(capsys, "--shape", "llama-9000", "--verified", "7")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model shape 'llama-9000'" in err
    for name in (
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-0.6b",
        "qwen3-30b-a3b",
        "qwen3.6-27b",
        "tiny:dense",
    ):
        assert name in err


def test_bad_values_reach_cmd_predict_as_exit_2(capsys):
    args = argparse.Namespace(
        shape="nope",
        verified=7,
        context=260,
        gpu="h200",
        accept_length=None,
        batches=[1],
        draft_shape=None,
        draft_passes=1,
        draft_tokens=None,
        draft_cost=0.0,
        no_cuda_graph=False,
        json=False,
    )
    assert cmd_predict(args) == 2
    assert "expected one of" in capsys.readouterr().err
    code, _, err = run(capsys, "--shape", "qwen3-4b", "--verified", "7", "--accept-length", "9")
    assert code == 2 and "accept length" in err


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--context", "-5"], "'-5' is not an integer >= 0"),
        (["--draft-passes", "-1"], "'-1' is not an integer >= 0"),
        (["--draft-cost", "nan"], "'nan' is not a finite number >= 0"),
        (["--draft-cost", "-0.2"], "'-0.2' is not a finite number >= 0"),
        (["--accept-length", "0.5"], "'0.5' is not an accept length >= 1"),
        (["--verified", "0"], "'0' is not a positive integer"),
    ],
)
def test_nonsense_is_refused_with_what_is_expected(args, fragment, capsys):
    from pytest_specenergy.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["predict", "--shape", "qwen3-4b", "--verified", "16", *args])
    assert exc.value.code == 2 and fragment in capsys.readouterr().err
