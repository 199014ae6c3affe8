"""Fill-mask: the most probable tokens for each mask token in a text, with transformers' output keys."""

from __future__ import annotations

import torch

from zhnlp.pipelines.base import Pipeline, is_positive_int, logger


class FillMaskPipeline(Pipeline):
    """Predict the tokens behind the tokenizer's mask token (``[MASK]``) with a masked-LM model.

    Input: a string holding the mask token at least once, or a list of such strings. Texts longer than
    ``max_length`` tokens are truncated; every mask must lie within the kept part.

    Output for a text with one mask: a list of ``top_k`` (option, default 5) candidates, best first, each
    ``{"score": float, "token": int, "token_str": str, "sequence": str}`` as in transformers:

    * ``score``: the token's softmax probability over the whole vocabulary;
    * ``token``: the token's id; ``token_str``: its text, ``tokenizer.decode([token])`` (``"首"``, ``"##s"``);
    * ``sequence``: the input with this mask replaced by the token. zhnlp's Chinese-friendly difference:
      the caller's own string with the token's text put in place of ``[MASK]`` (``"北京是中国的首都。"``, a
      ``##`` continuation prefix dropped), where transformers decodes the token ids and so separates every
      character with a space (``"北 京 是 中 国 的 首 都 。"``).

    For a text with several masks: one such list per mask, in text order (each ``sequence`` fills only its own
    mask and leaves the others as they are). A list of inputs gives a list of results, also a list of one
    (transformers unwraps a one-element list).

    Option ``targets``: a token or list of tokens to rank instead of the whole vocabulary (scores are still the
    probabilities over the whole vocabulary); a target that is not in the vocabulary is replaced by its first
    token, with a warning, as transformers does. ``top_k`` is then at most the number of targets.

    With no model given it loads ``bert-base-chinese``, whose masked-LM head was released with it.
    """

    task = "fill-mask"
    auto_class = "AutoModelForMaskedLM"
    default_model = "bert-base-chinese"
    head = "masked-LM head"
    default_options = {"top_k": 5, "targets": None}

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

    def check_options(self, options):
        top_k = options["top_k"]
        if not is_positive_int(top_k):
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}.")
        targets = options["targets"]
        if targets is not None:
            listed = [targets] if isinstance(targets, str) else targets
            if not isinstance(listed, (list, tuple)) or not listed or not all(
                    isinstance(t, str) and t for t in listed):
                raise ValueError(f"targets must be a token or a non-empty list of tokens, got {targets!r}.")

    def _target_ids(self, targets) -> list[int] | None:
        """Vocabulary ids of ``targets``; a target outside the vocabulary becomes its first token (warned)."""
        if targets is None:
            return None
        vocab = self.tokenizer.get_vocab()
        ids = []
        for target in [targets] if isinstance(targets, str) else targets:
            if target in vocab:
                ids.append(vocab[target])
                continue
            pieces = self.tokenizer(target, add_special_tokens=False)["input_ids"]
            if not pieces:
                logger.warning("fill-mask: the target %r gives no token; it is left out.", target)
                continue
            logger.warning("fill-mask: the target %r is not in the vocabulary; ranking its first token %r instead.",
                           target, self.tokenizer.convert_ids_to_tokens(pieces[0]))
            ids.append(pieces[0])
        if not ids:
            raise ValueError(f"none of the targets {targets!r} gives a token; pass tokens of the vocabulary.")
        return sorted(set(ids))

    def split_outputs(self, out, chunk, options):
        # Keep only the mask positions' top-k: the full (b, s, vocab) logits would be large.
        if "_target_ids" not in options:
            options["_target_ids"] = self._target_ids(options["targets"])
        targets = options["_target_ids"]
        logits = out["logits"]
        per_feature = []
        for j, feature in enumerate(chunk):
            probs = torch.softmax(logits[j, feature["mask_positions"]].float(), dim=-1)  # (masks, vocab)
            if targets is not None:
                probs = probs[:, targets]  # (masks, targets)
            scores, ids = probs.topk(min(options["top_k"], probs.size(-1)), dim=-1)
            if targets is not None:
                ids = torch.tensor(targets)[ids]
            per_feature.append({"scores": scores.cpu(), "ids": ids.cpu()})
        return per_feature

    def postprocess(self, items, features, outputs, options):
        results = []
        for text, feature, out in zip(items, features, outputs):
            per_mask = []
            for m, (start, end) in enumerate(feature["mask_spans"]):
                candidates = []
                for score, token_id in zip(out["scores"][m].tolist(), out["ids"][m].tolist()):
                    token_str = self.tokenizer.decode([token_id])  # SentencePiece's "▁" already a space
                    filled = token_str.removeprefix("##")  # a WordPiece continuation joins its neighbour
                    candidates.append({"score": score, "token": token_id, "token_str": token_str,
                                       "sequence": text[:start] + filled + text[end:]})
                per_mask.append(candidates)
            results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return results
