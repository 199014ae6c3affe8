"""Fine-tuning data through ``datasets`` (zhnlp.data.tasks.hf): local files parsed into cached Arrow tables
with the same examples as zhnlp's readers, zhnlp's line-numbered messages for malformed files, in-memory
datasets (ClassLabel names, hub-style squad rows), saved datasets, wrong columns as one error; and collate
against transformers' own collators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zhnlp.data.tasks import collate, hf
from zhnlp.data.tasks.classification import read_classification
from zhnlp.data.tasks.ner import read_ner
from zhnlp.errors import DataError

datasets = pytest.importorskip("datasets")

ROWS = [{"text": "房间很干净，早餐也不错。", "label": 1}, {"text": "服务态度太差了。", "label": 0},
        {"text": "位置方便，下次还来。", "label": 1}]
TAGGED = [{"tokens": list("北京欢迎你"), "tags": ["B-LOC", "I-LOC", "O", "O", "O"]},
          {"tokens": list("张三去上海"), "tags": ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]}]


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_jsonl_file_is_read_through_datasets_into_a_cached_arrow_table(tmp_path):
    path = jsonl(tmp_path / "train.jsonl", ROWS)
    table = hf.load_file("classification", path)
    assert isinstance(table, datasets.Dataset) and table.num_rows == 3
    assert table.cache_files and table.cache_files[0]["filename"].endswith(".arrow")  # memory-mapped from disk
    examples, labels, _ = hf.read_file("classification", path, None)
    assert (examples, labels) == read_classification(path)
    ner = jsonl(tmp_path / "ner.jsonl", TAGGED)
    assert hf.load_file("ner", ner) is not None
    assert hf.read_file("ner", ner, None)[0] == read_ner(ner)


def test_tsv_and_csv_files_give_the_examples_of_zhnlps_reader(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text('label\ttext_a\n1\t"引号"不算 NA\n\n0\t01\n', encoding="utf-8")  # no quoting, NA is text
    assert hf.load_file("classification", tsv) is not None
    examples, labels, _ = hf.read_file("classification", tsv, None)
    assert [(e.text_a, e.label) for e in examples] == [('"引号"不算 NA', "1"), ("01", "0")] and labels == ["0", "1"]
    assert (examples, labels) == read_classification(tsv)
    csv = tmp_path / "pairs.csv"
    csv.write_text('text_a,text_b,label\n"北京，上海",两个城市,same\n天津,"他说""好""",diff\n', encoding="utf-8")
    examples, labels, _ = hf.read_file("classification", csv, None)
    assert [(e.text_a, e.text_b, e.label) for e in examples] == [("北京，上海", "两个城市", "same"),
                                                                  ("天津", '他说"好"', "diff")]
    assert (examples, labels) == read_classification(csv) and labels == ["diff", "same"]


def test_malformed_files_get_zhnlps_line_numbered_message(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "好", "label": 1}\n\n{"text": "坏" "label": 0}\n{"label": 1}\n', encoding="utf-8")
    with pytest.raises(DataError) as e:
        hf.read_file("classification", bad, None)
    assert f"{bad}:3: invalid JSON" in str(e.value) and f"{bad}:4: missing field 'text'" in str(e.value)
    # valid JSON lines with a row problem: datasets parses them, zhnlp's reader names the line
    missing = jsonl(tmp_path / "m.jsonl", [ROWS[0], {"text": "没有标签"}, ROWS[1]])
    with pytest.raises(DataError, match=f"{missing}:2: no label, while other lines have one"):
        hf.read_file("classification", missing, None)
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("label\ttext_a\n1\t好\n0\t坏\t多余\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{tsv}:3: wrong column count: 3 tab-separated fields"):
        hf.read_file("classification", tsv, None)
    csv = tmp_path / "bad.csv"
    csv.write_text("text,label\n好,1\n坏,0,extra\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{csv}:3: wrong column count"):
        hf.read_file("classification", csv, None)
    ner = jsonl(tmp_path / "n.jsonl", [TAGGED[0], {"tokens": ["张"], "tags": ["X-PER"]}])
    with pytest.raises(DataError, match=rf"{ner}:2: tag 'X-PER' is not a valid tag"):
        hf.read_file("ner", ner, None)


