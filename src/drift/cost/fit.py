"""A link's coefficients from measured times: least squares in relative error, every coefficient >= 0.

``drift bench comm`` fits a ``Fit`` per collective and rank count to its sweep (``fit_alpha_beta``);
``benchmarks/two_level.py`` fits a ``Machine``'s two levels with the same solver (``non_negative_lstsq``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from drift.cost.collectives import Fit, terms


def fit_alpha_beta(kind: str, points: Sequence[tuple[int, float, float]], threshold_bytes: int | None = None) -> Fit:
    """Least squares in relative error of the model of ``Fit`` over ``(ranks, bytes, seconds)`` points,
    every coefficient >= 0; gamma is fitted only with a threshold."""
    columns = []
    for p, n, _ in points:
        steps, wire = terms(kind, p, n)
        columns.append([steps, wire] + ([steps * (n / p > threshold_bytes)] if threshold_bytes is not None else []))
    t = np.array([s for _, _, s in points], dtype=np.float64)
    a = np.array(columns, dtype=np.float64) / t[:, None]  # relative error: every size counts alike
    coef = non_negative_lstsq(a, np.ones_like(t))
    gamma = float(coef[2]) if threshold_bytes is not None else 0.0
    return Fit(float(coef[0]), float(coef[1]), gamma, threshold_bytes)


def non_negative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin ||a x - b||`` over ``x >= 0`` for a few columns. The solution is the unconstrained least
    squares solution on its own support, so the best non-negative one over all supports is it."""
    best, best_residual = np.zeros(a.shape[1]), float(b @ b)
    tie = 1e-12 * best_residual  # rounding: a larger support must do better by more than this
    for k in range(1, a.shape[1] + 1):
        for support in itertools.combinations(range(a.shape[1]), k):
            x = np.zeros(a.shape[1])
            x[list(support)] = np.linalg.lstsq(a[:, support], b, rcond=None)[0]
            residual = float(np.sum((a @ x - b) ** 2))
            if x.min() >= 0 and residual < best_residual - tie:
                best, best_residual = x, residual
    return best
