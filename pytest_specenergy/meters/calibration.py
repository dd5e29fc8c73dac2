"""Where the GPU presets' constants come from: a fit to ML.ENERGY's measured serving figures
(``benchmarks/mlenergy_calibration.py`` does the fit and prints the table; the method and its
assumptions: ``docs/report.md``)."""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Calibration:
    """The measured data a preset's constants were fitted to, and what the fit assumed: recorded in
    every modeled window and in the meter's description, so calibrated and uncalibrated figures
    can be told apart."""

    #: Short, versioned name: the data set, its GPU, the commit of the data.
    id: str
    #: Who measured what, where the figures are published.
    source: str
    #: The extract in this repository the fit reads.
    data: str
    #: The preset's constants the fit chose, and from which figures.
    fitted: tuple[str, ...]
    #: What the fit took as given.
    assumed: tuple[str, ...]
    #: How a GPU without published figures got its constants ("" for the GPU that was fitted).
    transferred: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


_SOURCE = (
    "ML.ENERGY Leaderboard v3 (The ML.ENERGY Benchmark, vLLM, bf16, CUDA graphs, one H100 SXM, "
    "steady state): Qwen3-8B and Llama-3.1-8B-Instruct on lm-arena-chat, max_num_seqs 8-256; "
    "github.com/ml-energy/leaderboard@0cd52da public/data/models/, Apache-2.0"
)
_DATA = "benchmarks/data/mlenergy_v3_h100.json"
_FITTED = (
    "fixed_step_s, bandwidth_bytes_per_s (peak_flops_per_s = bandwidth x the paper's balance "
    "point, 316 FLOP/byte) and static_w: least squares on log step time (avg batch / output "
    "throughput) and log average power of all 16 runs",
    "joules_per_flop: the centre of the range in which predict keeps the paper's four s.9 "
    "crossovers (ML.ENERGY's runs alone prefer 1.55 pJ/FLOP, which moves three of them)",
)
_ASSUMED = (
    "a step's memory time and compute time add (kernels do not hide one behind the other)",
    "mean prompt of 300 tokens (lm-arena-chat's is not published); a request's context is its "
    "prompt plus half its output, length-weighted from the published output histogram",
    "each step also prefills the prompts of the requests that finish in it (vLLM's chunked "
    "prefill), reading the weights once",
    "joules_per_byte kept at the presets' earlier 90 pJ/B (H100), 80 (H200): on memory-bound "
    "steps it trades one for one with static_w",
    "700 W board power limit",
)

#: The fit to ML.ENERGY's H100 figures (``benchmarks/mlenergy_calibration.py``).
ML_ENERGY_H100 = Calibration(
    id="mlenergy-v3-h100@0cd52da",
    source=_SOURCE,
    data=_DATA,
    fitted=_FITTED,
    assumed=_ASSUMED,
)

#: The H200: ML.ENERGY publishes no H200 figures, so its constants come from the H100 fit.
ML_ENERGY_H200 = Calibration(
    id="mlenergy-v3-h100@0cd52da, transferred to h200",
    source=_SOURCE,
    data=_DATA,
    fitted=_FITTED,
    assumed=_ASSUMED,
    transferred="the same GH100 die and 700 W limit as the fitted H100: its fixed step cost, peak "
    "FLOP/s, static W and J/FLOP; its bandwidth is that peak over the paper's H200 balance point "
    "(163 FLOP/byte), 4.23 TB/s, within 2% of the uncalibrated preset's 4.3 TB/s (a device copy "
    "on an H200 of this workplace, its comment said)",
)

#: Fitted constants of the H100 (``benchmarks/mlenergy_calibration.py`` prints the fit that gives
#: them and fails when these drift from it).
H100_FIXED_STEP_S = 0.549e-3
H100_BANDWIDTH_BYTES_PER_S = 2.184e12
H100_STATIC_W = 304.5
H100_JOULES_PER_FLOP = 0.85e-12
