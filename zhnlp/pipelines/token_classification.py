"""Named-entity recognition: entities with their character spans, one tag per character underneath."""

from __future__ import annotations

import numpy as np

from zhnlp.data.tasks.ner import NERExample, decode_ner, encode_ner
from zhnlp.metrics.ner import entities
from zhnlp.pipelines.base import Pipeline, refuse_json_object


class TokenClassificationPipeline(Pipeline):
    """Find named entities with a fine-tuned token-classification model (BIO or BMES tags in ``config.id2label``).

    Input: a string or a list of strings. Each character is one word (as in MSRA/People's Daily NER): the text is
    tagged character by character (:func:`zhnlp.data.tasks.ner.decode_ner`), texts longer than ``max_length``
    tokens in windows that overlap by ``stride`` tokens (option, default 32), and the tags are read as entities
    with :func:`zhnlp.metrics.ner.entities`.

    Output per input: a list of ``{"entity": type, "word": text[start:end], "start": int, "end": int,
    "score": float}`` in text order. ``score`` is the mean over the entity's characters of the probability of the
    tag the model picked at the character's first token (its softmax maximum; averaged over the windows that hold
    the character; characters that produce no token, such as spaces, are left out).
    """

    task = "ner"
    auto_class = "AutoModelForTokenClassification"
    head, finetune_task = "token-classification head", "ner"
    default_options = {"stride": 32}
    output_names = {"logits": True}

    def __init__(self, model=None, **kwargs):
        super().__init__(model, **kwargs)
        id2label = self.model.config.id2label or {}
        bad = [tag for tag in id2label.values() if tag != "O" and not (tag[:2] in ("B-", "I-", "M-", "E-", "S-"))]
        if not id2label or bad:
            raise ValueError(f"the model's config.id2label {id2label or '(missing)'} does not name BIO/BMES tags "
                             f"(O, B-PER, I-PER, ...); save the fine-tuned model with its id2label.")
        self.id2label = id2label
        self.label2id = {tag: i for i, tag in id2label.items()}
        self.check_options(self.options)  # the stride against the window, now that max_length is known

    def check_options(self, options):
        stride = options["stride"]
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 0:
            raise ValueError(f"stride must be a non-negative integer, got {stride!r}.")
        room = getattr(self, "max_length", None)
        room = room - 2 if room is not None else None  # sub-tokens per window besides [CLS] and [SEP]
        if room is not None and stride >= room:
            raise ValueError(f"stride={stride} (the overlap of consecutive windows) must be smaller than the {room} "
                             f"sub-tokens a window of max_length={self.max_length} holds; pass stride={room // 4} "
                             f"or raise max_length.")

    def check_input(self, item):
        if not isinstance(item, str):
            raise TypeError(f"ner takes a string (or a list of strings), got {type(item).__name__}.")
        refuse_json_object(item, "ner", "plain text")
        return item

    def preprocess(self, items, options):
        # Empty texts have no entities and give the tokenizer nothing to tag: they produce no features.
        examples = [NERExample(tokens=list(text), tags=None, line=0) for text in items if text]
        return encode_ner(self.tokenizer, examples, self.label2id, max_length=self.max_length,
                          stride=options["stride"])

    def postprocess(self, items, features, outputs, options):
        results = [[] for _ in items]
        if not features:
            return results
        width = max(len(f["input_ids"]) for f in features)
        logits = np.zeros((len(features), width, len(self.id2label)), dtype=np.float32)
        for row, out in enumerate(outputs):
            logits[row, :len(out["logits"])] = out["logits"].numpy()
        examples = [NERExample(tokens=list(text), tags=None, line=0) for text in items if text]
        position = [i for i, text in enumerate(items) if text]  # example index -> input index
        tags = decode_ner(examples, features, logits, self.id2label)
        char_probs = _char_probabilities(examples, features, logits)
        for example_index, (example, example_tags) in enumerate(zip(examples, tags)):
            text = "".join(example.tokens)
            found = []
            for kind, start, end in entities(example_tags, scheme="auto"):
                probs = [p for i in range(start, end) if (p := char_probs[example_index].get(i)) is not None]
                found.append({"entity": kind, "word": text[start:end], "start": start, "end": end,
                              "score": float(np.mean(probs)) if probs else 0.0})
            results[position[example_index]] = found
        return results


def _char_probabilities(examples, features, logits) -> list[dict[int, float]]:
    """Per example, {character: probability of the model's tag at its first token, averaged over windows}."""
    shifted = logits - logits.max(-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)  # (features, seq, labels)
    sums: list[dict[int, list[float]]] = [{} for _ in examples]
    for row, feature in enumerate(features):
        index = feature["example_index"]
        seen = set()
        for token, word in enumerate(feature["word_ids"]):
            if word is None or word in seen:
                continue
            seen.add(word)
            sums[index].setdefault(word, []).append(float(probs[row, token].max()))
    return [{word: float(np.mean(values)) for word, values in per.items()} for per in sums]
