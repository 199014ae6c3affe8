"""Named-entity recognition data: one tag per word, sub-token label alignment, windows, and decoding.

Files, told apart by the first non-blank line (``{`` starts JSON lines):

* JSON lines ``{"tokens": [...], "tags": [...]}`` (``tags`` may be absent in a file to predict on);
* CoNLL style, the ChineseNER/MSRA format: ``TOKEN TAG`` on each line (space or tab), a blank line between
  sentences; ``-DOCSTART-`` lines are skipped.

Tags are ``O`` or ``X-TYPE`` with X one of B, I, M, E, S (BIO, BMES and BIOES all fit).

Words are usually single characters. :func:`encode_ner` tokenises them with ``is_split_into_words=True``; a word
may become several sub-tokens (a Latin word, a number) or none (a space, a zero-width or control character).
The label goes on a word's first sub-token, -100 (ignored by the loss) on its other sub-tokens and on special
tokens. Long sentences are cut into windows of ``max_length`` tokens that overlap by ``stride`` sub-tokens (the
tokenizer's own ``return_overflowing_tokens`` windows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zhnlp.data.tasks import IGNORE_INDEX, Problems, first_line, jsonl_objects, read_lines
from zhnlp.errors import DataError

TAG = re.compile(r"^(?:O|[BIMES]-\S+)$")
_TAG_HELP = "tags are O or X-TYPE with X one of B, I, M, E, S (e.g. B-PER, I-LOC, S-ORG)"


@dataclass
class NERExample:
    """One sentence: its words and their tags (None when unlabelled); ``line`` is the 1-based line of the
    sentence in its file (0 when built in code)."""

    tokens: list[str]
    tags: list[str] | None
    line: int


# ============================================================== reading
def read_ner(path) -> list[NERExample]:
    """Read a NER file (JSON lines or CoNLL ``TOKEN TAG``, see the module docstring).

    Every problem (invalid JSON, missing tokens, tokens and tags of different lengths, a missing tag column, a tag
    that is not ``O``/``X-TYPE``, tags on some sentences but not others) is collected and raised as one
    :class:`~zhnlp.errors.DataError` naming ``FILE:LINE`` for each."""
    path = Path(path)
    lines = read_lines(path, "NER")
    problems = Problems()
    if first_line(lines).lstrip().startswith("{"):
        examples = _read_jsonl(path, lines, problems)
    else:
        examples = _read_conll(path, lines, problems)
    return _finish(examples, problems, str(path), lambda e: f"{path}:{e.line}")


def _finish(examples: list[NERExample], problems: Problems, name: str, where) -> list[NERExample]:
    tagged = sum(e.tags is not None for e in examples)
    if 0 < tagged < len(examples):
        for e in examples:
            if e.tags is None:
                problems.add(where(e), "no 'tags', while other sentences have them; tag every sentence, "
                                       "or none for a file to predict on")
    problems.raise_if_any(f"cannot read {name}")
    if not examples:
        raise DataError(f"{name} holds no sentences; check that it is the right file")
    return examples


def ner_from_rows(rows, name: str = "the dataset", tag_names: list[str] | None = None) -> list[NERExample]:
    """The sentences of in-memory rows (dicts with ``tokens`` and ``tags``, or ``ner_tags`` as in the Hugging
    Face hub's NER datasets; a ``datasets.Dataset`` iterates as such rows), checked as :func:`read_ner` checks
    a JSON-lines file; problems name ``NAME row I`` (0-based). ``tag_names``: the names integer tags stand
    for (a ``Sequence(ClassLabel)`` column's names)."""
    problems = Problems()
    examples = []
    for index, raw in enumerate(rows):
        row = {k: v for k, v in raw.items() if v is not None}
        if "tags" not in row and "ner_tags" in row:
            row["tags"] = row.pop("ner_tags")
        tags = row.get("tags")
        if tag_names is not None and isinstance(tags, list) and all(isinstance(t, int) for t in tags):
            row["tags"] = [tag_names[t] if 0 <= t < len(tag_names) else t for t in tags]
        example, problem = _row_example(row, index + 1)
        if problem is not None:
            problems.add(f"{name} row {index}", problem)
        else:
            examples.append(example)
    return _finish(examples, problems, name, lambda e: f"{name} row {e.line - 1}")


def _bad_tags(tags: list[str]) -> list[str]:
    return [t for t in tags if not TAG.match(t)]


def _read_jsonl(path: Path, lines: list[str], problems: Problems) -> list[NERExample]:
    examples = []
    example = '{"tokens": ["北", "京"], "tags": ["B-LOC", "I-LOC"]}'
    for number, where, row in jsonl_objects(path, lines, problems, example):
        found, problem = _row_example(row, number)
        if problem is not None:
            problems.add(where, problem)
        else:
            examples.append(found)
    return examples


def _row_example(row: dict, number: int) -> tuple[NERExample | None, str | None]:
    """(sentence, None) for a valid row (a JSON line, a dataset row), else (None, what is wrong)."""
    tokens = row.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
        return None, "missing or empty 'tokens'; give a non-empty list of non-empty strings"
    tags = row.get("tags")
    if tags is not None:
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            return None, "'tags' must be a list of strings"
        if len(tags) != len(tokens):
            return None, f"length mismatch: {len(tokens)} tokens but {len(tags)} tags; give one tag per token"
        bad = _bad_tags(tags)
        if bad:
            return None, f"tag {bad[0]!r} is not a valid tag; {_TAG_HELP}"
    return NERExample(list(tokens), list(tags) if tags is not None else None, number), None


def _read_conll(path: Path, lines: list[str], problems: Problems) -> list[NERExample]:
    examples: list[NERExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    start, bad = 0, False
    for number, line in enumerate(lines + [""], start=1):
        if not line.strip() or line.startswith("-DOCSTART-"):
            if tokens and not bad:
                examples.append(NERExample(tokens, tags, start))
            tokens, tags, bad = [], [], False
            continue
        if not tokens:
            start = number
        parts = line.split()
        where = f"{path}:{number}"
        if len(parts) == 1:
            problems.add(where, f"missing tag column in {line.strip()!r}; write 'TOKEN TAG' (e.g. '北 B-LOC'), "
                                f"or use JSON lines for a file without tags")
            bad = True
        elif len(parts) > 2:
            problems.add(where, f"{len(parts)} columns in {line.strip()!r}; expected 'TOKEN TAG'")
            bad = True
        elif not TAG.match(parts[1]):
            problems.add(where, f"tag {parts[1]!r} is not a valid tag; {_TAG_HELP}")
            bad = True
        else:
            tokens.append(parts[0])
            tags.append(parts[1])
            continue
        tokens.append("")  # keeps the sentence open so its later lines are still checked
        tags.append("O")
    return examples


def label_list_from(examples: list[NERExample]) -> list[str]:
    """The tags of ``examples``: ``"O"`` first (always present), then the others sorted."""
    tags = {t for e in examples if e.tags is not None for t in e.tags}
    return ["O"] + sorted(tags - {"O"})


# ============================================================== features
def encode_ner(tokenizer, examples: list[NERExample], label2id: dict[str, int], max_length: int = 128,
               stride: int = 32) -> list[dict]:
    """Feature dicts for every window of every example, in order.

    Each has ``input_ids``, ``token_type_ids``, ``attention_mask``, ``labels`` (only for tagged examples: the
    word's tag id on its first sub-token, -100 elsewhere), and for decoding ``example_index``, ``word_ids``
    (per token, the word index or None for special tokens) and ``window_start`` (the index of the window's first
    sub-token in the example's whole sub-token sequence). Windows hold ``max_length`` tokens with the special
    tokens and overlap by ``stride`` sub-tokens."""
    room = max_length - tokenizer.num_special_tokens_to_add()
    if room < 1 or not 0 <= stride < room:
        raise ValueError(f"stride={stride} must be >= 0 and smaller than the {room} sub-tokens a window of "
                         f"max_length={max_length} holds; lower stride or raise max_length")
    if not examples:
        return []
    from zhnlp.tokenizers.auto import require_alignment

    require_alignment(tokenizer, "token classification (NER)")
    words = [e.tokens for e in examples]
    full = tokenizer(words, is_split_into_words=True, add_special_tokens=False)
    enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length, stride=stride,
                    return_overflowing_tokens=True)
    features = []
    window_of: dict[int, int] = {}
    for f, index in enumerate(enc["overflow_to_sample_mapping"]):
        k = window_of.get(index, 0)
        window_of[index] = k + 1
        word_ids = enc.word_ids(f)
        content = [i for i, w in enumerate(word_ids) if w is not None]
        start = k * (room - stride)
        ids = enc["input_ids"][f]
        # the tokenizer cuts its windows every room - stride sub-tokens; check it so labels can never shift
        if [ids[i] for i in content] != full["input_ids"][index][start:start + len(content)]:
            raise RuntimeError(f"window {k} of example {index} is not the expected slice of its sub-tokens; "
                               f"the tokenizer windows differently than encode_ner assumes")
        feature = {"input_ids": ids, "token_type_ids": enc["token_type_ids"][f] if "token_type_ids" in enc
                   else [0] * len(ids), "attention_mask": enc["attention_mask"][f], "example_index": index,
                   "word_ids": word_ids, "window_start": start}
        example = examples[index]
        if example.tags is not None:
            full_words = full.word_ids(index)
            labels = [IGNORE_INDEX] * len(ids)
            for j, i in enumerate(content):
                pos = start + j
                w = word_ids[i]
                if pos == 0 or full_words[pos - 1] != w:  # the word's first sub-token
                    tag = example.tags[w]
                    if tag not in label2id:
                        raise DataError(f"line {example.line}: tag {tag!r} is not in the label set {sorted(label2id)}; "
                                        f"build label2id from all the data (label_list_from(train + dev))")
                    labels[i] = label2id[tag]
            feature["labels"] = labels
        features.append(feature)
    return features


# ============================================================== decoding
def _as_logits(logits, n_features: int) -> np.ndarray:
    if hasattr(logits, "detach"):
        logits = logits.detach().float().cpu().numpy()
    array = np.asarray(logits)
    if array.ndim != 3 or array.shape[0] != n_features:
        raise ValueError(f"logits have shape {array.shape}; expected (num_features={n_features}, seq_len, "
                         f"num_labels)")
    return array


def decode_ner(examples: list[NERExample], features: list[dict], logits, id2label: dict[int, str]) -> list[list[str]]:
    """One tag per word of every example from ``logits`` (array or tensor, ``(num_features, seq_len,
    num_labels)``, aligned with ``features``).

    A word's tag is the argmax at its first sub-token, read from the window in which that sub-token is farthest
    from a window edge (ties: the earlier window), where the model saw the most context. A word that produced no
    sub-token (a space, a control character) gets the inside tag of the entity around it when the words before
    and after it are inside one entity of one type (``B-PER [space] I-PER`` -> ``I-PER``; ``M-`` in BMES), else
    ``O``. Finally ill-formed sequences are repaired minimally: an ``I-X``/``M-X`` that does not continue an
    ``X`` entity becomes ``B-X``, such an ``E-X`` becomes ``S-X`` (``B-X`` without S tags), so each predicted
    entity starts with a start tag (see :func:`repair`)."""
    scores = _as_logits(logits, len(features))
    labels = set(id2label.values())
    # pass 1: each word's first sub-token, as a position in the example's whole sub-token sequence
    first: list[dict[int, int]] = [{} for _ in examples]
    for feature in features:
        firsts = first[feature["example_index"]]
        for pos, w, _ in _content(feature):
            if pos < firsts.get(w, pos + 1):
                firsts[w] = pos
    # pass 2: read each first sub-token in the window where it is farthest from an edge (ties: earlier window)
    chosen: list[dict[int, tuple[int, int]]] = [{} for _ in examples]  # word -> (distance, label id)
    for f, feature in enumerate(features):
        index = feature["example_index"]
        content = _content(feature)
        for j, (pos, w, token) in enumerate(content):
            if pos != first[index][w]:
                continue
            distance = min(j, len(content) - 1 - j)
            if w not in chosen[index] or distance > chosen[index][w][0]:
                chosen[index][w] = (distance, int(np.argmax(scores[f, token])))
    results = []
    for example, words in zip(examples, chosen):
        tags: list[str | None] = [id2label[words[w][1]] if w in words else None for w in range(len(example.tokens))]
        results.append(repair(_fill_untokenised(tags, labels), labels))
    return results


def _content(feature: dict) -> list[tuple[int, int, int]]:
    """(position in the example's sub-token sequence, word index, index in the window) of each content token."""
    tokens = [(i, w) for i, w in enumerate(feature["word_ids"]) if w is not None]
    return [(feature["window_start"] + j, w, i) for j, (i, w) in enumerate(tokens)]


def _split(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def _fill_untokenised(tags: list[str | None], labels: set[str]) -> list[str]:
    """Tags for words without sub-tokens (None): inside the surrounding entity when both neighbours (the nearest
    words that have tags) are in one entity of one type, else O."""
    out = list(tags)
    for i, tag in enumerate(tags):
        if tag is not None:
            continue
        before = next((out[k] for k in range(i - 1, -1, -1) if out[k] is not None), "O")
        after = next((tags[k] for k in range(i + 1, len(tags)) if tags[k] is not None), "O")
        (p_prefix, p_type), (n_prefix, n_type) = _split(before), _split(after)
        if p_type and p_type == n_type and p_prefix in "BIM" and n_prefix in "IME":
            inside = f"M-{p_type}" if f"M-{p_type}" in labels else f"I-{p_type}"
            out[i] = inside
        else:
            out[i] = "O"
    return out  # type: ignore[return-value]


def repair(tags: list[str], labels: set[str] | None = None) -> list[str]:
    """``tags`` with every continuation tag (``I-X``, ``M-X``, ``E-X``) that does not follow an open ``X``
    entity (``B-X``, ``I-X``, ``M-X``) turned into a start tag: ``B-X``, except that such an ``E-X`` becomes
    ``S-X`` when the scheme has S tags (BMES/BIOES: some tag of ``labels``, by default of ``tags``, starts with
    ``S-``). Nothing else changes, so a well-formed sequence comes back as it was."""
    singles = any(t.startswith("S-") for t in (tags if labels is None else labels))
    out = []
    open_type = ""
    for tag in tags:
        prefix, kind = _split(tag)
        if prefix in "IME" and kind != open_type:
            prefix = "S" if prefix == "E" and singles else "B"
            tag = f"{prefix}-{kind}"
        out.append(tag)
        open_type = kind if prefix in "BIM" else ""
    return out
