"""What makes ELECTRA different, against transformers' Electra* classes in one process: embedding tables of another
width than the encoder (narrower for discriminators, wider for hfl's generators), no pooler, the discriminator
(``AutoModelForPreTraining``) and its padding-free loss, the generator tied or not to the word embeddings, the GELU
sentence classifier, hub-style checkpoints, and LTP's real tiny model when it has been fetched.

Every head at one process, TP=2 and PP=2 runs from ``tests/tiny.py``'s table (configs ``electra_*``)."""

import json
import logging

import pytest
import torch
import transformers
from safetensors.torch import load_file

import zhnlp
from tests.tiny import CONFIGS, hf_model, inputs
from zhnlp.errors import CheckpointError, ModelNotFoundError

AUTO = {"base": zhnlp.AutoModel, "mlm": zhnlp.AutoModelForMaskedLM, "pretraining": zhnlp.AutoModelForPreTraining,
        "sequence_classification": zhnlp.AutoModelForSequenceClassification,
        "token_classification": zhnlp.AutoModelForTokenClassification}
# hfl's small generator shape, shrunk: 4 layers of hidden 16 under 32-wide embeddings (projected down)
GENERATOR = dict(embedding_size=32, hidden_size=16, num_attention_heads=2, intermediate_size=24)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


def saved(tmp_path, head, name="electra_small", **extra):
    hf = hf_model(name, head, **extra)
    hf.save_pretrained(tmp_path / "hf")
    return hf, tmp_path / "hf"


def compare(ours, ref, names, atol=1e-5):
    for k in names:
        assert ours[k].shape == ref[k].shape, k
        assert (ours[k] - ref[k]).abs().max() <= atol, (k, (ours[k] - ref[k]).abs().max())


def state_dicts_equal(a, b):
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---------------------------------------------------------------- embedding width, the generator
@pytest.mark.parametrize("tied", [True, False])
def test_generator_with_wider_embeddings_tied_or_not(tmp_path, tied):
    """embedding_size > hidden_size (hfl's generators): the projection maps down, the generator head back up to the
    embedding width; with tie_word_embeddings false its vocabulary projection is a weight of its own."""
    hf, path = saved(tmp_path, "mlm", **GENERATOR, tie_word_embeddings=tied)
    assert (hf.generator_lm_head.weight is hf.electra.embeddings.word_embeddings.weight) == tied
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(path)
    batch = inputs("electra_small", "mlm")
    with torch.no_grad():
        ours, ref = model(**batch, output_hidden_states=True), hf(**batch, output_hidden_states=True)
    compare(ours, ref, ("loss", "logits"))
    assert len(ours.hidden_states) == len(ref.hidden_states) == 5
    for a, b in zip(ours.hidden_states, ref.hidden_states):  # [0]: after embeddings_project, (b, s, 16)
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-5
    assert model.num_parameters() == hf.num_parameters()
    model.save_pretrained(tmp_path / "zh")
    written = load_file(str(tmp_path / "zh" / "model.safetensors"))
    assert ("generator_lm_head.weight" in written) == (not tied)
    assert written["electra.embeddings_project.weight"].shape == (16, 32)
    config = json.loads((tmp_path / "zh" / "config.json").read_text())
    assert (config["tie_word_embeddings"], config["embedding_size"], config["architectures"]) == (
        tied, 32, ["ElectraForMaskedLM"])
    state_dicts_equal(hf.state_dict(), transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "zh").state_dict())


@pytest.mark.parametrize("name,projected", [("electra_small", True), ("electra_base", False)])
def test_base_model_has_no_pooler_and_saves_without_prefix(tmp_path, name, projected):
    """ElectraModel: last_hidden_state only; its keys carry no ``electra.`` prefix, and embeddings_project exists
    only when the embedding width differs from the hidden size."""
    hf, path = saved(tmp_path, "base", name=name)
    model = zhnlp.AutoModel.from_pretrained(path)
    batch = inputs(name, "base")
    with torch.no_grad():
        ours = model(**batch)
    assert list(ours) == ["last_hidden_state"] and ours.pooler_output is None
    compare(ours, hf(**batch), ["last_hidden_state"])
    model.save_pretrained(tmp_path / "zh")
    keys = set(load_file(str(tmp_path / "zh" / "model.safetensors")))
    assert keys == set(hf.state_dict()) and not any(k.startswith("electra.") for k in keys)
    assert ("embeddings_project.weight" in keys) == projected
    assert json.loads((tmp_path / "zh" / "config.json").read_text())["architectures"] == ["ElectraModel"]


