"""Masking units for Chinese pretraining: which tokens are masked together.

A WordPiece tokenizer for Chinese cuts every CJK character into a token of its own, and those tokens never carry the
``##`` continuation prefix. megatron-core's whole-word masking finds word boundaries from ``##`` prefixes, so on
Chinese it sees every character as a word and degrades to character masking. The functions here recover the units
from the text instead: jieba words (Chinese whole-word masking), phrases (ERNIE phrase-level masking) and entities
(ERNIE entity-level masking), each expressed as groups of token indices.

Inputs are the text, the ``(start, end)`` character offsets of its tokens as a fast tokenizer returns them with
``return_offsets_mapping=True`` (special tokens have ``(0, 0)``; any empty span is treated as special) and a
segmenter, i.e. anything with ``spans(text) -> [(start, end), ...]`` tiling the text, such as
:class:`zhnlp.tokenizers.segment.Segmenter`.

A unit is a sorted list of token indices; the units of one call are disjoint and ordered by their first token.
:func:`units_to_ids` turns them into one int32 per token (the unit id, ``-1`` for none), compact enough for a corpus
preprocessor to store next to the token ids; :func:`ids_to_units` reads them back.
"""

from __future__ import annotations

from typing import Collection, Iterable, Sequence

import numpy as np

Offsets = Sequence[Sequence[int]]
Unit = list[int]


def whole_word_units(text: str, offsets: Offsets, segmenter) -> list[Unit]:
    """One unit per jieba word: the tokens that start inside the word.

    Every non-special token belongs to exactly one unit, and all tokens starting in one word share a unit, so masking
    a unit never masks part of a word. A token that straddles two words (rare, e.g. an English wordpiece across a
    jieba cut) goes with the word where it starts.
    """
    return _units_by_start(text, offsets, segmenter.spans(text))


def whole_word_unit_ids(text: str, offsets: Offsets, segmenter) -> np.ndarray:
    """:func:`whole_word_units` as per-token int32 unit ids (-1 for special tokens), ready to store.

    Computed without building the unit lists (the corpus preprocessor calls this per sentence):
    units are numbered in text order, exactly as ``units_to_ids(whole_word_units(...))``."""
    owner = _owners(text, offsets, segmenter.spans(text))
    ids = np.full(len(owner), -1, dtype=np.int32)
    real = owner >= 0
    ids[real] = np.unique(owner[real], return_inverse=True)[1]
    return ids


def phrase_units(text: str, offsets: Offsets, segmenter, phrases: Collection[str] | None = None) -> list[Unit]:
    """ERNIE-style phrase-level units: runs of jieba words that form a phrase, and single words elsewhere.

    ``phrases`` is a set of multi-word phrases (strings). From left to right, at each word boundary the longest run
    of consecutive words whose text is in ``phrases`` becomes one unit; words outside any phrase are units of their
    own, so the result covers every non-special token like :func:`whole_word_units`. Phrases are only matched on word
    boundaries: ``"长江大桥"`` does not match inside ``"南京市长江大桥"`` if jieba cut it as ``"市长 / 江大桥"``.
    Without ``phrases`` the phrases are the segmenter's own words (give it phrase entries with ``add_word`` to make
    them single words), i.e. the result equals :func:`whole_word_units`.
    """
    words = segmenter.spans(text)
    if phrases:
        words = _merge_phrases(text, words, phrases)
    return _units_by_start(text, offsets, words)


def entity_units(text: str, offsets: Offsets, entities: Iterable[Sequence[int]] | Collection[str]) -> list[Unit]:
    """Units for entities: one per entity, holding every token that overlaps it.

    ``entities`` is either a sequence of ``(start, end)`` character spans (e.g. the person/place/organisation spans
    of People's Daily) or a collection of entity strings (a dictionary), matched on the text longest first, left to
    right, without overlaps. A token that sticks out of an entity joins the entity's unit (tokens are never split).
    Overlapping spans claim tokens in order of start, longer first; a span whose tokens are all claimed already is
    dropped. Only tokens in entities get a unit: combine with :func:`whole_word_units` through :func:`combine_units`
    for a full entity-level masking plan.
    """
    entities = list(entities)
    if entities and all(isinstance(e, str) for e in entities):
        spans = dictionary_spans(text, entities)
    else:
        spans = [_check_span(text, e) for e in entities]
    spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
    starts, ends = _token_bounds(text, offsets)
    claimed = np.zeros(len(starts), dtype=bool)
    units = []
    for start, end in spans:
        # (T,) tokens with a real span that overlaps [start, end)
        hit = (starts < end) & (ends > start) & (ends > starts) & ~claimed
        if hit.any():
            claimed |= hit
            units.append(np.flatnonzero(hit).tolist())
    return sorted(units)


def dictionary_spans(text: str, words: Collection[str]) -> list[tuple[int, int]]:
    """Character spans of dictionary ``words`` in ``text``: longest match first, left to right, non-overlapping."""
    vocab = {w for w in words if w}
    if not vocab:
        return []
    lengths = sorted({len(w) for w in vocab}, reverse=True)
    spans, i = [], 0
    while i < len(text):
        for n in lengths:
            if text[i:i + n] in vocab:
                spans.append((i, i + n))
                i += n
                break
        else:
            i += 1
    return spans


