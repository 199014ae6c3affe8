"""zhnlp's tokenizers against transformers: identical ids, token types and offsets.

The reference is transformers' BertTokenizerFast loaded from a directory holding the real
bert-base-chinese vocab.txt (tests/assets, 21,128 tokens). (In transformers 5,
``BertTokenizerFast(vocab_file=...)`` ignores the file and builds a 5-token vocabulary, so the
reference is loaded with from_pretrained.) Real Chinese text comes from the CMRC2018 trial set
(CC-BY-SA-4.0, read from ../shared when present, never copied here) plus handwritten sentences
covering the awkward cases.
"""

from __future__ import annotations

import json
import pickle
import shutil
import unicodedata

import pytest
import sentencepiece as spm
import torch
import transformers

from tests.conftest import ROOT
from zhnlp.errors import ModelNotFoundError
from zhnlp.tokenizers import AutoTokenizer, WordPieceTokenizer, add_cli, train_sentencepiece, train_wordpiece
from zhnlp.tokenizers.sentencepiece import MODEL_FILE

VOCAB = ROOT / "tests" / "assets" / "bert-base-chinese-vocab.txt"
CMRC = ROOT.parent / "shared" / "data" / "cmrc2018" / "cmrc2018_trial.json"

HANDWRITTEN = [
    "我爱北京天安门。",
    "自然语言处理（NLP）是人工智能的一个重要方向。",
    "iPhone 15 Pro Max的售价为9999元，比去年贵了10%。",
    "Transformer模型在2017年由Google提出，BERT-base有1.1亿参数。",
    "ＡＢＣ全角字母，１２３全角数字，“引号”、《书名号》、【括号】！？",
    "今天天气真好😀👍🏻，我们去公园吧～",
    "Café résumé naïve Ångström Zürich 北京Ⅻ",
    "  前后有空格  ，\t制表符\t，换行\n和\r\n回车  ",
    "\u3000\u3000全角空格开头的段落。\u00a0不间断空格\u200b零宽空格",
    "控制字符\x00\x07和替换符\ufffd以及组合符号e\u0301",
    "繁體中文：臺灣的資訊科技產業發達。",
    "日本語のテキストとカタカナ、한국어 텍스트도 섞여 있다.",
    "电话：010-12345678，邮箱：test@example.com，网址：https://www.example.com/path?q=1",
    "数学公式：E=mc²，x₁+x₂≥3.14159，½＋¼。",
    "这是一个[MASK]词，[CLS]和[SEP]出现在文本里。",
    "supercalifragilisticexpialidocious" * 4 + "超长单词之后的中文。",
    "ＨＥＬＬＯ　ＷＯＲＬＤ，大写全角。",
    "",
    " ",
    "。",
    "😀",
]


def _cmrc() -> tuple[list[str], list[tuple[str, str]]]:
    if not CMRC.is_file():
        return [], []
    data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
    contexts = [p["context"] for a in data for p in a["paragraphs"]]
    pairs = [(q["question"], p["context"]) for a in data for p in a["paragraphs"] for q in p["qas"]]
    return contexts, pairs


CONTEXTS, QA_PAIRS = _cmrc()
needs_cmrc = pytest.mark.skipif(not CMRC.is_file(), reason=f"CMRC2018 trial set not found at {CMRC}")


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert-base-chinese")
    shutil.copy(VOCAB, d / "vocab.txt")
    return d


@pytest.fixture(scope="module")
def ref(vocab_dir):
    tok = transformers.BertTokenizerFast.from_pretrained(vocab_dir)
    assert len(tok) == 21128, "the reference tokenizer did not read the real vocabulary"
    return tok


@pytest.fixture(scope="module")
def ours(vocab_dir):
    tok = AutoTokenizer.from_pretrained(vocab_dir)
    assert isinstance(tok, WordPieceTokenizer) and len(tok) == 21128
    return tok


def _same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], f"{key} differs"


