"""Task datasets for fine-tuning: readers, feature building and decoding of model outputs.

* :mod:`~zhnlp.data.tasks.classification` -- single texts and text pairs with a label (jsonl or TSV with a header).
* :mod:`~zhnlp.data.tasks.mrc` -- extractive question answering in SQuAD v1 format (CMRC2018, DRCD): context
  windows, gold token positions, and decoding of start/end logits back to character spans.
* :mod:`~zhnlp.data.tasks.ner` -- token tagging (jsonl or CoNLL ``char TAG``): label alignment on sub-tokens,
  windows for long sentences, and decoding back to one tag per word.
* :mod:`~zhnlp.data.tasks.mlm` -- texts without labels for masked-LM fine-tuning (jsonl or plain text): windows,
  whole-word units, seeded per-epoch masking.

Every reader reports bad data as one :class:`~zhnlp.errors.DataError` listing up to :data:`MAX_REPORTED`
problems as ``FILE:LINE: problem; fix`` with the total count, so a user fixes a file in one pass rather than
one error per run. :func:`collate` turns a list of feature dicts into a padded batch of int64 tensors (with
transformers' padding collators). :mod:`~zhnlp.data.tasks.hf` reads ``datasets`` objects, saved datasets and
local files through ``datasets``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch

from zhnlp.errors import DataError

MAX_REPORTED = 10  # problems listed in one DataError; the rest are only counted
IGNORE_INDEX = -100  # label of positions the loss skips (padding, special tokens, non-first sub-tokens)

# key -> padding value (None: the pad_token_id argument)
_SEQUENCE_KEYS = {"input_ids": None, "token_type_ids": 0, "attention_mask": 0}
_SCALAR_KEYS = ("start_positions", "end_positions")


class Problems:
    """Collects data problems while a reader goes through a file, then raises them together.

    ``add(where, problem)`` records ``"WHERE: problem"``; ``raise_if_any(what)`` raises one DataError holding the
    first :data:`MAX_REPORTED` of them and the total count, or does nothing if the data was clean."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.count = 0

    def add(self, where: str, problem: str) -> None:
        self.count += 1
        if len(self.messages) < MAX_REPORTED:
            self.messages.append(f"{where}: {problem}")

    def __bool__(self) -> bool:
        return self.count > 0

    def raise_if_any(self, what: str) -> None:
        if not self.count:
            return
        more = f"\n... and {self.count - len(self.messages)} more" if self.count > len(self.messages) else ""
        noun = "problem" if self.count == 1 else "problems"
        raise DataError(f"{what}: {self.count} {noun}:\n" + "\n".join(self.messages) + more)


def _as_dict(feature: Any) -> Mapping:
    # MRCFeature (a dataclass) knows its model inputs; plain features are dicts already
    return feature.as_inputs() if hasattr(feature, "as_inputs") else feature


def collate(features: list, pad_to: int | None = None, pad_token_id: int | None = None,
            tokenizer=None) -> dict[str, torch.Tensor]:
    """Pad a list of features into a batch of int64 tensors with transformers' collators
    (``DataCollatorWithPadding``; ``DataCollatorForTokenClassification`` when ``labels`` are per token).

    Each feature is a dict of Python lists/ints (or an :class:`~zhnlp.data.tasks.mrc.MRCFeature`, taken through
    its ``as_inputs()``): ``input_ids`` (padded with ``pad_token_id``, default the ``tokenizer``'s or 0),
    ``token_type_ids`` and ``attention_mask`` (padded with 0), and optionally ``labels`` -- an int per feature
    (classification, shape ``(B,)``) or a list per token (tagging, padded with -100, shape ``(B, T)``) -- and
    ``start_positions``/``end_positions`` (ints, shape ``(B,)``). Sequences are padded on the right to the longest
    in the batch, or to ``pad_to`` (an error if a feature is longer). Other keys (``example_index``,
    ``word_ids``, ...) are bookkeeping for decoding and are left out.
    """
    if not features:
        raise ValueError("collate() got an empty list of features")
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None) or 0
    rows = [_as_dict(f) for f in features]
    longest = max(len(r["input_ids"]) for r in rows)
    if pad_to is not None and pad_to < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest feature ({longest} tokens); "
                         f"raise pad_to or encode with a smaller max_length")
    keys = [k for k in (*_SEQUENCE_KEYS, "labels", *_SCALAR_KEYS) if k in rows[0]]
    per_token = "labels" in rows[0] and not isinstance(rows[0]["labels"], int)
    for i, r in enumerate(rows):
        for key in keys:
            value = _field(r, key, i)
            if key in _SEQUENCE_KEYS or (key == "labels" and per_token):
                if len(value) != len(r["input_ids"]):
                    raise ValueError(f"feature {i}: {key} has {len(value)} entries but input_ids has "
                                     f"{len(r['input_ids'])}")
    collator = _collator(pad_token_id, per_token, pad_to)
    batch = collator([{k: r[k] for k in keys} for r in rows])
    return {k: batch[k].long() for k in keys}


