"""The ERNIE 4.5 tokenizer layout: zhnlp.AutoTokenizer gives the ids of transformers' own ERNIE 4.5 tokenizer.

The real tokenizer.model is not reachable here, so a SentencePiece model is trained on the project's corpora
(sentiment reviews, MSRA NER sentences, People's Daily 1998) and written in the ERNIE 4.5 layout by
train_ernie4_5_tokenizer; transformers.AutoTokenizer loads the same directory (with an ernie4_5 config.json,
as in the hub repos), and the two must agree on every text of those corpora: ids with and without special
tokens, padded batches, decoding, special and added tokens, and the chat template."""

from __future__ import annotations

import json

import pytest
import transformers

import zhnlp
from zhnlp.errors import TokenizerError
from zhnlp.tokenizers import ernie4_5


def _corpus_texts() -> list[str]:
    from zhnlp.data.fetch import fetch

    texts = []
    reviews = fetch("sentiment-reviews")
    for split in ("train", "dev", "test"):
        texts += [json.loads(line)["text"] for line in open(reviews / f"{split}.jsonl", encoding="utf-8")]
    msra = fetch("msra-ner")
    for split in ("train", "dev", "test"):
        texts += ["".join(json.loads(line)["tokens"]) for line in open(msra / f"{split}.jsonl", encoding="utf-8")]
    texts += (fetch("peoples-daily-1998") / "corpus.txt").read_text(encoding="utf-8").split("\n")
    return [t for t in texts if t]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    texts = _corpus_texts()
    root = tmp_path_factory.mktemp("ernie45-tok")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(texts), encoding="utf-8")
    out = root / "tokenizer"
    ours = ernie4_5.train_ernie4_5_tokenizer([corpus], out, vocab_size=6000, input_sentence_size=30000,
                                              num_threads=2)
    # the hub repos ship config.json beside the tokenizer; transformers picks the tokenizer by its model_type
    transformers.Ernie4_5Config(vocab_size=len(ours), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=8).save_pretrained(out)
    return {"dir": out, "texts": texts, "ours": zhnlp.AutoTokenizer.from_pretrained(out),
            "theirs": transformers.AutoTokenizer.from_pretrained(str(out))}


def test_layout_files_are_the_ernie45_ones(layout):
    out = layout["dir"]
    assert {p.name for p in out.iterdir()} == {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                                               "added_tokens.json", "config.json"}
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Ernie4_5_Tokenizer" and "chat_template" in config
    assert type(layout["theirs"]).__name__ == "TokenizersBackend"  # transformers' forced fast path for ernie4_5


@pytest.mark.slow  # ~15 s on an idle 2-core machine: 92,000 texts through both tokenizers
def test_every_corpus_text_gets_transformers_ids(layout):
    ours, theirs, texts = layout["ours"], layout["theirs"], layout["texts"]
    assert len(texts) > 90_000
    ids = ours(texts)["input_ids"]
    assert ids == theirs(texts)["input_ids"]
    # ERNIE 4.5 adds no bos/eos around a text: add_special_tokens changes nothing
    assert ours(texts[:500], add_special_tokens=False)["input_ids"] == ids[:500]
    assert theirs(texts[:500], add_special_tokens=False)["input_ids"] == ids[:500]
    sample = ids[::10]  # decoding every text would double the test's time for little more coverage
    assert ours.decode(ids[0]) and ours.batch_decode(sample) == theirs.batch_decode(sample)
    unk = ours.unk_token_id
    assert sum(i == unk for row in ids for i in row) == 0  # byte fallback: no character of the corpora is lost


def test_special_and_added_tokens_and_flags(layout):
    ours, theirs = layout["ours"], layout["theirs"]
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    assert {i: repr(t) for i, t in ours.added_tokens_decoder.items()} == {
        i: repr(t) for i, t in theirs.added_tokens_decoder.items()}
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert (ours.bos_token_id, ours.eos_token_id, ours.unk_token_id, ours.pad_token_id) == (1, 2, 0, 0)
    assert ours.cls_token == "<|begin_of_sentence|>" and ours.sep_token == "<|end_of_sentence|>"
    assert ours.sys_start_token == theirs.sys_start_token == "<mask:4>"
    assert ours.model_input_names == theirs.model_input_names == ["input_ids", "attention_mask"]
    image = ours.convert_tokens_to_ids("<|IMAGE_PLACEHOLDER|>")
    assert image == ours.vocab_size  # the first id after the SentencePiece vocabulary
    text = "<|begin_of_sentence|>北京<|IMAGE_PLACEHOLDER|>的<mask:1>天气<|end_of_sentence|></s>"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours(text)["input_ids"][0] == ours.cls_token_id and image in ours(text)["input_ids"]
    ids = ours(text)["input_ids"]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches(layout, side):
    ours, theirs, texts = layout["ours"], layout["theirs"], layout["texts"][::997]
    ours.padding_side = theirs.padding_side = side
    try:
        a = ours(texts, padding=True, truncation=True, max_length=48)
        b = theirs(texts, padding=True, truncation=True, max_length=48)
        assert a["input_ids"] == b["input_ids"] and a["attention_mask"] == b["attention_mask"]
        assert "token_type_ids" not in a  # the ERNIE 4.5 model takes none
        assert any(row[0 if side == "left" else -1] == 0 for row in a["input_ids"])  # padded with <unk>, id 0
    finally:
        ours.padding_side = theirs.padding_side = "right"


