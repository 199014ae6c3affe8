"""Extractive reading comprehension on CMRC2018 (SQuAD format; official EM/F1).

Only the CMRC2018 *trial* set (256 articles, 1,002 questions; CC-BY-SA-4.0, Cui et al. 2019,
https://github.com/ymcui/cmrc2018) is reachable from this project's machines, so the recipe
splits it by article, with a fixed seed, into a training part (80%) and a held-out part (20%)
scored as dev and test. With the official train and dev files, pass them instead:
``--set train=cmrc2018_train.json --set dev=cmrc2018_dev.json --set test=``.

    python tasks/cmrc2018.py --model runs/ernie-debug/exported [--set epochs=2]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from _common import main

SEED = 2018


def split_trial(held_out: float = 0.2, seed: int = SEED) -> tuple[Path, Path]:
    """Write the trial set's article split (once) beside the fetched data, in its own directory
    (a re-fetch replaces the dataset's directory); returns (train, held-out)."""
    from zhnlp.data.fetch import fetch

    data = fetch("cmrc2018-trial")
    split = data.parent / f"cmrc2018-trial-split{seed}"
    split.mkdir(exist_ok=True)
    train, rest = split / "train.json", split / "heldout.json"
    if not (train.is_file() and rest.is_file()):
        source = json.loads((data / "cmrc2018_trial.json").read_text(encoding="utf-8"))
        articles = list(source["data"])
        random.Random(seed).shuffle(articles)
        cut = round(len(articles) * (1 - held_out))
        for path, part in ((train, articles[:cut]), (rest, articles[cut:])):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"version": source.get("version", ""), "data": part}, ensure_ascii=False),
                           encoding="utf-8")
            tmp.replace(path)
    return train, rest


def recipe(model: str, output: str | None = None):
    from zhnlp.training.finetune import FinetuneConfig

    train, held_out = split_trial()
    return FinetuneConfig(task="mrc", model=model, train=str(train), dev=str(held_out), test=str(held_out),
                          output=output or "runs/cmrc2018", epochs=2, lr=3e-5, batch_size=32, max_length=512,
                          doc_stride=128, max_answer_length=256)


if __name__ == "__main__":
    sys.exit(main(recipe, __doc__.splitlines()[0]))
