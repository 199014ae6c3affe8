"""Named-entity recognition / token classification, with transformers' output conventions.

``aggregation_strategy="none"`` (the default, as in transformers) gives one result per token the model tagged
with something other than ``O``; ``"simple"``, ``"first"``, ``"average"`` and ``"max"`` group tokens into
entities exactly as transformers' ``TokenClassificationPipeline`` defines them.
"""

from __future__ import annotations

import numpy as np

from zhnlp.data.tasks.ner import NERExample, encode_ner
from zhnlp.pipelines.base import Pipeline, refuse_json_object

STRATEGIES = ("none", "simple", "first", "average", "max")


class TokenClassificationPipeline(Pipeline):
    """Tag tokens with a fine-tuned token-classification model (tags in ``config.id2label``, e.g. BIO or BMES).

    Input: a string or a list of strings. Each character is one word, as in the Chinese NER data zhnlp fine-tunes
    on (MSRA, People's Daily; :func:`zhnlp.data.tasks.ner.encode_ner`): a character becomes one token (a few, such
    as rare symbols, more; spaces none). On Chinese text these are exactly the tokens transformers' pipeline sees;
    on Latin letters and digits they differ (transformers would keep ``2024`` one token, here it is four), as the
    model was trained. Texts longer than ``max_length`` tokens are read in windows that overlap by ``stride``
    tokens (option, default 32; a zhnlp extra, transformers needs an aggregation strategy for windows); a token
    in two windows is read in the one where it is farthest from the window's edge.

    Output per input, with ``aggregation_strategy="none"`` (default): a list, in text order, of
    ``{"entity": tag, "score": float, "index": int, "word": str, "start": int, "end": int}`` for each token whose
    most probable tag is not in ``ignore_labels`` (option, default ``["O"]``):

    * ``entity``: the tag the model gives the token (``"B-PER"``), the argmax of its softmax;
    * ``score``: that tag's softmax probability;
    * ``index``: the token's position in the encoded text, ``[CLS]`` being 0 (for a text in windows, the
      position it would have in one long sequence);
    * ``word``: the token (``"张"``; ``"##s"`` for a continuation piece; the text itself for ``[UNK]``);
    * ``start``, ``end``: the token's character span in the caller's string, ``text[start:end]``.

    With ``aggregation_strategy`` ``"simple"``: adjacent tokens of one type form an entity (a ``B-`` tag always
    starts a new one), ``{"entity_group": type, "score": mean of the tokens' scores, "word": text[start:end],
    "start", "end"}``. ``"first"``, ``"average"``, ``"max"`` first give every word (a character and its
    continuation pieces) one tag: its first token's, the one of the highest averaged probability, or the
    most confident token's, then group as ``"simple"``. Differences from transformers: ``word`` of a group is
    ``text[start:end]`` (``"张三"``; transformers joins tokens with spaces, ``"张 三"``); BMES tags group
    too (``S-``/``E-`` close an entity; transformers reads only ``B-``/``I-``); ``score`` is a Python float
    (transformers: ``numpy.float32``).
    """

    task = "ner"
    auto_class = "AutoModelForTokenClassification"
    head, finetune_task = "token-classification head", "ner"
    default_options = {"stride": 32, "aggregation_strategy": "none", "ignore_labels": ("O",)}
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
        strategy = options["aggregation_strategy"]
        name = getattr(strategy, "value", strategy)  # transformers' AggregationStrategy enum works too
        if not isinstance(name, str) or name.lower() not in STRATEGIES:
            raise ValueError(f"aggregation_strategy must be one of {', '.join(map(repr, STRATEGIES))}, got "
                             f"{strategy!r}.")
        options["aggregation_strategy"] = name.lower()
        labels = options["ignore_labels"]
        if isinstance(labels, str) or not all(isinstance(label, str) for label in labels):
            raise TypeError(f"ignore_labels must be a list of tag names (e.g. ['O']), got {labels!r}.")

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
        position = [i for i, text in enumerate(items) if text]  # example index -> input index
        tokens = _tokens_per_example(len(position), features, outputs)
        for example_index, per_token in enumerate(tokens):
            text = items[position[example_index]]
            results[position[example_index]] = self._entities(text, per_token, options)
        return results

    def _entities(self, text: str, per_token: list[tuple], options: dict) -> list[dict]:
        """transformers' gather_pre_entities -> aggregate -> ignore_labels filter, on one text's tokens."""
        unk = self.tokenizer.unk_token_id
        pre = []
        previous_word = None
        for pos, (token_id, word, probs) in enumerate(per_token):
            token = text[word] if token_id == unk else self.tokenizer.convert_ids_to_tokens(token_id)
            pre.append({"word": token, "scores": probs, "start": word, "end": word + 1, "index": pos + 1,
                        "is_subword": word == previous_word})
            previous_word = word
        strategy = options["aggregation_strategy"]
        if strategy in ("none", "simple"):
            tagged = [{"entity": self.id2label[int(p["scores"].argmax())], "score": float(p["scores"].max()),
                       "index": p["index"], "word": p["word"], "start": p["start"], "end": p["end"]} for p in pre]
        else:
            tagged = [self._word(group, strategy) for group in _words(pre)]
        ignore = set(options["ignore_labels"])
        if strategy == "none":
            return [e for e in tagged if e["entity"] not in ignore]
        return [g for g in _group(tagged, text) if g["entity_group"] not in ignore]

    def _word(self, group: list[dict], strategy: str) -> dict:
        """One tag for a word's tokens (transformers' aggregate_word)."""
        if strategy == "first":
            scores = group[0]["scores"]
        elif strategy == "max":
            scores = max(group, key=lambda p: p["scores"].max())["scores"]
        else:  # average
            scores = np.nanmean(np.stack([p["scores"] for p in group]), axis=0)
        best = int(scores.argmax())
        return {"entity": self.id2label[best], "score": float(scores[best]), "start": group[0]["start"],
                "end": group[-1]["end"]}


