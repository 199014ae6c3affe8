"""zhnlp against transformers in one process: every family and head, padded batches, losses,
and the HF -> zhnlp -> HF round trip."""

import pytest
import torch

import zhnlp
from tests.tiny import CASES, CONFIGS, hf_model, inputs

AUTO = {
    "base": zhnlp.AutoModel,
    "mlm": zhnlp.AutoModelForMaskedLM,
    "sequence_classification": zhnlp.AutoModelForSequenceClassification,
    "token_classification": zhnlp.AutoModelForTokenClassification,
    "question_answering": zhnlp.AutoModelForQuestionAnswering,
    "pretraining": zhnlp.AutoModelForPreTraining,
}


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


@pytest.mark.parametrize("name,head", CASES)
def test_outputs_and_loss_match_transformers(tmp_path, name, head):
    hf = hf_model(name, head)
    hf.save_pretrained(tmp_path / "hf")
    model = AUTO[head].from_pretrained(tmp_path / "hf")
    batch = inputs(name, head)
    with torch.no_grad():
        ref, out = hf(**batch), model(**batch)
    keys = [k for k in ("loss", "logits", "last_hidden_state", "pooler_output", "start_logits", "end_logits")
            if getattr(ref, k, None) is not None]
    assert keys, "reference produced no outputs"
    for k in keys:
        assert out[k].shape == ref[k].shape, k
        torch.testing.assert_close(out[k].cpu(), ref[k], rtol=0, atol=1e-5, msg=f"{name}/{head}: {k}")
    if head not in ("base",):
        assert out.loss is not None


@pytest.mark.parametrize("name,head", CASES)
def test_round_trip_is_bit_exact(tmp_path, name, head):
    hf = hf_model(name, head, seed=1)
    hf.save_pretrained(tmp_path / "hf")
    AUTO[head].from_pretrained(tmp_path / "hf").save_pretrained(tmp_path / "zh")
    back = type(hf).from_pretrained(tmp_path / "zh").eval()
    a, b = hf.state_dict(), back.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert back.config.to_dict()["model_type"] == CONFIGS[name]["model_type"]


def test_unpadded_batch_and_defaults(tmp_path):
    """No attention mask, no token types: transformers' defaults (all ones, all zeros)."""
    hf = hf_model("ernie3", "base")
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModel.from_pretrained(tmp_path / "hf")
    ids = inputs("ernie3", "base")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).last_hidden_state.cpu(), hf(ids).last_hidden_state, rtol=0, atol=1e-5)


def test_fine_tuning_step_matches_transformers(tmp_path):
    """Gradients of the loss (dropout off) equal transformers' for every weight."""
    hf = hf_model("ernie3", "sequence_classification", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf")
    model.train()
    hf.train()
    batch = inputs("ernie3", "sequence_classification")
    hf(**batch).loss.backward()
    model(**batch).loss.backward()
    grads = {n: p.grad for n, p in hf.named_parameters()}
    # map the gradients through the conversion table: put them in place of the weights and save
    for p in model.parameters():
        p.data.copy_(p.grad)
    model.save_pretrained(tmp_path / "grads")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "grads" / "model.safetensors"))
    for name, g in grads.items():
        torch.testing.assert_close(saved[name], g, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("extra,labels", [
    (dict(num_labels=1), torch.tensor([0.5, -1.0, 2.0, 0.0])),                       # regression
    (dict(num_labels=3, problem_type="multi_label_classification"),
     torch.tensor([[1.0, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])),                    # multi-label
    (dict(num_labels=5, classifier_dropout=0.3, hidden_act="gelu_new"), torch.tensor([4, 0, 2, 1])),
    (dict(num_labels=2, hidden_act="quick_gelu", layer_norm_eps=1e-7, max_position_embeddings=20),
     torch.tensor([1, 0, 0, 1])),
])
def test_other_configurations(tmp_path, extra, labels):
    hf = hf_model("bert", "sequence_classification", **extra)
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf")
    batch = dict(inputs("bert", "base"), labels=labels)
    with torch.no_grad():
        ref, out = hf(**batch), model(**batch)
    torch.testing.assert_close(out.logits.cpu(), ref.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.loss.cpu(), ref.loss, rtol=0, atol=1e-5)


def test_bfloat16_runs_close_to_float32(tmp_path):
    hf = hf_model("ernie3", "mlm")
    hf.save_pretrained(tmp_path / "hf")
    batch = inputs("ernie3", "mlm")
    ref = zhnlp.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf")(**batch)
    out = zhnlp.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", dtype="bfloat16")(**batch)
    assert out.logits.dtype == torch.bfloat16
    assert (out.logits.float() - ref.logits).abs().max() < 0.1
    assert abs(out.loss.item() - ref.loss.item()) < 0.05


def test_unsupported_position_embeddings_are_refused(tmp_path):
    hf_model("bert", "base", position_embedding_type="relative_key").save_pretrained(tmp_path / "hf")
    with pytest.raises(zhnlp.CheckpointError, match="position_embedding_type='relative_key'"):
        zhnlp.AutoModel.from_pretrained(tmp_path / "hf")


@pytest.mark.parametrize("padding", ["left", "right", "none"])
def test_sequence_classification_padding_sides(tmp_path, padding):
    """Right-padded batches run without their padding tokens, left-padded ones in the padded
    layout: both must give transformers' logits, loss and gradients."""
    hf = hf_model("ernie3", "sequence_classification", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").train()
    hf.train()
    batch = inputs("ernie3", "sequence_classification")
    if padding == "left":
        batch["attention_mask"] = batch["attention_mask"].flip(1)
    elif padding == "none":
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    ref, out = hf(**batch), model(**batch)
    torch.testing.assert_close(out.logits.cpu(), ref.logits, rtol=0, atol=1e-5)
    ref.loss.backward()
    out.loss.backward()
    word = model.chunks[0].embedding.word_embeddings.weight.grad[: hf.config.vocab_size]
    torch.testing.assert_close(word.cpu(), hf.ernie.embeddings.word_embeddings.weight.grad, rtol=0, atol=1e-5)
