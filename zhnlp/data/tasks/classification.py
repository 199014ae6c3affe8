"""Text classification data: single texts or text pairs with a label.

File formats, told apart by the first non-blank line (``{`` starts JSON lines) and the suffix (``.csv``):

* JSON lines: ``{"text": ..., "label": ...}`` or ``{"text_a": ..., "text_b": ..., "label": ...}`` (``text`` is an
  alias of ``text_a``, ``text_pair`` of ``text_b``: the pipelines' names, which ``zhnlp data fetch lcqmc`` and the
  other sentence-pair datasets write); the label is an int or a string and may be absent in unlabelled prediction
  files.
  Other keys (``id``, ``qid``, ...) are ignored.
* TSV (ChnSentiCorp / CLUE style): a header line naming the columns, e.g. ``label<TAB>text_a``,
  ``qid<TAB>label<TAB>text_a`` or ``text_a<TAB>text_b<TAB>label``; no quoting, a tab never occurs inside a field.
* CSV (``.csv``): the same columns, comma-separated with standard CSV quoting.

In-memory rows (a ``datasets.Dataset``, a list of dicts) go through :func:`classification_from_rows`.

Labels are strings throughout (``1`` and ``"1"`` are the same label); :func:`encode_classification` maps them
to indices in the label list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from zhnlp.data.tasks import Problems, first_line, jsonl_objects, read_lines
from zhnlp.errors import DataError

TEXT_COLUMNS = ("text", "text_a")  # either names the first text
KNOWN_COLUMNS = {"label", "text", "text_a", "text_b", "qid", "id"}


@dataclass
class TextExample:
    """One classification example; ``line`` is its 1-based line in the file (0 when built in code)."""

    text_a: str
    text_b: str | None
    label: str | None
    line: int


def _label_key(label: str) -> tuple:
    # numeric strings by value ("2" before "10"), after them every other label alphabetically
    return (0, int(label), label) if re.fullmatch(r"-?\d+", label) else (1, 0, label)


def read_classification(path, label_list: list[str] | None = None) -> tuple[list[TextExample], list[str]]:
    """Read a classification file (JSON lines or TSV with a header, see the module docstring).

    Returns the examples and the label list: ``label_list`` when given (a label outside it is an error), else
    the labels found, sorted (numeric strings numerically). Blank lines are skipped. Every problem (invalid
    JSON, a missing or empty text, a bad label, a wrong column count, labels on some lines but not others) is
    collected and raised as one :class:`~zhnlp.errors.DataError` naming ``FILE:LINE`` for each.
    """
    path = Path(path)
    lines = read_lines(path, "classification")
    problems = Problems()
    if first_line(lines).lstrip().startswith("{"):
        examples = _read_jsonl(path, lines, problems)
    elif path.suffix.lower() == ".csv":
        examples = _read_csv(path, lines, problems)
    else:
        examples = _read_tsv(path, lines, problems)
    return _finish(examples, problems, label_list, str(path), lambda e: f"{path}:{e.line}")


def _finish(examples: list[TextExample], problems: Problems, label_list, name: str, where,
            found_order: list[str] | None = None) -> tuple[list[TextExample], list[str]]:
    """The checks across examples (labels on all or none, labels inside ``label_list``), then the label list."""
    labelled = [e for e in examples if e.label is not None]
    if labelled and len(labelled) < len(examples):
        for e in examples:
            if e.label is None:
                problems.add(where(e), "no label, while other lines have one; "
                                       "give every line a label, or none for a prediction file")
    if label_list is not None:
        allowed = set(label_list)
        for e in labelled:
            if e.label not in allowed:
                problems.add(where(e), f"label {e.label!r} is not in the label set {list(label_list)}; "
                                       f"fix the label or pass a label_list that includes it")
    problems.raise_if_any(f"cannot read {name}")
    if not examples:
        raise DataError(f"{name} holds no examples; check that it is the right file")
    if label_list is not None:
        labels = list(label_list)
    elif found_order is not None:  # a datasets ClassLabel: its names, in its order
        labels = list(found_order)
    else:
        labels = sorted({e.label for e in labelled}, key=_label_key)
    return examples, labels


ROW_ALIASES = {"sentence": "text_a", "sentence1": "text_a", "sentence2": "text_b"}  # GLUE/CLUE column names


def classification_from_rows(rows, label_list: list[str] | None = None, name: str = "the dataset",
                             label_names: list[str] | None = None) -> tuple[list[TextExample], list[str]]:
    """The examples of in-memory rows (dicts with ``text``/``text_a`` [+ ``text_b``] and ``label``; a
    ``datasets.Dataset`` iterates as such rows), checked as :func:`read_classification` checks a file;
    problems name ``NAME row I`` (0-based, as ``dataset[i]``). ``label_names``: a ClassLabel's names,
    which integer labels stand for and which give the label order."""
    problems = Problems()
    examples = []
    for index, raw in enumerate(rows):
        row = {ROW_ALIASES.get(k, k): v for k, v in raw.items() if v is not None}
        if label_names is not None and isinstance(row.get("label"), int) and 0 <= row["label"] < len(label_names):
            row["label"] = label_names[row["label"]]
        example, problem = _row_example(row, index + 1)
        if problem is not None:
            problems.add(f"{name} row {index}", problem)
        else:
            examples.append(example)
    return _finish(examples, problems, label_list, name, lambda e: f"{name} row {e.line - 1}", label_names)


def _text_field(value, name: str) -> tuple[str | None, str | None]:
    """(text, problem) for a text field's value."""
    if not isinstance(value, str):
        return None, f"{name!r} must be a string, got {type(value).__name__}"
    if not value.strip():
        return None, f"{name!r} is empty; remove the line or fill in the text"
    return value, None


