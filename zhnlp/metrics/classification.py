"""Accuracy and macro-averaged F1 for single-label classification (sentiment, topic, NLI ...).

Labels may be any hashable values (ints, strings) as long as predictions and labels use the same ones.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

from zhnlp.errors import DataError


def _check(predictions: Sequence, labels: Sequence) -> None:
    if len(predictions) != len(labels):
        raise DataError(f"{len(predictions)} predictions for {len(labels)} labels; predict exactly one label per "
                        f"example, in the order of the examples")
    if not labels:
        raise DataError("no examples to score: predictions and labels are both empty")


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    """The fraction (0..1) of examples whose prediction equals the label."""
    _check(predictions, labels)
    return sum(p == g for p, g in zip(predictions, labels)) / len(labels)


def per_class_f1(predictions: Sequence, labels: Sequence, label_set: Sequence | None = None) -> dict[Hashable, float]:
    """F1 (0..1) of each class, one-vs-rest. The classes are ``label_set`` when given (a label or prediction
    outside it is an error), else every value seen in ``labels`` or ``predictions``.

    A class's F1 is 0 when it has no true positives -- including a class of ``label_set`` that is neither in the
    labels nor predicted, where F1 is undefined (0/0): scikit-learn's convention, so that a ``label_set`` listing
    classes absent from a small evaluation set lowers the macro average rather than being silently dropped."""
    _check(predictions, labels)
    if label_set is None:
        classes = list(dict.fromkeys([*labels, *predictions]))  # first-seen order, for a readable result
    else:
        classes = list(dict.fromkeys(label_set))
        known = set(classes)
        unknown = list(dict.fromkeys(x for x in [*labels, *predictions] if x not in known))
        if unknown:
            raise DataError(f"labels or predictions {', '.join(map(repr, unknown[:5]))} are not in label_set "
                            f"{classes!r}; pass the full label set, or label_set=None to use the values seen")
    true_pos = Counter(g for p, g in zip(predictions, labels) if p == g)
    predicted = Counter(predictions)
    gold = Counter(labels)
    # F1 = 2 tp / (2 tp + fp + fn) = 2 tp / (predicted + gold): the same number as from precision and recall.
    return {c: (2 * true_pos[c] / (predicted[c] + gold[c]) if true_pos[c] else 0.0) for c in classes}


def macro_f1(predictions: Sequence, labels: Sequence, label_set: Sequence | None = None) -> float:
    """The unweighted mean (0..1) over classes of the per-class F1 (see :func:`per_class_f1` for the classes and
    the convention for a class that never occurs)."""
    scores = per_class_f1(predictions, labels, label_set)
    return sum(scores.values()) / len(scores)


def classification_scores(predictions: Sequence, labels: Sequence, label_set: Sequence | None = None) -> dict:
    """``{"accuracy": 0..1, "macro_f1": 0..1, "total": number of examples}``."""
    return {"accuracy": accuracy(predictions, labels), "macro_f1": macro_f1(predictions, labels, label_set),
            "total": len(labels)}
