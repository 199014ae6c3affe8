"""Fill-mask: the most probable tokens for each mask token in a text."""

from __future__ import annotations

import torch

from zhnlp.pipelines.base import Pipeline, is_positive_int


class FillMaskPipeline(Pipeline):
    """Predict the tokens behind the tokenizer's mask token (``[MASK]``) with a masked-LM model.

    Input: a string holding the mask token at least once, or a list of such strings. Texts longer than
    ``max_length`` tokens are truncated; every mask must lie within the kept part.

    Output for a text with one mask: a list of ``top_k`` (option, default 5) candidates
    ``{"token": vocabulary token, "token_id": int, "score": softmax probability over the vocabulary,
    "sequence": the text with this mask replaced by the token}`` (a ``##`` continuation prefix is dropped in
    ``sequence``); for a text with several masks, one such list per mask, in text order (each ``sequence`` fills
    only its own mask and leaves the others as they are).

    With no model given it loads ``bert-base-chinese``, whose masked-LM head was released with it.
    """

    task = "fill-mask"
    auto_class = "AutoModelForMaskedLM"
    default_model = "bert-base-chinese"
    head = "masked-LM head"
    default_options = {"top_k": 5}

    def check_input(self, item):
        if not isinstance(item, str):
            raise TypeError(f"fill-mask takes a string (or a list of strings), got {type(item).__name__}.")
        mask = self.tokenizer.mask_token
        if mask is None or mask not in item:
            raise ValueError(f"no mask token in the input {item[:50]!r}: write {mask} where a token is to be "
                             f"predicted, e.g. '北京是中国的{mask}都。'.")
        return item

    def preprocess(self, items, options):
        features = []
        for i, text in enumerate(items):
            enc = self.tokenizer(text, truncation=True, max_length=self.max_length, return_offsets_mapping=True)
            positions = [p for p, t in enumerate(enc["input_ids"]) if t == self.tokenizer.mask_token_id]
            if len(positions) != text.count(self.tokenizer.mask_token):
                raise ValueError(f"a mask token in {text[:50]!r} lies beyond max_length={self.max_length} tokens; "
                                 "shorten the text around the mask or raise max_length.")
            features.append({"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                             "attention_mask": enc["attention_mask"], "example_index": i,
                             "mask_positions": positions,
                             "mask_spans": [tuple(enc["offset_mapping"][p]) for p in positions]})
        return features

    def split_outputs(self, out, chunk, options):
        # Keep only the mask positions' top-k: the full (b, s, vocab) logits would be large.
        top_k = options["top_k"]
        logits = out["logits"]
        per_feature = []
        for j, feature in enumerate(chunk):
            probs = torch.softmax(logits[j, feature["mask_positions"]].float(), dim=-1)  # (masks, vocab)
            scores, ids = probs.topk(min(top_k, probs.size(-1)), dim=-1)
            per_feature.append({"scores": scores.cpu(), "ids": ids.cpu()})
        return per_feature

    def check_options(self, options):
        top_k = options["top_k"]
        if not is_positive_int(top_k):
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}.")

    def postprocess(self, items, features, outputs, options):
        results = []
        for text, feature, out in zip(items, features, outputs):
            per_mask = []
            for m, (start, end) in enumerate(feature["mask_spans"]):
                candidates = []
                for score, token_id in zip(out["scores"][m].tolist(), out["ids"][m].tolist()):
                    token = self.tokenizer.convert_ids_to_tokens(token_id)
                    filled = token[2:] if token.startswith("##") else token
                    candidates.append({"token": token, "token_id": token_id, "score": score,
                                       "sequence": text[:start] + filled + text[end:]})
                per_mask.append(candidates)
            results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return results
