"""Masked-LM fine-tuning data (continued, domain- or task-adaptive pretraining on the user's own text).

Input: texts without labels -- JSON lines ``{"text": "..."}`` (other keys ignored), a plain ``.txt`` file (one
text per line; also any file whose first non-blank line does not start with ``{``), or in-memory rows with a
``text`` column (a ``datasets.Dataset``, a list of dicts).

Encoding (:func:`encode_mlm`): each text is tokenised once with the model's tokenizer and cut into consecutive
windows of ``max_length - 2`` tokens, each ``[CLS] window [SEP]``; nothing is dropped (the tail is a shorter
window) and a cut is moved back to the start of a word that would straddle it. Every token carries its masking
unit, from jieba's words (:func:`zhnlp.tokenizers.masking.whole_word_unit_ids`, as ``zhnlp preprocess`` computes
them for pretraining), or one unit per token without whole-word masking.

Masking (:class:`Masking`) is pretraining's (:func:`zhnlp.data.pretraining.mask_units`: whole units, 80% [MASK] /
10% random / 10% kept) and a pure function of its seed: training features get a fresh masking every epoch from
``(seed, epoch, feature index)``, so a resumed run sees the batches an uninterrupted one would; dev and test
features are masked once from ``(seed, feature index)``, so every evaluation scores the same task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zhnlp.data.tasks import Problems, first_line, jsonl_objects, read_lines
from zhnlp.errors import DataError

_SHAPE = '{"text": "..."}'
_TRAIN, _EVAL = 0, 1  # random streams: training epochs / the fixed dev and test masking


@dataclass
class MLMText:
    """One text; ``line`` is its 1-based line in the file (0 when built in code)."""

    text: str
    line: int = 0


# ------------------------------------------------------------------------------------------ reading
def _text(value) -> tuple[str | None, str | None]:
    if not isinstance(value, str):
        return None, f"'text' must be a string, got {type(value).__name__}"
    if not value.strip():
        return None, "'text' is empty; remove the line or fill in the text"
    return value, None


def read_mlm(path) -> list[MLMText]:
    """The texts of a JSON-lines file, or of a plain-text file (one text per line: a ``.txt`` file, or one whose
    first non-blank line does not start with ``{``). Blank lines are skipped; every problem of a JSON-lines file is
    collected and raised as one :class:`DataError` naming ``FILE:LINE``."""
    path = Path(path)
    lines = read_lines(path, "masked-LM text")
    if path.suffix.lower() == ".txt" or not first_line(lines).lstrip().startswith("{"):
        return _finish([MLMText(line, n) for n, line in enumerate(lines, start=1) if line.strip()], str(path))
    problems = Problems()
    out = []
    for number, where, row in jsonl_objects(path, lines, problems, _SHAPE):
        if "text" not in row:
            problems.add(where, f"no 'text' field (found {', '.join(map(repr, row)) or 'none'}); write the line "
                                f"as {_SHAPE}, or pass a .txt file with one text per line")
            continue
        text, problem = _text(row["text"])
        if problem:
            problems.add(where, problem)
        else:
            out.append(MLMText(text, number))
    problems.raise_if_any(f"cannot read {path}")
    return _finish(out, str(path))


def mlm_from_rows(rows, name: str) -> list[MLMText]:
    """The texts of in-memory rows (dicts with ``text``; a ``datasets.Dataset`` iterates as such), checked as a
    file is; problems name ``NAME row I`` (0-based, as ``dataset[i]``)."""
    problems = Problems()
    out = []
    for i, row in enumerate(rows):
        text, problem = _text(row.get("text")) if isinstance(row, dict) and "text" in row else \
            (None, f"no 'text' column; each row needs one like {_SHAPE}")
        if problem:
            problems.add(f"{name} row {i}", problem)
        else:
            out.append(MLMText(text))
    problems.raise_if_any(f"cannot read {name}")
    return _finish(out, name)


def _finish(texts: list[MLMText], name: str) -> list[MLMText]:
    if not texts:
        raise DataError(f"{name} holds no text; check that it is the right file")
    return texts


# ------------------------------------------------------------------------------------------ encoding
def encode_mlm(tokenizer, examples: list[MLMText], max_length: int, whole_word: bool = True) -> list[dict]:
    """Windows of every text -> features: ``input_ids`` (``[CLS] ... [SEP]``, unmasked), ``token_type_ids``,
    ``attention_mask``, ``units`` (int64 array, the masking unit of every token, -1 on the special tokens) and
    ``index`` (the feature's position, which seeds its masking)."""
    room = max_length - 2
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls is None or sep is None:
        raise DataError("the model's tokenizer has no [CLS]/[SEP] tokens, which masked-LM windows are built with; "
                        "fine-tune an encoder with a BERT-style tokenizer.")
    texts = [e.text for e in examples]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    segmenter = None
    if whole_word:
        from zhnlp.tokenizers.segment import Segmenter

        segmenter = Segmenter()
    features = []
    for text, ids, offsets in zip(texts, enc["input_ids"], enc["offset_mapping"]):
        if not ids:
            continue  # nothing the tokenizer keeps (e.g. only control characters): nothing to learn from
        units = _units(text, offsets, segmenter)
        for start, end in _windows(units, room):
            n = end - start + 2
            features.append({"input_ids": [cls, *ids[start:end], sep], "token_type_ids": [0] * n,
                             "attention_mask": [1] * n, "units": np.concatenate([[-1], units[start:end], [-1]]),
                             "index": len(features)})
    if not features:
        raise DataError("no text gives any token with the model's tokenizer; check the file and the model.")
    return features


def _units(text: str, offsets, segmenter) -> np.ndarray:
    """(T,) int64 masking unit of every token: its jieba word, or itself without a segmenter."""
    if segmenter is None:
        return np.arange(len(offsets), dtype=np.int64)
    from zhnlp.tokenizers.masking import whole_word_unit_ids

    return whole_word_unit_ids(text, offsets, segmenter).astype(np.int64)


def _windows(units: np.ndarray, room: int) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` token ranges of at most ``room`` tokens covering every token; a cut inside a
    word moves back to the word's start unless the word began the window."""
    out, start, n = [], 0, len(units)
    while start < n:
        end = min(start + room, n)
        if end < n:
            cut = end
            while cut > start and units[cut] >= 0 and units[cut] == units[cut - 1]:
                cut -= 1
            end = cut if cut > start else end
        out.append((start, end))
        start = end
    return out


# ------------------------------------------------------------------------------------------ masking
class Masking:
    """Seeded masking of encoded features (``special``: :class:`zhnlp.data.pretraining.SpecialTokens`)."""

    def __init__(self, special, mask_prob: float, seed: int):
        self.special, self.mask_prob, self.seed = special, mask_prob, seed

    def for_epoch(self, feature: dict, epoch: int) -> dict:
        """Training: ``feature`` masked afresh for ``epoch``, a pure function of ``(seed, epoch, index)``."""
        return self._apply(feature, np.random.default_rng([self.seed, _TRAIN, epoch, feature["index"]]))

    def fixed(self, features: list[dict]) -> list[dict]:
        """Dev/test: each feature masked once, from ``(seed, index)`` (the same at every evaluation)."""
        return [self._apply(f, np.random.default_rng([self.seed, _EVAL, f["index"]])) for f in features]

    def _apply(self, feature: dict, rng) -> dict:
        from zhnlp.data.pretraining import mask_units

        ids = np.asarray(feature["input_ids"], dtype=np.int64)
        masked, labels = mask_units(ids, feature["units"], rng, self.special, self.mask_prob)
        return {**feature, "input_ids": masked.tolist(), "labels": labels.tolist()}
