"""benchmarks/reference_engine.py runs: every batch point gets transformers' generate and the
engine on the same prompts, a ratio per repeat and their median (on tiny:dense, a few tokens)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import reference_engine  # noqa: E402  (a benchmark script, not a package)

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_each_batch_prints_generate_and_the_engine_with_ratios(capsys) -> None:
    args = ["--model", "tiny:dense", "--batches", "1,2", "--max-new-tokens", "3", "--reps", "2"]
    assert reference_engine.main([*args, "--threads", "0", "--drafters", "none,ngram"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^  transformers generate +[\d.]+ tok/s$", out, re.M)) == 2, out
    rows = re.findall(r"engine \((\w+)\).*ratio per repeat:\s+([\d. ]+?)\s+median ([\d.]+)", out)
    assert [r[0] for r in rows] == ["none", "ngram", "none", "ngram"], out
    for _, per_repeat, median in rows:
        ratios = [float(x) for x in per_repeat.split()]
        assert len(ratios) == 2 and all(r > 0 for r in ratios)
        assert float(median) == pytest.approx(
            sorted(ratios)[0] / 2 + sorted(ratios)[1] / 2, abs=0.01
        )
