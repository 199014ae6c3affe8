"""Compiled mode's parts that need no compiling: the flags, its refusals, and the two ops compiled layers call
(oneDNN linear, opaque attention) against the eager computation, gradients included."""

import json

import pytest
import torch
import torch.nn.functional as F

import zhnlp
from zhnlp.cli import main
from zhnlp.errors import LayoutError
from zhnlp.models.common import layers as L
from zhnlp.models.common.onednn import onednn_linear
from zhnlp.training.config import override, recipe


def test_compile_flags(capsys):
    assert main(["pretrain", "--recipe", "ernie-debug", "--compile", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["compile"] is True
    assert main(["finetune", "classification", "--model", "m", "--compile", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["compile"] is True


def test_compile_with_fsdp_is_refused():
    with pytest.raises(LayoutError, match="--compile with --fsdp.*drop one of them"):
        override(recipe("ernie-debug"), compile=True, fsdp=True).check(world_size=2)


def test_no_cxx_compiler_is_one_clear_error(monkeypatch):
    from zhnlp.models.common import compiled

    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    with pytest.raises(compiled.CompileUnavailableError, match="needs a C\\+\\+ compiler.*drop --compile"):
        compiled.check_available(torch.device("cpu"))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_onednn_linear_equals_f_linear(dtype, tol):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(24, 16, generator=g).to(dtype).requires_grad_()
    b = torch.randn(24, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(3, 5, 24, generator=g).to(dtype)
    out = onednn_linear(x, w, b)
    ours = torch.autograd.grad(out, (x, w, b), grad)
    ref = F.linear(x, w, b)
    theirs = torch.autograd.grad(ref, (x, w, b), grad)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e, rtol=tol, atol=tol)


def _attention_inputs(packed: bool):
    """(s, b, nh, hd) float64 query/key/value of a batch of 3 rows of 10, 7 and 4 real tokens, and its mask;
    ``packed``: the real tokens only, row after row, (21, 1, nh, hd)."""
    mask = torch.zeros(3, 1, 1, 10, dtype=torch.bool)
    mask[1, ..., 7:] = True
    mask[2, ..., 4:] = True
    g = torch.Generator().manual_seed(1)
    shape = (21, 1, 2, 4) if packed else (10, 3, 2, 4)
    return [torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)] + [mask]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("first", [False, True], ids=["all-positions", "first-only"])
def test_opaque_attention_equals_eager(packed, first):
    zhnlp.distributed.init()
    q, k, v, mask = _attention_inputs(packed)
    ref = L.sdpa(q, k, v, mask, 0.0, None, first, False)
    out = L.opaque_sdpa(q, k, v, mask, 0.0, None, first, False)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    grad = torch.randn_like(ref)
    for a, e in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-12)

    def with_dropout(q, k, v):  # the same generator state each call: the same masks; backward draws them again
        torch.manual_seed(5)
        return L.opaque_sdpa(q, k, v, mask, 0.3, None, first, False)

    assert not torch.equal(with_dropout(q, k, v), out)
    assert torch.autograd.gradcheck(with_dropout, (q, k, v), eps=1e-6, atol=1e-6)
