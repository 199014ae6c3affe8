"""ERNIE-M against transformers 4.x's golden outputs, in one process.

transformers 5 has no ErnieM, so the reference is ``tests/assets/ernie_m/``: tiny ErnieM checkpoints of every head
written by transformers 4.46 with a right-padded batch and what transformers computed on it (every layer's hidden
states, logits, losses, one model's gradients), made by ``scripts/make_ernie_m_fixture.py``. TP=2 and PP=2 run
the same cases in ``tests/distributed/test_ernie_m_parallel.py``; the tokenizer is tested in
``tests/unit/test_ernie_m_tokenizer.py``.
"""

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import zhnlp
from zhnlp.errors import CheckpointError

FIXTURE = Path(__file__).resolve().parent.parent / "assets" / "ernie_m"
CASES = sorted(p.name for p in FIXTURE.iterdir() if (p / "hf").is_dir())
AUTO = {"base": zhnlp.AutoModel, "sequence_classification": zhnlp.AutoModelForSequenceClassification,
        "token_classification": zhnlp.AutoModelForTokenClassification,
        "question_answering": zhnlp.AutoModelForQuestionAnswering}


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


def case(name: str):
    """(meta, checkpoint directory, inputs, reference outputs) of fixture case ``name``."""
    root = FIXTURE / name
    meta = json.loads((root / "meta.json").read_text())
    return (meta, root / "hf", load_file(str(root / "inputs.safetensors")),
            load_file(str(root / "reference.safetensors")))


def run(model, batch: dict) -> dict:
    """The model's outputs and every layer's hidden states (the plain call takes the fast paths, the
    hidden-states call the padded layout), named as in reference.safetensors."""
    with torch.no_grad():
        out = dict(model(**batch))
        out.update({f"hidden_states.{i}": h for i, h in
                    enumerate(model(**batch, output_hidden_states=True).hidden_states)})
    return out


def assert_matches(out: dict, ref: dict, what: str, atol: float = 1e-5) -> None:
    assert set(ref) <= set(out), f"{what}: missing {sorted(set(ref) - set(out))}"
    for k, v in ref.items():
        assert out[k].shape == v.shape, f"{what}: {k} {tuple(out[k].shape)} vs {tuple(v.shape)}"
        diff = (out[k].float() - v.float()).abs().max().item()
        assert diff <= atol, f"{what}: {k} differs by {diff:.2e}"


def test_fixture_covers_every_head():
    heads = {json.loads((FIXTURE / n / "meta.json").read_text())["head"] for n in CASES}
    assert heads == set(AUTO)
    assert set(zhnlp.models.family_for_model_type("ernie_m").bridge.HEAD_PARTS) == set(AUTO)


@pytest.mark.parametrize("name", CASES)
def test_outputs_losses_and_hidden_states_match_transformers(name):
    meta, path, batch, ref = case(name)
    model = AUTO[meta["head"]].from_pretrained(path)
    assert model.fresh_weights == []
    assert model.num_parameters() == meta["num_parameters"]
    assert any(k.startswith("hidden_states.") for k in ref) and ("loss" in ref) == (meta["head"] != "base")
    assert_matches(run(model, batch), ref, name)


def test_defaults_mask_the_pad_id_and_offset_positions():
    """Without an attention mask ErnieM masks the tokens equal to pad_token_id; explicit position ids get the
    offset of 2 as well; token type ids (which ERNIE-M has no table for) change nothing."""
    _, path, batch, ref = case("base")
    extra = load_file(str(FIXTURE / "base" / "extra.safetensors"))
    model = zhnlp.AutoModel.from_pretrained(path)
    ids = batch["input_ids"]
    assert (ids == model.config.pad_token_id).any() and not (batch["attention_mask"] == 1).all()
    with torch.no_grad():
        assert_matches({"h": model(ids).last_hidden_state}, {"h": extra["no_mask.last_hidden_state"]}, "no mask")
        positions = model(**batch, position_ids=extra["position_ids"]).last_hidden_state
        assert_matches({"h": positions}, {"h": extra["positions.last_hidden_state"]}, "position ids")
        assert (positions - ref["last_hidden_state"]).abs().max() > 1e-3  # the positions did change the result
        typed = model(**batch, token_type_ids=torch.ones_like(ids)).last_hidden_state
    assert torch.equal(typed, model(**batch).last_hidden_state)


