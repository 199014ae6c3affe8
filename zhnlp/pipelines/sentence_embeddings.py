"""Feature extraction and sentence similarity: token features, pooled sentence embeddings, cosine scores.

    embed = zhnlp.pipeline("feature-extraction", "m3e-small", pooling="mean", normalize=True)
    embed("今天天气很好")                                    # [0.01, -0.03, ...]: one vector (hidden size)
    sim = zhnlp.pipeline("sentence-similarity", "m3e-small")
    sim({"source_sentence": "我想退款", "sentences": ["怎么申请退款", "今天下雨了"]})   # [0.87, 0.31]
    sim({"text": "我想退款", "text_pair": "怎么申请退款"})                             # {"score": 0.87}

How a sentence becomes one vector (``pooling``) is a property of the model: a sentence-embedding model was trained
with one of them, and another gives worse vectors. It is looked up in this order: the ``pooling=`` option; the model
card's ``pooling`` (for a model loaded by name); a sentence-transformers ``modules.json`` + pooling config in the
model's directory; else ``"mean"`` (sentence-transformers' default), with a notice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from zhnlp.cards import POOLINGS
from zhnlp.pipelines.base import UNSET, Pipeline, logger, refuse_json_object


def pool(last_hidden_state, attention_mask, pooling: str, pooler_output=None):
    """One vector per row: ``(b, s, h)`` token states and ``(b, s)`` mask -> ``(b, h)``.

    ``mean``: the average over the row's real tokens (its special tokens included, as sentence-transformers does);
    ``cls``: the first token's state; ``pooler``: the model's own pooler output (``pooler_output``)."""
    if pooling == "cls":
        return last_hidden_state[:, 0]
    if pooling == "pooler":
        if pooler_output is None:
            raise ValueError("pooling='pooler' needs a model with a pooler, and this one returns no pooler_output; "
                             "use pooling='mean' or 'cls'.")
        return pooler_output
    if pooling == "mean":
        mask = attention_mask.to(last_hidden_state.dtype).unsqueeze(-1)
        return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1)
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}.")


def pooling_of(name_or_path) -> str | None:
    """The pooling a sentence-embedding model was trained with, from its model card (a model name) or its
    directory's sentence-transformers files; None when neither says."""
    from zhnlp import cards
    from zhnlp.errors import ModelNotFoundError

    name = os.fspath(name_or_path) if name_or_path else ""
    if name and not Path(name).is_dir():
        try:
            pooling = getattr(cards.require_card(name), "pooling", None)
        except ModelNotFoundError:  # a hub repo id: no card
            pooling = None
        if pooling:
            return pooling
    if name and Path(name).is_dir():
        return _sentence_transformers_pooling(Path(name))
    return None