# ---------------------------------------------------------------- WordPiece parity
def test_vocab_asset_is_bert_base_chinese():
    lines = VOCAB.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 21128
    assert [lines[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_single_texts_ids_and_offsets(ref, ours):
    texts = HANDWRITTEN + CONTEXTS + [q for q, _ in QA_PAIRS]
    kw = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
    _same(ours(texts, **kw), ref(texts, **kw))
    # One by one as well: the single-text path is a different code path in transformers.
    for text in HANDWRITTEN:
        _same(ours(text, **kw), ref(text, **kw))
        assert ours.tokenize(text) == ref.tokenize(text)


def test_offsets_point_into_the_original_text(ours):
    for text in HANDWRITTEN + CONTEXTS[:50]:
        enc = ours(text, return_offsets_mapping=True, add_special_tokens=False)
        for tid, (start, end) in zip(enc["input_ids"], enc["offset_mapping"]):
            piece = ours.convert_ids_to_tokens(tid).removeprefix("##")
            if tid in ours.all_special_ids:  # [UNK] covers a span it cannot spell; [MASK] in text is matched as is
                continue
            # The token is (part of) the lower-cased, accent-stripped form of that span: part, because
            # NFD splits a Hangul syllable into jamo, each a token pointing at the whole syllable.
            span = unicodedata.normalize("NFD", text[start:end].lower())
            assert piece in "".join(c for c in span if unicodedata.category(c) != "Mn"), (text, start, end)


def test_long_text_truncation_and_padding(ref, ours):
    texts = HANDWRITTEN + CONTEXTS[:64]
    for kw in (dict(truncation=True, max_length=32, padding="longest"),
               dict(truncation=True, max_length=128, padding="max_length", return_offsets_mapping=True),
               dict(padding=True, pad_to_multiple_of=8)):
        _same(ours(texts, **kw), ref(texts, **kw))
    a = ours(texts, truncation=True, max_length=48, padding=True, return_tensors="pt")
    b = ref(texts, truncation=True, max_length=48, padding=True, return_tensors="pt")
    for key in b:
        assert torch.equal(a[key], b[key]), key
    assert a["input_ids"].shape[0] == len(texts) and a["input_ids"].shape[1] <= 48


def test_reading_comprehension_windows(ref, ours):
    pairs = [("北京是哪个国家的首都？", "北京，简称“京”，是中华人民共和国的首都。" * 12),
             ("What is BERT？", "BERT（Bidirectional Encoder Representations from Transformers）是Google提出的。" * 5)]
    pairs += QA_PAIRS[:300]
    questions, contexts = [q for q, _ in pairs], [c for _, c in pairs]
    kw = dict(truncation="only_second", max_length=64, stride=16, return_overflowing_tokens=True,
              return_offsets_mapping=True, padding="max_length")
    a, b = ours(questions, contexts, **kw), ref(questions, contexts, **kw)
    _same(a, b)
    assert len(a["input_ids"]) > len(pairs)  # long contexts really were split into windows
    assert a.sequence_ids(0) == b.sequence_ids(0)
    # A single pair, and the tensors a QA collator would build.
    a = ours(*pairs[0], return_tensors="pt", **kw)
    b = ref(*pairs[0], return_tensors="pt", **kw)
    for key in b:
        assert torch.equal(a[key], b[key]), key


def test_pairs_without_windows(ref, ours):
    pairs = [(a, b) for a, b in zip(HANDWRITTEN, reversed(HANDWRITTEN))]
    for kw in (dict(), dict(truncation="longest_first", max_length=40), dict(truncation="only_first", max_length=200)):
        _same(ours([p[0] for p in pairs], [p[1] for p in pairs], return_offsets_mapping=True, **kw),
              ref([p[0] for p in pairs], [p[1] for p in pairs], return_offsets_mapping=True, **kw))


def test_decode_matches(ref, ours):
    for text in HANDWRITTEN[:8]:
        ids = ref(text)["input_ids"]
        assert ours.decode(ids) == ref.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


def test_cased_vocab_follows_tokenizer_config(vocab_dir, tmp_path):
    d = tmp_path / "cased"
    shutil.copytree(vocab_dir, d)
    (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "tokenizer_class": "BertTokenizer"}))
    ours, ref = AutoTokenizer.from_pretrained(d), transformers.AutoTokenizer.from_pretrained(d)
    assert not ours.do_lower_case
    text = "Hello WORLD Café 你好"
    _same(ours(text, return_offsets_mapping=True), ref(text, return_offsets_mapping=True))
    assert ours(text)["input_ids"] != AutoTokenizer.from_pretrained(vocab_dir)(text)["input_ids"]


