"""Named-entity recognition on MSRA (PER/LOC/ORG, BIO; ``zhnlp data fetch msra-ner``): entity-level
precision, recall and F1 on its test set.

    python tasks/msra_ner.py --model runs/ernie-debug/exported [--set epochs=1]
"""

from __future__ import annotations

import sys

from _common import main


def recipe(model: str, output: str | None = None):
    from zhnlp.data.fetch import fetch
    from zhnlp.training.finetune import FinetuneConfig

    data = fetch("msra-ner")
    return FinetuneConfig(task="ner", model=model, train=str(data / "train.jsonl"), dev=str(data / "dev.jsonl"),
                          test=str(data / "test.jsonl"), output=output or "runs/msra-ner", epochs=3, lr=5e-5,
                          batch_size=32, max_length=128)


if __name__ == "__main__":
    sys.exit(main(recipe, __doc__.splitlines()[0]))
