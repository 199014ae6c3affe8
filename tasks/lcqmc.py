"""Sentence-pair classification on LCQMC (do two questions ask the same thing? ``zhnlp data fetch lcqmc``):
accuracy and macro-F1 on its test split. The same recipe fits ``bq`` (bank customer questions) with
``--set train=...``, or use ``--dataset bq``-style copies of this file.

    python tasks/lcqmc.py --model m3e-small [--set max_train_examples=20000]
"""

from __future__ import annotations

import sys

from _common import main


def recipe(model: str, output: str | None = None, dataset: str = "lcqmc"):
    from zhnlp.data.fetch import fetch
    from zhnlp.training.finetune import FinetuneConfig

    data = fetch(dataset)
    return FinetuneConfig(task="classification", model=model, train=str(data / "train.jsonl"),
                          dev=str(data / "dev.jsonl"), test=str(data / "test.jsonl"), labels=["0", "1"],
                          label_names=["different", "same"], output=output or f"runs/{dataset}", epochs=2,
                          lr=5e-5, batch_size=32, max_length=64)


if __name__ == "__main__":
    sys.exit(main(recipe, __doc__.splitlines()[0]))