def test_gradients_match_transformers(tmp_path):
    """Every weight's gradient of the classification loss (eval mode: dropout off), mapped to transformers' names
    through save_pretrained."""
    _, path, batch, _ = case("sequence_classification")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(path)
    model(**batch).loss.backward()
    for p in model.parameters():
        p.data.copy_(p.grad)
    model.save_pretrained(tmp_path / "grads")
    saved = load_file(str(tmp_path / "grads" / "model.safetensors"))
    grads = load_file(str(FIXTURE / "sequence_classification" / "grads.safetensors"))
    assert set(saved) == set(grads)
    for k, g in grads.items():
        assert (saved[k] - g).abs().max() <= 1e-5, k


@pytest.mark.parametrize("name", CASES)
def test_save_pretrained_round_trip(tmp_path, name):
    """zhnlp writes transformers 4.x's files (keys, values, config.json with the right class) and loads them
    back with identical outputs. (That transformers 4.x itself loads them is checked by the fixture script.)"""
    meta, path, batch, ref = case(name)
    model = AUTO[meta["head"]].from_pretrained(path)
    model.save_pretrained(tmp_path / "zh")
    theirs, ours = load_file(str(path / "model.safetensors")), load_file(str(tmp_path / "zh" / "model.safetensors"))
    assert set(ours) == set(theirs)
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), k
    original = json.loads((path / "config.json").read_text())
    written = json.loads((tmp_path / "zh" / "config.json").read_text())
    assert written["architectures"] == original["architectures"] == [meta["hf_class"]]
    for k in set(original) - {"transformers_version", "torch_dtype"}:  # (transformers 4 omits default labels)
        assert written[k] == original[k], k
    again = AUTO[meta["head"]].from_pretrained(tmp_path / "zh")
    out, back = run(model, batch), run(again, batch)
    for k in ref:
        assert torch.equal(out[k], back[k]), k