# ---------------------------------------------------------------- the discriminator
def test_discriminator_loss_reads_every_token_without_a_mask(tmp_path):
    hf, path = saved(tmp_path, "pretraining")
    model = zhnlp.AutoModelForPreTraining.from_pretrained(path)
    batch = inputs("electra_small", "pretraining")
    del batch["attention_mask"]
    with torch.no_grad():
        ours, ref = model(**batch), hf(**batch)
    compare(ours, ref, ("loss", "logits"))
    assert ours.logits.shape == batch["input_ids"].shape


def test_discriminator_loss_leaves_padding_out(tmp_path):
    """Changing the labels of padding tokens changes nothing; changing one of a real token does."""
    _, path = saved(tmp_path, "pretraining")
    model = zhnlp.AutoModelForPreTraining.from_pretrained(path)
    batch = inputs("electra_small", "pretraining")
    with torch.no_grad():
        loss = model(**batch).loss
        flipped = dict(batch, labels=torch.where(batch["attention_mask"] == 0, 1 - batch["labels"], batch["labels"]))
        assert torch.equal(model(**flipped).loss, loss)
        real = batch["labels"].clone()
        real[0, 0] = 1 - real[0, 0]
        assert not torch.equal(model(**dict(batch, labels=real)).loss, loss)


@pytest.mark.parametrize("head", ["pretraining", "mlm"])
def test_training_gradients_match_transformers(tmp_path, head):
    """Gradients of the loss (dropout off) equal transformers' for every weight: the projection, the discriminator,
    and the tied generator's contribution to the word embeddings."""
    hf, path = saved(tmp_path, head, **NO_DROPOUT)
    model = AUTO[head].from_pretrained(path).train()
    hf.train()
    batch = inputs("electra_small", head)
    hf(**batch).loss.backward()
    model(**batch).loss.backward()
    for p in model.parameters():  # map the gradients through the conversion table: save them as the weights
        p.data.copy_(p.grad)
    model.save_pretrained(tmp_path / "grads")
    grads = load_file(str(tmp_path / "grads" / "model.safetensors"))
    for name, p in hf.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-5, msg=name)


def test_discriminator_checkpoint_from_the_hub_loads_into_every_head(tmp_path, caplog):
    """hfl's discriminators are ElectraForPreTraining checkpoints in a pytorch_model.bin with old transformers'
    position_ids buffer: every head loads them, the discriminator's weights ignored, a new head named as fresh."""
    hf = hf_model("electra_small", "pretraining")
    state = dict(hf.state_dict(), **{"electra.embeddings.position_ids": torch.arange(64)[None]})
    hf.config.save_pretrained(tmp_path / "hub")
    torch.save(state, tmp_path / "hub" / "pytorch_model.bin")
    batch = inputs("electra_small", "base")
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
        assert (zhnlp.AutoModelForPreTraining.from_pretrained(tmp_path / "hub")(**batch).logits - ref.logits).abs() \
            .max() <= 1e-5
        base = zhnlp.AutoModel.from_pretrained(tmp_path / "hub")
        assert base.fresh_weights == []
        assert (base(**batch).last_hidden_state - ref.hidden_states[-1]).abs().max() <= 1e-5
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        classifier = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hub", num_labels=3)
        generator = zhnlp.AutoModelForMaskedLM.from_pretrained(tmp_path / "hub")
    assert classifier.fresh_weights == ["classifier.dense.bias", "classifier.dense.weight",
                                        "classifier.out_proj.bias", "classifier.out_proj.weight"]
    assert generator.fresh_weights == ["generator_lm_head.bias", "generator_predictions.LayerNorm.bias",
                                       "generator_predictions.LayerNorm.weight", "generator_predictions.dense.bias",
                                       "generator_predictions.dense.weight"]
    assert "has no weights for classifier.dense.bias, classifier.dense.weight" in caplog.text


