"""The speed paths of the decoder (benchmarks/bench_llm.py) give the numbers of the general ones: the TP=1 loss
equals megatron's vocab-parallel loss (padding columns and -100 labels included), and ``last_position_only`` gives
the last position's logits of a full forward."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

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


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_split_cpu_linear_equals_f_linear(threads, rows):
    """The per-thread block product of few rows gives F.linear's numbers (to the rounding of a different GEMM
    kernel); autograd and widths no thread count divides keep F.linear itself."""
    from zhnlp.models.common.linear import SPLIT_ROWS, _blocks, linear

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, 1, 48, generator=g)
        for out in (60, 61):  # 61 has no divisor <= threads: one block, F.linear itself
            w, b = torch.randn(out, 48, generator=g), torch.randn(out, generator=g)
            with torch.no_grad():
                torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
            if out == 61:
                assert torch.equal(linear(x, w, b), F.linear(x, w, b))
                assert linear(x, w, b).shape == (rows, 1, out)
        assert _blocks(60) == threads and _blocks(61) == 1
        wg = torch.randn(60, 48, generator=g, requires_grad=True)
        y = linear(x, wg)
        assert y.grad_fn is not None and "Bmm" not in type(y.grad_fn).__name__
        y.sum().backward()
        torch.testing.assert_close(wg.grad, x.reshape(-1, 48).sum(0).expand(60, 48))
        # which product runs: the split for few rows, F.linear itself (no batched product) beyond SPLIT_ROWS
        many = torch.randn(SPLIT_ROWS + rows, 48, generator=g)
        w, b = torch.randn(60, 48, generator=g), torch.randn(60, generator=g)
        with torch.no_grad(), mock.patch("torch.baddbmm", wraps=torch.baddbmm) as batched:
            linear(x, w, b)
            assert batched.call_count == 1
            assert torch.equal(linear(many, w, b), F.linear(many, w, b))
            assert batched.call_count == 1
    finally:
        torch.set_num_threads(before)
