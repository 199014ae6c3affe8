"""Input embeddings: the vocabulary-parallel word embedding (whose gradient can meet a tied output layer's in
place) and the encoders' sum word + token type + position (+ ERNIE task type), optionally factorised (a narrower
table projected to the hidden size: ALBERT, ELECTRA, RoFormer)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from zhnlp.models.common.layers import LayerNorm
from zhnlp.models.common.linear import TiedWeightGrad


class VocabEmbedding(tensor_parallel.VocabParallelEmbedding):
    """megatron's vocabulary-parallel word embedding (rows split over TP ranks, output all-reduced). Called with
    ``tied_grad`` (the same :class:`TiedWeightGrad` the tied output layer of this forward gets), its weight gradient
    is the output layer's with the looked-up rows added in place: one gradient tensor instead of three."""

    def forward(self, input_, tied_grad: TiedWeightGrad | None = None):
        if tied_grad is None or not (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(input_)
        if self.tp_group.size() > 1:
            outside = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)  # rows of other ranks
            local = (input_ - self.vocab_start_index).masked_fill(outside, 0)
            out = _TiedLookup.apply(local, self.weight, tied_grad).masked_fill(outside.unsqueeze(-1), 0.0)
        else:
            out = _TiedLookup.apply(input_, self.weight, tied_grad)
        if self.reduce_scatter_embeddings:  # [b, s, h] -> [s/tp, b, h]
            return tensor_parallel.reduce_scatter_to_sequence_parallel_region(
                out.transpose(0, 1).contiguous(), group=self.tp_group)
        return tensor_parallel.reduce_from_tensor_model_parallel_region(out, group=self.tp_group)


class _TiedLookup(torch.autograd.Function):
    """``F.embedding(ids, weight)``; backward adds the rows' gradients into the tied output layer's weight
    gradient (left in ``slot`` by its backward, which runs first) and returns that as the weight's gradient. Without
    one (a loss that never read the logits) the rows go into a table of zeros, as ``F.embedding`` does."""

    @staticmethod
    def forward(ctx, ids, weight, slot):
        ctx.save_for_backward(ids)
        ctx.slot, ctx.weight_shape = slot, weight.shape
        return F.embedding(ids, weight)  # (*ids.shape, h)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        table, ctx.slot.grad = ctx.slot.grad, None
        if table is None:
            table = grad.new_zeros(ctx.weight_shape)
        table.index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]).to(table.dtype))
        return None, table, None


class EncoderEmbeddings(MegatronModule):
    """Sum of the embeddings, LayerNorm and dropout, then (factorised embeddings) a projection to the hidden size;
    output ``(s, b, h)``.

    The word embedding is vocabulary-parallel (rows split across TP ranks, output all-reduced);
    position, token-type and task-type tables are small and replicated. The LayerNorm runs on
    the full sequence before it is scattered for sequence parallelism, so its gradients are
    already identical on every TP rank.

    ``embedding_size`` (default: the hidden size) is the tables' width. ALBERT, ELECTRA and RoFormer use narrower
    tables: the normalised, dropped-out sum is then projected to the hidden size by ``projection`` (a replicated
    linear layer, applied to the whole sequence before any sequence-parallel split). ``max_position_embeddings`` 0
    means no position table (rotary positions are applied inside attention instead).
    """

    def __init__(self, config, vocab_size: int, max_position_embeddings: int, type_vocab_size: int,
                 task_type_vocab_size: int, layer_norm_eps: float, embedding_size: int | None = None):
        super().__init__(config=config)
        h, dtype = config.hidden_size, config.params_dtype
        e = embedding_size or h
        self.word_embeddings = tensor_parallel.VocabParallelEmbedding(
            vocab_size, e, init_method=config.init_method, config=config)
        self.position_embeddings = (torch.nn.Embedding(max_position_embeddings, e, dtype=dtype)
                                    if max_position_embeddings else None)
        self.token_type_embeddings = torch.nn.Embedding(type_vocab_size, e, dtype=dtype) if type_vocab_size else None
        self.task_type_embeddings = (torch.nn.Embedding(task_type_vocab_size, e, dtype=dtype)
                                     if task_type_vocab_size else None)
        self.layernorm = LayerNorm(config, e, eps=layer_norm_eps, sequence_parallel=False)
        self.projection = torch.nn.Linear(e, h, dtype=dtype) if embedding_size is not None else None

    def forward(self, input_ids, position_ids=None, token_type_ids=None, task_type_ids=None):
        # all inputs: (b, s) int64
        x = self.word_embeddings(input_ids)  # (b, s, e)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        if self.task_type_embeddings is not None:
            x = x + self.task_type_embeddings(task_type_ids)
        x = self.layernorm(x)
        if self.projection is not None:
            # Dropout before the projection, on the whole sequence: the same mask on every TP rank.
            x = self.projection(F.dropout(x, p=self.config.hidden_dropout, training=self.training))
        x = x.transpose(0, 1).contiguous()  # (s, b, h)
        if self.config.sequence_parallel:
            x = tensor_parallel.scatter_to_sequence_parallel_region(x)  # (s/tp, b, h)
            # Each rank now holds different tokens: draw their dropout from the per-rank stream.
            rng = tensor_parallel.get_cuda_rng_tracker().fork()
        else:
            rng = nullcontext()
        if self.projection is None:
            with rng:
                x = F.dropout(x, p=self.config.hidden_dropout, training=self.training)
        return x
