"""Non-neural baselines that fine-tuned models are measured against (see ``scripts/real_weights.py``)."""

from zhnlp.baselines.tfidf import TfidfClassifier

__all__ = ["TfidfClassifier"]
