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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blockwise_cross_entropy_equals_f_cross_entropy(dtype, monkeypatch):
    """Loss and gradient of zhnlp's blockwise cross-entropy are F.cross_entropy's on float32 logits, with padded
    vocabulary columns (no part in the softmax, zero gradient), -100 rows (no loss, zero gradient) and blocks of
    rows that do not divide the batch."""
    from zhnlp.models.common import cross_entropy as CE

    monkeypatch.setattr(CE, "BLOCK_ELEMENTS", 3 * 37)  # blocks of 3 rows: 20 rows end in a partial block
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(20, 40, generator=g) * 5).to(dtype)  # 37 real columns + 3 of padding
    target = torch.randint(0, 37, (20,), generator=g)
    target[[0, 7, 19]] = -100
    x = logits.clone().requires_grad_()
    y = logits.clone().requires_grad_()
    got = CE.cross_entropy(x, target, columns=37)
    ref = F.cross_entropy(y[:, :37].float(), target, ignore_index=-100)
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)
    (got * 3).backward()
    (ref * 3).backward()
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.float(), y.grad.float(), rtol=0, atol=1e-7 if dtype == torch.float32 else 1e-3)
    assert x.grad[:, 37:].abs().max() == 0 and x.grad[[0, 7, 19]].abs().max() == 0


def test_blockwise_cross_entropy_edge_cases():
    from zhnlp.models.common.cross_entropy import cross_entropy

    x = torch.randn(4, 10, requires_grad=True)
    none = cross_entropy(x, torch.full((4,), -100))  # nothing to count: NaN like torch, and no gradient
    assert torch.isnan(none) and torch.isnan(F.cross_entropy(x.detach(), torch.full((4,), -100)))
    none.backward()
    assert x.grad.abs().max() == 0
    with pytest.raises(IndexError, match="label 10 is out of range for a vocabulary of 10"):
        cross_entropy(x, torch.tensor([1, 2, 3, 10]))
    with pytest.raises(IndexError, match="label 8 is out of range for a vocabulary of 8"):
        cross_entropy(x, torch.tensor([1, 8, 3, 2]), columns=8)  # a padding column is no label either


def _plain_tied_grads(chunk, batch):
    """Gradients of ``chunk`` for ``batch`` with its embedding lookup and output projection through plain autograd
    (F.embedding / F.linear), the reference for the shared-gradient path."""
    from zhnlp.models.common import embeddings as E
    from zhnlp.models.common import linear as L

    with mock.patch.object(E._TiedLookup, "apply", lambda ids, w, slot: F.embedding(ids, w)), \
            mock.patch.object(L._TiedProjection, "apply", lambda x, w, b, slot: F.linear(x, w, b)):
        chunk.zero_grad(set_to_none=True)
        chunk(**batch)["loss"].backward()
    return {n: p.grad.clone() for n, p in chunk.named_parameters() if p.grad is not None}


def test_tied_embedding_gradient_meets_the_output_layers_in_one_tensor(tmp_path):
    """With tied weights on one rank the embedding's gradient rows are added into the output layer's weight gradient:
    the same numbers as autograd's sum of two tensors, for one forward, for two forwards accumulated before one
    backward, and for a loss that never reads the logits (the lookup then starts from zeros)."""
    hf_model("tied", seed=0).save_pretrained(tmp_path / "hf")
    chunk = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").chunks[0]
    chunk.train()
    a, b = inputs(seed=1), inputs(seed=2)
    with zhnlp.distributed.cpu.scope():
        ref = _plain_tied_grads(chunk, a)
        name = "embedding.word_embeddings.weight"
        assert name in ref and chunk.output_layer.weight is None  # one shared parameter
        chunk.zero_grad(set_to_none=True)
        chunk(**a)["loss"].backward()
        for n, g in ref.items():
            torch.testing.assert_close(chunk.get_parameter(n).grad, g, rtol=0, atol=1e-6, msg=n)

        # two graphs alive at once: each forward's slot carries its own projection gradient
        ref_b = _plain_tied_grads(chunk, b)
        chunk.zero_grad(set_to_none=True)
        (chunk(**a)["loss"] + chunk(**b)["loss"]).backward()
        torch.testing.assert_close(chunk.get_parameter(name).grad, ref[name] + ref_b[name], rtol=0, atol=1e-6)

        # a loss on the hidden states only: no projection gradient arrives, the rows still do
        chunk.zero_grad(set_to_none=True)
        emb = chunk.embedding(a["input_ids"], tied_grad=zhnlp.models.common.linear.TiedWeightGrad())
        (emb ** 2).sum().backward()
        expected = torch.zeros_like(chunk.get_parameter(name))
        rows = (2 * emb.detach()).transpose(0, 1).reshape(-1, emb.shape[-1])  # d/d emb of the sum of squares, (b*s, h)
        expected.index_add_(0, a["input_ids"].reshape(-1), rows)
        torch.testing.assert_close(chunk.get_parameter(name).grad, expected, rtol=0, atol=1e-6)