_COLLATORS: dict = {}


def _collator(pad_token_id: int, per_token: bool, pad_to: int | None):
    """transformers' padding collator for ``pad_token_id`` (cached): right padding to the longest feature
    or to ``pad_to``, per-token labels with -100."""
    key = (pad_token_id, per_token, pad_to)
    if key not in _COLLATORS:
        from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

        padding = dict(padding="max_length", max_length=pad_to) if pad_to is not None else dict(padding="longest")
        if per_token:
            made = DataCollatorForTokenClassification(_padder(pad_token_id), label_pad_token_id=IGNORE_INDEX,
                                                      return_tensors="pt", **padding)
        else:
            made = DataCollatorWithPadding(_padder(pad_token_id), return_tensors="pt", **padding)
        if len(_COLLATORS) > 64:
            _COLLATORS.clear()
        _COLLATORS[key] = made
    return _COLLATORS[key]


def _padder(pad_token_id: int):
    """A tokenizer that only pads (right side, ``pad_token_id``): what transformers' collators call ``pad`` on.
    Padding needs no vocabulary, so the collators work the same whatever tokenizer encoded the features."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    unk = pad_token_id + 1
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[PAD]": pad_token_id, "[UNK]": unk},
                                                                       unk_token="[UNK]")),
                                  pad_token="[PAD]", unk_token="[UNK]", padding_side="right",
                                  model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    if tok.pad_token_id != pad_token_id:
        raise RuntimeError(f"the padding tokenizer pads with {tok.pad_token_id}, not {pad_token_id}")
    return tok


def _field(row: Mapping, key: str, index: int) -> Any:
    if key not in row:
        raise ValueError(f"feature {index} has no {key!r} while feature 0 has one; "
                         f"do not mix labelled and unlabelled features in one batch")
    return row[key]


def first_line(lines: Iterable[str]) -> str:
    """The first line that is not blank ('' for a file of blank lines): readers sniff the format from it."""
    return next((line for line in lines if line.strip()), "")


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file (a BOM and CRLF endings accepted), or one clear DataError."""
    try:
        return path.read_text(encoding="utf-8-sig").replace("\r\n", "\n").split("\n")
    except FileNotFoundError as e:
        raise DataError(f"no {what} file at {path}; check the path") from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}); convert it to UTF-8") from e


def jsonl_objects(path: Path, lines: list[str], problems: Problems, example: str) -> Iterator[tuple[int, str, dict]]:
    """``(line number, "FILE:LINE", object)`` for every non-blank line that holds a JSON object; lines
    that are not valid JSON or not an object are reported to ``problems`` (``example`` shows the
    expected shape) and skipped."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            problems.add(where, f"invalid JSON ({e.msg} at column {e.colno}); fix the line so that it is one JSON "
                                f"object like {example}")
            continue
        if not isinstance(row, dict):
            problems.add(where, f"expected a JSON object, got {type(row).__name__}; write one object per line "
                                f"like {example}")
            continue
        yield number, where, row
