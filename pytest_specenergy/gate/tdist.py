"""Student's t distribution with numpy only (scipy is not a dependency), vectorized so that the
simulation and the gate get the very same numbers (the methods: docs/gate.md#the-sequential-limit-test)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

_lgamma = np.vectorize(math.lgamma, otypes=[float])
_MAX_TERMS = 300
_EPS = 1e-15
_TINY = 1e-300


def _betacf_scalar(a: float, b: float, x: float) -> float:
    """The continued fraction for one value, in plain floats (small inputs: no numpy overhead)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) >= _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2.0 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) >= _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) >= _TINY else _TINY
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def _betacf(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Continued fraction of I_x(a, b) (Numerical Recipes' betacf, on arrays)."""
    if x.size <= 16:
        return np.array(
            [
                _betacf_scalar(float(ai), float(bi), float(xi))
                for ai, bi, xi in zip(a, b, x, strict=True)
            ]
        )
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) < _TINY, _TINY, d)
    h = d.copy()
    done = np.zeros(x.shape, dtype=bool)
    for m in range(1, _MAX_TERMS):
        m2 = 2.0 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = np.where(np.abs(d) < _TINY, _TINY, d)
            c = 1.0 + aa / c
            c = np.where(np.abs(c) < _TINY, _TINY, c)
            d = 1.0 / d
            delta = d * c
            h = np.where(done, h, h * delta)
        done |= np.abs(delta - 1.0) < _EPS
        if done.all():
            break
    return h


def betainc(a: ArrayLike, b: ArrayLike, x: ArrayLike) -> np.ndarray:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    a, b, x = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float), np.asarray(x, float))
    out = np.empty(x.shape)
    low, high = x <= 0.0, x >= 1.0
    out[low], out[high] = 0.0, 1.0
    mid = ~(low | high)
    if mid.any():
        am, bm, xm = a[mid], b[mid], x[mid]
        log_front = (
            _lgamma(am + bm) - _lgamma(am) - _lgamma(bm) + am * np.log(xm) + bm * np.log1p(-xm)
        )
        front = np.exp(log_front)
        direct = xm < (am + 1.0) / (am + bm + 2.0)
        value = np.empty(xm.shape)
        if direct.any():
            value[direct] = front[direct] * _betacf(am[direct], bm[direct], xm[direct]) / am[direct]
        flip = ~direct
        if flip.any():
            value[flip] = 1.0 - front[flip] * _betacf(bm[flip], am[flip], 1.0 - xm[flip]) / bm[flip]
        out[mid] = value
    return out


def t_sf(t: ArrayLike, df: ArrayLike) -> np.ndarray:
    """Upper tail P(T > t) of Student's t, ``df`` > 0; ``t = +-inf`` gives 0 or 1, ``df = inf`` the
    normal tail."""
    t, df = np.broadcast_arrays(np.asarray(t, float), np.asarray(df, float))
    if np.any(~(df > 0)):
        raise ValueError("degrees of freedom must be positive")
    out = np.empty(t.shape)
    normal = np.isinf(df)
    if normal.any():
        out[normal] = 0.5 * np.vectorize(math.erfc, otypes=[float])(t[normal] / math.sqrt(2.0))
    finite = ~normal
    if finite.any():
        tf, dff = t[finite], df[finite]
        with np.errstate(over="ignore", invalid="ignore"):
            x = np.where(np.isinf(tf), 0.0, dff / (dff + tf * tf))
        tail = 0.5 * betainc(dff / 2.0, np.full_like(dff, 0.5), x)  # P(|T| > |t|) / 2
        out[finite] = np.where(tf >= 0, tail, 1.0 - tail)
    return out


def t_pdf(t: ArrayLike, df: ArrayLike) -> np.ndarray:
    """Density of Student's t with ``df`` degrees of freedom (``inf``: the normal density)."""
    t, df = np.broadcast_arrays(np.asarray(t, float), np.asarray(df, float))
    shape = t.shape
    t, df = t.reshape(-1), df.reshape(-1)
    out = np.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    finite = np.isfinite(df)
    if finite.any():
        v, x = df[finite], t[finite]
        log_norm = _lgamma((v + 1.0) / 2.0) - _lgamma(v / 2.0) - 0.5 * np.log(v * math.pi)
        out[finite] = np.exp(log_norm - (v + 1.0) / 2.0 * np.log1p(x * x / v))
    return out.reshape(shape)


def t_ppf(p: ArrayLike, df: ArrayLike) -> np.ndarray:
    """Quantile of Student's t: the t with P(T <= t) = p, for 0 < p < 1 (the method:
    docs/gate.md)."""
    p, df = np.broadcast_arrays(np.asarray(p, float), np.asarray(df, float))
    if np.any((p <= 0) | (p >= 1)):
        raise ValueError("quantile level must lie in (0, 1)")
    shape = p.shape
    p, df = p.reshape(-1), df.reshape(-1)
    q = np.minimum(p, 1.0 - p)  # lower-tail level, <= 1/2
    lo, hi = np.full(q.shape, -1e12), np.zeros(q.shape)
    # The start: Fisher's expansion of t in the normal quantile z and 1/df (close from df = 3 on, so
    # Newton needs 2-5 steps, not 9 from -1; the gate solves two quantiles per look).
    inv_cdf = NormalDist().inv_cdf
    z = np.array([inv_cdf(v) if v < 0.5 else 0.0 for v in q])
    inv = 1.0 / np.maximum(df, 3.0)
    fisher = (
        z
        + (z**3 + z) / 4.0 * inv
        + (5 * z**5 + 16 * z**3 + 3 * z) / 96.0 * inv**2
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384.0 * inv**3
    )
    t = np.where(df >= 3.0, fisher, np.where(q < 0.5, -1.0, 0.0))
    for _ in range(100):
        cdf = t_sf(-t, df)
        below = cdf < q
        lo, hi = np.where(below, t, lo), np.where(below, hi, t)
        newton = t - (cdf - q) / np.maximum(t_pdf(t, df), 1e-300)
        inside = (newton >= lo) & (newton <= hi)
        middle = -np.sinh(0.5 * (np.arcsinh(-lo) + np.arcsinh(-hi)))
        nxt = np.where(cdf == q, t, np.where(inside, newton, middle))
        converged = np.all(np.abs(nxt - t) <= 1e-13 * (1.0 + np.abs(t)))
        t = nxt
        if converged:
            break
    return np.where(p > 0.5, -t, t).reshape(shape)


__all__ = ["betainc", "t_pdf", "t_ppf", "t_sf"]