def test_pretraining_head_is_refused_for_families_without_one(tmp_path):
    hf_model("bert", "base").save_pretrained(tmp_path / "bert")
    message = (r"model_type 'bert' has no pretraining head in zhnlp, so AutoModelForPreTraining cannot load it; it "
               r"needs a family with a pretraining head, such as an ELECTRA discriminator \(model_type electra\)\. "
               r"This model loads with AutoModel, AutoModelForMaskedLM, ")
    with pytest.raises(CheckpointError, match=message):
        zhnlp.AutoModelForPreTraining.from_pretrained(tmp_path / "bert")
    with pytest.raises(CheckpointError, match="the config: model_type 'bert' has no pretraining head in zhnlp"):
        zhnlp.AutoModelForPreTraining.from_config(dict(CONFIGS["bert"]))


# ---------------------------------------------------------------- the sentence classifier
def test_sentence_classifier_uses_gelu_whatever_hidden_act(tmp_path):
    """ELECTRA's classifier has its own dense + GELU on [CLS] (no tanh pooler, not the encoder's relu); right- and
    left-padded batches (the padding-free and the padded paths) and the hidden states all match."""
    hf, path = saved(tmp_path, "sequence_classification", hidden_act="relu", num_labels=3)
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(path)
    batch = dict(inputs("electra_small", "base"), labels=torch.tensor([2, 0, 1, 1]))
    for mask in (batch["attention_mask"], batch["attention_mask"].flip(1)):
        with torch.no_grad():
            ours = model(**dict(batch, attention_mask=mask), output_hidden_states=True)
            ref = hf(**dict(batch, attention_mask=mask), output_hidden_states=True)
        compare(ours, ref, ("loss", "logits"))
        for a, b in zip(ours.hidden_states, ref.hidden_states):
            assert (a - b).abs().max() <= 1e-5
    assert model.chunks[0].encoder.layers[-1].first_token_only  # restored after recording every position


# ---------------------------------------------------------------- config and inputs
@pytest.mark.parametrize("change,message", [
    (dict(is_decoder=True), "is_decoder=True, which zhnlp does not support"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type='relative_key'"),
    (dict(embedding_size=0), "embedding_size=0 is not a valid size"),
    (dict(hidden_act="gelu_bad"), "hidden_act 'gelu_bad' is not supported"),
])
def test_unsupported_configs_are_refused(tmp_path, change, message):
    _, path = saved(tmp_path, "base")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message):
        zhnlp.AutoModel.from_pretrained(path)


def test_from_config_ties_the_generator_and_counts_as_transformers(tmp_path):
    config = zhnlp.AutoConfig.for_model("electra", **{k: v for k, v in CONFIGS["electra_small"].items()
                                                      if k != "model_type"})
    model = zhnlp.AutoModelForMaskedLM.from_config(config)
    model.save_pretrained(tmp_path / "zh")
    back = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "zh")
    assert back.generator_lm_head.weight is back.electra.embeddings.word_embeddings.weight
    assert model.num_parameters() == back.num_parameters()
    with pytest.raises(TypeError, match="ELECTRA has no task_type_ids"):
        model(torch.ones(1, 4, dtype=torch.long), task_type_ids=torch.zeros(1, 4, dtype=torch.long))


# ---------------------------------------------------------------- real weights: LTP's tiny ELECTRA
def test_ltp_tiny_matches_transformers_on_chinese_text():
    """LTP 4's tiny encoder (3 layers, hidden 256, embeddings 128), once `zhnlp models fetch ltp-tiny` has put it
    in the models cache (ZHNLP_HOME): zhnlp and transformers' ElectraModel agree on Chinese sentences."""
    try:
        directory = zhnlp.hub.resolve("ltp-tiny")
    except ModelNotFoundError as e:
        pytest.skip(f"ltp-tiny is not available: {e}")
    tokenizer = zhnlp.AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(["哈工大社会计算与信息检索研究中心研制了语言技术平台。", "他叫汤姆去拿外衣。"], padding=True,
                      return_tensors="pt")
    x = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    ref = transformers.ElectraModel.from_pretrained(directory).eval()
    model = zhnlp.AutoModel.from_pretrained(directory)
    with torch.no_grad():
        ours, theirs = model(**x, output_hidden_states=True), ref(**x, output_hidden_states=True)
    assert ours.last_hidden_state.shape == (2, x["input_ids"].shape[1], 256)
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        assert (a - b).abs().max() <= 1e-5
    assert model.num_parameters() == ref.num_parameters()