def _sentence_transformers_pooling(directory: Path) -> str | None:
    modules = directory / "modules.json"
    if not modules.is_file():
        return None
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
        folder = next(e["path"] for e in entries if str(e.get("type", "")).endswith("Pooling"))
        config = json.loads((directory / folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, StopIteration, TypeError, AttributeError):
        logger.warning("%s: modules.json is unreadable or names no pooling module; pass pooling= to choose one.",
                       directory)
        return None
    keys = (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"))
    modes = [m for m, key in keys if config.get(key)]
    if len(modes) != 1:
        logger.warning("%s: the sentence-transformers pooling config %s is not one of mean or CLS pooling; pass "
                       "pooling= to choose one.", directory, sorted(k for k, v in config.items() if v is True))
        return None
    return modes[0]


class _Embeddings(Pipeline):
    """What both tasks share: a base encoder (``zhnlp.AutoModel``) and the pooling of its token states."""

    auto_class = "AutoModel"
    head = "base encoder"
    output_names = {"last_hidden_state": True}

    def __init__(self, model=None, **kwargs):
        super().__init__(model, **kwargs)
        source = getattr(self.model, "name_or_path", None) or (model if not isinstance(model, torch.nn.Module)
                                                                 else None)
        self.model_pooling = pooling_of(source)

    def _refuse_untrained(self, name: str) -> None:
        """A base model whose pooler was not in the checkpoint (a masked-LM checkpoint) still gives real token
        states: only ``pooling="pooler"`` needs the pooler, and :meth:`resolve_pooling` refuses that then."""
        fresh = list(getattr(self.model, "fresh_weights", []) or [])
        pooler = [w for w in fresh if w.startswith("pooler.") or ".pooler." in w]  # bert.pooler.dense.weight
        self.fresh_pooler = bool(pooler)
        if self.fresh_pooler:
            kept = [w for w in fresh if w not in pooler]
            self.model.fresh_weights, saved = kept, fresh
            try:
                super()._refuse_untrained(name)
            finally:
                self.model.fresh_weights = saved
        else:
            super()._refuse_untrained(name)

    def check_options(self, options):
        pooling = options.get("pooling", UNSET)
        if pooling not in (UNSET, None) and pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, got {pooling!r}.")
        if not isinstance(options.get("normalize", False), bool):
            raise ValueError(f"normalize must be True or False, got {options['normalize']!r}.")

    def resolve_pooling(self, options) -> str:
        pooling = options.get("pooling", UNSET)
        if pooling == "pooler" and getattr(self, "fresh_pooler", False):
            raise ValueError("pooling='pooler' needs the model's pooler, which this checkpoint does not have (it "
                             "would be random); use pooling='mean' or 'cls'.")
        if pooling not in (UNSET, None):
            return pooling
        if self.model_pooling is None:
            self.model_pooling = "mean"
            logger.info("%s: neither the model card nor the model directory names a pooling; using mean pooling "
                        "(pass pooling='cls' or 'pooler' for a model trained with those).", self.task)
        return self.model_pooling

    def _check_text(self, text, what: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"{what} must be a string, got {type(text).__name__}.")
        if not text.strip():
            raise ValueError(f"{what} is empty (or only whitespace); there is nothing to embed.")
        refuse_json_object(text, self.task, "plain text")
        return text

    def encode_features(self, texts: list[str], owner: list[int]) -> list[dict]:
        features = []
        for text, i in zip(texts, owner):
            enc = self.tokenizer(text, truncation=True, max_length=self.max_length)
            features.append({"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                             "attention_mask": enc["attention_mask"], "example_index": i})
        return features

    def split_outputs(self, out, chunk, options):
        per_feature = super().split_outputs(out, chunk, options)
        if "pooler_output" in out and out["pooler_output"] is not None:
            for j, feature in enumerate(per_feature):
                feature["pooler_output"] = out["pooler_output"][j].float().cpu()
        return per_feature

    def vectors(self, outputs, options) -> list[torch.Tensor]:
        """One sentence vector per feature."""
        pooling = self.resolve_pooling(options)
        found = []
        for out in outputs:
            states = out["last_hidden_state"].unsqueeze(0)
            mask = torch.ones(states.shape[:2])
            pooled = out.get("pooler_output")
            vector = pool(states, mask, pooling, None if pooled is None else pooled.unsqueeze(0))[0]
            if options.get("normalize"):
                vector = torch.nn.functional.normalize(vector, dim=-1)
            found.append(vector)
        return found


class FeatureExtractionPipeline(_Embeddings):
    """Hidden states of a base encoder, per token or pooled into one sentence vector.

    Input: a string or a list of strings (each truncated to ``max_length`` tokens, special tokens included).

    Output per input, as transformers' feature-extraction pipeline gives it when ``pooling`` is not set: the last
    layer's states of every token, ``[CLS]`` and ``[SEP]`` included, as nested lists of shape
    ``[1, tokens, hidden]``. With ``pooling`` (option: ``"mean"``, ``"cls"`` or ``"pooler"``, or ``"auto"``: the
    model's own, see the module docstring) one sentence vector instead, a list of ``hidden`` floats, L2-normalised
    when ``normalize=True``. ``return_tensors=True`` gives torch tensors instead of lists.
    """

    task = "feature-extraction"
    default_options = {"pooling": None, "normalize": False, "return_tensors": False}

    def check_options(self, options):
        if options["pooling"] == "auto":
            options["pooling"] = UNSET
        super().check_options(options)
        if options["pooling"] is None and options["normalize"]:
            raise ValueError("normalize=True applies to sentence vectors: also pass pooling ('auto' for the model's "
                             "own, or 'mean', 'cls', 'pooler').")

    def check_input(self, item):
        return self._check_text(item, "the input")

    def preprocess(self, items, options):
        return self.encode_features(items, list(range(len(items))))

    def postprocess(self, items, features, outputs, options):
        if options["pooling"] is None:
            found = [out["last_hidden_state"].unsqueeze(0) for out in outputs]
        else:
            found = self.vectors(outputs, options)
        return found if options["return_tensors"] else [t.tolist() for t in found]


class SentenceSimilarityPipeline(_Embeddings):
    """Cosine similarity of sentence embeddings (pooled as the model was trained, see the module docstring).

    Input: ``{"source_sentence": str, "sentences": [str, ...]}`` (the Hugging Face hub's sentence-similarity
    convention) -> the list of the source sentence's similarities to each sentence, in order; or
    ``{"text": str, "text_pair": str}`` -> ``{"score": similarity}``; or a list of such dicts -> a list of results.
    Scores are cosines in [-1, 1]. Option ``pooling`` overrides the model's pooling.
    """

    task = "sentence-similarity"
    default_options = {"pooling": UNSET, "normalize": True}

    def check_input(self, item):
        if not isinstance(item, dict):
            raise TypeError(f"sentence-similarity takes a dict {{'source_sentence', 'sentences'}} or {{'text', "
                            f"'text_pair'}} (or a list of them), got {type(item).__name__}.")
        keys = set(item)
        if keys == {"source_sentence", "sentences"}:
            sentences = item["sentences"]
            if not isinstance(sentences, (list, tuple)) or not sentences:
                raise ValueError("'sentences' must be a non-empty list of strings to compare with 'source_sentence'.")
            return ([self._check_text(item["source_sentence"], "'source_sentence'")]
                    + [self._check_text(s, f"'sentences'[{k}]") for k, s in enumerate(sentences)], True)
        if keys == {"text", "text_pair"}:
            return [self._check_text(item["text"], "'text'"), self._check_text(item["text_pair"], "'text_pair'")], False
        raise ValueError(f"a sentence-similarity input has the keys 'source_sentence' and 'sentences', or 'text' and "
                         f"'text_pair'; got {sorted(keys)}.")

    def preprocess(self, items, options):
        texts, owner = [], []
        for i, (group, _) in enumerate(items):
            texts += group
            owner += [i] * len(group)
        return self.encode_features(texts, owner)

    def postprocess(self, items, features, outputs, options):
        vectors = self.vectors(outputs, {**options, "normalize": True})
        results, k = [], 0
        for group, is_list in items:
            source, others = vectors[k], torch.stack(vectors[k + 1:k + len(group)])
            k += len(group)
            scores = (others @ source).clamp(-1.0, 1.0).tolist()
            results.append(scores if is_list else {"score": scores[0]})
        return results


def read_pairs(path) -> tuple[list[tuple[str, str]], list[float]]:
    """Sentence pairs and gold scores from a jsonl file of ``{"text", "text_pair", "label"}`` lines."""
    from zhnlp.errors import DataError

    pairs, gold = [], []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; pass a jsonl file of {{text, text_pair, label}} lines "
                        f"(e.g. test.jsonl from `zhnlp data fetch stsb-zh`).") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text, pair, label = row["text"], row["text_pair"], float(row["label"])
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path}:{n}: expected a JSON object with text, text_pair and a numeric label "
                            f"({type(e).__name__}: {e}).") from None
        pairs.append((text, pair))
        gold.append(label)
    if len(pairs) < 2:
        raise DataError(f"{path}: {len(pairs)} sentence pair(s); a correlation needs at least 2.")
    return pairs, gold


def evaluate_sts(model, path, pooling: str | None = None, batch_size: int = 32, max_length: int = 128) -> dict:
    """Spearman and Pearson correlation (percent) of the model's cosine similarities with the gold scores of
    ``path`` (see :func:`read_pairs`), with the pooling used."""
    from zhnlp.metrics.similarity import sts_scores

    pairs, gold = read_pairs(path)
    sim = SentenceSimilarityPipeline(model, batch_size=batch_size, max_length=max_length,
                                     **({"pooling": pooling} if pooling else {}))
    predicted = [r["score"] for r in sim.iter_results({"text": a, "text_pair": b} for a, b in pairs)]
    return {**sts_scores(predicted, gold), "pooling": sim.resolve_pooling(sim.options)}