def _tokens_per_example(n_examples: int, features: list[dict], outputs: list[dict]) -> list[list[tuple]]:
    """Per example, its tokens in order as ``(token id, word index, softmax probabilities)``; a token that two
    windows hold is read in the window where it is farthest from an edge (ties: the earlier window), as
    :func:`zhnlp.data.tasks.ner.decode_ner` reads tags."""
    chosen: list[dict[int, tuple]] = [{} for _ in range(n_examples)]
    for feature, out in zip(features, outputs):
        logits = out["logits"].numpy().astype(np.float32)
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        probs = shifted / shifted.sum(-1, keepdims=True)  # (seq, labels)
        content = [(i, w) for i, w in enumerate(feature["word_ids"]) if w is not None]
        per = chosen[feature["example_index"]]
        for j, (i, w) in enumerate(content):
            pos = feature["window_start"] + j
            distance = min(j, len(content) - 1 - j)
            if pos not in per or distance > per[pos][0]:
                per[pos] = (distance, feature["input_ids"][i], w, probs[i])
    return [[per[pos][1:] for pos in sorted(per)] for per in chosen]


def _words(pre: list[dict]) -> list[list[dict]]:
    """Tokens grouped by word: a word's first token and its continuation pieces (transformers' aggregate_words)."""
    groups: list[list[dict]] = []
    for p in pre:
        if groups and p["is_subword"]:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def _split_tag(tag: str) -> tuple[str, str]:
    """(begin/inside, type) as transformers' get_tag, extended to BMES: B-/S- begin, I-/M-/E- continue; a tag
    without a prefix (``O``) continues its own kind."""
    if tag[:2] in ("B-", "S-"):
        return "B", tag[2:]
    if tag[:2] in ("I-", "M-", "E-"):
        return "I", tag[2:]
    return "I", tag


def _group(tagged: list[dict], text: str) -> list[dict]:
    """Adjacent tokens (or words) of one type become one entity; a B- (or S-) tag starts a new one, and after an
    E- or S- tag (BMES) the entity is closed (transformers' group_entities)."""
    groups: list[list[dict]] = []
    for entity in tagged:
        bi, kind = _split_tag(entity["entity"])
        if groups:
            last = groups[-1][-1]["entity"]
            _, last_kind = _split_tag(last)
            if kind == last_kind and bi != "B" and last[:2] not in ("E-", "S-"):
                groups[-1].append(entity)
                continue
        groups.append([entity])
    out = []
    for group in groups:
        start, end = group[0]["start"], group[-1]["end"]
        out.append({"entity_group": _split_tag(group[0]["entity"])[1],
                    "score": float(np.nanmean([e["score"] for e in group])),
                    "word": text[start:end], "start": start, "end": end})
    return out