# ---------------------------------------------------------------- save / load
def test_save_pretrained_loads_in_transformers_with_identical_ids(ours, tmp_path):
    ours.save_pretrained(tmp_path)
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8") == VOCAB.read_text(encoding="utf-8")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    texts = HANDWRITTEN + CONTEXTS[:100]
    kw = dict(return_offsets_mapping=True, truncation=True, max_length=64, padding=True)
    _same(theirs(texts, **kw), ours(texts, **kw))
    _same(again(texts, **kw), ours(texts, **kw))


def test_fullwidth_normalisation_keeps_offsets_and_survives_saving(vocab_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(vocab_dir, normalize_fullwidth=True)
    text = "ＡＢＣ１２３，ｘｙｚ！全角"
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    assert enc["input_ids"] == tok("ABC123,xyz!全角", add_special_tokens=False)["input_ids"]
    assert enc["offset_mapping"][0] == (0, 3) and enc["offset_mapping"][-1] == (len(text) - 1, len(text))
    tok.save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    _same(theirs(HANDWRITTEN, return_offsets_mapping=True), tok(HANDWRITTEN, return_offsets_mapping=True))
    assert AutoTokenizer.from_pretrained(tmp_path).normalize_fullwidth


def test_tokenizer_json_without_vocab_txt(ours, tmp_path):
    ours.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").unlink()  # some hub repos ship only tokenizer.json
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(again, WordPieceTokenizer)
    _same(again(HANDWRITTEN, return_offsets_mapping=True), ours(HANDWRITTEN, return_offsets_mapping=True))


def test_pickles_for_multiprocess_data_loading(vocab_dir):
    tok = AutoTokenizer.from_pretrained(vocab_dir, normalize_fullwidth=True)
    again = pickle.loads(pickle.dumps(tok))
    assert again.normalize_fullwidth and again(HANDWRITTEN) == tok(HANDWRITTEN)


# ---------------------------------------------------------------- names, hub, errors
def test_vocab_without_special_tokens_names_them(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n你\n好\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"lacks the special tokens \['\[CLS\]', '\[SEP\]', '\[MASK\]'\]"):
        AutoTokenizer.from_pretrained(tmp_path)


def test_model_name_goes_through_hub_resolve(vocab_dir, monkeypatch):
    asked = []

    def fake_resolve(name, revision=None):
        asked.append((name, revision))
        return vocab_dir

    monkeypatch.setattr("zhnlp.tokenizers.auto.hub.resolve", fake_resolve)
    tok = AutoTokenizer.from_pretrained("bert-base-chinese")
    assert asked == [("bert-base-chinese", None)] and len(tok) == 21128


def test_unknown_name_and_uncached_repo_raise_model_not_found(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="unknown model name"):
        AutoTokenizer.from_pretrained("ernie-3.0-bse-zh")
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        AutoTokenizer.from_pretrained("nobody/no-such-tokenizer-repo")


def test_directory_without_tokenizer_files(tmp_path):
    with pytest.raises(ModelNotFoundError, match="holds no tokenizer: expected vocab.txt"):
        AutoTokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------- training
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    file = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    file.write_text("\n".join((CONTEXTS or HANDWRITTEN * 20) + HANDWRITTEN), encoding="utf-8")
    return file


@pytest.mark.parametrize("model_type,byte_fallback", [("unigram", False), ("bpe", False), ("unigram", True)])
def test_sentencepiece_train_save_load(corpus, tmp_path, model_type, byte_fallback):
    # Without CMRC the handwritten corpus is tiny: few pieces, and only 98% of its characters kept.
    vocab_size, coverage = (5000, 0.9995) if CONTEXTS else (240 + 256 * byte_fallback, 0.98)
    tok = train_sentencepiece([corpus], tmp_path, vocab_size=vocab_size, model_type=model_type,
                              character_coverage=coverage, byte_fallback=byte_fallback)
    assert len(tok) == vocab_size
    assert [tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id] == [0, 1, 2, 3, 4]
    proc = spm.SentencePieceProcessor(model_file=str(tmp_path / MODEL_FILE))
    texts = [t for t in HANDWRITTEN if "[" not in t] + CONTEXTS[:100] + [q for q, _ in QA_PAIRS[:200]]
    for text in texts:  # the fast pipeline is SentencePiece itself
        ids = proc.encode(text)
        assert tok(text, add_special_tokens=False)["input_ids"] == ids, text
        if byte_fallback:  # (without it SentencePiece writes an unknown piece as " ⁇ ", we as "[UNK]")
            assert tok.decode(ids) == proc.decode(ids), text
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    kw = dict(return_offsets_mapping=True, truncation="only_second", max_length=64, stride=16,
              return_overflowing_tokens=True, padding=True)
    # Questions short enough to leave room for a context window longer than the stride.
    questions = [t for t in texts if len(tok(t, add_special_tokens=False)["input_ids"]) < 40]
    contexts = ([c for c in CONTEXTS[:100]] or HANDWRITTEN * 3)[: len(questions)]
    questions = questions[: len(contexts)]
    _same(theirs(questions, contexts, **kw), tok(questions, contexts, **kw))
    _same(again(questions, contexts, **kw), tok(questions, contexts, **kw))
    assert tok("甲", "乙")["input_ids"][0] == 2 and tok("[MASK]", add_special_tokens=False)["input_ids"] == [4]


def test_train_wordpiece_vocab_layout(corpus, tmp_path):
    tok = train_wordpiece([corpus], tmp_path, vocab_size=6000, min_frequency=2)
    vocab = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = set(vocab)
    text = corpus.read_text(encoding="utf-8")
    cjk = {c for c in text if 0x4E00 <= ord(c) <= 0x9FFF}
    assert cjk <= tokens, "a CJK character of the corpus got no token of its own"
    assert not any(t.startswith("##") and 0x4E00 <= ord(t[2]) <= 0x9FFF for t in tokens if len(t) == 3)
    assert any(t.startswith("##") for t in tokens)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    _same(theirs(HANDWRITTEN, return_offsets_mapping=True), tok(HANDWRITTEN, return_offsets_mapping=True))
    assert tok.unk_token_id not in tok(CONTEXTS[:20] or HANDWRITTEN[:3])["input_ids"][0]


def test_cli_subcommands(corpus, tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="zhnlp")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tokenizer", "train-wordpiece", str(corpus), "-o", str(tmp_path / "wp"),
                              "--vocab-size", "6000"])
    assert args.func(args) == 0 and (tmp_path / "wp" / "vocab.txt").is_file()
    args = parser.parse_args(["tokenizer", "train-sentencepiece", str(corpus), "-o", str(tmp_path / "sp"),
                              "--vocab-size", "20"])
    assert args.func(args) == 2  # vocabulary smaller than the character set: a message, not a traceback
    assert "SentencePiece training failed" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["sentiment-reviews", "peoples-daily-1998", "msra-ner"])
def test_parity_on_every_text_of_the_real_corpora(dataset):
    """Every text of the project's fetched corpora: ids and offsets equal BertTokenizerFast's."""
    import json as _json

    import transformers

    import zhnlp
    from zhnlp.data.fetch import fetch

    root = fetch(dataset)
    if dataset == "peoples-daily-1998":
        texts = (root / "corpus.txt").read_text(encoding="utf-8").splitlines()
    else:
        texts = []
        for split in sorted(root.glob("*.jsonl")):
            for line in split.read_text(encoding="utf-8").splitlines():
                row = _json.loads(line)
                texts.append(row["text"] if "text" in row else "".join(row["tokens"]))
    vocab_dir = fetch("bert-base-chinese-vocab")
    ours = zhnlp.AutoTokenizer.from_pretrained(vocab_dir)
    ref = transformers.BertTokenizerFast.from_pretrained(vocab_dir)
    for start in range(0, len(texts), 2048):
        batch = texts[start:start + 2048]
        a = ours(batch, return_offsets_mapping=True)
        b = ref(batch, return_offsets_mapping=True)
        assert a["input_ids"] == b["input_ids"]
        assert a["offset_mapping"] == b["offset_mapping"]
    assert len(texts) > 10000
