"""Task data through Hugging Face ``datasets``: in-memory datasets, saved datasets and local files.

What fine-tuning accepts as ``train``/``dev``/``test`` (:func:`open_source`):

* a file path: classification jsonl/TSV/CSV, NER jsonl (read through ``datasets``' json/csv
  builders, which parse into a memory-mapped Arrow file cached under ``HF_DATASETS_CACHE`` and
  reused while the file is unchanged) or CoNLL, reading comprehension SQuAD json, masked-LM
  jsonl or plain text (zhnlp's readers);
* a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``;
* a ``datasets.Dataset``, a ``datasets.DatasetDict`` (its ``train`` / ``validation`` / ``test``
  split), or a list of dicts.

Columns: classification ``text`` (or ``text_a``, ``sentence``) [+ ``text_b``/``sentence2``] and
``label`` (a ClassLabel's names are the labels, in its order); NER ``tokens`` and ``tags`` (or
``ner_tags``, a ``Sequence(ClassLabel)``); reading comprehension ``context``, ``question``,
``answers`` (``{"text": [...], "answer_start": [...]}``, as the hub's squad/cmrc2018) and ``id``;
masked LM ``text``.

Malformed data: the rows are checked as zhnlp's readers check a file; when a file read through
``datasets`` has a problem (or ``datasets`` cannot parse it), the file is read again by zhnlp's own
reader, whose error names ``FILE:LINE`` for every problem (``datasets`` knows no line numbers).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from zhnlp.errors import DataError

logger = logging.getLogger("zhnlp")

SPLITS = {"train": ("train",), "dev": ("validation", "dev", "valid"), "test": ("test",)}
COLUMNS = {  # task -> (alternatives for each required column, optional columns)
    "classification": ([("text", "text_a", "sentence", "sentence1")], ["text_b", "sentence2", "label"]),
    "ner": ([("tokens",)], ["tags", "ner_tags"]),
    "mrc": ([("context",), ("question",)], ["answers", "id", "title"]),
    "mlm": ([("text",)], []),
}


# ------------------------------------------------------------------------------------------ sources
def saved_dataset_kind(path) -> str | None:
    """``"Dataset"`` / ``"DatasetDict"`` for a directory ``save_to_disk`` wrote, else None."""
    p = Path(path)
    if (p / "dataset_dict.json").is_file():
        return "DatasetDict"
    if (p / "state.json").is_file() and (p / "dataset_info.json").is_file():
        return "Dataset"
    return None


def source_problem(path) -> str | None:
    """None for a file or a saved dataset directory, else what is wrong with ``path``."""
    p = Path(path)
    if p.is_file() or (p.is_dir() and saved_dataset_kind(p)):
        return None
    if p.is_dir():
        return ("is a directory, but not a dataset saved with save_to_disk (no dataset_dict.json or "
                "state.json in it); pass a data file or a save_to_disk directory")
    return "does not exist"


def data_source(text: str) -> str:
    """``type=`` for ``--train/--dev/--test``: a data file or a ``save_to_disk`` directory."""
    import argparse

    problem = source_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text} {problem}")
    return text


def check_source(flag: str, value) -> None:
    """The Python-API form of :func:`data_source` for a path (objects pass): one DataError naming ``flag``."""
    if isinstance(value, (str, Path)):
        problem = source_problem(value)
        if problem:
            raise DataError(f"{flag} {value} {problem}.")


def is_dataset_dict(value) -> bool:
    if isinstance(value, (str, Path)):
        return saved_dataset_kind(value) == "DatasetDict"
    return type(value).__name__ in ("DatasetDict", "IterableDatasetDict") or (
        isinstance(value, dict) and bool(value) and all(hasattr(v, "column_names") for v in value.values()))


def describe(value) -> str | None:
    """A short JSON-able description of a source, for metrics.json."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return f"list of {len(value)} rows"
    rows = getattr(value, "num_rows", None)
    return f"{type(value).__name__}({rows} rows)" if rows is not None else type(value).__name__


def pick_split(value, split: str, flag: str):
    """The ``split`` ("train"/"dev"/"test") of a DatasetDict (or its save_to_disk directory); other
    sources are returned as they are. None when a DatasetDict has no such split and ``split`` is
    optional (dev/test); a missing train split is an error naming the splits there are."""
    if not is_dataset_dict(value):
        return value
    if isinstance(value, (str, Path)):
        import datasets

        value = datasets.load_from_disk(str(value))
    for name in SPLITS[split]:
        if name in value:
            return value[name]
    if split == "train":
        raise DataError(f"{flag}: the DatasetDict has no {' or '.join(SPLITS[split])} split (it has "
                        f"{', '.join(value)}); pass the split to train on, e.g. train=dataset_dict['{next(iter(value))}'].")
    return None


