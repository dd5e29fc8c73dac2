"""The HTML report opens in a real browser, offline, and its figures are drawn.

Renders the stored fixtures (``tests/data/report/``) to a file, screenshots it with headless
Chromium and reads the pixels: the page must not be blank, and the drafters' line colours
must appear - and must not appear when the same report is rendered without figures, which
shows the colour count really sees the plots. Skipped when no Chromium is installed
(``apt-get install -y chromium``; or point ``SPECENERGY_CHROMIUM`` at a binary).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import compare_documents
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.settings import DEFAULT_LIMITS
from pytest_specenergy.report.html import render_html
from pytest_specenergy.report.plots import BASELINE_COLOR
from pytest_specenergy.report.plots import PALETTE

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "report"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str | None:
    override = os.environ.get("SPECENERGY_CHROMIUM")
    if override:
        return override
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed "
    "(apt-get install -y chromium, or set SPECENERGY_CHROMIUM)",
)


def chromium_command(
    binary: str, page: Path, png: Path, profile: Path, height: int = 3000
) -> list[str]:
    """The exact headless screenshot command (no network, no first-run, throwaway profile)."""
    return [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        f"--window-size=1400,{height}",
        page.resolve().as_uri(),
    ]


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _screenshot(page_html: str, tmp_path: Path, name: str, height: int = 3000) -> np.ndarray:
    page, png = tmp_path / f"{name}.html", tmp_path / f"{name}.png"
    page.write_text(page_html, encoding="utf-8")
    result = subprocess.run(
        chromium_command(CHROMIUM, page, png, tmp_path / f"profile-{name}", height),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert png.exists(), f"no screenshot (rc {result.returncode}):\n{result.stderr[-2000:]}"
    return _pixels(png)


def _pixels(png: Path) -> np.ndarray:
    try:
        from PIL import Image

        return np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    except ImportError:
        import matplotlib.image as mpimg

        return np.round(mpimg.imread(str(png))[..., :3] * 255).astype(np.int16)


def _distinct_colours(pixels: np.ndarray) -> int:
    """How many RGB colours the screenshot holds. Each pixel is packed into one 24-bit integer
    and the colours counted with ``bincount``: ``np.unique(..., axis=0)`` sorted the 12.6M rows
    of a 9000 px page lexicographically and took 16 s of this test's 22."""
    rgb = pixels.astype(np.int32)
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    return int(np.count_nonzero(np.bincount(packed.ravel(), minlength=1 << 24)))


def _count(pixels: np.ndarray, hex_color: str, tolerance: int = 6) -> int:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    return int((np.abs(pixels - rgb).max(axis=-1) <= tolerance).sum())


@pytest.fixture(scope="module")
def documents():
    # Typed documents, as the CLI reads them (these checks passed plain dicts, and went
    # unnoticed where Chromium was missing and they were skipped).
    history = [
        RunDocument.from_dict(json.loads(Path(p).read_text()))
        for p in sorted(glob.glob(str(FIXTURES / "history-*.json")))
    ]
    run, baseline = (
        RunDocument.from_dict(_load("run.json")),
        RunDocument.from_dict(_load("baseline.json")),
    )
    limits = [parse_fail_expr(text) for text in DEFAULT_LIMITS]
    return run, compare_documents(baseline, run, limits), history


def test_report_renders_with_figures_in_chromium(documents, tmp_path):
    pytest.importorskip("matplotlib")
    run, baseline, history = documents
    page = render_html(run, baseline, history)
    assert page.count("<svg") == 5
    # The figures follow the verdict and the tables: a tall window takes in the whole page.
    pixels = _screenshot(page, tmp_path, "report", height=9000)
    assert pixels.shape[0] >= 9000 and pixels.shape[1] >= 1400
    non_white = int((pixels.min(axis=-1) < 240).sum())
    colours = _distinct_colours(pixels)
    assert non_white > 0.03 * pixels.shape[0] * pixels.shape[1], "the page looks blank"
    assert colours > 200, f"only {colours} distinct colours: nothing was drawn"
    # Drafter lines (dflash, eagle3, ngram take the first three palette colours), the dashed
    # baseline and the red of the latency-choice rings and step marks are all on screen.
    for color in PALETTE[:3] + ("#d62728",):
        assert _count(pixels, color) > 300, f"plot colour {color} is missing from the screenshot"
    assert _count(pixels, BASELINE_COLOR) > 300


def test_tables_only_report_has_no_plot_colours(documents, tmp_path):
    run, baseline, _ = documents
    pixels = _screenshot(render_html(run, baseline, plots=False), tmp_path, "tables")
    assert int((pixels.min(axis=-1) < 240).sum()) > 10_000, "the tables did not render"
    for color in PALETTE[:3] + ("#d62728",):
        assert _count(pixels, color) < 50, f"{color} drawn although figures are off"


def test_report_opens_with_the_verdict_and_nothing_overflows(documents, tmp_path):
    run, baseline, _ = documents
    pixels = _screenshot(render_html(run, baseline, plots=False), tmp_path, "top", height=3000)
    # The REGRESSED badges (#b3261e) of the verdict line and the comparison table are on the
    # first screen of a 1400 px wide window, not thousands of pixels down.
    assert _count(pixels[:900], "#b3261e", tolerance=10) > 200, "no verdict badge near the top"
    # Wide tables scroll inside their box: the page's right margin stays empty.
    margin = pixels[:, -34:-20]  # the body margin, left of the page scrollbar
    assert int((margin.min(axis=-1) < 240).sum()) < 0.001 * margin.shape[0] * margin.shape[1], (
        "something overflows the page's right edge"
    )
