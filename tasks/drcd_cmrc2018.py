"""Reading comprehension trained on DRCD (Traditional Chinese, converted to Simplified with OpenCC: ``zhnlp data
fetch drcd --convert t2s``) plus the training part of the CMRC2018 trial set, scored on the trial set's held-out
articles (the same 80/20 article split as ``tasks/cmrc2018.py``): official CMRC2018 EM/F1.

DRCD (CC-BY-SA-3.0, Delta Research Center) dev and test hold about 7,000 questions on Taiwanese Wikipedia
articles; the CMRC2018 trial set (CC-BY-SA-4.0, Cui et al. 2019) 800 training questions. The two are merged into
one SQuAD file beside the fetched data.

    python tasks/drcd_cmrc2018.py --model m3e-small [--set epochs=1]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _common import main
from cmrc2018 import split_trial


def merged_training_file() -> Path:
    """DRCD dev + test (Simplified) and the CMRC2018 trial training articles as one SQuAD file (written once)."""
    from zhnlp.data.fetch import fetch

    drcd = fetch("drcd", convert="t2s")
    cmrc_train, _ = split_trial()
    out = cmrc_train.parent / "drcd-t2s+cmrc2018-trial-train.json"
    if not out.is_file():
        articles = []
        for path in sorted(drcd.glob("DRCD_*.json")) + [cmrc_train]:
            articles += json.loads(path.read_text(encoding="utf-8"))["data"]
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": "drcd-t2s+cmrc2018-trial-train", "data": articles},
                                  ensure_ascii=False), encoding="utf-8")
        tmp.replace(out)
    return out


def recipe(model: str, output: str | None = None):
    from zhnlp.training.finetune import FinetuneConfig

    _, held_out = split_trial()
    return FinetuneConfig(task="mrc", model=model, train=str(merged_training_file()), dev=str(held_out),
                          test=str(held_out), output=output or "runs/drcd-cmrc2018", epochs=2, lr=5e-5,
                          batch_size=32, max_length=384, doc_stride=128, max_answer_length=64)


if __name__ == "__main__":
    sys.exit(main(recipe, __doc__.splitlines()[0]))
