"""Loading mistakes (config.json, weight shapes, labels, tokenizer files) each give one clear
message naming the file or key, the value and the fix."""

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import zhnlp
from tests.tiny import CONFIGS, hf_model, inputs
from zhnlp import hub
from zhnlp.conversion import engine
from zhnlp.conversion.mappings import FuseQKV, Rename, Tied
from zhnlp.errors import CheckpointError, ModelNotFoundError, TokenizerError
from zhnlp.models.common.pretrained import PretrainedModel
from zhnlp.models.ernie.config import ErnieConfig
from zhnlp.tokenizers import AutoTokenizer, WordPieceTokenizer, read_vocab, train_sentencepiece
from zhnlp.tokenizers.auto import check_tokenizer_fits
from zhnlp.tokenizers.segment import Segmenter

BERT_VOCAB = Path(__file__).parents[1] / "assets" / "bert-base-chinese-vocab.txt"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()


def _edit_config(directory, **changes):
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(changes)
    (directory / "config.json").write_text(json.dumps(cfg))


def _replace_tensor(directory, key, value):
    f = directory / "model.safetensors"
    tensors = load_file(str(f))
    assert key in tensors, f"test setup: {key} is not in the checkpoint"
    tensors[key] = value
    save_file(tensors, str(f))


# ---------------------------------------------------------------- 1. config.json that is not an object
@pytest.mark.parametrize("content,kind", [("[1, 2]", "array"), ('"x"', "string"), ("3", "number"),
                                          ("null", "null"), ("true", "boolean")])
def test_config_json_that_is_not_an_object(ckpt, content, kind):
    (ckpt / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=rf"config\.json holds a JSON {kind} \({re.escape(content)}\), but "
                                              r"config\.json must be a JSON object of model settings"):
        zhnlp.AutoModel.from_pretrained(ckpt)
    with pytest.raises(CheckpointError, match=f"holds a JSON {kind}"):
        ErnieConfig.from_json_file(ckpt / "config.json")