def combine_units(primary: list[Unit], fallback: list[Unit]) -> list[Unit]:
    """``primary`` units plus the tokens of ``fallback`` units that ``primary`` does not claim.

    E.g. ``combine_units(entity_units(...), whole_word_units(...))``: entities as units, and every other word as its
    own unit (a word that shares tokens with an entity keeps only its remaining tokens).
    """
    claimed = {t for unit in primary for t in unit}
    rest = [[t for t in unit if t not in claimed] for unit in fallback]
    return sorted([list(u) for u in primary] + [u for u in rest if u])


def units_to_ids(units: list[Unit], num_tokens: int) -> np.ndarray:
    """Per-token unit ids: an int32 array of length ``num_tokens``, the index of the unit holding each token, -1 for
    tokens in no unit (special tokens). This is what a corpus preprocessor stores beside the token ids."""
    ids = np.full(num_tokens, -1, dtype=np.int32)
    for unit_id, unit in enumerate(units):
        for token in unit:
            if not 0 <= token < num_tokens:
                raise ValueError(f"unit {unit_id} names token {token}, outside 0..{num_tokens - 1}; pass the number "
                                 f"of tokens of the sequence the units were computed for")
            if ids[token] != -1:
                raise ValueError(f"token {token} is in units {ids[token]} and {unit_id}; units must be disjoint")
            ids[token] = unit_id
    return ids


def ids_to_units(ids: np.ndarray | Sequence[int]) -> list[Unit]:
    """Inverse of :func:`units_to_ids`: the units as sorted lists of token indices, ordered by unit id."""
    ids = np.asarray(ids)
    n_units = int(ids.max()) + 1 if ids.size else 0
    units: list[Unit] = [[] for _ in range(n_units)]
    for token, unit_id in enumerate(ids.tolist()):
        if unit_id >= 0:
            units[unit_id].append(token)
    return units


# ---------------------------------------------------------------------------------------------------- helpers
def _token_bounds(text: str, offsets: Offsets) -> tuple[np.ndarray, np.ndarray]:
    """(T,) start and end arrays of the token offsets, checked against the text."""
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = bounds[:, 0], bounds[:, 1]
    bad = np.flatnonzero((starts < 0) | (ends < starts) | (ends > len(text)))
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"token {t} has offsets ({starts[t]}, {ends[t]}), outside a text of {len(text)} characters; "
                         f"pass the offsets the tokenizer returned for this very text (return_offsets_mapping=True)")
    return starts, ends


def _units_by_start(text: str, offsets: Offsets, spans: Sequence[tuple[int, int]]) -> list[Unit]:
    """Group tokens by the span (of ``spans``, which tile the text) in which each token starts."""
    owner = _owners(text, offsets, spans)
    units: dict[int, Unit] = {}
    for token, span in enumerate(owner.tolist()):
        if span >= 0:
            units.setdefault(span, []).append(token)
    return sorted(units.values())


def _owners(text: str, offsets: Offsets, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Per token, the index of the span it starts in (-1 for special tokens)."""
    starts, ends = _token_bounds(text, offsets)
    span_of_char = np.full(len(text), -1, dtype=np.int64)  # (len(text),) index of the span covering each char
    for i, (start, end) in enumerate(spans):
        span_of_char[start:end] = i
    real = ends > starts  # special tokens have (0, 0)
    owner = np.full(len(starts), -1, dtype=np.int64)
    owner[real] = span_of_char[starts[real]]
    if (owner[real] < 0).any():
        raise ValueError("the segmenter's spans do not cover every token start; a segmenter must tile the text "
                         "(Segmenter.spans does)")
    return owner


def _merge_phrases(text: str, words: list[tuple[int, int]], phrases: Collection[str]) -> list[tuple[int, int]]:
    """Merge runs of consecutive word spans whose text is a phrase; greedy, longest run first."""
    phrases = set(phrases)
    longest = max(map(len, phrases))
    merged, i = [], 0
    while i < len(words):
        start = words[i][0]
        best = i  # index of the last word of the longest phrase starting at word i (i itself: no phrase)
        j = i + 1
        while j < len(words) and words[j][1] - start <= longest:
            if text[start:words[j][1]] in phrases:
                best = j
            j += 1
        merged.append((start, words[best][1]))
        i = best + 1
    return merged


def _check_span(text: str, span: Sequence[int]) -> tuple[int, int]:
    if isinstance(span, str):
        raise ValueError(f"entity {span!r} is a string among spans; pass either (start, end) spans or entity strings")
    try:
        start, end = (int(x) for x in span)
    except (TypeError, ValueError) as err:
        raise ValueError(f"entity {span!r} is neither a (start, end) span nor a string; pass spans or a set of "
                         f"entity strings, not a mix") from err
    if not 0 <= start < end <= len(text):
        raise ValueError(f"entity span ({start}, {end}) is empty or outside a text of {len(text)} characters")
    return start, end
