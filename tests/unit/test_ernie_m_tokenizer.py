"""The ERNIE-M tokenizer: zhnlp.AutoTokenizer gives transformers 4.x's ErnieMTokenizer ids.

transformers 5 has no ErnieMTokenizer, so ``tests/assets/ernie_m/tokenizer_cases.json`` holds what transformers
4.46's gave (``scripts/make_ernie_m_fixture.py``) on the fixture's tokenizer (a SentencePiece model trained on
People's Daily and review text, with an ERNIE-M vocab.txt whose ids differ from the model's): single texts and
pairs, special tokens written in the text, truncation strategies, overflow, padding, lower-casing, decoding,
the vocabulary, and a few hundred corpus lines and random strings."""

import json
import shutil
from pathlib import Path

import pytest

import zhnlp
from zhnlp.errors import TokenizerError
from zhnlp.tokenizers.ernie_m import ErnieMTokenizer, cut_piece, cut_pieces

FIXTURE = Path(__file__).resolve().parent.parent / "assets" / "ernie_m"
TOKENIZER = FIXTURE / "tokenizer"
CASES = json.loads((FIXTURE / "tokenizer_cases.json").read_text(encoding="utf-8"))["cases"]


def _plain(value):
    """A BatchEncoding or nested result as JSON would hold it (tuples as lists, int keys as strings)."""
    if hasattr(value, "data"):
        value = dict(value.data)
    return json.loads(json.dumps(value))


@pytest.fixture(scope="module")
def tokenizers():
    """One tokenizer per distinct set of loading arguments."""
    return {json.dumps(init, sort_keys=True): zhnlp.AutoTokenizer.from_pretrained(TOKENIZER, **init)
            for init in ({}, {"do_lower_case": True})}


