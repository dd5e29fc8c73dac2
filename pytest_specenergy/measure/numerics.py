"""The largest top-2 margin an engine's own rounding can flip: the margin a divergence must be under
to count as a numerical tie (the tie rule: ``docs/methodology.md#equivalence-and-numerical-ties``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Mapping

#: The logit magnitude the margin is sized for: the top logits of real LLMs lie in [16, 32), so a
#: logit's rounding step (one ulp) there is the most two near-tied logits can move apart when
#: kernels round in another order (each by up to half an ulp).
LOGIT_RANGE_TOP = 32.0

#: Significant bits (the implicit one included) of each dtype logits are computed in, by every
#: spelling an engine reports it (SGLang's ``--dtype``, torch's names).
SIGNIFICANT_BITS: dict[str, int] = {
    "bfloat16": 8,
    "bf16": 8,
    "float16": 11,
    "half": 11,
    "fp16": 11,
    "float32": 24,
    "float": 24,
    "fp32": 24,
    "float64": 53,
    "double": 53,
}

#: The smallest margin any engine gets (nats, 2**-13 = 1.2e-4): below one ulp of a float32 logit,
#: rounding is no longer what moves logits apart, but the engine's two paths are (a decode step
#: and a verify pass order their sums differently, the hybrid's recurrence runs chunked or
#: stepwise). Measured here: the tiny models' decode and verify logits differ by up to 1.05e-5 in
#: float32 and 3.6e-6 in float64 (benchmarks/results/tiny_dtype.txt, "path noise"); this leaves
#: ten times that.
PATH_NOISE_FLOOR = 2.0**-13

#: What an engine that does not resolve its dtype (SGLang's ``auto``) is taken to round like: the
#: coarsest dtype logits are served in, so its ties are judged as today's bf16 engines' are.
ASSUMED_DTYPE = "bfloat16"


@dataclass(frozen=True)
class NoiseMargin:
    """The margin (nats) below which an engine's rounding can swap the top two tokens, and where
    the figure came from (said beside every tie)."""

    margin: float
    source: str

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {"margin": self.margin, "source": self.source}


def ulp_margin(dtype: str) -> float:
    """One ulp of a logit at the top of the range, ``[LOGIT_RANGE_TOP / 2, LOGIT_RANGE_TOP)``:
    bfloat16 0.125, float16 2**-6, float32 2**-19."""
    bits = SIGNIFICANT_BITS.get(dtype.lower())
    if bits is None:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(SIGNIFICANT_BITS))}")
    return LOGIT_RANGE_TOP / 2 * 2.0 ** -(bits - 1)


def dtype_margin(dtype: str) -> float:
    """The margin an engine computing logits in ``dtype`` may flip: one ulp of a logit at the top
    of the range (:func:`ulp_margin`), never below :data:`PATH_NOISE_FLOOR`: bfloat16 0.125,
    float16 2**-6, float32 and float64 2**-13."""
    return max(ulp_margin(dtype), PATH_NOISE_FLOOR)


def noise_margin(server_info: Mapping[str, Any] | None) -> NoiseMargin:
    """The engine's noise margin from its ``/server_info``: the reference server's emulated rounding
    (``logit_noise_scale``, fault ``numerical-noise``: each logit scaled by up to ``1 +- scale/2``,
    so two logits under ``LOGIT_RANGE_TOP`` swap only within ``LOGIT_RANGE_TOP * scale``), else the
    dtype's (:func:`dtype_margin`), else :data:`ASSUMED_DTYPE`'s, said so."""
    info = server_info if isinstance(server_info, Mapping) else {}
    scale = info.get("logit_noise_scale")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0:
        return NoiseMargin(
            LOGIT_RANGE_TOP * float(scale),
            f"the engine's emulated logit rounding (relative {float(scale):.3g}, "
            "fault numerical-noise)",
        )
    dtype = str(info.get("dtype") or "").lower()
    if dtype in SIGNIFICANT_BITS:
        return NoiseMargin(dtype_margin(dtype), _said(dtype))
    said = f"dtype {dtype!r}" if dtype else "no dtype"
    return NoiseMargin(
        dtype_margin(ASSUMED_DTYPE),
        f"{said} in /server_info: assumed {ASSUMED_DTYPE}, one ulp of a logit under "
        f"{LOGIT_RANGE_TOP:g}",
    )


def _said(dtype: str) -> str:
    """Where a dtype's margin comes from, in words."""
    if ulp_margin(dtype) >= PATH_NOISE_FLOOR:
        return f"one {dtype} ulp of a logit under {LOGIT_RANGE_TOP:g}"
    return f"the {dtype} engine's path noise floor (decode vs verify logits), 2**-13"
