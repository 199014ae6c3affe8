"""Task datasets for fine-tuning: readers, feature building and decoding of model outputs.

* :mod:`~zhnlp.data.tasks.classification` -- single texts and text pairs with a label (jsonl or TSV with a header).
* :mod:`~zhnlp.data.tasks.mrc` -- extractive question answering in SQuAD v1 format (CMRC2018, DRCD): context
  windows, gold token positions, and decoding of start/end logits back to character spans.
* :mod:`~zhnlp.data.tasks.ner` -- token tagging (jsonl or CoNLL ``char TAG``): label alignment on sub-tokens,
  windows for long sentences, and decoding back to one tag per word.

Every reader reports bad data as one :class:`~zhnlp.errors.DataError` listing up to :data:`MAX_REPORTED`
problems as ``FILE:LINE: problem; fix`` with the total count, so a user fixes a file in one pass rather than
one error per run. :func:`collate` turns a list of feature dicts into a padded batch of int64 tensors.
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


def collate(features: list, pad_to: int | None = None, pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a list of features into a batch of int64 tensors.

    Each feature is a dict of Python lists/ints (or an :class:`~zhnlp.data.tasks.mrc.MRCFeature`, taken through
    its ``as_inputs()``): ``input_ids`` (padded with ``pad_token_id``), ``token_type_ids`` and ``attention_mask``
    (padded with 0), and optionally ``labels`` -- an int per feature (classification, shape ``(B,)``) or a list
    per token (tagging, padded with -100, shape ``(B, T)``) -- and ``start_positions``/``end_positions`` (ints,
    shape ``(B,)``). Sequences are padded to the longest in the batch, or to ``pad_to`` (an error if a feature is
    longer). Other keys (``example_index``, ``word_ids``, ...) are bookkeeping for decoding and are left out.
    """
    if not features:
        raise ValueError("collate() got an empty list of features")
    rows = [_as_dict(f) for f in features]
    longest = max(len(r["input_ids"]) for r in rows)
    if pad_to is not None and pad_to < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest feature ({longest} tokens); "
                         f"raise pad_to or encode with a smaller max_length")
    width = pad_to if pad_to is not None else longest
    batch: dict[str, torch.Tensor] = {}
    keys = [k for k in _SEQUENCE_KEYS if k in rows[0]]
    if "labels" in rows[0] and not isinstance(rows[0]["labels"], int):
        keys.append("labels")
    for key in keys:
        pad = {"labels": IGNORE_INDEX}.get(key, _SEQUENCE_KEYS.get(key))
        pad = pad_token_id if pad is None else pad
        batch[key] = torch.tensor([_padded(r, key, width, pad, i) for i, r in enumerate(rows)], dtype=torch.long)
    scalars = [k for k in _SCALAR_KEYS if k in rows[0]]
    if "labels" in rows[0] and isinstance(rows[0]["labels"], int):
        scalars.insert(0, "labels")
    for key in scalars:
        batch[key] = torch.tensor([_field(r, key, i) for i, r in enumerate(rows)], dtype=torch.long)
    return batch


def _field(row: Mapping, key: str, index: int) -> Any:
    if key not in row:
        raise ValueError(f"feature {index} has no {key!r} while feature 0 has one; "
                         f"do not mix labelled and unlabelled features in one batch")
    return row[key]


def _padded(row: Mapping, key: str, width: int, pad: int, index: int) -> list[int]:
    values = list(_field(row, key, index))
    if len(values) != len(row["input_ids"]):
        raise ValueError(f"feature {index}: {key} has {len(values)} entries but input_ids has {len(row['input_ids'])}")
    return values + [pad] * (width - len(values))


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
