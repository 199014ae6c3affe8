"""The CPU compatibility layer for megatron-core: what it maps, and what it leaves alone."""

import pytest
import torch

import zhnlp
from zhnlp.distributed import cpu

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the layer is only installed without CUDA")


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()


def test_cuda_devices_map_to_the_cpu_only_inside_the_mode():
    with cpu.device_mode():
        for device in ("cuda", "cuda:0", torch.device("cuda"), 0, torch.cuda.current_device()):
            assert torch.zeros(2, device=device).device.type == "cpu"
        assert torch.ones(2).to("cuda").device.type == "cpu"
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"  # what megatron's optimizer compares
    assert torch.ones(2).type() == "torch.FloatTensor"
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(2, device="cuda")  # outside the mode nothing is redirected


def test_megatron_rng_tracker_forks_the_cpu_generator():
    """Inside zhnlp's scope (a forward, a training step) megatron's RNG tracker forks the CPU generator."""
    from megatron.core import tensor_parallel

    with cpu.scope():
        zhnlp.distributed.set_seed(7)
        before = torch.get_rng_state()
        with tensor_parallel.get_cuda_rng_tracker().fork():
            inside = torch.rand(4)
        assert torch.equal(torch.get_rng_state(), before), "the fork must restore the default stream"
        zhnlp.distributed.set_seed(7)
        with tensor_parallel.get_cuda_rng_tracker().fork():
            assert torch.equal(torch.rand(4), inside), "the model-parallel stream is seeded deterministically"
        # the model-parallel stream differs from the default one (seed + 2718 + tp_rank)
        zhnlp.distributed.set_seed(7)
        assert not torch.equal(torch.rand(4), inside)


def test_torch_cuda_is_patched_only_inside_the_scope_and_scopes_nest():
    real = torch.cuda.current_device
    assert not cpu.active()
    with cpu.scope():
        assert torch.cuda.current_device() == torch.device("cpu") and cpu.active()
        with cpu.device_mode():  # nested: still patched, the mode on top
            assert torch.zeros(1, device="cuda").device.type == "cpu"
        assert torch.cuda.current_device() == torch.device("cpu"), "leaving the inner scope keeps the outer one"
        assert torch.ones(1).cuda().device.type == "cpu"
    assert torch.cuda.current_device is real and not cpu.active()
    assert "cuda" not in torch.Tensor.__dict__, "Tensor.cuda is torch's own again"
    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.get_rng_state()
    with pytest.raises(ValueError, match="boom"), cpu.scope():  # an error inside still restores torch
        raise ValueError("boom")
    assert torch.cuda.current_device is real


def _function(module: str):
    """A custom autograd Function, as if defined in ``module``, whose backward allocates on "cuda"."""

    class AllocatesOnCuda(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2 + torch.zeros(grad.shape, device="cuda")

    AllocatesOnCuda.__module__ = module
    return AllocatesOnCuda


def test_megatron_backward_functions_run_in_the_mode():
    """The autograd engine clears the mode stack for backward; megatron's Functions get it back,
    other libraries' Functions do not."""
    x = torch.randn(3, requires_grad=True)
    _function("megatron.core.tensor_parallel.fake").apply(x).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    y = torch.randn(3, requires_grad=True)
    with pytest.raises((RuntimeError, AssertionError)):
        _function("someone_else").apply(y).sum().backward()


def test_layout_reports_the_world_of_one():
    lay = zhnlp.distributed.layout()
    assert (lay.tp, lay.pp, lay.dp, lay.world_size, lay.backend) == (1, 1, 1, 1, "gloo")
    assert lay.is_first_stage and lay.is_last_stage