def test_chat_template_as_transformers_renders_it(layout):
    ours, theirs = layout["ours"], layout["theirs"]
    messages = [{"role": "system", "content": "你是一个乐于助人的助手。"}, {"role": "user", "content": "你好"},
                {"role": "assistant", "content": "您好！有什么可以帮您？"}, {"role": "user", "content": "北京在哪里？"}]
    text = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|begin_of_sentence|>你是一个乐于助人的助手。\nUser: 你好\nAssistant: 您好！有什么可以帮您？"
                    "<|end_of_sentence|>User: 北京在哪里？\nAssistant: ")
    assert text == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for prompt in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=prompt) == theirs.apply_chat_template(
            messages, add_generation_prompt=prompt)
    assert not ours.apply_chat_template(messages[:2], tokenize=False).endswith("Assistant: ")


def test_reloads_after_save_pretrained(layout, tmp_path):
    ours = layout["ours"]
    ours.save_pretrained(tmp_path)
    again = zhnlp.AutoTokenizer.from_pretrained(tmp_path)  # now a tokenizer.json directory
    sample = layout["texts"][:300]
    assert again(sample)["input_ids"] == ours(sample)["input_ids"]
    assert again.chat_template == ours.chat_template


def _copy(layout, directory, skip=()):
    directory.mkdir()
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
        if name not in skip:
            (directory / name).write_bytes((layout["dir"] / name).read_bytes())
    return directory


def test_failures_name_the_file_and_the_fix(layout, tmp_path):
    d = _copy(layout, tmp_path / "no-model", skip=("tokenizer.model",))
    with pytest.raises(TokenizerError, match=r"has no tokenizer.model.*train_ernie4_5_tokenizer"):
        zhnlp.AutoTokenizer.from_pretrained(d)
    d = _copy(layout, tmp_path / "corrupt")
    (d / "tokenizer.model").write_bytes((d / "tokenizer.model").read_bytes()[:5000])
    with pytest.raises(TokenizerError, match=r"tokenizer.model is not a readable SentencePiece model"):
        zhnlp.AutoTokenizer.from_pretrained(d)
    d = _copy(layout, tmp_path / "gap")
    added = json.loads((d / "added_tokens.json").read_text())
    (d / "added_tokens.json").write_text(json.dumps({k: v + 5 for k, v in added.items()}))
    with pytest.raises(TokenizerError, match=r"added_tokens.json: '<\|IMAGE_PLACEHOLDER\|>' has id \d+, but the "
                                             r"next free id .* is \d+"):
        zhnlp.AutoTokenizer.from_pretrained(d)
    (d / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json is not valid JSON"):
        zhnlp.AutoTokenizer.from_pretrained(d)
    with pytest.raises(TokenizerError, match=r"zhnlp never runs code from a model repository.*drop "
                                             r"trust_remote_code"):
        zhnlp.AutoTokenizer.from_pretrained(layout["dir"], trust_remote_code=True)


def test_tokenizer_class_alone_or_model_type_alone_selects_the_layout(layout, tmp_path):
    d = _copy(layout, tmp_path / "by-type", skip=("tokenizer_config.json",))
    (d / "config.json").write_text(json.dumps({"model_type": "ernie4_5_moe"}))
    tok = zhnlp.AutoTokenizer.from_pretrained(d)
    assert tok("你好世界")["input_ids"] == layout["ours"]("你好世界")["input_ids"]  # no [CLS]/[SEP] template
    assert ernie4_5.is_ernie4_5_layout(layout["dir"], {"tokenizer_class": "Ernie4_5_Tokenizer"})
    assert not ernie4_5.is_ernie4_5_layout(tmp_path, {})


def test_tokenizer_command_writes_the_layout(layout, tmp_path, capsys):
    from zhnlp.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(layout["texts"][:3000]), encoding="utf-8")
    out = tmp_path / "tok"
    assert main(["tokenizer", "train-ernie4_5", str(corpus), "-o", str(out), "--vocab-size", "3000",
                 "--character-coverage", "0.99", "--input-sentence-size", "3000"]) == 0
    assert "ERNIE 4.5 tokenizer files (3000 pieces, 3006 tokens" in capsys.readouterr().out
    tok = zhnlp.AutoTokenizer.from_pretrained(out)
    assert tok.cls_token == "<|begin_of_sentence|>" and tok.chat_template == ernie4_5.CHAT_TEMPLATE
    assert main(["tokenizer", "train-ernie4_5", str(corpus), "-o", str(out)]) == 2  # refuses to overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert main(["tokenizer", "train-ernie4_5", str(corpus), "-o", str(tmp_path / "small"), "--vocab-size",
                 "20"]) == 2
    assert "SentencePiece training failed" in capsys.readouterr().err