def test_task_checkpoints_load_into_other_heads(caplog):
    """A classification checkpoint loads as the base model (its classifier ignored) and as a token classifier
    (its pooler ignored, the classifier reused as transformers does)."""
    _, path, batch, ref = case("sequence_classification")
    base = zhnlp.AutoModel.from_pretrained(path)
    assert base.fresh_weights == []
    with torch.no_grad():
        assert_matches({"h": base(**batch).last_hidden_state}, {"h": ref["hidden_states.4"]}, "base")
    tagger = zhnlp.AutoModelForTokenClassification.from_pretrained(path)
    logits = tagger(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert tagger.fresh_weights == [] and logits.shape == (*batch["input_ids"].shape, 3)
    _, path, _, _ = case("base")
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        span = zhnlp.AutoModelForQuestionAnswering.from_pretrained(path)
    assert span.fresh_weights == ["qa_outputs.bias", "qa_outputs.weight"]
    assert "has no weights for qa_outputs.bias, qa_outputs.weight" in caplog.text


def test_activation_dropout_applies_in_training_only():
    """act_dropout drops FFN activations in training (and nothing else does when the other rates are 0)."""
    _, path, batch, _ = case("token_classification")
    quiet = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    plain = zhnlp.AutoModelForTokenClassification.from_pretrained(path, act_dropout=0.0, **quiet)
    dropped = zhnlp.AutoModelForTokenClassification.from_pretrained(path, act_dropout=0.5, **quiet)
    with torch.no_grad():
        reference = plain(**batch).logits
        assert torch.equal(plain.train()(**batch).logits, reference)
        assert torch.equal(dropped(**batch).logits, reference)  # eval mode
        assert (dropped.train()(**batch).logits - reference).abs().max() > 1e-3


@pytest.mark.parametrize("head", sorted(AUTO))
def test_full_shapes_describe_the_built_model(head):
    """bridge.full_shapes (checked against a checkpoint before any stage is built) equals the built model's."""
    from zhnlp.conversion import engine
    from zhnlp.models.common.pretrained import PretrainedModel

    family = zhnlp.models.family_for_model_type("ernie_m")
    arch = family.config_class.from_json_file(FIXTURE / "token_classification" / "hf" / "config.json", num_labels=2)
    model = PretrainedModel(family, arch, head, {"perform_initialization": False})
    table, shapes = family.bridge.table(arch), family.bridge.full_shapes(arch)
    names = engine.global_param_names(model.chunks[0])
    for local, p in model.chunks[0].named_parameters():
        mapping, _ = table.find(names[local])
        assert shapes[mapping.megatron] == tuple(p.shape), names[local]


def test_tokenizer_and_model_run_in_a_pipeline(tmp_path):
    """A checkpoint directory with ERNIE-M's tokenizer files: the text-classification pipeline gives the labels'
    probabilities of the model run on the tokenizer's ids (the token types it also returns are ignored)."""
    shutil.copytree(FIXTURE / "sequence_classification" / "hf", tmp_path / "model")
    for f in (FIXTURE / "tokenizer").iterdir():
        shutil.copy(f, tmp_path / "model" / f.name)
    texts = ["服务很好，下次还来。", "What is ERNIE-M?"]
    tok = zhnlp.AutoTokenizer.from_pretrained(tmp_path / "model")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")
    batch = tok(texts, padding=True, return_tensors="pt")
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask"}
    with torch.no_grad():
        probs = model(**batch).logits.softmax(-1)
    got = zhnlp.pipeline("text-classification", model=str(tmp_path / "model"), top_k=None)(texts)
    for row, scores in zip(probs, got):
        assert {s["label"]: round(s["score"], 5) for s in scores} == {
            name: round(p.item(), 5) for name, p in zip(("negative", "neutral", "positive"), row)}


# ---------------------------------------------------------------- what ERNIE-M does not have
def test_masked_lm_is_refused_with_the_common_message():
    _, path, _, _ = case("base")
    message = (r"model_type 'ernie_m' has no mlm head in zhnlp, so AutoModelForMaskedLM cannot load it; it needs a "
               r"model family with the mlm head\. This model loads with AutoModel, "
               r"AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoModelForQuestionAnswering")
    with pytest.raises(CheckpointError, match=message):
        zhnlp.AutoModelForMaskedLM.from_pretrained(path)
    with pytest.raises(CheckpointError, match="the config: model_type 'ernie_m' has no mlm head in zhnlp"):
        zhnlp.AutoModelForMaskedLM.from_config({"model_type": "ernie_m", "vocab_size": 100, "hidden_size": 8,
                                                "num_attention_heads": 2, "intermediate_size": 8,
                                                "num_hidden_layers": 1})


def _with_config(tmp_path, name: str, **changes) -> Path:
    target = tmp_path / name
    shutil.copytree(FIXTURE / name / "hf", target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("changes,message", [
    (dict(position_embedding_type="relative_key"),
     r"config\.json sets position_embedding_type='relative_key', which zhnlp does not support \(only absolute"),
    (dict(is_decoder=True), r"config\.json sets is_decoder=True, which zhnlp does not support \(ERNIE-M is an encoder"),
    (dict(hidden_act="swiglu"), r"hidden_act 'swiglu' is not supported; known: "),
    (dict(pad_token_id=9999), r"pad_token_id=9999 must be a token id in \[0, 342\)"),
    (dict(max_position_embeddings=2), r"max_position_embeddings=2 is not a valid size; it must be an integer >= 3"),
    (dict(act_dropout=1.5), r"act_dropout=1\.5 is not valid; it must be a number in \[0, 1\)"),
    (dict(dropout=0.3, classifier_dropout=0.2),
     r"sets both dropout=0\.3 and classifier_dropout=0\.2, which transformers reads as the same setting"),
])
def test_unsupported_or_invalid_configs_are_refused(tmp_path, changes, message):
    path = _with_config(tmp_path, "base", **changes)
    with pytest.raises(CheckpointError, match=re.escape(str(path / "config.json")) + ":? " + message):
        zhnlp.AutoModel.from_pretrained(path)


def test_span_head_needs_two_labels(tmp_path):
    path = _with_config(tmp_path, "question_answering", num_labels=3, id2label=None)
    with pytest.raises(CheckpointError, match=r"ErnieMForQuestionAnswering sizes its span layer by num_labels, which "
                                              r"must be 2 \(start and end logits\), but the config has num_labels=3"):
        zhnlp.AutoModelForQuestionAnswering.from_pretrained(path)


def test_transformers_attribute_aliases():
    """ErnieMConfig's attribute_map: ``num_classes`` is num_labels, ``dropout`` is classifier_dropout."""
    config = zhnlp.AutoConfig.from_dict({"model_type": "ernie_m", "num_classes": 4, "dropout": 0.3})
    assert (config.num_labels, config.classifier_dropout, config.head_dropout) == (4, 0.3, 0.3)
    assert config.to_dict()["classifier_dropout"] == 0.3 and "dropout" not in config.to_dict()
    default = zhnlp.AutoConfig.for_model("ernie_m", act_dropout=None)
    assert (default.activation_dropout, default.head_dropout, default.pad_token_id) == (0.1, 0.1, 1)
