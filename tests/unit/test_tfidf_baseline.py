"""The TF-IDF + logistic-regression baseline learns what the n-grams say, for texts and for pairs."""

import random

import pytest

from zhnlp.baselines import TfidfClassifier
from zhnlp.baselines.tfidf import ngrams

GOOD = ["很好吃", "服务周到", "环境不错", "值得推荐", "性价比高", "下次还来"]
BAD = ["太难吃", "服务很差", "环境脏乱", "不推荐", "价格太贵", "再也不来"]


def _reviews(n, rng):
    texts, labels = [], []
    for _ in range(n):
        label = rng.random() < 0.5
        words = rng.sample(GOOD if label else BAD, 2) + rng.sample(["今天", "我们", "这家店", "晚上", "朋友"], 2)
        rng.shuffle(words)
        texts.append("，".join(words))
        labels.append("positive" if label else "negative")
    return texts, labels


def test_ngrams():
    assert ngrams("北京 大学", 1, 2) == ["北", "京", "大", "学", "北京", "京大", "大学"]


def test_learns_sentiment_words_and_keeps_label_values():
    rng = random.Random(0)
    train, train_y = _reviews(300, rng)
    test, test_y = _reviews(100, rng)
    clf = TfidfClassifier().fit(train, train_y)
    predicted = clf.predict(test)
    assert set(predicted) <= {"positive", "negative"}
    assert sum(p == y for p, y in zip(predicted, test_y)) >= 97
    # an n-gram never seen in training carries no weight: the prediction comes from the known words
    assert clf.predict(["值得推荐，龘龘龘"]) == ["positive"]


def test_pairs_learn_matching():
    rng = random.Random(1)
    vocab = [chr(0x4E00 + i) for i in range(400)]

    def pair(same):
        a = "".join(rng.sample(vocab, 6))
        b = "".join(rng.sample(a, 6)) if same else "".join(rng.sample(vocab, 6))
        return (a, b), int(same)

    train = [pair(rng.random() < 0.5) for _ in range(400)]
    test = [pair(rng.random() < 0.5) for _ in range(100)]
    clf = TfidfClassifier(ngram_range=(1, 1), min_df=1).fit([x for x, _ in train], [y for _, y in train])
    predicted = clf.predict([x for x, _ in test])
    assert sum(p == y for p, (_, y) in zip(predicted, test)) >= 90  # only the shared-n-gram features can do this


def test_errors():
    with pytest.raises(ValueError, match="as many labels as texts"):
        TfidfClassifier().fit(["a", "b"], [1])
    with pytest.raises(ValueError, match="lower min_df"):
        TfidfClassifier(min_df=5).fit(["甲", "乙"], [0, 1])
    with pytest.raises(RuntimeError, match="call fit"):
        TfidfClassifier().predict(["甲"])