def _read_jsonl(path: Path, lines: list[str], problems: Problems) -> list[TextExample]:
    examples = []
    for number, where, row in jsonl_objects(path, lines, problems, '{"text": "...", "label": 1}'):
        example, problem = _row_example(row, number)
        if problem is not None:
            problems.add(where, problem)
        else:
            examples.append(example)
    return examples


def _row_example(row: dict, number: int) -> tuple[TextExample | None, str | None]:
    """(example, None) for a valid row (a JSON line, a dataset row), else (None, what is wrong)."""
    if "text" in row and "text_a" in row:
        return None, "has both 'text' and 'text_a' (aliases); keep one of them"
    if "text_pair" in row:
        if "text_b" in row:
            return None, "has both 'text_b' and 'text_pair' (aliases); keep one of them"
        row = {**row, "text_b": row["text_pair"]}
    key = "text" if "text" in row else "text_a"
    if key not in row:
        return None, "missing field 'text' (or 'text_a'); add the text to classify"
    text_a, problem = _text_field(row[key], key)
    text_b = None
    if problem is None and row.get("text_b") is not None:
        text_b, problem = _text_field(row["text_b"], "text_b")
    label = None
    if problem is None and row.get("label") is not None:
        label, problem = _label(row["label"])
    if problem is not None:
        return None, problem
    return TextExample(text_a, text_b, label, number), None


def _read_csv(path: Path, lines: list[str], problems: Problems) -> list[TextExample]:
    """Comma-separated values with a header (standard CSV quoting), the columns of the TSV format. A
    record is numbered by its first line (a quoted field may span lines)."""
    import csv

    reader = csv.reader(line + "\n" for line in lines)
    header = [c.strip() for c in next(reader, [])]
    if not any(c in header for c in TEXT_COLUMNS) or len(set(header)) != len(header):
        raise DataError(f"{path}:1: the header {header} names no text column (or a column twice); fix: a header "
                        f"line such as 'label,text' or 'text_a,text_b,label' (known columns: {sorted(KNOWN_COLUMNS)})")
    examples = []
    start = reader.line_num + 1
    for fields in reader:
        number, start = start, reader.line_num + 1
        if not any(v.strip() for v in fields):
            continue
        where = f"{path}:{number}"
        if len(fields) != len(header):
            problems.add(where, f"wrong column count: {len(fields)} comma-separated fields, the header has "
                                f"{len(header)} ({','.join(header)}); fix the commas or quote the field")
            continue
        row = dict(zip(header, fields))
        if "label" in row:
            row["label"] = row["label"].strip()
        example, problem = _row_example(row, number)
        if problem is not None:
            problems.add(where, problem)
        else:
            examples.append(example)
    return examples