def test_read_config_json(ckpt):
    raw = hub.read_config_json(ckpt)  # the directory or the file
    assert raw == hub.read_config_json(ckpt / "config.json") and raw["model_type"] == "ernie"
    (ckpt / "config.json").write_bytes(b'{\n "model_type": "ernie",\n "x": "\xff"\n}')
    with pytest.raises(CheckpointError, match=r"config\.json is not UTF-8 text \(invalid byte 0xff on line 3\)"):
        hub.read_config_json(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(ModelNotFoundError, match=r"config\.json not found"):
        hub.read_config_json(ckpt)


def test_config_dict_that_is_not_a_dict():
    with pytest.raises(CheckpointError, match=r"x/config\.json must be a JSON object of model settings, got list"):
        ErnieConfig.from_dict([1, 2], source="x/config.json")


# ---------------------------------------------------------------- 2. tensors of the wrong shape
@pytest.mark.parametrize("head,key,shape,expected,param", [
    ("base", "encoder.layer.1.attention.self.query.weight", (32, 31), (32, 32),
     "encoder.layers.1.self_attention.linear_qkv.weight"),
    ("base", "encoder.layer.1.attention.self.value.bias", (30,), (32,),
     "encoder.layers.1.self_attention.linear_qkv.bias"),
    ("base", "embeddings.word_embeddings.weight", (200, 32), (250, 32), "embedding.word_embeddings.weight"),
    # more rows than vocab_size used to load silently (the extra rows were cut off)
    ("base", "embeddings.word_embeddings.weight", (300, 32), (250, 32), "embedding.word_embeddings.weight"),
    ("base", "encoder.layer.0.output.dense.weight", (32, 40), (32, 48), "encoder.layers.0.mlp.linear_fc2.weight"),
    ("base", "embeddings.LayerNorm.weight", (33,), (32,), "embedding.layernorm.weight"),
    ("base", "encoder.layer.3.attention.self.key.weight", (32, 32, 1), (32, 32),
     "encoder.layers.3.self_attention.linear_qkv.weight"),
    ("mlm", "cls.predictions.bias", (300,), (250,), "output_layer.bias"),
    ("sequence_classification", "classifier.weight", (3, 32), (2, 32), "classifier.out.weight"),
    ("question_answering", "qa_outputs.bias", (3,), (2,), "qa_outputs.out.bias"),
])
def test_wrong_shape_names_key_and_both_shapes(tmp_path, head, key, shape, expected, param):
    hf_model("ernie3", head).save_pretrained(tmp_path / "c")
    if head != "base":
        key = key if key.startswith(("cls.", "classifier", "qa_outputs")) else "ernie." + key
    _replace_tensor(tmp_path / "c", key, torch.zeros(shape))
    auto = {"base": zhnlp.AutoModel, "mlm": zhnlp.AutoModelForMaskedLM,
            "sequence_classification": zhnlp.AutoModelForSequenceClassification,
            "question_answering": zhnlp.AutoModelForQuestionAnswering}[head]
    full_key = key if head != "base" else "ernie." + key
    message = (rf"shape mismatch for {re.escape(param)} \({re.escape(full_key)}: expected "
               rf"{re.escape(str(expected))}, found {re.escape(str(shape))}\).*fix its sizes \(vocab_size")
    with pytest.raises(CheckpointError, match=message):
        auto.from_pretrained(tmp_path / "c")


def test_all_wrong_shapes_are_listed_at_once(ckpt):
    _edit_config(ckpt, intermediate_size=64)
    with pytest.raises(CheckpointError) as err:
        zhnlp.AutoModel.from_pretrained(ckpt)
    text = str(err.value)
    assert "\n" not in text
    # four layers x (fc1 weight, fc1 bias, fc2 weight) = 12 wrong tensors: the first four named, then a count
    assert text.count("shape mismatch for") == 4 and "... and 8 more" in text
    assert "ernie.encoder.layer.0.intermediate.dense.weight: expected (64, 32), found (48, 32)" in text


def test_a_classifier_of_another_size_is_refused_not_reinitialised(tmp_path):
    hf_model("ernie3", "sequence_classification", num_labels=3).save_pretrained(tmp_path / "c")
    with pytest.raises(CheckpointError, match=r"classifier\.weight: expected \(2, 32\), found \(3, 32\)"):
        zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "c", num_labels=2)


@pytest.mark.parametrize("key,shape,param", [
    ("ernie.encoder.layer.1.attention.self.query.weight", (32, 31),
     "encoder.layers.1.self_attention.linear_qkv.weight"),
    ("ernie.embeddings.word_embeddings.weight", (300, 32), "embedding.word_embeddings.weight"),
    ("ernie.encoder.layer.2.attention.output.dense.weight", (32, 30),
     "encoder.layers.2.self_attention.linear_proj.weight"),
])
def test_the_per_rank_loader_checks_full_shapes_too(ckpt, monkeypatch, key, shape, param):
    """The loader itself compares each key's full shape before reading a slice (a row slice of
    a tensor with too many rows would otherwise look right), whatever the global check said."""
    monkeypatch.setattr(engine, "check_shapes", lambda *a, **k: [])
    _replace_tensor(ckpt, key.removeprefix("ernie."), torch.zeros(shape))  # a base model saves unprefixed keys
    with pytest.raises(CheckpointError, match=rf"shape mismatch for {re.escape(param)} \({re.escape(key)}: "
                                              rf"expected .*, found {re.escape(str(shape))}\)"):
        zhnlp.AutoModel.from_pretrained(ckpt)


_TP2_WORKER = """
import json, sys
from pathlib import Path
import torch
import zhnlp
from zhnlp.conversion import engine
from zhnlp.errors import CheckpointError

ckpt, out = map(Path, sys.argv[1:3])
torch.set_num_threads(1)
lay = zhnlp.distributed.init(tp=2)
report = {}
for name in ("global", "per-rank"):
    if name == "per-rank":
        engine.check_shapes = lambda *a, **k: []
    try:
        zhnlp.AutoModelForMaskedLM.from_pretrained(ckpt)
        report[name] = "loaded"
    except CheckpointError as e:
        report[name] = str(e)
(out / f"rank{lay.rank}.json").write_text(json.dumps(report))
zhnlp.distributed.shutdown()
"""


