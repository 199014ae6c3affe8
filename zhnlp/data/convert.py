"""Traditional -> Simplified Chinese with OpenCC, for any text and for every fetched dataset, offsets kept valid.

    from zhnlp.data.convert import convert_text
    convert_text("臺灣的計程車")                     # '台湾的计程车'
    zhnlp data fetch drcd --convert t2s             # the cache entry drcd-t2s, beside the original drcd

OpenCC converts phrases first (``乾隆`` stays, ``乾燥`` -> ``干燥``), then characters. A phrase table may map a
phrase to one of another length, so whole-text conversion cannot be trusted to keep character offsets (the t2s
tables of OpenCC 1.4.2 happen to be length-preserving entry by entry; the code does not rely on it). Where a text
carries offsets (a reading-comprehension context and its answers, a sentence and its entity spans), it is cut at
every offset, the pieces are converted one by one and the offsets are recomputed from the converted pieces'
lengths: exact for any table. Each answer's text becomes the converted context's slice at its new offset, so
``context[answer_start:answer_start + len(text)] == text`` holds for every answer that held it before. The price
is a phrase that straddles a cut, converted as two pieces; how many texts that changed is counted
(``phrases_cut_at_offsets``; DRCD: 3 of 2,000 contexts, e.g. 設於倫敦 -> 设于伦敦 where the whole text gives 设於伦敦).

Labels, tags, ids and every field that is not text are left as they are, so a converted dataset reads exactly as
the original does, row for row. Conversion can make two pairs of a sentence-pair dataset equal (a Traditional and a
Simplified variant of one question pair); they are counted, not dropped (LCQMC: one pair in train and dev, one in
train and test).
"""

from __future__ import annotations

import collections
import functools
import json
from pathlib import Path
from typing import Callable, Iterable

from zhnlp.data.pairs import pair_key
from zhnlp.errors import DataError

OPENCC_REQUIREMENT = "opencc==1.4.2"
CONVERSIONS = {"t2s": "Traditional -> Simplified Chinese (OpenCC t2s: phrases, then characters)"}
CONVERT_RECIPE = 1  # bump when the conversion changes, so that converted caches are rebuilt
TEXT_FIELDS = ("text", "text_pair", "text_a", "text_b")  # classification and pair rows; other shapes by their keys
VERBATIM = ("LICENCE", "LICENSE")  # licence texts are copied unchanged
Convert = Callable[[str], str]


@functools.lru_cache(maxsize=None)
def converter(conversion: str = "t2s") -> Convert:
    """The text -> text function of ``conversion`` (a key of :data:`CONVERSIONS`), built once per process."""
    if conversion not in CONVERSIONS:
        raise DataError(f"unknown conversion {conversion!r}; the known conversions are: {', '.join(CONVERSIONS)}")
    try:
        import opencc
    except ImportError as e:
        raise DataError(f"converting Chinese scripts needs OpenCC: pip install {OPENCC_REQUIREMENT}") from e
    return opencc.OpenCC(f"{conversion}.json").convert


def opencc_version() -> str:
    """The installed OpenCC's version (recorded with every converted dataset)."""
    converter()  # the clear error when it is missing
    import opencc

    return opencc.__version__


def convert_text(text: str, conversion: str = "t2s") -> str:
    """``text`` converted (phrase-level, whole): for texts without offsets into them."""
    return converter(conversion)(text)


def convert_spans(text: str, offsets: Iterable[int], convert: Convert) -> tuple[str, dict[int, int], bool]:
    """Convert ``text`` cut at every offset in ``offsets``; returns the converted text, each offset's new position
    (``{old: new}``; offsets outside ``0..len(text)`` are left out) and whether cutting changed the result against
    converting the whole text (a phrase across an offset)."""
    cuts = sorted({0, len(text), *(o for o in offsets if 0 <= o <= len(text))})
    pieces, where, pos = [], {}, 0
    for start, end in zip(cuts, cuts[1:]):
        where[start] = pos
        pieces.append(convert(text[start:end]))
        pos += len(pieces[-1])
    where[len(text)] = pos
    new = "".join(pieces)
    return new, where, len(cuts) > 2 and new != convert(text)


def _move(where: dict[int, int], offset: int) -> int:
    """An offset that is not a cut of :func:`convert_spans`, moved with the start of its piece (exact when the
    piece kept its length); offsets outside the text are returned unchanged."""
    if offset in where or offset < 0 or offset > max(where):
        return where.get(offset, offset)
    cut = max(k for k in where if k <= offset)
    return where[cut] + offset - cut


