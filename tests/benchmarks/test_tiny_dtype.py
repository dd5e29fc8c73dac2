"""benchmarks/tiny_dtype.py runs, and its figures come from the dtype asked for: the dense tiny
model's float64 paths agree to ~1e-14, float32's to ~1e-5 (what a float32 engine's tie margin,
2**-13, is sized for), and healthy speculation is exact in both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tiny_dtype  # noqa: E402  (a benchmark script, not a package)

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_rows_measure_both_dtypes_and_float64_speculation_is_exact() -> None:
    import torch

    threads = torch.get_num_threads()
    rows = {
        r.dtype: r for r in tiny_dtype.measure_rows(["tiny:dense"], prompts=1, tokens=4, rounds=1)
    }
    # the worker's later in-process tests keep their threads
    assert torch.get_num_threads() == threads
    table = tiny_dtype.format_rows(list(rows.values()), tokens=4)
    assert set(rows) == {"float64", "float32"}, table
    assert rows["float64"].vs_float64 == 1.0 and rows["float32"].generate_s > 0, table
    assert all(r.spec_differs == 0 and r.batch_differs == 0 for r in rows.values()), table
    assert rows["float64"].prompts == 5, table  # 1 prompt of each built-in corpus
    # The two dtypes really ran: their reduction noise differs by orders of magnitude.
    assert rows["float64"].path_noise < 1e-10 < rows["float32"].path_noise, table
    assert 0 < rows["float64"].min_gap <= rows["float64"].gap_p01, table


def test_divergences_count_every_corpus_and_name_what_differs() -> None:
    (line,) = tiny_dtype.count_divergences(["tiny:dense"], "float32", prompts=1, tokens=8)
    assert line == "tiny:dense   float32  spec != base: 0 of 5 prompts (40 tokens, batch 8)", line
    (bad,) = tiny_dtype.count_divergences(
        ["tiny:dense"], "float32", prompts=1, tokens=8, faults=("accept-off-by-one",)
    )
    assert "spec != base: 0 of" not in bad and "('code', 0, " in bad, bad
