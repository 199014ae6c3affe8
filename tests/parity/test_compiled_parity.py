"""Compiled mode (``from_pretrained(..., compile=True)``) against transformers in one process: the encoder's
classifier on padded batches of three lengths (padding dropped, [CLS]-only last layer: the opaque attention op)
with no more than one recompile for the new lengths, and its fine-tuning gradients; the decoder's logits and loss,
and a mixture-of-experts decoder compiled around its MoE blocks."""

import pytest
import torch
from safetensors.torch import load_file
from torch._dynamo.utils import counters

import zhnlp
from tests import tiny, tiny_decoder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


def test_compiled_classifier_matches_transformers(tmp_path):
    hf = tiny.hf_model("ernie3", "sequence_classification", hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", compile=True)
    assert model.compiled
    counters.clear()
    for seq in (12, 9, 11):  # padded batches: the packed path; a second length recompiles once, dynamic
        batch = tiny.inputs("ernie3", "sequence_classification", seq=seq)
        with torch.no_grad():
            ref, out = hf(**batch), model(**batch)
        torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-5, msg=f"length {seq}")
        torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-5, msg=f"length {seq}")
    # two layer kinds (all positions, [CLS] only), each static then dynamic: the third length compiles nothing
    assert counters["stats"]["unique_graphs"] <= 4
    assert not counters["graph_break"], dict(counters["graph_break"])

    model.train()
    hf.train()
    batch = tiny.inputs("ernie3", "sequence_classification")
    hf(**batch).loss.backward()
    model(**batch).loss.backward()
    for p in model.parameters():  # the gradients through the conversion table, as in test_parity_single
        p.data.copy_(p.grad)
    model.save_pretrained(tmp_path / "grads")
    saved = load_file(str(tmp_path / "grads" / "model.safetensors"))
    for name, p in hf.named_parameters():
        torch.testing.assert_close(saved[name], p.grad, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_compiled_decoder_matches_transformers(tmp_path, moe):
    hf = tiny_decoder.hf_moe_model("moe_shared") if moe else tiny_decoder.hf_model("tied")
    hf.save_pretrained(tmp_path / "hf")
    model = zhnlp.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", compile=True)
    batch = tiny_decoder.inputs()
    with torch.no_grad():
        ref, out = hf(**batch), model(**batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out.logits[real], ref.logits[real], rtol=0, atol=2e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=1e-5)
    prompt = batch["input_ids"][:, :5]  # generation runs the layers eagerly (the KV cache), with transformers' tokens
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(prompt, max_new_tokens=4, eos_token_id=[]), expected)
