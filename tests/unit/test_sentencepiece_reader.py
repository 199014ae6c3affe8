"""The SentencePiece .model reader: sentencepiece's own protobuf classes read the file, transformers'
SpmConverter builds the fast pipeline, and the ids equal ``SentencePieceProcessor.encode`` for models trained
here (``SentencePieceTrainer`` on a small Chinese text) with the normaliser and whitespace settings varied."""

from __future__ import annotations

import itertools
import sys

import pytest
import sentencepiece as spm

from tests.unit.test_tokenizers import HANDWRITTEN
from zhnlp.errors import TokenizerError
from zhnlp.tokenizers import sentencepiece as zsp

SUBJECTS = ["我们", "北京大学的学生", "这家公司", "人工智能", "老师", "自然语言处理", "上海市政府", "小明和小红"]
VERBS = ["发布了", "研究", "喜欢", "正在讨论", "参观了", "提出", "介绍了"]
OBJECTS = ["新的模型。", "长城和故宫。", "一篇论文，", "天气预报！", "数据集；", "iPhone 15 和 BERT 模型", "2024年的计划？"]
TEXTS = [t for t in HANDWRITTEN if "[" not in t] + [
    "北京大学的学生  喜欢   人工智能", "   前面三个空格", "后面三个空格   ", "换行\n\n两次", "制表\t符",
    "ＡＢＣ１２３全角（括号）", "unknown 字符 ㊙ 和 䶮", "北京大学北京大学", "a  b   c", "\u3000全角空格"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    lines = ["".join(parts) for parts in itertools.product(SUBJECTS, VERBS, OBJECTS)]
    file = tmp_path_factory.mktemp("spm-corpus") / "corpus.txt"
    file.write_text("\n".join(lines + HANDWRITTEN), encoding="utf-8")
    return file


def _train(corpus, directory, **options):
    prefix = directory / "m"
    settings = dict(input=str(corpus), model_prefix=str(prefix), vocab_size=320, character_coverage=0.995,
                    pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="[PAD]", unk_piece="[UNK]", bos_piece="[CLS]",
                    eos_piece="[SEP]", control_symbols=["[MASK]"], num_threads=1, minloglevel=2)
    spm.SentencePieceTrainer.train(**{**settings, **options})
    return prefix.with_suffix(".model")


@pytest.mark.parametrize("options", [
    {"model_type": "unigram"},
    {"model_type": "bpe"},
    {"model_type": "unigram", "byte_fallback": True, "vocab_size": 560},
    {"model_type": "bpe", "user_defined_symbols": ["北京大学", "人工智能"]},
    {"model_type": "unigram", "normalization_rule_name": "identity", "remove_extra_whitespaces": False,
     "add_dummy_prefix": False},
    {"model_type": "bpe", "normalization_rule_name": "nmt_nfkc_cf", "split_by_whitespace": False},
], ids=["unigram", "bpe", "byte-fallback", "user-symbols", "identity-no-prefix", "nfkc-cf"])
def test_ids_equal_sentencepiece_processor(corpus, tmp_path, options):
    model = _train(corpus, tmp_path, **options)
    proc = spm.SentencePieceProcessor(model_file=str(model))
    tok = zsp.load_sentencepiece(model)
    assert len(tok) == proc.get_piece_size()
    for text in TEXTS:
        ids = proc.encode(text)
        assert tok(text, add_special_tokens=False)["input_ids"] == ids, repr(text)
        assert tok.convert_ids_to_tokens(ids) == [proc.id_to_piece(i) for i in ids]
        if options.get("byte_fallback"):
            assert tok.decode(ids) == proc.decode(ids), repr(text)
    enc = tok("北京大学的学生", "喜欢人工智能")
    assert enc["input_ids"][0] == proc.bos_id() and enc["input_ids"].count(proc.eos_id()) == 2
    assert [tok.pad_token, tok.unk_token, tok.cls_token, tok.sep_token, tok.mask_token] == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_the_proto_is_sentencepieces_own(corpus, tmp_path):
    from sentencepiece import sentencepiece_model_pb2

    model = _train(corpus, tmp_path, model_type="bpe", byte_fallback=True, vocab_size=560)
    proto = zsp.read_model_proto(model)
    assert isinstance(proto, sentencepiece_model_pb2.ModelProto)
    proc = spm.SentencePieceProcessor(model_file=str(model))
    assert [p.piece for p in proto.pieces] == [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
    assert proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE
    assert proto.trainer_spec.byte_fallback and proto.normalizer_spec.add_dummy_prefix
    assert not hasattr(zsp, "_varint") and not hasattr(zsp, "_fields")  # no hand-written wire-format reader left


@pytest.mark.parametrize("content, message", [
    (b"\x0a\x05ab", r"is not a readable SentencePiece model \("),
    (b"\xff\xfe garbage", r"is not a readable SentencePiece model \("),
])
def test_corrupt_model_files_are_one_clear_error(tmp_path, content, message):
    file = tmp_path / "sentencepiece.model"
    file.write_bytes(content)
    for read in (zsp.load_sentencepiece, zsp.read_model_proto):
        with pytest.raises(TokenizerError, match=message) as e:
            read(file)
        assert str(e.value).startswith(str(file)) and "\n" not in str(e.value)
        assert str(e.value).endswith("use the .model file that came with the model, or train one with "
                                     "`zhnlp tokenizer train-sentencepiece`.")


def test_truncated_empty_and_unsupported_models(corpus, tmp_path):
    model = _train(corpus, tmp_path, model_type="unigram")
    cut = tmp_path / "cut.model"
    cut.write_bytes(model.read_bytes()[:len(model.read_bytes()) // 2])
    with pytest.raises(TokenizerError, match=r"cut\.model is not a readable SentencePiece model"):
        zsp.load_sentencepiece(cut)
    with pytest.raises(TokenizerError, match=r"cut\.model is not a readable SentencePiece model"):
        zsp.read_model_proto(cut)
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    with pytest.raises(TokenizerError, match=r"empty\.model is a SentencePiece model without pieces"):
        zsp.read_model_proto(empty)
    (tmp_path / "char").mkdir()
    char = _train(corpus, tmp_path / "char", model_type="char", vocab_size=200)
    with pytest.raises(TokenizerError, match=r"SentencePiece model type 'char' is not supported; train a 'unigram' "
                                             r"or 'bpe' model"):
        zsp.load_sentencepiece(char)
    with pytest.raises(FileNotFoundError, match="no SentencePiece model at"):
        zsp.load_sentencepiece(tmp_path / "missing.model")


def test_missing_protobuf_names_the_package(corpus, tmp_path, monkeypatch):
    model = _train(corpus, tmp_path, model_type="unigram")
    monkeypatch.delattr(spm, "sentencepiece_model_pb2", raising=False)
    monkeypatch.setitem(sys.modules, "sentencepiece.sentencepiece_model_pb2", None)  # the import now fails
    with pytest.raises(ImportError, match=r"reading a SentencePiece model needs the protobuf package .* "
                                          r"`pip install protobuf`"):
        zsp.read_model_proto(model)
