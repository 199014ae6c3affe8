"""Masking units follow jieba words, phrases and entities, cover exactly the real tokens, and round-trip as ids."""

from pathlib import Path

import numpy as np
import pytest
from transformers import BertTokenizerFast

from zhnlp.tokenizers.masking import (combine_units, dictionary_spans, entity_units, ids_to_units, phrase_units,
                                      units_to_ids, whole_word_unit_ids, whole_word_units)
from zhnlp.tokenizers.segment import Segmenter

VOCAB = Path(__file__).resolve().parents[1] / "assets" / "bert-base-chinese-vocab.txt"

# Written for these tests: CJK words, English wordpieces, digits, punctuation and spaces.
TEXTS = [
    "南京市长江大桥于1968年建成通车",
    "我在Transformer模型上做了pre-training实验，iPhone6的价格是5999元。",
    "毛泽东在北京会见了联合国秘书长",
    "他来到了网易杭研大厦 看到了 Jean-Pierre 和 www.example.com",
]


class FixedSegmenter:
    """A segmenter with given word spans, for cases jieba would not produce on demand."""

    def __init__(self, spans):
        self._spans = spans

    def spans(self, text):
        return self._spans


@pytest.fixture(scope="module")
def tokenizer():
    """bert-base-chinese's WordPiece vocabulary when the asset is there, else a character vocabulary of TEXTS."""
    if VOCAB.is_file():
        return BertTokenizerFast(vocab=str(VOCAB))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += sorted({c for text in TEXTS for c in text.lower() if not c.isspace()})
    tokens += ["##" + c for c in sorted({c for text in TEXTS for c in text.lower() if c.isascii() and c.isalnum()})]
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(dict.fromkeys(tokens))})


@pytest.fixture(scope="module")
def segmenter():
    return Segmenter()


def encode(tokenizer, text):
    enc = tokenizer(text, return_offsets_mapping=True)
    return enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]


def check_partition(units, offsets):
    """Units are disjoint, sorted, and cover exactly the non-special tokens."""
    claimed = [t for unit in units for t in unit]
    assert len(claimed) == len(set(claimed)), "a token is in two units"
    assert all(unit == sorted(unit) for unit in units) and units == sorted(units)
    assert set(claimed) == {i for i, (s, e) in enumerate(offsets) if e > s}


def test_whole_word_units_are_jieba_words(tokenizer, segmenter):
    for text in TEXTS:
        ids, offsets = encode(tokenizer, text)
        units = whole_word_units(text, offsets, segmenter)
        check_partition(units, offsets)
        assert 0 not in [t for u in units for t in u] and len(ids) - 1 not in [t for u in units for t in u]
        words = segmenter.spans(text)
        word_of = {i: next(w for w, (s, e) in enumerate(words) if s <= start < e)
                   for i, (start, end) in enumerate(offsets) if end > start}
        for unit in units:  # a unit lies inside one word ...
            assert len({word_of[t] for t in unit}) == 1
        for w in set(word_of.values()):  # ... and holds all of that word's tokens: words are never split
            assert [t for t, word in word_of.items() if word == w] in units


def test_multi_character_word_is_one_unit(tokenizer, segmenter):
    text = TEXTS[0]
    _, offsets = encode(tokenizer, text)
    units = whole_word_units(text, offsets, segmenter)
    assert ["".join(text[offsets[t][0]:offsets[t][1]] for t in u) for u in units] == \
        ["南京市", "长江大桥", "于", "1968", "年", "建成", "通车"]


def test_token_straddling_two_words_goes_with_its_first_word():
    offsets = [(0, 0), (0, 3), (3, 4), (4, 6), (0, 0)]
    units = whole_word_units("abcdef", offsets, FixedSegmenter([(0, 2), (2, 5), (5, 6)]))
    assert units == [[1], [2, 3]]  # token (0,3) starts in word (0,2); token (4,6) starts in word (2,5)


def test_phrase_dictionary_longest_match_on_word_boundaries(tokenizer, segmenter):
    text = TEXTS[0]  # 南京市 / 长江大桥 / 于 / 1968 / 年 / 建成 / 通车
    _, offsets = encode(tokenizer, text)
    phrases = {"南京市长江大桥", "长江大桥于", "建成通车", "市长江"}  # "市长江" crosses a word boundary
    units = phrase_units(text, offsets, segmenter, phrases)
    check_partition(units, offsets)
    pieces = ["".join(text[offsets[t][0]:offsets[t][1]] for t in u) for u in units]
    assert pieces == ["南京市长江大桥", "于", "1968", "年", "建成通车"]  # the longer phrase wins over 长江大桥于
    assert phrase_units(text, offsets, segmenter) == whole_word_units(text, offsets, segmenter)


def test_phrase_prefers_the_longest_run():
    words = FixedSegmenter([(0, 1), (1, 2), (2, 3), (3, 4)])
    offsets = [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4), (0, 0)]
    assert phrase_units("甲乙丙丁", offsets, words, {"甲乙", "甲乙丙"}) == [[1, 2, 3], [4]]


def test_entity_units_match_supplied_spans(tokenizer):
    text = TEXTS[2]  # 毛泽东 PER, 北京 LOC, 联合国 ORG
    _, offsets = encode(tokenizer, text)
    spans = [(0, 3), (4, 6), (9, 12)]
    units = entity_units(text, offsets, spans)
    assert [(offsets[u[0]][0], offsets[u[-1]][1]) for u in units] == spans
    assert entity_units(text, offsets, {"毛泽东", "北京", "联合国"}) == units  # the same from a dictionary
    full = combine_units(units, whole_word_units(text, offsets, Segmenter()))
    check_partition(full, offsets)
    assert all(u in full for u in units)


def test_entity_units_never_split_a_token():
    offsets = [(0, 0), (0, 2), (2, 5), (5, 6), (0, 0)]
    assert entity_units("abcdef", offsets, [(3, 4)]) == [[2]]  # the entity sits inside token (2,5)
    assert entity_units("abcdef", offsets, [(1, 3), (2, 6)]) == [[1, 2], [3]]  # overlaps: the first claims first


def test_dictionary_spans_longest_first():
    assert dictionary_spans("他在北京大学读书，北京很大", {"北京", "北京大学", "大学"}) == [(2, 6), (9, 11)]
    assert dictionary_spans("任何文本", set()) == []


def test_unit_ids_round_trip(tokenizer, segmenter):
    text = TEXTS[1]
    ids, offsets = encode(tokenizer, text)
    units = whole_word_units(text, offsets, segmenter)
    unit_ids = units_to_ids(units, len(ids))
    assert unit_ids.dtype == np.int32 and unit_ids.shape == (len(ids),)
    assert unit_ids[0] == -1 and unit_ids[-1] == -1  # [CLS], [SEP]
    assert ids_to_units(unit_ids) == units
    assert np.array_equal(whole_word_unit_ids(text, offsets, segmenter), unit_ids)
    with pytest.raises(ValueError, match="units must be disjoint"):
        units_to_ids([[1, 2], [2]], 4)


def test_offsets_from_another_text_are_rejected(segmenter):
    with pytest.raises(ValueError, match="outside a text of 2 characters"):
        whole_word_units("你好", [(0, 0), (0, 1), (1, 5)], segmenter)
