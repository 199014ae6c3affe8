"""Corpus preprocessing: bad lines reported with their numbers, files identical on re-runs and
across worker counts, token ids that decode back to the normalised text, aligned unit side data."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from zhnlp.data.preprocess import PreprocessError, preprocess, split_sentences

ASSETS = Path(__file__).resolve().parent.parent / "assets"
TEXTS = [
    "百度提出了知识增强的语义表示模型ERNIE。它在中文任务上表现很好！",
    "北京是中华人民共和国的首都，也是全国的政治、文化中心。",
    "今天天气很好，我们去公园散步吧？好的。",
    "自然语言处理（NLP）是人工智能的一个重要方向；2024年有很多进展。",
]


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    shutil.copy(ASSETS / "bert-base-chinese-vocab.txt", d / "vocab.txt")
    return d


@pytest.fixture
def corpus(tmp_path):
    lines = [json.dumps({"text": t}, ensure_ascii=False).encode() for t in TEXTS]
    lines.insert(1, b"{not json")
    lines.insert(3, json.dumps({"title": "no text field"}).encode())
    lines.insert(4, b'{"text": "\xff\xfe broken utf-8"}')
    lines.insert(5, json.dumps({"text": "   "}).encode())
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_split_sentences():
    assert split_sentences("你好。今天好吗？好！\n再见") == ["你好。", "今天好吗？", "好！", "再见"]
    assert split_sentences("他说：“走吧。”然后走了") == ["他说：“走吧。”", "然后走了"]


def test_bad_lines_are_counted_with_line_numbers(tmp_path, corpus, vocab_dir):
    report = preprocess([corpus], tmp_path / "out", str(vocab_dir), progress=False)
    assert report.documents == len(TEXTS)
    assert report.bad_lines == {"are not valid JSON": [2], "have no 'text' field": [4],
                                "are not valid UTF-8 (byte 10)": [5], "are empty": [6]}
    assert "1 line(s) are not valid JSON: line 2" in report.summary()


def test_fail_mode_writes_nothing(tmp_path, corpus, vocab_dir):
    with pytest.raises(PreprocessError, match="line 2"):
        preprocess([corpus], tmp_path / "out", str(vocab_dir), on_error="fail", progress=False)
    assert not list(tmp_path.glob("out*"))


def test_round_trip_and_alignment(tmp_path, corpus, vocab_dir):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from zhnlp.tokenizers import AutoTokenizer

    preprocess([corpus], tmp_path / "out", str(vocab_dir), progress=False)
    tok = AutoTokenizer.from_pretrained(str(vocab_dir))
    ids, units = IndexedDataset(str(tmp_path / "out")), IndexedDataset(str(tmp_path / "out_units"))
    docs = ids.document_indices
    assert len(docs) - 1 == len(TEXTS)
    for d, text in enumerate(TEXTS):
        decoded = "".join(tok.decode(ids[s]) for s in range(docs[d], docs[d + 1]))
        assert decoded.replace(" ", "") == text.lower().replace(" ", "")
        for s in range(docs[d], docs[d + 1]):
            assert len(units[s]) == len(ids[s]) and (np.asarray(units[s]) >= 0).all()


def test_reruns_and_worker_counts_give_identical_files(tmp_path, corpus, vocab_dir):
    for name, workers in (("a", 1), ("b", 1), ("c", 2)):
        preprocess([corpus], tmp_path / name, str(vocab_dir), workers=workers, progress=False)
    for suffix in (".bin", ".idx", "_units.bin", "_units.idx"):
        a = (tmp_path / f"a{suffix}").read_bytes()
        assert a == (tmp_path / f"b{suffix}").read_bytes() == (tmp_path / f"c{suffix}").read_bytes(), suffix
    meta_a = json.loads((tmp_path / "a.json").read_text())
    meta_b = json.loads((tmp_path / "b.json").read_text())
    assert meta_a["sha256"] == meta_b["sha256"] and meta_a["counts"] == meta_b["counts"]


def test_missing_input(tmp_path, vocab_dir):
    with pytest.raises(PreprocessError, match="input files not found"):
        preprocess([tmp_path / "nope.jsonl"], tmp_path / "out", str(vocab_dir), progress=False)


def test_entity_spans_become_single_units(tmp_path, vocab_dir):
    """ERNIE entity masking: supplied person/place spans are one unit each, even across jieba words."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    text = "今天张三丰去了北京大学。他很高兴。"
    entities = [{"start": 2, "end": 5}, {"start": 7, "end": 11}]  # 张三丰, 北京大学
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps({"text": text, "entities": entities}, ensure_ascii=False) + "\n", encoding="utf-8")
    preprocess([path], tmp_path / "out", str(vocab_dir), entities_field="entities", progress=False)
    side = IndexedDataset(str(tmp_path / "out_units"))  # keep it open: items are views of its mmap
    units = np.array(side[0])
    assert len(set(units[2:5])) == 1 and len(set(units[7:11])) == 1  # one character per token here
    assert units[2] != units[1] and units[5] != units[4] and units[7] != units[6]
    meta = json.loads((tmp_path / "out.json").read_text())
    assert meta["masking"] == "entity+word"


def test_bad_entity_spans_are_reported(tmp_path, vocab_dir):
    path = tmp_path / "e.jsonl"
    bad = json.dumps({"text": "北京", "entities": [{"start": 0, "end": 9}]}) + "\n"
    good = json.dumps({"text": "上海", "entities": [{"start": 0, "end": 2}]}) + "\n"
    path.write_text(bad + good)
    report = preprocess([path], tmp_path / "out", str(vocab_dir), entities_field="entities", progress=False)
    assert report.bad_lines == {"have 'entities' spans outside the text": [1]} and report.documents == 1
    # a corpus with no usable line at all is an error that names the reason, and writes nothing
    path.write_text(bad)
    with pytest.raises(PreprocessError, match=r"e\.jsonl: no usable text \(1 bad line\(s\): 1 line\(s\) have "
                                              r"'entities' spans outside the text: line 1\); nothing was written"):
        preprocess([path], tmp_path / "none", str(vocab_dir), entities_field="entities", progress=False)
    assert not list(tmp_path.glob("none*"))
