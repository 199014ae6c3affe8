"""The speed paths of the decoder (benchmarks/bench_llm.py) give the numbers of the general ones: the TP=1 loss
equals megatron's vocab-parallel loss (padding columns and -100 labels included), and ``last_position_only`` gives
the last position's logits of a full forward."""

import pytest
import torch

import zhnlp
from tests.tiny_decoder import hf_model, inputs
from zhnlp.auto import AutoModelForCausalLM
from zhnlp.models.common import heads as H
from zhnlp.models.common.decoder import vocab_parallel_causal_lm_loss


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()
    yield


def test_tp1_loss_equals_megatrons_vocab_parallel_loss():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 3, 40, generator=g) * 4  # (s, b, Vp): the last 8 columns are vocabulary padding
    labels = torch.randint(0, 32, (3, 7), generator=g)
    labels[0, 2:] = -100
    labels[2, -1] = -100
    ref = H.vocab_parallel_masked_lm_loss(logits, labels, 32, 0)
    got = vocab_parallel_causal_lm_loss(logits, labels, 32, 0, 1)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    x = logits.clone().requires_grad_()
    vocab_parallel_causal_lm_loss(x, labels, 32, 0, 1).backward()
    y = logits.clone().requires_grad_()
    H.vocab_parallel_masked_lm_loss(y, labels, 32, 0).backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=1e-7)


def test_last_position_only_is_the_last_row_of_the_full_logits(tmp_path):
    hf_model("tied", seed=0).save_pretrained(tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    chunk = model.chunks[0]
    ids = inputs()["input_ids"]
    with torch.no_grad(), zhnlp.distributed.cpu.scope():
        full = chunk(ids)["logits"]  # (b, s, V)
        last = chunk(ids, last_position_only=True)["logits"]  # (b, 1, V)
        with pytest.raises(ValueError, match="last_position_only=True is for generation"):
            chunk(ids, labels=ids, last_position_only=True)
    assert last.shape == (ids.shape[0], 1, full.shape[-1])
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=0, atol=1e-5)