def test_datasets_in_memory_class_labels_and_row_numbers():
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    ds = datasets.Dataset.from_list([{"sentence": r["text"], "label": r["label"]} for r in ROWS], features=features)
    examples, labels, _ = hf.read_rows("classification", ds, None, "train data")
    assert labels == ["negative", "positive"]  # the ClassLabel's names, in its order
    assert [(e.text_a, e.label) for e in examples] == [(r["text"], ["negative", "positive"][r["label"]])
                                                       for r in ROWS]
    with pytest.raises(DataError, match=r"train data row 1: 'text' is empty"):
        hf.read_rows("classification", [ROWS[0], {"text": " ", "label": 0}], None, "train data")
    tags = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                              "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-LOC", "I-LOC"]))})
    ner = datasets.Dataset.from_list([{"tokens": list("去北京"), "ner_tags": [0, 1, 2]}], features=tags)
    [example], _, _ = hf.read_rows("ner", ner, None, "dev data")
    assert (example.tokens, example.tags) == (list("去北京"), ["O", "B-LOC", "I-LOC"])


def test_hub_style_squad_rows_are_checked_and_scored_as_squad():
    rows = [{"id": "q1", "title": "t", "context": "北京是中国的首都。", "question": "首都是哪里？",
             "answers": {"text": ["北京"], "answer_start": [0]}}]
    examples, _, reference = hf.read_rows("mrc", datasets.Dataset.from_list(rows), None, "dev data")
    assert [(e.qid, e.gold["text"]) for e in examples] == [("q1", "北京")]
    from zhnlp.metrics.cmrc2018 import evaluate

    assert evaluate(reference, {"q1": "北京"})["em"] == 100.0


def test_a_dataset_with_the_wrong_columns_is_one_error_naming_expected_and_found():
    ds = datasets.Dataset.from_list([{"review": "好", "stars": 5}])
    with pytest.raises(DataError) as e:
        hf.read_rows("classification", ds, None, "--train data")
    message = str(e.value)
    assert "\n" not in message
    assert "lacks the column(s) text or text_a or sentence or sentence1" in message
    assert "found review, stars" in message and "rename_column" in message
    with pytest.raises(DataError, match=r"lacks the column\(s\) context, question .* found id"):
        hf.read_rows("mrc", [{"id": "x"}], None, "dev")


def test_sources_saved_datasets_and_dataset_dict_splits(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                               "validation": datasets.Dataset.from_list(ROWS[:2])})
    dd.save_to_disk(tmp_path / "dd")
    dd["train"].save_to_disk(tmp_path / "train")
    (tmp_path / "plain").mkdir()
    assert hf.source_problem(tmp_path / "dd") is None and hf.source_problem(tmp_path / "train") is None
    assert "not a dataset saved with save_to_disk" in hf.source_problem(tmp_path / "plain")
    assert hf.source_problem(tmp_path / "nowhere") == "does not exist"
    assert hf.data_source(str(tmp_path / "train")) == str(tmp_path / "train")
    assert hf.pick_split(str(tmp_path / "dd"), "dev", "--dev").num_rows == 2
    assert hf.pick_split(dd, "test", "--test") is None
    with pytest.raises(DataError, match=r"--train: the DatasetDict has no train split \(it has validation\)"):
        hf.pick_split(datasets.DatasetDict({"validation": dd["validation"]}), "train", "--train")
    assert hf.open_source(str(tmp_path / "train"), "--train").num_rows == 3
    with pytest.raises(DataError, match="holds a DatasetDict"):
        hf.open_source(str(tmp_path / "dd"), "--dev")
    with pytest.raises(DataError, match="a list of data must hold dicts"):
        hf.open_source(["text"], "--train")


def test_collate_matches_transformers_collators():
    from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

    from zhnlp.tokenizers.wordpiece import WordPieceTokenizer
    from tests.conftest import ROOT

    tok = WordPieceTokenizer.from_vocab(ROOT / "tests/assets/bert-base-chinese-vocab.txt")
    enc = tok(["北京欢迎你", "好"])
    rows = [{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")} for i in range(2)]
    scalar = [dict(r, labels=i) for i, r in enumerate(rows)]
    expected = DataCollatorWithPadding(tok, padding="max_length", max_length=8, return_tensors="pt")(scalar)
    got = collate(scalar, pad_to=8, tokenizer=tok)
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in expected.items()}
    tagged = [dict(r, labels=[-100] + [1] * (len(r["input_ids"]) - 2) + [-100]) for r in rows]
    expected = DataCollatorForTokenClassification(tok, return_tensors="pt")(tagged)
    got = collate(tagged)
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in expected.items()}
    with pytest.raises(ValueError, match="feature 1: labels has 2 entries but input_ids has 3"):
        collate([tagged[0], dict(rows[1], labels=[0, 0])])