def test_tensor_parallel_ranks_refuse_a_wrong_shape_alike(tmp_path):
    """Under TP=2 each rank reads only its rows; rank 0's rows of an embedding with too many rows
    exist, so only a check of the full shape catches it: both ranks raise the same message."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT, free_port

    hf_model("ernie3", "mlm").save_pretrained(tmp_path / "c")
    _replace_tensor(tmp_path / "c", "ernie.embeddings.word_embeddings.weight", torch.zeros(300, 32))
    (tmp_path / "worker.py").write_text(_TP2_WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", str(tmp_path / "worker.py"), str(tmp_path / "c"), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert reports[0] == reports[1]
    shapes = r"ernie\.embeddings\.word_embeddings\.weight: expected \(250, 32\), found \(300, 32\)"
    assert re.search(r"shape mismatch for embedding\.word_embeddings\.weight \(" + shapes, reports[0]["global"])
    assert re.search(r"shape mismatch for embedding\.word_embeddings\.weight \(" + shapes, reports[0]["per-rank"])


def test_mapping_shapes_per_kind():
    full = (256, 32)  # padded vocabulary rows
    assert Rename("a", "k", vocab=True, vocab_size=250).hf_shapes(None, full) == {"k": (250, 32)}
    assert Tied("a", "k", vocab=True, vocab_size=250).hf_shapes(None, full) == {"k": (250, 32)}
    assert Rename("l.*.w", "h.*.w").hf_shapes(3, (48, 32)) == {"h.3.w": (48, 32)}
    qkv = FuseQKV("l.*.qkv", q="h.*.q", k="h.*.k", v="h.*.v", head_dim=8)
    assert qkv.hf_shapes(1, (96, 32)) == {"h.1.q": (32, 32), "h.1.k": (32, 32), "h.1.v": (32, 32)}
    assert qkv.hf_shapes(0, (96,)) == {"h.0.q": (32,), "h.0.k": (32,), "h.0.v": (32,)}


def _family(name):
    from zhnlp.models import family_for_model_type

    return family_for_model_type(CONFIGS[name]["model_type"])


@pytest.mark.parametrize("name,head", [(n, h) for n in CONFIGS for h in _family(n).bridge.HEAD_PARTS])
def test_full_shapes_describe_the_built_model(name, head):
    """bridge.full_shapes (used to check a checkpoint before any stage is built) equals the
    shapes of the model's parameters, for every family of the tiny configs and each of its heads."""
    family = _family(name)
    arch = family.config_class.from_dict(dict(CONFIGS[name], num_labels=3))
    model = PretrainedModel(family, arch, head, {"perform_initialization": False})
    table, shapes = family.bridge.table(arch), family.bridge.full_shapes(arch)
    names = engine.global_param_names(model.chunks[0])
    for local, p in model.chunks[0].named_parameters():
        mapping, _ = table.find(names[local])
        assert shapes[mapping.megatron] == tuple(p.shape), names[local]


# ---------------------------------------------------------------- 3. num_labels and id2label
def test_num_labels_argument_that_contradicts_id2label(tmp_path, caplog):
    """transformers 5 warns and lets num_labels win, rebuilding the label maps as LABEL_i."""
    import transformers

    hf_model("ernie3", "base", id2label={0: "neg", 1: "neu", 2: "pos"}).save_pretrained(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "c", num_labels=2)
    assert re.search(r"config\.json names 3 labels \(neg, neu, pos\) but num_labels=2 was passed; the head gets 2 "
                     r"labels named LABEL_0\.\.LABEL_1, as transformers does", caplog.text)
    ref = transformers.ErnieConfig.from_pretrained(tmp_path / "c", num_labels=2)
    assert model.config.num_labels == ref.num_labels == 2
    assert model.config.to_dict()["id2label"] == ref.id2label
    assert model(inputs("ernie3", "base")["input_ids"]).logits.shape == (4, 2)


def test_num_labels_argument_that_agrees_keeps_the_names(tmp_path, caplog):
    hf_model("ernie3", "base", id2label={0: "neg", 1: "neu", 2: "pos"}).save_pretrained(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "c", num_labels=3)
    assert model.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert "LABEL_" not in caplog.text