def open_source(value, flag: str):
    """A path -> a Path (a file) or the Dataset saved there; objects as they are. DataError for anything else."""
    if isinstance(value, (str, Path)):
        check_source(flag, value)
        if Path(value).is_dir():
            import datasets

            loaded = datasets.load_from_disk(str(value))
            if is_dataset_dict(loaded):
                raise DataError(f"{flag} {value} holds a DatasetDict ({', '.join(loaded)}); pass it as train= (its "
                                "splits fill train, dev and test) or save the split you mean on its own.")
            return loaded
        return Path(value)
    if isinstance(value, list):
        if not all(isinstance(r, dict) for r in value):
            bad = next(type(r).__name__ for r in value if not isinstance(r, dict))
            raise DataError(f"{flag}: a list of data must hold dicts (one example each), found a {bad}.")
        return value
    if hasattr(value, "column_names") and hasattr(value, "__iter__"):
        return value
    raise DataError(f"{flag}: cannot read a {type(value).__name__} as data; pass a file path, a save_to_disk "
                    "directory, a datasets.Dataset, a DatasetDict or a list of dicts.")


# ------------------------------------------------------------------------------------------ columns
def check_columns(task: str, found: list[str], name: str) -> None:
    """One DataError naming the expected and the found columns when a required one is missing."""
    required, optional = COLUMNS[task]
    missing = [alts for alts in required if not any(a in found for a in alts)]
    if missing:
        expected = [" or ".join(alts) for alts in required] + [f"optional {c}" for c in optional]
        raise DataError(f"{name} lacks the column(s) {', '.join(' or '.join(a) for a in missing)} a {task} "
                        f"dataset needs: expected {', '.join(expected)}; found {', '.join(found) or 'no columns'}. "
                        f"Rename the columns (dataset.rename_column(old, new)).")


def _columns(rows) -> list[str]:
    if hasattr(rows, "column_names"):
        return list(rows.column_names)
    return list(dict.fromkeys(k for r in rows for k in r))


def _class_names(rows, column: str) -> list[str] | None:
    """The names of a ClassLabel column (or of a Sequence of ClassLabel), else None."""
    feature = getattr(rows, "features", {}).get(column) if hasattr(rows, "features") else None
    feature = getattr(feature, "feature", feature)  # Sequence(ClassLabel) / List(ClassLabel)
    names = getattr(feature, "names", None)
    return list(names) if names else None


def _rows(rows) -> list[dict]:
    return rows.to_list() if hasattr(rows, "to_list") else list(rows)


# ------------------------------------------------------------------------------------------ per task
def read_rows(task: str, rows, labels: list[str] | None, name: str, training: bool = False):
    """Examples of in-memory rows (a Dataset or a list of dicts) for ``task`` ->
    (examples, labels, reference); ``reference`` is what the task's metric scores against (reading
    comprehension: the SQuAD dict), else None."""
    check_columns(task, _columns(rows), name)
    if task == "classification":
        from zhnlp.data.tasks.classification import classification_from_rows

        examples, labels = classification_from_rows(_rows(rows), labels, name, _class_names(rows, "label"))
        return examples, labels, None
    if task == "ner":
        from zhnlp.data.tasks.ner import ner_from_rows

        names = _class_names(rows, "ner_tags") or _class_names(rows, "tags")
        # a ClassLabel's names are the tag set, in its order (the model's id2label), unless labels are given
        return ner_from_rows(_rows(rows), name, names), labels if labels is not None else names, None
    if task == "mlm":
        from zhnlp.data.tasks.mlm import mlm_from_rows

        return mlm_from_rows(_rows(rows), name), None, None
    from zhnlp.data.tasks.mrc import read_squad

    data = squad_from_rows(_rows(rows))
    return read_squad(data, training=training), None, data


def squad_from_rows(rows: list[dict]) -> dict:
    """Flat reading-comprehension rows (one question each, as the hub's squad/cmrc2018 datasets) as a
    SQuAD v1 dict, one article per row (``data[i]`` is row i), so read_squad checks and scores them."""
    articles = []
    for i, row in enumerate(rows):
        answers = row.get("answers")
        if isinstance(answers, dict):  # {"text": [...], "answer_start": [...]}
            texts, starts = answers.get("text") or [], answers.get("answer_start") or []
            answers = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
        qa = {"id": str(row["id"]) if row.get("id") is not None else f"row-{i}", "question": row.get("question"),
              "answers": answers if answers is not None else []}
        articles.append({"title": str(row.get("title") or ""), "paragraphs": [{"context": row.get("context"),
                                                                                "qas": [qa]}]})
    return {"version": "v1.0", "data": articles}


