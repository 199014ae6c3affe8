"""zhnlp against transformers in one process: every family and head, padded batches, losses,
and the HF -> zhnlp -> HF round trip."""

import pytest
import torch

import zhnlp
from tests.tiny import CONFIGS, hf_model, inputs

AUTO = {
    "base": zhnlp.AutoModel,
    "mlm": zhnlp.AutoModelForMaskedLM,
    "sequence_classification": zhnlp.AutoModelForSequenceClassification,
    "token_classification": zhnlp.AutoModelForTokenClassification,
    "question_answering": zhnlp.AutoModelForQuestionAnswering,
}


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


@pytest.mark.parametrize("head", list(AUTO))
@pytest.mark.parametrize("name", list(CONFIGS))
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
        torch.testing.assert_close(out[k], ref[k], rtol=0, atol=1e-5, msg=f"{name}/{head}: {k}")
    if head not in ("base",):
        assert out.loss is not None


@pytest.mark.parametrize("head", list(AUTO))
@pytest.mark.parametrize("name", list(CONFIGS))
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
        torch.testing.assert_close(model(ids).last_hidden_state, hf(ids).last_hidden_state, rtol=0, atol=1e-5)


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