def test_default_label_names_are_replaced_without_a_warning(ckpt, tmp_path, caplog):
    zhnlp.AutoModel.from_pretrained(ckpt).save_pretrained(tmp_path / "zh")  # writes LABEL_0, LABEL_1
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "zh", num_labels=5)
    assert model.config.num_labels == 5 and "LABEL_" not in caplog.text


def test_config_json_whose_num_labels_contradicts_its_id2label(ckpt, caplog):
    import transformers

    _edit_config(ckpt, num_labels=2, id2label={"0": "neg", "1": "neu", "2": "pos"})
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        model = zhnlp.AutoModelForSequenceClassification.from_pretrained(ckpt)
    assert re.search(r"config\.json: num_labels=2 contradicts id2label, which names 3 labels \(neg, neu, pos\); "
                     r"using 2 labels", caplog.text)
    ref = transformers.ErnieConfig.from_pretrained(ckpt)
    assert model.config.num_labels == ref.num_labels == 2
    assert model.config.to_dict()["id2label"] == ref.id2label


@pytest.mark.parametrize("value", [0, -1, 2.5, "3", True])
def test_num_labels_argument_out_of_range(ckpt, value):
    with pytest.raises(ValueError, match=rf"num_labels={re.escape(repr(value))} is not a valid number of labels; "
                                         r"give an integer >= 1 \(1 for regression, 2 or more for classification\)"):
        zhnlp.AutoModelForSequenceClassification.from_pretrained(ckpt, num_labels=value)


@pytest.mark.parametrize("value", [0, -3, 1.5])
def test_num_labels_in_config_json_out_of_range(ckpt, value):
    _edit_config(ckpt, num_labels=value)
    with pytest.raises(CheckpointError, match=rf"config\.json: num_labels={value} is not a valid number of labels; "
                                              r"give an integer >= 1"):
        zhnlp.AutoModel.from_pretrained(ckpt)


@pytest.mark.parametrize("id2label,message", [
    ({"0": "a", "x": "b"}, r"id2label key 'x' is not a label id; keys must be the integers 0\.\.n-1"),
    ({"0": "a", "2": "b"}, r"id2label has ids \[0, 2\], but they must be 0\.\.1 without gaps"),
    ({}, r"id2label=\{\} must be a non-empty object"),
    (["a", "b"], r"id2label=\['a', 'b'\] must be a non-empty object"),
])
def test_id2label_that_cannot_name_the_outputs(ckpt, id2label, message):
    _edit_config(ckpt, id2label=id2label)
    with pytest.raises(CheckpointError, match=r"config\.json: " + message):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_single_label_classification_needs_two_labels():
    with pytest.raises(ValueError, match=r"problem_type='single_label_classification' needs num_labels >= 2, got 1"):
        ErnieConfig.from_dict({}, num_labels=1, problem_type="single_label_classification")


# ---------------------------------------------------------------- 4. a tokenizer larger than the model
@pytest.fixture(scope="module")
def bert_tokenizer():
    return WordPieceTokenizer.from_vocab(BERT_VOCAB)


def test_tokenizer_larger_than_the_vocabulary(bert_tokenizer):
    config = ErnieConfig(vocab_size=1000)
    with pytest.raises(CheckpointError, match=r"the tokenizer in models/bert has 21128 tokens \(largest id 21127\) "
                                              r"but the model's vocab_size is 1000; use the tokenizer that belongs"):
        check_tokenizer_fits(bert_tokenizer, config, "models/bert")
    with pytest.raises(CheckpointError, match="vocab_size is 21127;"):
        check_tokenizer_fits(bert_tokenizer, {"vocab_size": 21127}, "d")  # a config.json dict
    check_tokenizer_fits(bert_tokenizer, ErnieConfig(vocab_size=21128), "d")  # fits exactly
    check_tokenizer_fits(bert_tokenizer, {"vocab_size": 40000}, "d")  # smaller tokenizers are fine


