"""Evaluation metrics: classification accuracy / macro-F1, CMRC2018 EM/F1, entity-level NER F1 and STS correlations.

    from zhnlp.metrics import accuracy, macro_f1
    from zhnlp.metrics import cmrc2018, ner, similarity
    cmrc2018.evaluate("cmrc2018_dev.json", {"DEV_0_QUERY_0": "1963年"})   # {"em": .., "f1": .., "total", "skip"}
    ner.entity_scores(predicted_tags, gold_tags)                          # {"precision", "recall", "f1", ...}
    similarity.spearman(cosines, gold_scores)                             # STS-B's figure (ties averaged)

``zhnlp evaluate cmrc2018 DATASET.json PREDICTIONS.json`` scores a predictions file from the command line;
``zhnlp evaluate sts DATA.jsonl --model M`` embeds sentence pairs with a model and correlates the cosines.
"""

from zhnlp.metrics import cmrc2018, ner, similarity
from zhnlp.metrics.classification import accuracy, classification_scores, macro_f1, per_class_f1
from zhnlp.metrics.ner import entities, entity_scores

__all__ = ["accuracy", "macro_f1", "per_class_f1", "classification_scores", "cmrc2018", "ner", "entities",
           "entity_scores", "similarity"]
