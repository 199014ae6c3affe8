"""Segmenter gives jieba's precise-mode words on every backend, keeps user words to itself, and tiles the text."""

import json
import os
from pathlib import Path

import jieba
import pytest

from zhnlp.tokenizers import segment as seg_mod
from zhnlp.tokenizers.segment import Segmenter, bench_segmentation, rjieba_available, segment

needs_rjieba = pytest.mark.skipif(not rjieba_available(), reason="rjieba is not installed (pip install rjieba)")

# Texts written for these tests; each line aims at a place where jieba-rs and jieba may part ways.
TRICKY = [
    "让-皮埃尔·巴利冈（Jean-Pierre Balligand）以7-6、6-2赢下了决赛。",  # HMM splits at '-' in jieba only
    "欢迎访问www.example.com，或者写信到abc_def@gmail.com联系我们。",
    "㐀㐁是扩展A区的字，鿰鿱也不在jieba的汉字范围里，豈更是兼容区的字。",  # ideographs outside U+4E00-U+9FD5
    "C++和C#都是编程语言，AT&T是一家公司，增长了3.5%，达到１２.５％。",
    "全角\u3000空格、不换行\xa0空格、\r\n换行\n\n和\t制表符都原样保留",
    "他来到了网易杭研大厦，看到iPhone6和e-mail地址",
    "表情😀也要处理好",
    "",
    " ",
]


def cmrc_contexts() -> list[str]:
    """CMRC2018 trial contexts (CC-BY-SA-4.0, Cui et al. 2019), when the shared data directory is present."""
    directory = os.environ.get("ZHNLP_CMRC2018_DIR")
    path = (Path(directory) if directory else Path(__file__).resolve().parents[3] / "shared/data/cmrc2018")
    path = path / "cmrc2018_trial.json"
    if not path.is_file():
        pytest.skip(f"CMRC2018 trial set not found at {path}; set ZHNLP_CMRC2018_DIR")
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    return [p["context"] for article in data for p in article["paragraphs"]]


@pytest.fixture(scope="module")
def reference():
    """A private jieba tokenizer: the behaviour every backend must reproduce."""
    tok = jieba.Tokenizer()
    tok.initialize()
    return tok


@pytest.fixture(scope="module")
def segmenters():
    """One segmenter per (backend, hmm); they share nothing, so dictionaries load lazily, once each."""
    backends = ["jieba"] + (["rjieba"] if rjieba_available() else [])
    return {(b, hmm): Segmenter(hmm=hmm, backend=b) for b in backends for hmm in (True, False)}


@pytest.mark.parametrize("hmm", [True, False])
def test_precise_mode_equals_jieba_on_tricky_texts(reference, segmenters, hmm):
    for (backend, seg_hmm), seg in segmenters.items():
        if seg_hmm != hmm:
            continue
        for text in TRICKY:
            assert seg.cut(text) == reference.lcut(text, cut_all=False, HMM=hmm), (backend, text)


@pytest.mark.parametrize("hmm", [True, False])
def test_precise_mode_equals_jieba_on_cmrc_contexts(reference, segmenters, hmm):
    texts = cmrc_contexts()
    expected = [reference.lcut(t, HMM=hmm) for t in texts]
    for (backend, seg_hmm), seg in segmenters.items():
        if seg_hmm == hmm:
            assert [seg.cut(t) for t in texts] == expected, backend


def test_segment_function_matches_jieba(reference):
    for text in TRICKY:
        assert segment(text) == reference.lcut(text)
        assert segment(text, hmm=False) == reference.lcut(text, HMM=False)


def test_spans_tile_the_text(segmenters):
    seg = segmenters[("jieba", True)]
    for text in TRICKY:
        spans = seg.spans(text)
        assert [text[s:e] for s, e in spans] == seg.cut(text)
        assert all(s < e for s, e in spans)
        assert [s for s, _ in spans] == [0, *[e for _, e in spans]][:len(spans)]  # no gap, no overlap
        assert (spans[-1][1] if spans else 0) == len(text)


def test_hmm_switch():
    text = "他来到了网易杭研大厦"
    assert "杭研" in Segmenter(hmm=True).cut(text)  # an unknown word only the HMM joins
    assert "杭研" not in Segmenter(hmm=False).cut(text)


def test_add_word_affects_only_that_segmenter(segmenters):
    text = "江州市长江大桥参加了长江大桥的通车仪式"
    mine = Segmenter()
    mine.add_word("江州市长江大桥")
    assert mine.cut(text)[0] == "江州市长江大桥"
    assert mine.backend == "jieba"  # auto falls back: rjieba's user-word bookkeeping is not jieba's
    assert "江州市长江大桥" not in Segmenter(backend="jieba").cut(text)  # fresh segmenter: the stock dictionary
    for seg in segmenters.values():
        assert "江州市长江大桥" not in seg.cut(text)
    assert "江州市长江大桥" not in seg_mod._stock_jieba().FREQ  # the shared stock dictionary is untouched
    assert "江州市长江大桥" not in jieba.dt.FREQ  # and so is the global jieba
    with pytest.raises(ValueError, match="freq 0 forces a split in every tokenizer"):
        mine.add_word("长江", freq=0)


def test_load_userdict_matches_jieba(tmp_path):
    path = tmp_path / "user.txt"
    path.write_text("\ufeff石墨烯 5 n\n凯特琳 nz\n\n云计算\n", encoding="utf-8")
    ref = jieba.Tokenizer()
    ref.load_userdict(str(path))
    mine = Segmenter(userdict=path)
    text = "石墨烯和云计算是凯特琳的研究方向"
    assert mine.cut(text) == ref.lcut(text) == ["石墨烯", "和", "云计算", "是", "凯特琳", "的", "研究", "方向"]
    assert mine.user_words == ["石墨烯", "凯特琳", "云计算"]
    with pytest.raises(FileNotFoundError, match="user dictionary .* not found"):
        mine.load_userdict(tmp_path / "missing.txt")


def test_backend_selection_and_fallback(monkeypatch):
    assert Segmenter(backend="jieba").backend == "jieba"
    with pytest.raises(ValueError, match="unknown segmentation backend 'fast'"):
        Segmenter(backend="fast")
    monkeypatch.setattr(seg_mod, "rjieba_available", lambda: False)
    assert Segmenter().backend == "jieba"
    with pytest.raises(ImportError, match="pip install rjieba"):
        Segmenter(backend="rjieba")


@needs_rjieba
def test_auto_prefers_rjieba_and_explicit_rjieba_keeps_user_words():
    assert Segmenter().backend == "rjieba"
    fast = Segmenter(backend="rjieba")
    fast.add_word("江州市长江大桥")
    assert fast.backend == "rjieba"
    assert fast.cut("江州市长江大桥参加了通车仪式")[0] == "江州市长江大桥"


@needs_rjieba
def test_bench_segmentation_reports_speed_and_agreement():
    result = bench_segmentation(TRICKY * 3, repeat=1)
    assert result["chars"] == 3 * sum(map(len, TRICKY))
    assert result["jieba_chars_per_s"] > 0 and result["rjieba_chars_per_s"] > 0
    assert result["rjieba_agreement"]["texts"] == 1.0
    assert result["rjieba_raw_agreement"]["texts"] < 1.0  # rjieba alone differs on these texts