def _at(context: str, answer: dict) -> bool:
    start, text = answer.get("answer_start"), answer.get("text")
    return isinstance(start, int) and isinstance(text, str) and 0 <= start and \
        context[start:start + len(text)] == text


def convert_squad(data: dict, convert: Convert) -> tuple[dict, collections.Counter]:
    """A SQuAD-format dict (``data -> paragraphs -> context, qas -> question, answers``) with titles, contexts,
    questions and answers converted and every ``answer_start`` recomputed; returns it and statistics.

    An answer at its offset before is at its (new) offset after, its text being the converted context's slice
    there. An answer that was not (an off-by-one start, a start of -1 for a paraphrased reference) is no cut, so
    it cannot split a phrase of the context: its text is converted alone and its start moved with the piece of the
    context it lies in (see :func:`~zhnlp.data.tasks.mrc.read_squad` for how such answers are read)."""
    stats = collections.Counter()
    try:
        articles = data["data"]
        out = {**data, "data": []}
        for article in articles:
            paragraphs = []
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                answers = [a for q in paragraph["qas"] for a in q.get("answers") or []]
                offsets = [o for a in answers if _at(context, a)
                           for o in (a["answer_start"], a["answer_start"] + len(a["text"]))]
                new_context, where, cut = convert_spans(context, offsets, convert)
                stats["contexts"] += 1
                stats["phrases_cut_at_offsets"] += cut
                stats["contexts_changed"] += new_context != context
                stats["contexts_changed_length"] += len(new_context) != len(context)
                qas = []
                for q in paragraph["qas"]:
                    new_answers = []
                    for a in q.get("answers") or []:
                        stats["answers"] += 1
                        placed = _at(context, a)
                        stats["answers_not_at_answer_start_before"] += not placed
                        if placed:
                            start, end = where[a["answer_start"]], where[a["answer_start"] + len(a["text"])]
                            new = {**a, "answer_start": start, "text": new_context[start:end]}
                        else:  # converted alone; a start inside the context moves with it
                            new = dict(a)
                            if isinstance(a.get("text"), str):
                                new["text"] = convert(a["text"])
                            if isinstance(a.get("answer_start"), int):
                                new["answer_start"] = _move(where, a["answer_start"])
                        stats["answers_not_at_answer_start"] += not _at(new_context, new)
                        new_answers.append(new)
                    stats["questions"] += 1
                    new_q = {**q, "question": convert(q["question"])}
                    if "answers" in q:
                        new_q["answers"] = new_answers
                    qas.append(new_q)
                paragraphs.append({**paragraph, "context": new_context, "qas": qas})
            new_article = {**article, "paragraphs": paragraphs}
            if isinstance(article.get("title"), str):
                new_article["title"] = convert(article["title"])
            out["data"].append(new_article)
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(f"not a SQuAD-format reading-comprehension file ({e!r}): expected "
                        f"data -> paragraphs -> context and qas -> question, answers") from e
    return out, stats


def convert_tokens(tokens: list[str], tags: list[str], convert: Convert) -> tuple[list[str], bool]:
    """Tokens of a tagged sentence converted, one output token per input token; returns them and whether cutting
    at entity boundaries changed the result against converting the sentence whole.

    The sentence is cut where an entity begins or ends (a ``B-``/``S-`` tag, or a change of type, ``O`` included)
    and each piece converted whole; a piece of one-character tokens whose conversion has its
    length is split back into characters, any other piece is converted token by token."""
    if len(tags) != len(tokens):
        raise DataError(f"{len(tokens)} tokens but {len(tags)} tags; every token needs one tag")
    # a cut where an entity begins (B-/S-) and wherever the type changes (entity <-> O, one type to another)
    bounds = sorted({0, len(tokens)} | {i for i in range(1, len(tags))
                                        if tags[i][:2] in ("B-", "S-") or tags[i][2:] != tags[i - 1][2:]})
    out = []
    for start, end in zip(bounds, bounds[1:]):
        piece = tokens[start:end]
        converted = convert("".join(piece))
        if all(len(t) == 1 for t in piece) and len(converted) == len(piece):
            out.extend(converted)
        else:
            out.extend(convert(t) for t in piece)
    return out, "".join(out) != convert("".join(tokens))


