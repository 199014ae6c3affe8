"""Traditional -> Simplified conversion (zhnlp.data.convert, ``zhnlp data fetch NAME --convert t2s``): known
characters, offsets kept exact even by a table that changes lengths, every row shape, the converted cache entry
(its own directory, rebuilt when the original changes), and DRCD converted with every answer at its offset."""

import argparse
import collections
import hashlib
import json

import pytest

from zhnlp.data import convert as C
from zhnlp.data import fetch as F
from zhnlp.data import sources as S
from zhnlp.errors import DataError

pytest.importorskip("opencc")

T2S = C.converter("t2s")
# a table that changes lengths (OpenCC's t2s never does; tw2sp-like tables do): phrases first, as OpenCC does
STRETCH = {"資料庫": "数据库系统", "軟體": "软件", "臺": "台", "灣": "湾", "這": "这", "個": "个"}


def stretch(text):
    out, i = [], 0
    while i < len(text):
        for size in (3, 2, 1):
            if text[i:i + size] in STRETCH:
                out.append(STRETCH[text[i:i + size]])
                i += size
                break
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def answers_at_offsets(data):
    return [p["context"][a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
            for art in data["data"] for p in art["paragraphs"] for q in p["qas"] for a in q["answers"]]


def shape(value):
    """The structure of a JSON value: keys, list lengths, the type of every leaf, ids and labels verbatim."""
    if isinstance(value, dict):
        return {k: v if k in ("id", "label", "tags") else shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


# ---------------------------------------------------------------- texts
def test_known_characters_and_phrases_are_converted():
    assert C.convert_text("臺灣") == "台湾" and C.convert_text("這") == "这"
    assert C.convert_text("這是臺灣的計程車，頭髮乾燥。") == "这是台湾的计程车，头发干燥。"
    assert C.convert_text("乾隆") == "乾隆"  # a phrase: 乾 alone would become 干
    assert C.convert_text("简体字不变 abc 123") == "简体字不变 abc 123"
    with pytest.raises(DataError, match="unknown conversion 's2x'; the known conversions are: t2s"):
        C.converter("s2x")


def test_spans_keep_exact_offsets_under_a_table_that_changes_lengths():
    text = "這個資料庫軟體在臺灣"
    new, where, cut = C.convert_spans(text, [2, 5, 5, 7, 8, 10, 99, -1], stretch)
    assert new == "这个数据库系统软件在台湾"
    assert where == {0: 0, 2: 2, 5: 7, 7: 9, 8: 10, 10: 12}  # 99 and -1 lie outside the text
    assert new[where[2]:where[5]] == "数据库系统" and new[where[5]:where[7]] == "软件" and not cut
    new, where, cut = C.convert_spans(text, [3], stretch)  # an offset inside 資料庫 cuts the phrase
    assert cut and new == "这个資料庫软件在台湾" and where[3] == 3


def squad(context, *answers):
    qas = [{"id": f"1-1-{i}", "question": "這是哪裡？", "answers": [{"id": "1", "text": t, "answer_start": s}]}
           for i, (t, s) in enumerate(answers)]
    return {"version": "1.3", "data": [{"title": "臺灣", "id": "1",
                                        "paragraphs": [{"id": "1-1", "context": context, "qas": qas}]}]}


def test_squad_answers_stay_at_their_offsets_when_lengths_change():
    context = "這個資料庫軟體在臺灣。"
    data = squad(context, ("資料庫", 2), ("軟體在臺灣", 5), ("臺灣", 8), ("資料庫", 3), ("不在", -1))
    assert answers_at_offsets(data) == [True, True, True, False, False]
    out, stats = C.convert_squad(data, stretch)
    assert out["data"][0]["paragraphs"][0]["context"] == "这个数据库系统软件在台湾。"
    answers = [q["answers"][0] for q in out["data"][0]["paragraphs"][0]["qas"]]
    assert [(a["text"], a["answer_start"]) for a in answers] == [
        ("数据库系统", 2), ("软件在台湾", 7), ("台湾", 10), ("数据库系统", 3), ("不在", -1)]
    # the two that were not at their offsets stay that way (no cut at them: 資料庫 is converted whole), the
    # off-by-one start moved with its piece of the context
    assert answers_at_offsets(out) == [True, True, True, False, False]
    assert stats == collections.Counter(contexts=1, contexts_changed=1, contexts_changed_length=1, answers=5,
                                        answers_not_at_answer_start_before=2, answers_not_at_answer_start=2,
                                        questions=5, phrases_cut_at_offsets=0)
    assert out["data"][0]["title"] == "台湾"
    assert out["data"][0]["paragraphs"][0]["qas"][0]["question"] == "这是哪裡？"  # 裡 is not in the toy table
    assert shape(out) == shape(data) and data["data"][0]["paragraphs"][0]["context"] == context  # input untouched
    with pytest.raises(DataError, match="not a SQuAD-format reading-comprehension file"):
        C.convert_squad({"data": [{"title": "x"}]}, stretch)


# ---------------------------------------------------------------- rows
def test_tokens_keep_one_output_token_per_input_token():
    tokens, tags = list("他在臺灣乾隆"), ["O", "O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    out, cut = C.convert_tokens(tokens, tags, T2S)
    assert out == list("他在台湾乾隆") and not cut
    out, _ = C.convert_tokens(["資料庫", "軟", "體"], ["B-ORG", "I-ORG", "O"], stretch)  # multi-character tokens
    assert out == ["数据库系统", "軟", "體"]  # one token each, converted alone
    with pytest.raises(DataError, match="3 tokens but 2 tags"):
        C.convert_tokens(["a", "b", "c"], ["O", "O"], T2S)


def test_rows_of_every_shape_keep_labels_tags_and_offsets():
    stats = collections.Counter()
    row = {"text": "這是", "text_pair": "臺灣", "label": 1, "id": "臺7"}
    assert C.convert_row(row, T2S, stats) == {"text": "这是", "text_pair": "台湾", "label": 1, "id": "臺7"}
    assert C.convert_row({"text": "這", "label": "正面"}, T2S, stats) == {"text": "这", "label": "正面"}
    assert C.convert_row({"text_a": "這", "text_b": "臺"}, T2S, stats) == {"text_a": "这", "text_b": "台"}
    ner = C.convert_row({"tokens": list("在臺灣"), "tags": ["O", "B-LOC", "I-LOC"]}, T2S, stats)
    assert ner == {"tokens": list("在台湾"), "tags": ["O", "B-LOC", "I-LOC"]}
    spans = {"text": "這個資料庫在臺灣", "entities": [{"start": 2, "end": 5, "type": "ORG", "text": "資料庫"},
                                                    {"start": 6, "end": 8, "type": "LOC", "text": "臺灣"}]}
    out = C.convert_row(spans, stretch, stats)
    assert out["text"] == "这个数据库系统在台湾"
    assert out["entities"] == [{"start": 2, "end": 7, "type": "ORG", "text": "数据库系统"},
                               {"start": 8, "end": 10, "type": "LOC", "text": "台湾"}]
    assert all(out["text"][e["start"]:e["end"]] == e["text"] for e in out["entities"])
    assert stats["rows"] == 5 and stats["rows_changed"] == 5
    with pytest.raises(DataError, match=r"a row with the keys \['label', 'words'\] holds no text"):
        C.convert_row({"words": ["這"], "label": 0}, T2S, stats)


def test_convert_files_copies_licences_and_refuses_unknown_kinds(tmp_path):
    counts = C.convert_files({"LICENCE": "臺灣 licence\n".encode(), "corpus.txt": "這\n臺灣\n".encode()}, tmp_path)
    assert (tmp_path / "LICENCE").read_text(encoding="utf-8") == "臺灣 licence\n"
    assert (tmp_path / "corpus.txt").read_text(encoding="utf-8") == "这\n台湾\n"
    assert counts == {"corpus.txt": {"lines": 2, "lines_changed": 2}}
    with pytest.raises(DataError, match="model.bin: zhnlp does not know how to convert a file of this kind"):
        C.convert_files({"model.bin": b"\x00"}, tmp_path)
    with pytest.raises(DataError, match="broken.jsonl is not valid JSON"):
        C.convert_files({"broken.jsonl": b'{"text": '}, tmp_path)


# ---------------------------------------------------------------- the converted cache entry
@pytest.fixture
def trad(tmp_path, monkeypatch):
    """A local dataset in Traditional Chinese: two splits of sentence pairs that become one pair when converted."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text('{"text": "臺灣", "text_pair": "好", "label": 1}\n', encoding="utf-8")
    (src / "dev.jsonl").write_text('{"text": "台湾", "text_pair": "好", "label": 1}\n', encoding="utf-8")

    def build(sources, out):
        for name, data in sources.items():
            (out / name).write_bytes(data)
        return {"train": {"total": 1}, "dev": {"total": 1}}

    monkeypatch.setitem(F.DATASETS, "trad", F.Dataset("trad", "a toy", "public domain",
                                                      ("train.jsonl", "dev.jsonl"), build, "copied",
                                                      locate=lambda: src))
    return src, tmp_path / "home"


def test_converted_copy_has_its_own_entry_and_follows_the_original(trad, capsys):
    from zhnlp.cli import configure_logging

    configure_logging()
    src, home = trad
    path = F.fetch("trad", home=home, convert="t2s")
    original = home / "data" / "trad"
    assert path == home / "data" / "trad-t2s" and (original / "train.jsonl").read_text(encoding="utf-8") == \
        '{"text": "臺灣", "text_pair": "好", "label": 1}\n'
    assert C.convert_text("臺灣") in (path / "train.jsonl").read_text(encoding="utf-8")
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"]["train.jsonl"] == {"rows": 1, "rows_changed": 1}
    assert meta["counts"]["pairs_in_two_files_after_conversion"] == {"dev.jsonl&train.jsonl": 1}
    assert meta["recipe"] == f"1+t2s.{C.CONVERT_RECIPE}+opencc-{C.opencc_version()}"
    assert "public domain This copy, unlike the original, is converted by zhnlp" in meta["licence"]
    assert meta["processing"].startswith("copied; then converted by zhnlp: Traditional -> Simplified")
    assert meta["source"]["directory"] == str(original)
    digest = hashlib.sha256((original / "train.jsonl").read_bytes()).hexdigest()
    assert meta["source"]["sha256"]["train.jsonl"] == digest

    built = meta["fetched"]
    assert F.fetch("trad", home=home, convert="t2s") == path  # intact: a no-op
    assert json.loads((path / "meta.json").read_text(encoding="utf-8"))["fetched"] == built
    (src / "train.jsonl").write_text('{"text": "這", "text_pair": "好", "label": 0}\n', encoding="utf-8")
    F.fetch("trad", home=home, force=True)  # the original changes ...
    capsys.readouterr()
    F.fetch("trad", home=home, convert="t2s")  # ... so its converted copy is converted again
    assert "was converted from another copy of trad; converting it again" in capsys.readouterr().err
    assert (path / "train.jsonl").read_text(encoding="utf-8") == '{"text": "这", "text_pair": "好", "label": 0}\n'
    (path / "dev.jsonl").write_text("{}\n", encoding="utf-8")  # a damaged converted copy is converted again
    F.fetch("trad", home=home, convert="t2s")
    assert "has a corrupted dev.jsonl (sha256 mismatch)" in capsys.readouterr().err and F.verify(path) is None
    assert (path / "dev.jsonl").read_text(encoding="utf-8") == '{"text": "台湾", "text_pair": "好", "label": 1}\n'
    assert sorted(p.name for p in (home / "data").iterdir()) == ["trad", "trad-t2s"]


def test_cli_converts_and_lists_and_refuses_a_vocabulary(trad, capsys):
    _, home = trad
    parser = argparse.ArgumentParser(prog="zhnlp")
    F.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "fetch", "trad", "--convert", "t2s", "--home", str(home)])
    assert args.func(args) == 0
    assert f"trad-t2s: {home / 'data' / 'trad-t2s'}  [dev.jsonl 1, train.jsonl 1, 0.0 MiB]" in capsys.readouterr().out
    args = parser.parse_args(["data", "list", "--home", str(home)])
    assert args.func(args) == 0
    assert "trad-t2s: trad, Traditional -> Simplified Chinese" in capsys.readouterr().out
    args = parser.parse_args(["data", "fetch", "trad", "bert-base-chinese-vocab", "--convert", "t2s",
                              "--home", str(home)])
    with pytest.raises(DataError, match="bert-base-chinese-vocab holds no running text to convert"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["data", "fetch", "trad", "--convert", "s2t"])
    assert "invalid choice: 's2t'" in capsys.readouterr().err


# ---------------------------------------------------------------- DRCD in Simplified
try:
    DRCD, DRCD_WHY = S.locate_drcd(), ""
except DataError as e:
    DRCD, DRCD_WHY = None, str(e)


@pytest.mark.skipif(DRCD is None, reason=f"DRCD is not available: {DRCD_WHY}")
def test_drcd_in_simplified_keeps_every_answer_at_its_offset(tmp_path):
    from zhnlp.data.tasks.mrc import read_squad

    path = F.fetch("drcd", home=tmp_path, convert="t2s")
    original = tmp_path / "data" / "drcd"
    assert (path / "LICENCE").read_bytes() == (DRCD / "LICENCE").read_bytes()
    counts = json.loads((path / "meta.json").read_text(encoding="utf-8"))["counts"]
    for name, questions, answers in (("DRCD_dev.json", 3524, 7048), ("DRCD_test.json", 3493, 6986)):
        before = json.loads((original / name).read_text(encoding="utf-8"))
        after = json.loads((path / name).read_text(encoding="utf-8"))
        assert (original / name).read_bytes() == (DRCD / name).read_bytes()  # the original stays as it was
        assert shape(after) == shape(before)  # same articles, questions, answers, ids and keys
        placed = answers_at_offsets(after)
        assert len(placed) == answers and all(placed)
        assert counts[name]["answers"] == answers and counts[name]["answers_not_at_answer_start"] == 0
        assert counts[name]["questions"] == questions and counts[name]["contexts_changed_length"] == 0
        text = json.dumps(after, ensure_ascii=False)
        assert "這" not in text and "臺灣" not in text and "这" in text
        examples = read_squad(path / name)  # the reading-comprehension task reads it as it reads the original
        assert len(examples) == questions and not examples.fixed_answers
    before = json.loads((original / "DRCD_dev.json").read_text(encoding="utf-8"))
    after = json.loads((path / "DRCD_dev.json").read_text(encoding="utf-8"))
    pairs = [(b["context"], a["context"]) for x, y in zip(before["data"], after["data"])
             for b, a in zip(x["paragraphs"], y["paragraphs"]) if "臺灣" in b["context"]]
    assert pairs and all(a[b.index("臺灣"):b.index("臺灣") + 2] == "台湾" for b, a in pairs)
