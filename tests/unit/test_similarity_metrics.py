"""Spearman and Pearson correlations: known values (ties included), invariances and errors."""

import math
import random

import pytest

from zhnlp.metrics.similarity import pearson, ranks, spearman, sts_scores


def test_known_values():
    # scipy.stats.spearmanr's documented example (a tie in the second list): 0.8207826816681233
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233, abs=1e-12)
    assert ranks([10, 20, 20, 5, 20]) == [2.0, 4.0, 4.0, 1.0, 4.0]
    # Pearson by hand: x = 1..4, y = 2, 4, 5, 9 -> co-deviation sum 11, squared deviations 5 and 26
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(5 * 26), abs=1e-12)


def test_rank_correlation_ignores_monotone_transforms():
    rng = random.Random(0)
    a = [rng.random() for _ in range(200)]
    b = [x + rng.gauss(0, 0.3) for x in a]
    rho = spearman(a, b)
    assert 0.5 < rho < 0.99
    assert spearman([math.exp(5 * x) for x in a], b) == pytest.approx(rho, abs=1e-12)
    assert spearman(a, [-x for x in b]) == pytest.approx(-rho, abs=1e-12)
    assert spearman(a, a) == pytest.approx(1.0)
    assert pearson([math.exp(5 * x) for x in a], b) != pytest.approx(pearson(a, b), abs=1e-3)


def test_sts_scores_in_percent_and_errors():
    scores = sts_scores([0.9, 0.1, 0.5, 0.4], [5, 0, 3, 3.5])
    assert scores["spearman"] == pytest.approx(80.0) and scores["total"] == 4
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="3 predictions for 2 gold scores"):
        spearman([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 pairs"):
        spearman([1], [1])
    with pytest.raises(ValueError, match="a prediction is nan"):
        spearman([1, float("nan")], [1, 2])
