"""Entity-level precision, recall and F1 for sequence labelling (NER), from BIO or BMES tag sequences.

Entities are ``(type, start, end_exclusive)`` spans. A predicted entity is correct only when a gold entity has the
same type and exactly the same boundaries; a partial overlap is both a false positive and a false negative.

Tags are ``O`` or ``PREFIX-TYPE`` (split at the first ``-``, so types may contain hyphens). Schemes:

* ``"BIO"`` (IOB2; IOB1 is read correctly too): prefixes ``B`` and ``I``;
* ``"BMES"`` (and BIOES, where ``I`` means the same as ``M``): prefixes ``B``, ``M``/``I``, ``E``, ``S``;
* ``"auto"``: BMES when any tag has an ``M``, ``E`` or ``S`` prefix, else BIO.

The scheme only says which prefixes are allowed; a tag outside it is an error. Spans are then read with the chunk
rules of CoNLL's ``conlleval`` (also seqeval's default mode), which cover both schemes and decide what an
ill-formed sequence means instead of rejecting it:

* an entity starts at ``B-X`` or ``S-X``, and at an ``I-X``/``M-X``/``E-X`` that does not continue an open entity
  of type X (after ``O``, after another type, after an ``E`` or ``S`` that closed the previous entity, or at the
  start of the sentence): ``O I-PER I-PER`` is one PER entity, ``B-PER I-LOC`` is two entities;
* an entity ends before ``B``, ``S``, ``O`` or a change of type, and after ``E`` or ``S``; an entity still open at
  the end of the sentence ends there: ``B-LOC M-LOC O`` is a LOC entity of two characters, ``B-LOC O`` of one.

This is lenient -- a model's broken sequence still yields spans, scored against gold like any other -- and is the
convention published NER scores are computed with.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from zhnlp.errors import DataError

Entity = tuple[str, int, int]

SCHEMES = {"BIO": frozenset("BI"), "BMES": frozenset("BMIES")}


def _split(tag: str, position: int) -> tuple[str, str]:
    """``(prefix, type)`` of one tag; ``("O", "")`` for ``O``."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or len(prefix) != 1 or not kind:
        raise DataError(f"tag {tag!r} at position {position} is not 'O' or 'PREFIX-TYPE' (such as 'B-PER'); "
                        f"convert the tags to BIO or BMES first")
    return prefix, kind


def detect_scheme(tags: Sequence[str]) -> str:
    """``"BMES"`` when any tag has an ``M``, ``E`` or ``S`` prefix, else ``"BIO"``."""
    return "BMES" if any(tag[:2] in ("M-", "E-", "S-") for tag in tags) else "BIO"


def entities(tags: Sequence[str], scheme: str = "auto") -> list[Entity]:
    """The ``(type, start, end_exclusive)`` entities of one tag sequence, in order (see the module docstring for
    the schemes and for how ill-formed sequences are read)."""
    if scheme == "auto":
        scheme = detect_scheme(tags)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tagging scheme {scheme!r}; use 'BIO', 'BMES' or 'auto'")
    allowed = SCHEMES[scheme]
    spans: list[Entity] = []
    open_type, open_start = None, 0  # the entity being read; None after O and after E/S, which close their entity
    for i, tag in enumerate(tags):
        prefix, kind = _split(tag, i)
        if prefix != "O" and prefix not in allowed:
            raise DataError(f"tag {tag!r} at position {i} is not a {scheme} tag (prefixes "
                            f"{', '.join(sorted(allowed))} or O); pass scheme='auto' or the scheme the tags use")
        continues = open_type == kind and prefix in ("I", "M", "E")
        if open_type is not None and not continues:
            spans.append((open_type, open_start, i))
            open_type = None
        if prefix == "O":
            continue
        if not continues:
            open_type, open_start = kind, i
        if prefix in ("E", "S"):
            spans.append((kind, open_start, i + 1))
            open_type = None
    if open_type is not None:
        spans.append((open_type, open_start, len(tags)))
    return spans


def _prf(correct: int, predicted: int, gold: int) -> dict:
    # An empty denominator gives 0 (nothing predicted: precision 0), as conlleval and seqeval do.
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "predicted": predicted, "gold": gold,
            "correct": correct}


def entity_scores(predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]], scheme: str = "auto") -> dict:
    """Micro precision, recall and F1 (0..1) over exact ``(type, start, end)`` matches of the entities of
    ``predicted`` against ``gold`` (one tag sequence per sentence, the same lengths), plus ``"predicted"``,
    ``"gold"`` and ``"correct"`` entity counts and ``"per_type"``: ``{type: the same keys}``.

    ``scheme="auto"`` detects one scheme from all the tags of both sides together."""
    if len(predicted) != len(gold):
        raise DataError(f"{len(predicted)} predicted tag sequences for {len(gold)} gold ones; predict one "
                        f"sequence per sentence, in order")
    if scheme == "auto":
        scheme = "BMES" if any(detect_scheme(tags) == "BMES" for tags in [*predicted, *gold]) else "BIO"
    elif scheme not in SCHEMES:
        raise ValueError(f"unknown tagging scheme {scheme!r}; use 'BIO', 'BMES' or 'auto'")
    n_pred, n_gold, n_correct = Counter(), Counter(), Counter()
    for s, (pred_tags, gold_tags) in enumerate(zip(predicted, gold)):
        if len(pred_tags) != len(gold_tags):
            raise DataError(f"sentence {s}: {len(pred_tags)} predicted tags for {len(gold_tags)} gold tags; tag "
                            f"every token exactly once")
        pred_spans, gold_spans = set(entities(pred_tags, scheme)), set(entities(gold_tags, scheme))
        n_pred.update(kind for kind, _, _ in pred_spans)
        n_gold.update(kind for kind, _, _ in gold_spans)
        n_correct.update(kind for kind, _, _ in pred_spans & gold_spans)
    types = sorted(set(n_pred) | set(n_gold))
    scores = _prf(sum(n_correct.values()), sum(n_pred.values()), sum(n_gold.values()))
    scores["per_type"] = {t: _prf(n_correct[t], n_pred[t], n_gold[t]) for t in types}
    return scores
