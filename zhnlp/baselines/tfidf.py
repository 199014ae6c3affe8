"""A character n-gram TF-IDF + logistic-regression text classifier: the strong simple baseline for Chinese text
classification (no segmentation needed), for single texts and for sentence pairs.

    clf = TfidfClassifier().fit(train_texts, train_labels)                 # texts: str, or (text, pair) tuples
    clf.predict(test_texts)                                                # labels as given to fit

Features: character n-grams (``ngram_range``, default 1-3) kept when they occur in at least ``min_df`` training
texts (the ``max_features`` most frequent), sublinear term frequency ``1 + log(tf)`` times the smoothed inverse
document frequency ``log((1 + n) / (1 + df)) + 1``, each row L2-normalised. A pair ``(a, b)`` is described by a's
n-grams, b's n-grams and the n-grams they share, each in its own feature space, plus one feature counting the
shared n-grams, so the classifier can learn what matching looks like. Logistic regression (softmax over the labels, L2 penalty ``1 / C``) is fitted by L-BFGS on
the whole training set (sparse matrices in torch).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Sequence

import torch

Text = str | tuple[str, str]


def ngrams(text: str, low: int, high: int) -> list[str]:
    """The character n-grams of ``text`` for ``low <= n <= high`` (whitespace dropped)."""
    chars = "".join(text.split())
    return [chars[i:i + n] for n in range(low, high + 1) for i in range(len(chars) - n + 1)]


class TfidfClassifier:
    def __init__(self, ngram_range: tuple[int, int] = (1, 3), min_df: int = 2, max_features: int = 300_000,
                 C: float = 10.0, max_iter: int = 200):
        if not (1 <= ngram_range[0] <= ngram_range[1]):
            raise ValueError(f"ngram_range must be (low, high) with 1 <= low <= high, got {ngram_range!r}.")
        self.ngram_range, self.min_df, self.max_features = ngram_range, min_df, max_features
        self.C, self.max_iter = C, max_iter

    # ------------------------------------------------------------------ features
    def _terms(self, item: Text) -> list[str]:
        low, high = self.ngram_range
        if isinstance(item, str):
            return ngrams(item, low, high)
        a, b = item
        grams_a, grams_b = ngrams(a, low, high), ngrams(b, low, high)
        shared = set(grams_a) & set(grams_b)
        # "s:" alone counts the shared n-grams: how much the two overlap, whatever they are
        return (["a:" + g for g in grams_a] + ["b:" + g for g in grams_b] + ["s:" + g for g in shared]
                + ["s:"] * len(shared))

    def _matrix(self, items: Sequence[Text]) -> torch.Tensor:
        rows, cols, values = [], [], []
        for r, item in enumerate(items):
            counts = Counter(t for t in self._terms(item) if t in self.vocabulary)
            weights = {self.vocabulary[t]: (1 + math.log(c)) * self.idf[self.vocabulary[t]] for t, c in counts.items()}
            norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
            for c, w in weights.items():
                rows.append(r)
                cols.append(c)
                values.append(w / norm)
        index = torch.tensor([rows, cols], dtype=torch.long)
        return torch.sparse_coo_tensor(index, torch.tensor(values, dtype=torch.float32),
                                       (len(items), len(self.vocabulary)), check_invariants=True).coalesce()

    # ------------------------------------------------------------------ fit / predict
    def fit(self, items: Sequence[Text], labels: Sequence[Hashable]) -> "TfidfClassifier":
        if len(items) != len(labels) or not items:
            raise ValueError(f"fit needs as many labels as texts (and at least one): {len(items)} texts, "
                             f"{len(labels)} labels.")
        df: Counter = Counter()
        for item in items:
            df.update(set(self._terms(item)))
        kept = [t for t, n in df.most_common(self.max_features) if n >= self.min_df]
        if not kept:
            raise ValueError(f"no n-gram occurs in at least min_df={self.min_df} training texts; lower min_df.")
        self.vocabulary = {t: i for i, t in enumerate(kept)}
        n = len(items)
        self.idf = [math.log((1 + n) / (1 + df[t])) + 1 for t in kept]
        self.classes = sorted(set(labels), key=str)
        target = torch.tensor([self.classes.index(y) for y in labels])
        x = self._matrix(items)
        self.weight = torch.zeros(len(kept), len(self.classes), requires_grad=True)
        self.bias = torch.zeros(len(self.classes), requires_grad=True)
        optimizer = torch.optim.LBFGS([self.weight, self.bias], max_iter=self.max_iter, line_search_fn="strong_wolfe")

        def loss_fn():
            optimizer.zero_grad()
            logits = torch.sparse.mm(x, self.weight) + self.bias
            # scikit-learn's scaling: C times the summed log-loss plus half the squared weights
            loss = torch.nn.functional.cross_entropy(logits, target, reduction="sum") * self.C
            loss = (loss + 0.5 * self.weight.pow(2).sum()) / n
            loss.backward()
            return loss

        optimizer.step(loss_fn)
        self.weight.requires_grad_(False)
        self.bias.requires_grad_(False)
        return self

    def decision_function(self, items: Sequence[Text]) -> torch.Tensor:
        if not hasattr(self, "weight"):
            raise RuntimeError("call fit(texts, labels) before predicting.")
        return torch.sparse.mm(self._matrix(items), self.weight) + self.bias

    def predict(self, items: Sequence[Text]) -> list:
        return [self.classes[i] for i in self.decision_function(items).argmax(-1).tolist()]
