"""The project's own pretraining corpus, prepared on first use.

People's Daily (January 1998, from ``zhnlp data fetch peoples-daily-1998``) tokenised with the
BERT-Chinese vocabulary, with its person/place/organisation spans as entity masking units
(ERNIE's knowledge masking), cached under ``$ZHNLP_HOME/corpora`` (``~/.cache/zhnlp/corpora``).
"""

from __future__ import annotations

import os
from pathlib import Path

from zhnlp.data.fetch import cache_dir, fetch
from zhnlp.data.preprocess import preprocess


def demo_corpus(workers: int = 1, progress: bool = True, objective: str = "mlm") -> Path:
    """The prefix of the preprocessed demo corpus (built once; later calls return at once).
    ``objective="causal-lm"``: the same text prepared for the decoders (``pd-causal``: whole
    documents, each ended by [SEP])."""
    name = "pd" if objective == "mlm" else "pd-causal"
    prefix = cache_dir().parent / "corpora" / "peoples-daily-1998" / name
    if Path(f"{prefix}.json").is_file():
        return prefix
    vocab = fetch("bert-base-chinese-vocab")
    source = fetch("peoples-daily-1998")
    entities = "entities" if objective == "mlm" else None  # masking units: masked LM only
    preprocess([source / "entities.jsonl"], prefix, str(vocab), entities_field=entities, workers=workers,
               progress=progress, objective=objective)
    return prefix


if __name__ == "__main__":
    print(demo_corpus(workers=os.cpu_count() or 1))