def test_tokenizer_fits_a_built_model():
    tok = WordPieceTokenizer.from_vocab({t: i for i, t in enumerate(SPECIALS + list("你好世界"))})
    model = zhnlp.AutoModel.from_config(dict(CONFIGS["bert"], vocab_size=9))
    check_tokenizer_fits(tok, model, "tiny")
    tok.add_tokens(["世界和平"])  # added tokens count: id 9 has no embedding row
    with pytest.raises(CheckpointError, match=r"has 10 tokens \(largest id 9\) but the model's vocab_size is 9"):
        check_tokenizer_fits(tok, model, "tiny")
    with pytest.raises(TypeError, match="needs the model's config"):
        check_tokenizer_fits(tok, object(), "tiny")


def test_sentencepiece_tokenizer_larger_than_the_vocabulary(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["今天天气很好，我们去公园散步。", "自然语言处理是人工智能的一个分支。",
                                 "北京是中国的首都。", "他喜欢读书和写字。"] * 30), encoding="utf-8")
    tok = train_sentencepiece([corpus], tmp_path / "spm", vocab_size=50, num_threads=1)
    n = len(tok.get_vocab())
    check_tokenizer_fits(tok, {"vocab_size": n}, str(tmp_path / "spm"))
    with pytest.raises(CheckpointError, match=rf"spm has {n} tokens \(largest id {n - 1}\) but the model's "
                                              rf"vocab_size is {n - 1}"):
        check_tokenizer_fits(tok, {"vocab_size": n - 1}, str(tmp_path / "spm"))


# ---------------------------------------------------------------- 5. invalid UTF-8
def test_vocab_that_is_not_utf8(tmp_path):
    (tmp_path / "vocab.txt").write_bytes("\n".join(SPECIALS).encode() + "\n你\n好\n".encode("gbk"))
    with pytest.raises(TokenizerError, match=r"vocab\.txt is not UTF-8 text \(invalid byte 0xc4 on line 6\); a "
                                             r"WordPiece vocabulary must be UTF-8"):
        AutoTokenizer.from_pretrained(tmp_path)


def test_invalid_utf8_far_into_a_large_vocab_names_the_right_line(tmp_path):
    lines = SPECIALS + [f"tok{i}" for i in range(20000)]
    data = "\n".join(lines).encode() + b"\nbad\xff\n"
    (tmp_path / "vocab.txt").write_bytes(data)
    with pytest.raises(TokenizerError, match=rf"invalid byte 0xff on line {len(lines) + 1}\)"):
        read_vocab(tmp_path / "vocab.txt")


def test_tokenizer_json_files_that_cannot_be_read(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_bytes(b'{"do_lower_case": "\xff"}')
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json is not UTF-8 text \(invalid byte 0xff on line "
                                             r"1\); fix or delete it"):
        AutoTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json holds a JSON array, not an object"):
        AutoTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "vocab.txt").unlink()
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is not valid JSON"):
        AutoTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is not a tokenizer file transformers can load"):
        AutoTokenizer.from_pretrained(tmp_path)


def test_sentencepiece_model_that_cannot_be_read(tmp_path):
    (tmp_path / "sentencepiece.model").write_bytes(b"\x0a\x05ab")
    with pytest.raises(TokenizerError, match=r"sentencepiece\.model is not a readable SentencePiece model"):
        AutoTokenizer.from_pretrained(tmp_path)


def test_user_dictionary_that_is_not_utf8(tmp_path):
    path = tmp_path / "userdict.txt"
    path.write_bytes("云计算 5\n".encode() + "自然语言 3 n\n".encode("gbk"))
    with pytest.raises(TokenizerError, match=r"user dictionary .*userdict\.txt is not UTF-8 text \(invalid byte 0xd7 on "
                                             r"line 2\); jieba dictionaries are UTF-8"):
        Segmenter(backend="jieba").load_userdict(path)


# ---------------------------------------------------------------- 6. duplicate lines in vocab.txt
def test_the_real_bert_vocabulary_has_no_duplicate_lines():
    vocab = read_vocab(BERT_VOCAB)
    assert len(vocab) == 21128 == len(BERT_VOCAB.read_text(encoding="utf-8").split("\n")) - 1