def convert_row(row: dict, convert: Convert, stats: collections.Counter) -> dict:
    """One JSON-lines row converted: ``tokens`` + ``tags`` (NER), ``text`` + ``entities`` with character offsets
    (spans), or the text fields of :data:`TEXT_FIELDS` (classification, pairs). Raises :class:`DataError` for a
    row with none of them."""
    new = dict(row)
    if isinstance(row.get("tokens"), list):
        new["tokens"], cut = convert_tokens(row["tokens"], row.get("tags") or ["O"] * len(row["tokens"]), convert)
        stats["phrases_cut_at_offsets"] += cut
    elif isinstance(row.get("entities"), list) and isinstance(row.get("text"), str):
        entities = row["entities"]
        new["text"], where, cut = convert_spans(row["text"], [o for e in entities for o in (e["start"], e["end"])],
                                                convert)
        new["entities"] = [{**e, "start": where[e["start"]], "end": where[e["end"]],
                            "text": new["text"][where[e["start"]]:where[e["end"]]]} for e in entities]
        stats["phrases_cut_at_offsets"] += cut
    elif any(isinstance(row.get(k), str) for k in TEXT_FIELDS):
        for k in TEXT_FIELDS:
            if isinstance(row.get(k), str):
                new[k] = convert(row[k])
    else:
        raise DataError(f"a row with the keys {sorted(row)} holds no text zhnlp knows how to convert "
                        f"({', '.join(TEXT_FIELDS)}, tokens, or text with entities)")
    stats["rows"] += 1
    stats["rows_changed"] += new != row
    return new


def convert_files(sources: dict[str, bytes], out: Path, conversion: str = "t2s") -> dict:
    """Convert the files of a fetched dataset (relative path -> bytes) into ``out``: ``*.jsonl`` row by row,
    ``*.json`` as SQuAD, ``*.txt`` line by line, licence texts verbatim. Returns statistics per file, and for
    sentence pairs how many pairs conversion made equal across splits (two variants of one pair become one)."""
    convert = converter(conversion)
    counts, pairs = {}, {}
    for rel, data in sorted(sources.items()):
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        name = Path(rel).name
        if name in VERBATIM:
            path.write_bytes(data)
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{rel} is not UTF-8 text ({e}), so it cannot be converted") from e
        try:
            result, stats = _convert_file(name, text, convert)
        except json.JSONDecodeError as e:
            raise DataError(f"{rel} is not valid JSON ({e}); fetch the dataset again with --force") from e
        path.write_text(result, encoding="utf-8", newline="\n")
        counts[rel] = dict(stats)
        if name.endswith(".jsonl"):
            rows = [json.loads(line) for line in result.split("\n") if line]
            if rows and all(isinstance(r.get("text"), str) and isinstance(r.get("text_pair"), str) for r in rows):
                pairs[rel] = {pair_key(r["text"], r["text_pair"]) for r in rows}
    if len(pairs) > 1:
        names = sorted(pairs)
        counts["pairs_in_two_files_after_conversion"] = {f"{x}&{y}": len(pairs[x] & pairs[y])
                                                         for i, x in enumerate(names) for y in names[i + 1:]}
    return counts


def _convert_file(name: str, text: str, convert: Convert) -> tuple[str, collections.Counter]:
    stats = collections.Counter()
    if name.endswith(".jsonl"):
        rows = [json.loads(line) for line in text.split("\n") if line.strip()]
        result = "".join(json.dumps(convert_row(r, convert, stats), ensure_ascii=False) + "\n" for r in rows)
    elif name.endswith(".json"):
        converted, stats = convert_squad(json.loads(text), convert)
        result = json.dumps(converted, ensure_ascii=False)
    elif name.endswith(".txt"):
        lines = text.split("\n")  # not splitlines: U+2028 and friends occur inside the data
        converted = [convert(line) for line in lines]
        result = "\n".join(converted)
        stats["lines"] = len(lines) - (lines[-1] == "")
        stats["lines_changed"] = sum(c != line for c, line in zip(converted, lines))
    else:
        raise DataError(f"{name}: zhnlp does not know how to convert a file of this kind "
                        f"(jsonl, SQuAD json and txt are converted, LICENCE copied)")
    return result, stats


def conversion_note(conversion: str, version: str) -> str:
    """The sentence recorded in a converted dataset's meta.json (processing and licence)."""
    return (f"converted by zhnlp: {CONVERSIONS[conversion]} with OpenCC {version} (Apache-2.0); texts with "
            f"character offsets (answers, entity spans) converted in pieces cut at every offset and the offsets "
            f"recomputed; labels, tags and ids unchanged; licence files copied verbatim")