@contextlib.contextmanager
def _quiet_datasets():
    """No progress bars or info lines from ``datasets`` while zhnlp reads a file (restored after)."""
    import datasets

    was = datasets.is_progress_bar_enabled()
    level = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield datasets
    finally:
        datasets.logging.set_verbosity(level)
        if was:
            datasets.enable_progress_bars()


def load_file(task: str, path: Path):
    """``path`` parsed by ``datasets`` (a memory-mapped, cached Arrow table) when its format is one
    ``datasets`` reads as the rows zhnlp expects, else None (CoNLL, SQuAD json, masked-LM text, a file
    ``datasets`` cannot parse: zhnlp's reader takes it)."""
    from zhnlp.data.tasks import first_line

    if task in ("mrc", "mlm"):
        return None
    try:
        with open(path, encoding="utf-8-sig") as f:
            head = first_line(f.readline() for _ in range(50))
    except (OSError, UnicodeDecodeError):
        return None  # zhnlp's reader says what is wrong
    suffix = path.suffix.lower()
    kwargs: dict[str, Any]
    if head.lstrip().startswith("{"):
        builder, kwargs = "json", {}
    elif task == "classification" and head.strip():
        import datasets

        delimiter = "," if suffix == ".csv" else "\t"
        columns = [c.strip() for c in next(iter(__import__("csv").reader([head], delimiter=delimiter)))]
        if len(set(columns)) != len(columns) or any(not c for c in columns):
            return None
        kwargs = dict(delimiter=delimiter, keep_default_na=False, column_names=columns, skiprows=1,
                      features=datasets.Features({c: datasets.Value("string") for c in columns}))
        if delimiter == "\t":
            kwargs["quoting"] = 3  # csv.QUOTE_NONE: zhnlp's TSV has no quoting
        builder = "csv"
    else:
        return None
    try:
        with _quiet_datasets() as datasets:
            return datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as e:  # noqa: BLE001 - any parse failure: zhnlp's reader gives the line-numbered answer
        logger.debug("datasets could not read %s (%s: %s); reading it with zhnlp's reader", path,
                     type(e).__name__, e)
        return None


def read_file(task: str, path: Path, labels: list[str] | None, training: bool = False):
    """A task file -> (examples, labels, reference): through ``datasets`` where it reads the format,
    and by zhnlp's reader (line-numbered errors) where it does not or the rows have a problem."""
    dataset = load_file(task, path)
    if dataset is not None:
        rows = dataset.to_list()
        delimited = dataset.info.builder_name == "csv"
        if delimited:  # TSV/CSV labels as zhnlp's reader takes them: stripped (an empty one is a problem)
            for row in rows:
                if isinstance(row.get("label"), str):
                    row["label"] = row["label"].strip()
        try:
            examples, labels_found, _ = read_rows(task, rows, labels, str(path), training)
        except DataError:
            pass  # the file has a problem: zhnlp's reader names its lines
        else:
            lines = _record_lines(path, delimited, path.suffix.lower() == ".csv")
            if len(lines) == len(rows) == len(examples):
                for example, line in zip(examples, lines):
                    example.line = line  # as zhnlp's reader numbers them: the file's line
            return examples, labels_found, None
    if task == "classification":
        from zhnlp.data.tasks.classification import read_classification

        examples, labels = read_classification(path, label_list=labels)
        return examples, labels, None
    if task == "ner":
        from zhnlp.data.tasks.ner import read_ner

        return read_ner(path), labels, None
    if task == "mlm":
        from zhnlp.data.tasks.mlm import read_mlm

        return read_mlm(path), None, None
    from zhnlp.data.tasks.mrc import read_squad

    return read_squad(path, training=training), None, str(path)


def _record_lines(path: Path, header: bool, quoted: bool) -> list[int]:
    """The 1-based line of every record of a JSON-lines / TSV / CSV file (blank lines and the header
    skipped; a quoted CSV field may span lines), read as a stream."""
    with open(path, encoding="utf-8-sig", newline="" if quoted else None) as f:
        if quoted:
            import csv

            reader = csv.reader(f)
            out, start = [], 1
            for record in reader:
                if any(field.strip() for field in record):
                    out.append(start)
                start = reader.line_num + 1
            return out[1:]
        numbers = [n for n, line in enumerate(f, start=1) if line.strip()]
    return numbers[1:] if header else numbers