def _label(value) -> tuple[str | None, str | None]:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None, f"label must be an int or a string, got {value!r}; write e.g. 1 or \"positive\""
    label = str(value)
    if not label.strip():
        return None, "label is an empty string; fill it in or leave the field out for an unlabelled line"
    return label, None


def _read_tsv(path: Path, lines: list[str], problems: Problems) -> list[TextExample]:
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        return []
    header = [c.strip() for c in lines[start].split("\t")]
    text_col = next((c for c in TEXT_COLUMNS if c in header), None)
    if text_col is None or len(set(header)) != len(header) or ("text" in header and "text_a" in header):
        raise DataError(
            f"{path}:{start + 1}: the first line {lines[start][:80]!r} is not a header naming the columns; "
            f"fix: add a tab-separated header line such as 'label\\ttext_a', 'label\\ttext', 'qid\\tlabel\\ttext_a' "
            f"or 'text_a\\ttext_b\\tlabel' (known columns: {sorted(KNOWN_COLUMNS)}), or use JSON lines")
    column = {name: i for i, name in enumerate(header)}
    examples = []
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        fields = line.split("\t")
        if len(fields) != len(header):
            problems.add(where, f"wrong column count: {len(fields)} tab-separated fields, the header has "
                                f"{len(header)} ({' '.join(header)}); fix the tabs on this line")
            continue
        text_a, problem = _text_field(fields[column[text_col]], text_col)
        text_b = None
        if problem is None and "text_b" in column:
            text_b, problem = _text_field(fields[column["text_b"]], "text_b")
        label = None
        if problem is None and "label" in column:
            label, problem = _label(fields[column["label"]].strip())
        if problem is not None:
            problems.add(where, problem)
            continue
        examples.append(TextExample(text_a, text_b, label, number))
    return examples


def encode_classification(tokenizer, examples: list[TextExample], label_list: list[str],
                          max_length: int = 128) -> list[dict]:
    """Tokenise examples into feature dicts: ``input_ids``, ``token_type_ids``, ``attention_mask`` (unpadded
    lists; :func:`~zhnlp.data.tasks.collate` pads) and ``labels`` (the label's index in ``label_list``, left out
    when ``example.label`` is None). Texts longer than ``max_length`` tokens are truncated, pairs longest-first
    (the longer text loses tokens until both fit)."""
    index = {label: i for i, label in enumerate(label_list)}
    features: list[dict | None] = [None] * len(examples)
    # one batched tokenizer call per kind (single texts, pairs) is much faster than one call per example
    for pairs in (False, True):
        chosen = [i for i, e in enumerate(examples) if (e.text_b is not None) == pairs]
        if not chosen:
            continue
        first = [examples[i].text_a for i in chosen]
        second = [examples[i].text_b for i in chosen] if pairs else None
        enc = tokenizer(first, second, truncation="longest_first" if pairs else True, max_length=max_length)
        for j, i in enumerate(chosen):
            feature = {"input_ids": enc["input_ids"][j], "attention_mask": enc["attention_mask"][j],
                       "token_type_ids": enc["token_type_ids"][j] if "token_type_ids" in enc
                       else [0] * len(enc["input_ids"][j])}
            label = examples[i].label
            if label is not None:
                if label not in index:
                    raise DataError(f"line {examples[i].line}: label {label!r} is not in the label list {label_list}; "
                                    f"read the file with the same label_list you encode with")
                feature["labels"] = index[label]
            features[i] = feature
    return features  # type: ignore[return-value]
