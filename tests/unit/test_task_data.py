"""zhnlp.data.tasks: readers and their error messages, feature building (tokenisation, windows, label alignment),
collate, and decoding model outputs back to tags and text spans."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from zhnlp.data.tasks import collate
from zhnlp.data.tasks.classification import TextExample, encode_classification, read_classification
from zhnlp.data.tasks.mrc import (MRCExample, build_mrc_features, decode_spans, oracle, read_squad,
                                  window_starts)
from zhnlp.data.tasks.ner import NERExample, decode_ner, encode_ner, label_list_from, read_ner, repair
from zhnlp.errors import DataError
from zhnlp.tokenizers.wordpiece import WordPieceTokenizer

from tests.conftest import ROOT

CLS, SEP, UNK = 101, 102, 100


@pytest.fixture(scope="module")
def tok():
    return WordPieceTokenizer.from_vocab(ROOT / "tests/assets/bert-base-chinese-vocab.txt")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(rows):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# ============================================================== classification: reading
def test_jsonl_single_texts_and_numeric_labels_sorted_by_value(tmp_path):
    path = write(tmp_path, "t.jsonl", jsonl([{"text": "好", "label": 10}, {"text": "坏", "label": 2},
                                             {"text": "行", "label": "1", "id": 7}]) + "\n")
    examples, labels = read_classification(path)
    assert labels == ["1", "2", "10"]  # numerically, not "1" < "10" < "2"
    assert examples == [TextExample("好", None, "10", 1), TextExample("坏", None, "2", 2),
                        TextExample("行", None, "1", 3)]


def test_jsonl_pairs_and_unlabelled_prediction_files(tmp_path):
    pairs = write(tmp_path, "p.jsonl", jsonl([{"text_a": "今天", "text_b": "明天", "label": "entail"}]))
    assert read_classification(pairs) == ([TextExample("今天", "明天", "entail", 1)], ["entail"])
    unlabelled = write(tmp_path, "u.jsonl", jsonl([{"text": "甲"}, {"text": "乙"}]))
    examples, labels = read_classification(unlabelled, label_list=["0", "1"])
    assert [e.label for e in examples] == [None, None] and labels == ["0", "1"]


@pytest.mark.parametrize("text, expected", [
    ("label\ttext_a\n1\t房间很好\n0\t太吵了\n",
     [TextExample("房间很好", None, "1", 2), TextExample("太吵了", None, "0", 3)]),
    ("label\ttext\n1\t房间很好\n", [TextExample("房间很好", None, "1", 2)]),
    ("qid\tlabel\ttext_a\n0\t1\t不错\n\n1\t0\t差\n",
     [TextExample("不错", None, "1", 2), TextExample("差", None, "0", 4)]),
    ("text_a\ttext_b\tlabel\r\n我饿了\t想吃饭\t1\r\n", [TextExample("我饿了", "想吃饭", "1", 2)]),
    ("qid\ttext_a\n0\t没有标签\n", [TextExample("没有标签", None, None, 2)]),
])
def test_tsv_with_a_header(tmp_path, text, expected):
    examples, _ = read_classification(write(tmp_path, "d.tsv", text))
    assert examples == expected


def test_tsv_without_header_fails_clearly(tmp_path):
    path = write(tmp_path, "d.tsv", "1\t房间很好\n0\t太吵了\n")
    header = r"the first line '1\\t房间很好' is not a header.*label\\ttext_a"
    with pytest.raises(DataError, match=rf"{path}:1: {header}"):
        read_classification(path)


def test_classification_errors_name_file_and_line(tmp_path):
    path = write(tmp_path, "bad.jsonl", jsonl([{"text": "好", "label": 1}, {"txt": "x", "label": 0}]) +
                 '{"text": "坏", "label": 0\n' + jsonl([{"text": "  ", "label": 0}, {"text": "行", "label": 5}]))
    with pytest.raises(DataError) as e:
        read_classification(path, label_list=["0", "1"])
    message = str(e.value)
    assert "4 problems" in message
    assert f"{path}:2: missing field 'text'" in message
    assert f"{path}:3: invalid JSON" in message
    assert f"{path}:4: 'text' is empty" in message
    assert f"{path}:5: label '5' is not in the label set ['0', '1']" in message


def test_tsv_wrong_column_count_and_many_problems_reported_together(tmp_path):
    rows = "".join(f"{i % 2}\n" for i in range(12))  # 12 lines that lack the text column
    path = write(tmp_path, "d.tsv", "label\ttext_a\n1\t好\n" + rows)
    with pytest.raises(DataError) as e:
        read_classification(path)
    message = str(e.value)
    assert "12 problems" in message and "... and 2 more" in message
    assert f"{path}:3: wrong column count: 1 tab-separated fields, the header has 2 (label text_a)" in message
    assert message.count("wrong column count") == 10


def test_labels_on_some_lines_only_is_an_error(tmp_path):
    path = write(tmp_path, "m.jsonl", jsonl([{"text": "好", "label": 1}, {"text": "坏"}]))
    with pytest.raises(DataError, match=rf"{path}:2: no label, while other lines have one"):
        read_classification(path)


# ============================================================== classification: features and collate
def test_encode_classification_on_chinese_with_a_latin_word(tok):
    examples = [TextExample("我在Nexon工作", None, "1", 1), TextExample("好", "我在Nexon工作", "0", 2),
                TextExample("没有标签", None, None, 3)]
    features = encode_classification(tok, examples, ["0", "1"], max_length=7)
    # 我 在 ne ##xon 工 作 -> truncated to 5 tokens + [CLS] [SEP]
    assert features[0] == {"input_ids": [CLS, 2769, 1762, 10564, 12854, 2339, SEP], "token_type_ids": [0] * 7,
                           "attention_mask": [1] * 7, "labels": 1}
    # pair, longest first: the long second text loses tokens, the one-token first text keeps its token
    assert features[1]["input_ids"] == [CLS, 1962, SEP, 2769, 1762, 10564, SEP]
    assert features[1]["token_type_ids"] == [0, 0, 0, 1, 1, 1, 1] and features[1]["labels"] == 0
    assert "labels" not in features[2]


def test_collate_pads_and_drops_bookkeeping_keys():
    features = [{"input_ids": [101, 5, 102], "token_type_ids": [0, 0, 0], "attention_mask": [1, 1, 1],
                 "labels": [-100, 3, -100], "word_ids": [None, 0, None], "example_index": 0},
                {"input_ids": [101, 102], "token_type_ids": [0, 0], "attention_mask": [1, 1],
                 "labels": [-100, -100], "word_ids": [None, None], "example_index": 1}]
    batch = collate(features, pad_to=4, pad_token_id=9)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[101, 5, 102, 9], [101, 102, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 3, -100, -100], [-100, -100, -100, -100]]
    assert all(t.dtype == torch.int64 for t in batch.values())
    scalar = collate([{"input_ids": [1], "token_type_ids": [0], "attention_mask": [1], "labels": 2,
                       "start_positions": 0, "end_positions": 0}] * 2)
    assert scalar["labels"].tolist() == [2, 2] and scalar["start_positions"].shape == (2,)
    with pytest.raises(ValueError, match="pad_to=1 is shorter than the longest feature"):
        collate(features, pad_to=1)


# ============================================================== NER: reading
def test_read_ner_conll_bmes_and_jsonl(tmp_path):
    conll = write(tmp_path, "msra.txt", "中 B-ORG\n国 E-ORG\n人 O\n\n\n北 B-LOC\n京 E-LOC\n李 S-PER\n")
    examples = read_ner(conll)
    assert examples == [NERExample(["中", "国", "人"], ["B-ORG", "E-ORG", "O"], 1),
                        NERExample(["北", "京", "李"], ["B-LOC", "E-LOC", "S-PER"], 6)]
    assert label_list_from(examples) == ["O", "B-LOC", "B-ORG", "E-LOC", "E-ORG", "S-PER"]
    data = write(tmp_path, "d.jsonl", jsonl([{"tokens": ["张", "三"], "tags": ["B-PER", "I-PER"]}]))
    assert read_ner(data) == [NERExample(["张", "三"], ["B-PER", "I-PER"], 1)]
    unlabelled = write(tmp_path, "u.jsonl", jsonl([{"tokens": ["张", "三"]}]))
    assert read_ner(unlabelled)[0].tags is None and label_list_from(read_ner(unlabelled)) == ["O"]


def test_read_ner_errors_name_file_and_line(tmp_path):
    data = write(tmp_path, "d.jsonl", jsonl([{"tokens": ["张", "三"], "tags": ["B-PER"]},
                                             {"tokens": ["张"], "tags": ["X-PER"]}, {"tags": ["O"]}]))
    with pytest.raises(DataError) as e:
        read_ner(data)
    message = str(e.value)
    assert f"{data}:1: length mismatch: 2 tokens but 1 tags" in message
    assert f"{data}:2: tag 'X-PER' is not a valid tag" in message
    assert f"{data}:3: missing or empty 'tokens'" in message
    conll = write(tmp_path, "c.txt", "中 B-ORG\n国\n\n人 Q\n")
    with pytest.raises(DataError) as e:
        read_ner(conll)
    assert f"{conll}:2: missing tag column in '国'" in str(e.value)
    assert f"{conll}:4: tag 'Q' is not a valid tag" in str(e.value)


# ============================================================== NER: features and decoding
def test_encode_ner_labels_first_sub_token_of_each_word(tok):
    example = NERExample(["我", "在", "Nexon", " ", "工", "作"], ["O", "O", "B-ORG", "I-ORG", "I-ORG", "O"], 1)
    label2id = {"O": 0, "B-ORG": 1, "I-ORG": 2}
    [feature] = encode_ner(tok, [example], label2id, max_length=16, stride=2)
    # the space produces no token; Nexon becomes ne ##xon and only ne carries the label
    assert feature["input_ids"] == [CLS, 2769, 1762, 10564, 12854, 2339, 868, SEP]
    assert feature["word_ids"] == [None, 0, 1, 2, 2, 4, 5, None]
    assert feature["labels"] == [-100, 0, 0, 1, -100, 2, 0, -100]
    assert feature["example_index"] == 0 and feature["window_start"] == 0
    assert set(collate([feature])) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    # decoding one-hot gold logits gives the space the entity's inside tag: the entity stays contiguous
    logits = np.zeros((1, 8, 3))
    logits[0, [1, 2, 3, 5, 6], [0, 0, 1, 2, 0]] = 1
    assert decode_ner([example], [feature], logits, {0: "O", 1: "B-ORG", 2: "I-ORG"}) == [example.tags]


def test_encode_ner_windows_cut_inside_a_word(tok):
    example = NERExample(["我", "Nexon", "好"], ["O", "B-ORG", "O"], 1)
    features = encode_ner(tok, [example], {"O": 0, "B-ORG": 1}, max_length=4, stride=1)  # 2 sub-tokens a window
    assert [f["input_ids"][1:-1] for f in features] == [[2769, 10564], [10564, 12854], [12854, 1962]]
    assert [f["window_start"] for f in features] == [0, 1, 2]
    # ne (the first sub-token of Nexon) is labelled in both windows that hold it; ##xon never
    assert [f["labels"] for f in features] == [[-100, 0, 1, -100], [-100, 1, -100, -100], [-100, -100, 0, -100]]


def test_decode_ner_reads_each_word_where_it_is_farthest_from_a_window_edge(tok):
    example = NERExample(list("甲乙丙丁戊"), None, 0)
    features = encode_ner(tok, [example], {"O": 0, "B-PER": 1}, max_length=5, stride=2)  # windows of 3, step 1
    assert [f["window_start"] for f in features] == [0, 1, 2]
    logits = np.zeros((3, 5, 2))
    logits[0, 2, 1] = 1  # window 0 says 乙 (at its centre) is B-PER ...
    logits[1, 1, 0] = 5  # ... window 1 has 乙 at its edge and says O: window 0 wins
    logits[1, 2, 1] = 1  # 丙 is central only in window 1
    assert decode_ner([example], features, logits, {0: "O", 1: "B-PER"}) == [["O", "B-PER", "B-PER", "O", "O"]]
    assert "labels" not in features[0]


def test_repair_makes_every_entity_start_with_a_start_tag():
    assert repair(["O", "I-PER", "I-PER", "B-LOC", "I-PER"]) == ["O", "B-PER", "I-PER", "B-LOC", "B-PER"]
    bmes = {"O", "B-LOC", "M-LOC", "E-LOC", "S-LOC"}
    assert repair(["E-LOC", "O", "M-LOC", "E-LOC", "B-LOC", "E-LOC"], bmes) == \
        ["S-LOC", "O", "B-LOC", "E-LOC", "B-LOC", "E-LOC"]


@pytest.mark.parametrize("max_length, stride", [(128, 32), (32, 8), (24, 0)])
def test_decode_ner_round_trip_on_real_msra_dev(tok, max_length, stride):
    from zhnlp.data.fetch import fetch

    examples = read_ner(fetch("msra-ner") / "dev.jsonl")[:600]
    labels = label_list_from(examples)
    features = encode_ner(tok, examples, {t: i for i, t in enumerate(labels)}, max_length, stride)
    windows = np.bincount([f["example_index"] for f in features])
    if max_length < 100:
        assert windows.max() >= 4, "the test should cover sentences cut into several windows"
    logits = np.zeros((len(features), max(len(f["input_ids"]) for f in features), len(labels)), dtype=np.float32)
    for i, feature in enumerate(features):
        for j, label in enumerate(feature["labels"]):
            if label != -100:
                logits[i, j, label] = 1.0
    decoded = decode_ner(examples, features, torch.from_numpy(logits), dict(enumerate(labels)))
    assert decoded == [e.tags for e in examples]
    # the pipelines' unlabelled examples from raw text work too
    raw = NERExample(tokens=list("张三在Nexon 工作"), tags=None, line=0)
    [tags] = decode_ner([raw], encode_ner(tok, [raw], {t: i for i, t in enumerate(labels)}, max_length, stride),
                        np.zeros((1, max_length, len(labels))), dict(enumerate(labels)))
    assert tags == ["O"] * len(raw.tokens)


# ============================================================== MRC: reading
def squad(*qas, context="北京是中国的首都，2008年举办了奥运会。"):
    return {"version": "v1.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": list(qas)}]}]}


def test_read_squad_and_a_fixed_answer_start(tmp_path):
    data = squad({"id": "q1", "question": "首都？", "answers": [{"text": "北京", "answer_start": 0}]},
                 {"id": "q2", "question": "哪年？", "answers": [{"text": "2008", "answer_start": 10}]})
    path = write(tmp_path, "s.json", json.dumps(data, ensure_ascii=False, indent=2))
    with pytest.warns(UserWarning, match=r"moved the answer_start of 1 answer\(s\).*q2 answer 0: 10 -> 9"):
        examples = read_squad(path)
    assert examples[1] == MRCExample("q2", "哪年？", data["data"][0]["paragraphs"][0]["context"],
                                     [{"text": "2008", "answer_start": 9}], "t")
    line = next(i for i, text in enumerate(path.read_text(encoding="utf-8").split("\n"), 1) if '"id": "q2"' in text)
    with pytest.raises(DataError, match=rf"{path}:{line} \(data\[0\].paragraphs\[0\].qas\[1\]\): question 'q2' "
                                        rf"answer 0 '2008' is not at answer_start 10 \(it occurs at 9\)"):
        read_squad(path, fix_answer_start=False)


def test_read_squad_errors_name_question_id_and_place(tmp_path):
    data = squad({"id": "q1", "question": "首都？", "answers": [{"text": "上海", "answer_start": 0}]},
                 {"id": "q2", "question": " ", "answers": [{"text": "北京", "answer_start": 0}]},
                 {"id": "q3", "answers": [{"text": "北京", "answer_start": 0}]},
                 {"id": "q1", "question": "又一个", "answers": [{"text": "北京", "answer_start": 0}]})
    path = write(tmp_path, "s.json", json.dumps(data, ensure_ascii=False, indent=1))
    with pytest.raises(DataError) as e:  # unfound="error": an answer not in the context is a problem too
        read_squad(path, allow_empty_question=False, unfound="error")
    message = str(e.value)
    assert "4 problems" in message
    line = next(i for i, text in enumerate(path.read_text(encoding="utf-8").split("\n"), 1) if '"id": "q1"' in text)
    assert (f"{path}:{line} (data[0].paragraphs[0].qas[0]): question 'q1' answer 0 '上海' does not occur in the "
            f"context" in message)
    assert "(data[0].paragraphs[0].qas[1]): question 'q2': empty 'question'" in message
    assert "(data[0].paragraphs[0].qas[2]): question 'q3': missing 'question'" in message
    assert "question id 'q1' also used at data[0].paragraphs[0].qas[0]" in message
    with pytest.warns(UserWarning) as caught:  # by default an empty question is kept, with a warning
        kept = read_squad(squad(*data["data"][0]["paragraphs"][0]["qas"][:2]), drop_unfound=True)
    assert [e.qid for e in kept] == ["q2"]  # q1 lost its only answer
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [
        "1 question(s) are empty, kept: q2", "dropped 1 answer(s) whose text is not in the context: q1 answer 0"]
    assert read_squad({"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "p", "question": "q"}]}]}]},
                      check_answers=False)[0].answers == []


# ============================================================== MRC: features and decoding
def test_mrc_features_offsets_and_gold_positions_across_windows(tok):
    context = "我在Nexon工作了 2008年到2010年"
    # tokens: 我 在 ne ##xon 工 作 了 2008 年 到 2010 年  (the space produces none)
    example = MRCExample("0", "哪年", context, [{"text": "2010", "answer_start": context.index("2010")}])
    features = build_mrc_features(tok, [example], max_seq_len=12, doc_stride=4, max_query_len=2)
    # 12 context tokens, windows of 12 - 2 - 3 = 7 starting every 4: [0, 7), [4, 11), [8, 12)
    assert window_starts(12, 7, 4) == [0, 4, 8] and len(features) == 3
    first, second, third = features
    assert first.input_ids[:4] == [CLS, 1525, 2399, SEP] and first.token_type_ids == [0] * 4 + [1] * 8
    assert first.offsets[:4] == [None] * 4 and first.offsets[-1] is None
    assert [context[s:e] for s, e in first.offsets[4:-1]] == ["我", "在", "Ne", "xon", "工", "作", "了"]
    assert (first.start_position, first.end_position) == (0, 0)  # 2010 is not in the first window
    assert [context[s:e] for s, e in second.offsets[4:-1]] == ["工", "作", "了", "2008", "年", "到", "2010"]
    assert (second.start_position, second.end_position) == (10, 10)
    assert [context[s:e] for s, e in third.offsets[4:-1]] == ["年", "到", "2010", "年"]
    assert (third.start_position, third.end_position) == (6, 6)
    assert third.as_inputs()["start_positions"] == 6


def test_decode_spans_picks_the_best_span_over_two_windows(tok):
    context = "张三和李四在Nexon公司工作"
    example = MRCExample("q", "谁", context, [])
    features = build_mrc_features(tok, [example], max_seq_len=10, doc_stride=4, max_query_len=1)
    assert [f.offsets[3][0] for f in features] == [0, 4, 11]  # windows start at 张, 四 and 公
    start, end = np.full((3, 10), -10.0), np.full((3, 10), -10.0)
    start[0, 3], end[0, 4] = 2.0, 2.0  # window 0: 张三, score 4
    start[1, 5], end[1, 6] = 3.0, 2.5  # window 1: ne ##xon, score 5.5: the best
    start[1, 8], end[1, 4] = 9.0, 9.0  # 司 ... 在: the end before the start, invalid
    start[1, 0], end[1, 0] = 50.0, 50.0  # [CLS] is never an answer
    best = decode_spans([example], features, torch.tensor(start), end)["q"]
    assert best == {"text": "Nexon", "start": 6, "end": 11, "score": 5.5}
    assert context[best["start"]:best["end"]] == best["text"]
    # a length limit of one token rules the two-token spans out; 在 and 司 tie (-1): the earlier start wins
    short = decode_spans([example], features, start, end, max_answer_len=1)["q"]
    assert short["text"] == "在" and short["score"] == 9.0 - 10.0
    assert decode_spans([MRCExample("e", "谁", " ", [])], build_mrc_features(tok, [MRCExample("e", "谁", " ", [])]),
                        np.zeros((1, 5)), np.zeros((1, 5)))["e"] == {"text": "", "start": 0, "end": 0,
                                                                    "score": float("-inf")}


def test_oracle_takes_the_whole_token_when_a_boundary_falls_inside_it(tok):
    context = "约2008年"  # 约 2008 年: "200" ends inside the token 2008
    examples = [MRCExample("a", "几", context, [{"text": "200", "answer_start": 1}]),
                MRCExample("b", "几", context, [{"text": "2008年", "answer_start": 1}])]
    features = build_mrc_features(tok, examples, max_seq_len=16, max_query_len=8)
    assert (features[0].start_position, features[0].end_position) == (4, 4)
    predictions = oracle(examples, features)
    assert predictions["a"]["text"] == "2008" and predictions["b"]["text"] == "2008年"
