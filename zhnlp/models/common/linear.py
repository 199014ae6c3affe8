"""megatron's tensor-parallel linears, computed with ``F.linear``.

megatron-core's linears run ``matmul`` and add the bias separately (or hand the bias back to
the caller with ``skip_bias_add``), which on a GPU is fused later. On a CPU that leaves an
extra full pass over every activation. These subclasses keep megatron's parameters,
attributes and communication (copy / all-reduce / sequence-parallel gather and
reduce-scatter from ``megatron.core.tensor_parallel.mappings``) and compute the GEMM with
the bias fused (``addmm``) wherever the bias may be added before the communication:

* column-parallel: the bias is sharded like the output, so it is always fused; the layer
  returns ``(output, None)`` even with ``skip_bias_add`` (callers add a None bias as nothing);
* row-parallel: the partial outputs are summed across ranks first, so the bias is fused only
  when tensor parallelism is off; otherwise it is added (or handed back) after the reduction.

MoE experts (``is_expert``) under expert or tensor parallelism communicate nothing here: megatron marks
them ``explicit_expert_comm`` because the token dispatcher moves their inputs and outputs.

Products of more than :data:`SPLIT_ROWS` rows on a CPU (fp32 or bf16; training and inference) go through
oneDNN's matmul (:mod:`zhnlp.models.common.onednn`), which picks its code path from the CPU's instruction set; MKL's
``sgemm`` behind ``F.linear`` takes an AVX2 path on AMD processors. Measured on this 2-core AMD EPYC: forward 24 ms
against 60 ms, each backward product 21 ms against 40 ms (1024 tokens x 768 -> 3072), and the ERNIE 4.5 dense
training step of ``benchmarks/bench_llm.py`` 1.77x transformers' (1.04-1.10x with MKL). Equal to ``F.linear`` to
float32 rounding; parity with transformers is tested on both paths.

Skinny products on a CPU (:func:`linear`): without autograd and with at most :data:`SPLIT_ROWS` input rows (the
decoding step of generation, the last position of a prompt), the output features are cut into one block per
intra-op thread and the blocks computed as one batched product, each thread streaming its own rows of the
weight. A single ``F.linear`` there leaves a second core mostly idle (MKL's skinny GEMM/GEMV); the batched form
computes each output element as a dot product over the same inputs, so the results agree to rounding (a
different kernel may sum in another order; at the 0.3B widths they are mostly bit-identical). Measured on this 2-core
machine (``benchmarks/bench_llm.py``): the 0.3B shape's decoding step is about 1.5x faster.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel import mappings as M

from zhnlp.models.common import onednn


SPLIT_ROWS = 64  # at most this many rows (tokens) take the split product; measured faster up to ~128 on 2 cores


def _blocks(out_features: int) -> int:
    """The number of output blocks for the split product: the most intra-op threads that divide the features."""
    for parts in range(torch.get_num_threads(), 1, -1):
        if out_features % parts == 0:
            return parts
    return 1


def linear(input_, weight, bias=None):
    """``F.linear(input_, weight, bias)``; on a CPU, through oneDNN for many rows, and without autograd for few
    rows as one batched product over blocks of output features (one per thread; equal to rounding, see the
    module's docstring). Traced by ``torch.compile`` (compiled mode): oneDNN on a CPU as well."""
    if torch.compiler.is_compiling():  # inside a compiled layer: one op inductor keeps (oneDNN on a CPU)
        return onednn.onednn_linear(input_, weight, bias) if onednn.available(input_, weight) \
            else F.linear(input_, weight, bias)
    rows = input_.numel() // max(input_.shape[-1], 1)
    if rows > SPLIT_ROWS and onednn.available(input_, weight):
        return onednn.onednn_linear(input_, weight, bias)
    if (input_.device.type != "cpu" or rows > SPLIT_ROWS or rows == 0 or not weight.is_contiguous()
            or (torch.is_grad_enabled() and (input_.requires_grad or weight.requires_grad
                                             or (bias is not None and bias.requires_grad)))):
        return F.linear(input_, weight, bias)
    out_features, in_features = weight.shape
    parts = _blocks(out_features)
    if parts == 1:
        return F.linear(input_, weight, bias)
    x = input_.reshape(1, rows, in_features).expand(parts, rows, in_features)
    w = weight.view(parts, out_features // parts, in_features).transpose(1, 2)  # (parts, in, out/parts)
    if bias is None:
        y = torch.bmm(x, w)
    else:
        y = torch.baddbmm(bias.view(parts, 1, out_features // parts), x, w)
    return y.transpose(0, 1).reshape(*input_.shape[:-1], out_features)


class TiedWeightGrad:
    """One forward's meeting point for the two gradients of a weight shared by the embedding lookup and the output
    projection (a tied decoder whose first and last layers are on one rank).

    Through autograd each use would produce its own vocabulary-sized gradient: the projection's product and the
    lookup's zero-filled table with the looked-up rows added, which autograd then sums (100k x 1k in float32:
    1.2 GB of fresh memory per step, most of a CPU's time outside the matrix products being the kernel zero-filling
    new pages). Instead the projection hands its gradient to this slot (:class:`_TiedProjection`) and the lookup,
    whose backward always runs after it, adds its rows into that tensor in place and returns it as the weight's one
    gradient (:class:`zhnlp.models.common.embeddings.VocabEmbedding`). A slot belongs to one forward call, so graphs
    kept from several forwards (gradient accumulation) do not mix."""

    __slots__ = ("grad",)

    def __init__(self):
        self.grad = None  # (V/tp, h): the projection's weight gradient, until the lookup takes it


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D ``a`` (m, k), ``b`` (k, n): through oneDNN where :func:`linear` uses it (as a linear with
    the strided weight ``b^T``), else ``mm``."""
    if a.shape[0] > SPLIT_ROWS and onednn.available(a, b):
        return onednn.onednn_linear(a, b.t(), None)
    return a.mm(b)


class _TiedProjection(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose weight gradient goes to a :class:`TiedWeightGrad` instead of autograd.
    Shapes: ``x`` ``(..., in)``, ``weight`` ``(out, in)``."""

    @staticmethod
    def forward(ctx, x, weight, bias, slot):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.slot = bias is not None, slot
        return linear(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad2d = grad.reshape(-1, grad.shape[-1])  # (tokens, out)
        grad_x = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad2d, weight).view(x.shape)  # (..., in)
        if ctx.needs_input_grad[1]:
            ctx.slot.grad = _product(grad2d.t(), x.reshape(-1, x.shape[-1]))  # (out, in), new and contiguous
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad2d.sum(0)
        return grad_x, None, grad_b, None


class ColumnLinear(ColumnParallelLinear):
    """Column-parallel linear: output features split across TP ranks. ``tied_grad`` (a model's output layer that
    shares its weight with the embedding on this rank): the weight gradient goes to that :class:`TiedWeightGrad`."""

    def forward(self, input_, weight=None, runtime_gather_output=None, tied_grad: TiedWeightGrad | None = None):
        weight = self.weight if weight is None else weight
        if self.explicit_expert_comm:  # the MoE token dispatcher gathers and scatters
            return linear(input_, weight, self.bias), None
        tp = self.tp_group.size() if self.tp_group is not None else 1
        if self.sequence_parallel:
            input_ = M.gather_from_sequence_parallel_region(input_, group=self.tp_group)  # (s, b, h)
        elif tp > 1:
            input_ = M.copy_to_tensor_model_parallel_region(input_, group=self.tp_group)
        if tied_grad is not None and torch.is_grad_enabled() and weight.requires_grad:
            output = _TiedProjection.apply(input_, weight, self.bias, tied_grad)  # (s, b, out/tp)
        else:
            output = linear(input_, weight, self.bias)  # (s, b, out/tp)
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather and tp > 1:
            output = M.gather_from_tensor_model_parallel_region(output, group=self.tp_group)
        return output, None


class RowLinear(RowParallelLinear):
    """Row-parallel linear: input features split across TP ranks, outputs summed."""

    def forward(self, input_):
        tp = self.tp_group.size() if self.tp_group is not None else 1
        if tp == 1 or self.explicit_expert_comm:  # experts (no biases): the MoE token dispatcher reduces
            return linear(input_, self.weight, self.bias), None
        output = linear(input_, self.weight)  # partial sums (s, b, out)
        if self.sequence_parallel:
            output = M.reduce_scatter_to_sequence_parallel_region(output, group=self.tp_group)
        else:
            output = M.reduce_from_tensor_model_parallel_region(output, group=self.tp_group)
        if self.bias is None or self.skip_bias_add:
            return output, self.bias
        return output + self.bias, None
