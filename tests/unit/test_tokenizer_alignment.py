"""Tasks that place tokens in the text (reading comprehension, NER, chat SFT) refuse, in one message, a tokenizer
that gives no character offsets or word ids (ERNIE-M's Python tokenizer, like transformers' own), instead of
failing later on a missing key; fast tokenizers pass."""

from pathlib import Path

import pytest

from zhnlp.data.tasks.mrc import MRCExample, build_mrc_features
from zhnlp.data.tasks.ner import NERExample, encode_ner
from zhnlp.data.tasks.sft import encode_conversation
from zhnlp.errors import TokenizerError
from zhnlp.tokenizers import AutoTokenizer

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@pytest.fixture(scope="module")
def ernie_m():
    return AutoTokenizer.from_pretrained(ASSETS / "ernie_m" / "tokenizer")


def test_reading_comprehension_names_the_missing_offsets(ernie_m):
    example = MRCExample(qid="q1", question="百度在哪里？", context="百度在北京。", answers=[{"text": "北京",
                                                                                    "answer_start": 3}])
    with pytest.raises(TokenizerError, match=r"reading comprehension needs the tokenizer's character offsets and "
                                             r"word ids, which ErnieMTokenizer .* does not give; fine-tune this "
                                             r"model on classification or sentence pairs"):
        build_mrc_features(ernie_m, [example], max_seq_len=32, doc_stride=8, max_query_len=12)


def test_ner_and_sft_name_it_too(ernie_m):
    with pytest.raises(TokenizerError, match=r"token classification \(NER\) needs the tokenizer's character"):
        encode_ner(ernie_m, [NERExample(tokens=list("百度在北京"), tags=["B-ORG", "I-ORG", "O", "B-LOC", "I-LOC"],
                                        line=1)], {"O": 0, "B-ORG": 1, "I-ORG": 2, "B-LOC": 3, "I-LOC": 4})
    with pytest.raises(TokenizerError, match=r"chat fine-tuning \(SFT\) needs"):
        encode_conversation(ernie_m, [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "好"}])


def test_a_fast_tokenizer_still_places_the_answer(tmp_path):
    import shutil

    shutil.copy(ASSETS / "bert-base-chinese-vocab.txt", tmp_path / "vocab.txt")
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.is_fast
    example = MRCExample(qid="q1", question="百度在哪里？", context="百度在北京。",
                         answers=[{"text": "北京", "answer_start": 3}])
    [feature] = build_mrc_features(tok, [example], max_seq_len=32, doc_stride=8, max_query_len=12)
    ids = tok(["北京"], add_special_tokens=False)["input_ids"][0]
    assert feature.input_ids[feature.start_position:feature.end_position + 1] == ids
