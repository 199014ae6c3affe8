"""Correlation metrics for semantic textual similarity (STS-B): Spearman's rank correlation (the standard STS
figure) and Pearson's correlation, between predicted similarities and gold scores.

    from zhnlp.metrics.similarity import spearman
    spearman([0.9, 0.1, 0.5], [5, 0, 3])      # 1.0: the same order

Ties get the average of the ranks they span (the usual definition, as scipy.stats.spearmanr computes it).
"""

from __future__ import annotations

import math
from typing import Sequence


def _check(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b):
        raise ValueError(f"{len(a)} predictions for {len(b)} gold scores; give one prediction per pair.")
    if len(a) < 2:
        raise ValueError(f"a correlation needs at least 2 pairs, got {len(a)}.")
    for name, values in (("prediction", a), ("gold score", b)):
        bad = next((v for v in values if not isinstance(v, (int, float)) or math.isnan(v) or math.isinf(v)), None)
        if bad is not None:
            raise ValueError(f"a {name} is {bad!r}; every value must be a finite number.")


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the average of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            out[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return out


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson's correlation coefficient; NaN when either side is constant (it is undefined there)."""
    _check(a, b)
    n = len(a)
    mean_a, mean_b = sum(a) / n, sum(b) / n
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b))
    var_a = sum((x - mean_a) ** 2 for x in a)
    var_b = sum((y - mean_b) ** 2 for y in b)
    if var_a == 0 or var_b == 0:
        return math.nan
    return cov / math.sqrt(var_a * var_b)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the (tie-averaged) ranks."""
    _check(a, b)
    return pearson(ranks(a), ranks(b))


def sts_scores(predictions: Sequence[float], gold: Sequence[float]) -> dict:
    """``{"spearman", "pearson"}`` in percent (as STS results are reported) and ``total``."""
    return {"spearman": 100 * spearman(predictions, gold), "pearson": 100 * pearson(predictions, gold),
            "total": len(gold)}