def test_duplicate_vocab_line_is_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + ["你", "好", "世", "你"]) + "\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"vocab\.txt: lines 6 and 9 both hold the token '你' \(ids 5 and 8\), "
                                             r"so the token -> id map and the id -> token list would disagree; "
                                             r"replace line 6 with an unused placeholder such as \[unused5\]"):
        AutoTokenizer.from_pretrained(tmp_path)


def test_two_empty_vocab_lines_are_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + ["你"]) + "\n\n\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"lines 7 and 8 are both empty \(ids 6 and 7\)"):
        read_vocab(tmp_path / "vocab.txt")


def test_vocab_dict_with_shared_ids_is_refused():
    vocab = {t: i for i, t in enumerate(SPECIALS)} | {"你": 5, "好": 5}
    with pytest.raises(TokenizerError, match=r"tokens '你' and '好' both have id 5"):
        WordPieceTokenizer.from_vocab(vocab)
    with pytest.raises(TokenizerError, match=r"token '你' has id -1; vocabulary ids must be integers >= 0"):
        WordPieceTokenizer.from_vocab({t: i for i, t in enumerate(SPECIALS)} | {"你": -1})


# ---------------------------------------------------------------- 7. empty vocabularies, missing special tokens
def test_empty_vocab_file(tmp_path):
    (tmp_path / "vocab.txt").write_bytes(b"")
    with pytest.raises(TokenizerError, match=r"vocab\.txt is empty; a WordPiece vocabulary holds one token per line"):
        AutoTokenizer.from_pretrained(tmp_path)
    with pytest.raises(TokenizerError, match=r"the vocabulary is empty"):
        WordPieceTokenizer.from_vocab({})


def test_missing_special_tokens_name_the_file(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\n你\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=rf"{re.escape(str(tmp_path / 'vocab.txt'))} lacks the special tokens "
                                             r"\['\[UNK\]'\]"):
        AutoTokenizer.from_pretrained(tmp_path)
    # a special token renamed in tokenizer_config.json must be in the vocabulary too
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"unk_token": "<unk>"}))
    with pytest.raises(TokenizerError, match=r"lacks the special tokens \['<unk>'\]"):
        AutoTokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------- sizes and rates of the wrong type or range
@pytest.mark.parametrize("key,value,rule", [
    ("num_attention_heads", 0, "a valid size; it must be an integer >= 1"),  # was a ZeroDivisionError
    ("vocab_size", "250", "a valid size; it must be an integer >= 1"),
    ("num_hidden_layers", 2.0, "a valid size; it must be an integer >= 1"),
    ("type_vocab_size", -1, "a valid size; it must be an integer >= 0"),
    ("task_type_vocab_size", 0, "a valid size; it must be an integer >= 1"),  # ernie3 sets use_task_id
    ("hidden_dropout_prob", 1.5, r"valid; it must be a number in \[0, 1\)"),
    ("classifier_dropout", "0.1", r"valid; it must be a number in \[0, 1\)"),
    ("layer_norm_eps", 0, "valid; it must be a number > 0"),
    ("initializer_range", None, "valid; it must be a number >= 0"),
])
def test_config_sizes_of_the_wrong_type_or_range(ckpt, key, value, rule):
    _edit_config(ckpt, **{key: value})
    with pytest.raises(CheckpointError, match=rf"config\.json: {key}={re.escape(repr(value))} is not {rule}\. "
                                              r"Fix config\.json"):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_type_vocab_size_zero_and_null_classifier_dropout_are_valid():
    arch = ErnieConfig.from_dict(dict(CONFIGS["bert"], type_vocab_size=0, classifier_dropout=None))
    assert arch.type_vocab_size == 0 and arch.classifier_dropout is None


# ---------------------------------------------------------------- checkpoint files
@pytest.mark.parametrize("content", ["[1]", '{"metadata": {}}', '{"weight_map": [1]}', "{not json"])
def test_safetensors_index_that_cannot_be_read(ckpt, content):
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00001.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(content)
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json is not a valid safetensors index "
                                              r"\(.+\); it must be a JSON object with \"weight_map\""):
        zhnlp.AutoModel.from_pretrained(ckpt)