def test_auto_tokenizer_picks_the_ernie_m_layout(tokenizers):
    tok = tokenizers["{}"]
    assert isinstance(tok, ErnieMTokenizer)
    assert {p.name for p in TOKENIZER.iterdir()} == {"sentencepiece.bpe.model", "vocab.txt", "tokenizer_config.json",
                                                     "special_tokens_map.json"}
    assert len(CASES) > 30 and sum(len(c["args"][0]) for c in CASES if c["name"] == "corpus") >= 300
    assert (tok.cls_token_id, tok.pad_token_id, tok.sep_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.mask_token_id == len(tok) - 1 and tok.model_input_names == ["input_ids", "token_type_ids",
                                                                           "attention_mask"]
    assert (tok.cls_token_id, tok.sep_token_id) == CLS_SEP


def _check_added_outputs(got: dict, expected: dict, pairs: bool) -> None:
    """zhnlp's tokenizer returns token types and an attention mask where transformers' returns them only when
    asked: where the reference lacks them they must be what transformers gives when asked (these results are not
    padded: all ones; types 0 for [CLS] A, 1 from the first [SEP] on), and they are then removed from ``got``."""
    rows = got["input_ids"] if got["input_ids"] and isinstance(got["input_ids"][0], list) else [got["input_ids"]]
    nested = rows is got["input_ids"]
    for key in ("attention_mask", "token_type_ids"):
        if key in expected:
            continue
        want = []
        for ids in rows:
            if key == "attention_mask" or not pairs:
                want.append([int(key == "attention_mask")] * len(ids))
            else:
                first = ids.index(CLS_SEP[1])
                want.append([0] * first + [1] * (len(ids) - first))
        assert got.pop(key) == (want if nested else want[0]), key


CLS_SEP = (0, 2)  # the fixture's [CLS] and [SEP] ids


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_transformers_4_ids(tokenizers, case):
    """Every result equals transformers 4.x's (beyond it, the token types and attention mask it gives only when
    asked: see _check_added_outputs)."""
    tok = tokenizers[json.dumps(case["init"], sort_keys=True)]
    got = _plain(getattr(tok, case["method"])(*case["args"], **case["kwargs"]))
    if isinstance(got, dict) and "input_ids" in got:
        _check_added_outputs(got, case["expected"], pairs=case["method"] == "__call__" and len(case["args"]) == 2)
    assert got == case["expected"]


def test_save_pretrained_writes_the_layout_transformers_4_reads(tokenizers, tmp_path):
    """The saved directory holds ERNIE-M's files (transformers 4.x loading it is checked by the fixture script)
    and loads back with the same ids and vocabulary."""
    tok = tokenizers["{}"]
    tok.save_pretrained(tmp_path / "saved")
    files = {p.name for p in (tmp_path / "saved").iterdir()}
    assert {"sentencepiece.bpe.model", "vocab.txt", "tokenizer_config.json"} <= files
    assert (tmp_path / "saved" / "vocab.txt").read_bytes() == (TOKENIZER / "vocab.txt").read_bytes()
    assert (tmp_path / "saved" / "sentencepiece.bpe.model").read_bytes() == \
        (TOKENIZER / "sentencepiece.bpe.model").read_bytes()
    config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "ErnieMTokenizer" and config["do_lower_case"] is False
    assert not {"sentencepiece_model_ckpt", "vocab_file", "backend"} & set(config)  # no paths of this machine
    back = zhnlp.AutoTokenizer.from_pretrained(tmp_path / "saved")
    texts = next(c for c in CASES if c["name"] == "corpus")["args"][0]
    assert back(texts)["input_ids"] == tok(texts)["input_ids"]
    assert back.get_vocab() == tok.get_vocab()


def test_layout_found_from_the_model_config(tmp_path):
    """A directory with the two files and an ernie_m config.json (no tokenizer_config.json) is ERNIE-M's, not a
    WordPiece vocab.txt; without vocab.txt the SentencePiece model's own ids are used."""
    for name in ("sentencepiece.bpe.model", "vocab.txt"):
        shutil.copy(TOKENIZER / name, tmp_path / name)
    shutil.copy(FIXTURE / "base" / "hf" / "config.json", tmp_path / "config.json")
    tok = zhnlp.AutoTokenizer.from_pretrained(tmp_path)
    expected = next(c for c in CASES if c["name"] == "single")["expected"]["input_ids"]
    assert isinstance(tok, ErnieMTokenizer)
    assert tok(next(c for c in CASES if c["name"] == "single")["args"][0])["input_ids"] == expected
    (tmp_path / "vocab.txt").unlink()
    own = zhnlp.AutoTokenizer.from_pretrained(tmp_path)
    assert own.convert_tokens_to_ids("▁") == own.sp_model.piece_to_id("▁") != tok.convert_tokens_to_ids("▁")


def test_the_cut_after_sentencepiece():
    """Ideographs and ERNIE-M's punctuation stand alone, digits part from letters, a bare word-start mark left by a
    cut is dropped, and a lone one survives only inside the text before a piece that does not start a word."""
    assert cut_piece("▁中国人") == ["中", "国", "人"]
    assert cut_piece("ab中c") == ["ab", "中", "c"]
    assert cut_piece("▁abc123def") == ["▁abc", "123", "def"]
    assert cut_piece("▁2020") == ["2020"]
    assert cut_piece("x,y!") == ["x", ",", "y", "!"]
    assert cut_piece("a-b") == ["a-b"]
    assert cut_pieces(["▁", "hello", "▁", "你好", "▁", "▁world", "▁"]) == ["hello", "▁", "你", "好", "▁world"]


def test_unreadable_files_are_refused_by_name(tmp_path):
    with pytest.raises(TokenizerError, match="has no sentencepiece.bpe.model: an ERNIE-M tokenizer is a "
                                             "SentencePiece model"):
        (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "ErnieMTokenizer"}')
        zhnlp.AutoTokenizer.from_pretrained(tmp_path)
    (tmp_path / "sentencepiece.bpe.model").write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="sentencepiece.bpe.model is not a readable SentencePiece model"):
        zhnlp.AutoTokenizer.from_pretrained(tmp_path)
    shutil.copy(TOKENIZER / "sentencepiece.bpe.model", tmp_path / "sentencepiece.bpe.model")
    (tmp_path / "vocab.txt").write_text("[CLS]\n[PAD]\n[CLS]\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"vocab\.txt: lines 1 and 3 both hold the token '\[CLS\]'"):
        zhnlp.AutoTokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").unlink()
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "ErnieMTokenizer", "sp_model_kwargs": '
                                                    '{"add_bos": true}}')
    with pytest.raises(TokenizerError, match=r"sp_model_kwargs \['add_bos'\] are not supported"):
        zhnlp.AutoTokenizer.from_pretrained(tmp_path)
