"""Sentiment analysis / text classification: one label (or a ranking of labels) per text or text pair."""

from __future__ import annotations

import torch

from zhnlp.pipelines.base import UNSET, Pipeline, is_positive_int, refuse_json_object

FUNCTIONS = ("default", "sigmoid", "softmax", "none")


class TextClassificationPipeline(Pipeline):
    """Classify texts with a fine-tuned sequence-classification model.

    Input: a string, a dict ``{"text": ..., "text_pair": ...}`` (``text_pair`` optional, e.g. for sentence-pair
    tasks such as AFQMC), or a non-empty list of those. Empty (or whitespace-only) texts and pairs are refused, as
    are texts that are whole JSON objects (a jsonl line given as the text). Texts longer than ``max_length``
    tokens (special tokens included) are truncated to it: only their beginning is classified; a pair is trimmed
    from its longer side first.

    Output, as transformers' text-classification pipeline gives it:

    * without ``top_k``: per input the most probable label, ``{"label": name, "score": float}``; a single string
      gives a list holding that one dict (``[{"label", "score"}]``), a single dict input gives the dict itself,
      a list of inputs a list of dicts;
    * with ``top_k`` (option): ``None`` every label, an integer the ``top_k`` best, as a list of
      ``{"label", "score"}`` sorted by score (a list of such lists for a list of inputs).

    ``label`` is the name in the model's ``config.id2label`` (``LABEL_i`` where it has none); ``score`` the
    label's score after ``function_to_apply`` (option): ``"softmax"`` (probabilities over the labels),
    ``"sigmoid"`` (each label's own probability), ``"none"`` (the raw logit), or ``"default"``/None: sigmoid for
    a single-output model or ``problem_type="multi_label_classification"``, none for ``"regression"``, softmax
    otherwise. (One difference: transformers wraps a single string's result in one more list when ``top_k`` was
    given to ``pipeline(...)`` rather than to the call; here both give the same.)
    """

    task = "sentiment-analysis"
    auto_class = "AutoModelForSequenceClassification"
    head, finetune_task = "sequence-classification head", "classification"
    default_options = {"top_k": UNSET, "function_to_apply": None}
    output_names = {"logits": False}

    def check_options(self, options):
        top_k = options["top_k"]
        if not (top_k is UNSET or top_k is None or is_positive_int(top_k)):
            raise ValueError(f"top_k must be None (every label) or a positive integer, got {top_k!r}.")
        function = options["function_to_apply"]
        name = getattr(function, "value", function)  # transformers' ClassificationFunction enum works too
        if not (name is None or isinstance(name, str) and name.lower() in FUNCTIONS):
            raise ValueError(f"function_to_apply must be one of {', '.join(map(repr, FUNCTIONS))} (or None), got "
                             f"{function!r}.")
        options["function_to_apply"] = None if name is None else name.lower()

    def single_result(self, item, result, options):
        # transformers: a single string without top_k gives [best]; a dict input, or any top_k, the result itself
        return [result] if isinstance(item, str) and options["top_k"] is UNSET else result

    def check_input(self, item):
        if isinstance(item, str):
            return self._checked(item, None)
        if isinstance(item, dict):
            extra = sorted(set(item) - {"text", "text_pair"})
            if "text" not in item or extra:
                raise ValueError(f"a text-classification input dict has the keys 'text' and optionally 'text_pair', "
                                 f"got {sorted(item)}.")
            text, pair = item["text"], item.get("text_pair")
            if not isinstance(text, str) or not (pair is None or isinstance(pair, str)):
                raise TypeError(f"'text' and 'text_pair' must be strings, got {type(text).__name__} and "
                                f"{type(pair).__name__}.")
            return self._checked(text, pair)
        raise TypeError(f"text classification takes a string or a dict {{'text', 'text_pair'}}, "
                        f"got {type(item).__name__}.")

    def _checked(self, text: str, pair: str | None) -> tuple[str, str | None]:
        # An empty text still gets [CLS] [SEP] and a confident-looking label: refuse it instead.
        if not text.strip():
            raise ValueError("the text is empty (or only whitespace); there is nothing to classify.")
        if pair is not None and not pair.strip():
            raise ValueError("'text_pair' is empty (or only whitespace); give the second text, or leave "
                             "'text_pair' out to classify 'text' alone.")
        refuse_json_object(text, "text classification", "plain text")
        return text, pair

    def preprocess(self, items, options):
        features = []
        for i, (text, pair) in enumerate(items):
            enc = self.tokenizer(text, pair, truncation=True, max_length=self.max_length)
            features.append({"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                             "attention_mask": enc["attention_mask"], "example_index": i})
        return features

    def postprocess(self, items, features, outputs, options):
        config = self.model.config
        names = config.id2label or {}
        function = options["function_to_apply"]
        if function in (None, "default"):
            function = ("none" if config.problem_type == "regression" else "sigmoid"
                        if config.num_labels == 1 or config.problem_type == "multi_label_classification"
                        else "softmax")
        top_k = options["top_k"]
        results = []
        for out in outputs:
            logits = out["logits"].float()
            scores = {"sigmoid": torch.sigmoid, "softmax": lambda x: torch.softmax(x, dim=-1),
                      "none": lambda x: x}[function](logits)
            order = torch.argsort(scores, descending=True, stable=True).tolist()
            ranked = [{"label": names.get(i, f"LABEL_{i}"), "score": float(scores[i])} for i in order]
            if top_k is UNSET:
                results.append(ranked[0])
            elif top_k is None:
                results.append(ranked)
            else:
                results.append(ranked[:top_k])
        return results
