"""Building blocks shared by post-LayerNorm encoders (ERNIE, BERT) on megatron-core.

Shapes follow megatron's convention inside the encoder: ``[s, b, h]`` (sequence first);
under sequence parallelism each tensor-parallel rank holds ``[s/tp, b, h]``.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules
from megatron.core.utils import make_viewless_tensor


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` with megatron's constructor and sequence-parallel marking.

    Under sequence parallelism each rank normalises a different slice of the sequence, so
    the LayerNorm gradients are partial sums: ``finalize_model_grads`` all-reduces every
    parameter flagged ``sequence_parallel`` across the tensor-parallel group.
    (megatron's own no-apex fallback asserts when sequence parallelism is on.)
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, sequence_parallel: bool | None = None):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        sp = config.sequence_parallel if sequence_parallel is None else sequence_parallel
        for p in self.parameters():
            p.sequence_parallel = sp


def is_packed(hidden, attention_mask) -> bool:
    """True when padding has been removed: ``hidden`` is ``(T, 1, ...)`` over the real tokens,
    row after row, while the mask still describes the padded ``(b, s)`` batch."""
    return attention_mask is not None and (
        hidden.shape[1] != attention_mask.shape[0] or hidden.shape[0] != attention_mask.shape[-1])


def real_token_index(attention_mask):
    """Flat positions (row-major, ``b_i * s + position``) of the real tokens of a padded batch,
    from megatron's mask ``(b, 1, 1, s)`` (True = padding): packing keeps each row contiguous."""
    return (~attention_mask[:, 0, 0, :]).reshape(-1).nonzero().squeeze(1)


def row_starts(attention_mask) -> tuple[list[int], list[int]]:
    """Where each row starts in the packed tokens, and its length."""
    lengths = (~attention_mask[:, 0, 0, :]).sum(1).tolist()
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    return starts, lengths


class CoreAttention(MegatronModule):
    """What zhnlp's core attentions share: megatron's core-attention constructor (the arguments its
    SelfAttention passes), keeping the dropout probability and the softmax scale."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type="self", softmax_scale=None,
                 cp_comm_type=None, pg_collection=None, attention_dropout=None):
        super().__init__(config=config)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale


class SDPAttention(CoreAttention):
    """Core attention through ``torch.nn.functional.scaled_dot_product_attention``.

    Takes megatron's per-partition query/key/value ``[s, b, heads/tp, head_dim]`` and an
    optional padding mask ``[b, 1, 1, s]`` in megatron's convention (True = masked out).
    Returns ``[s, b, heads/tp * head_dim]``. Packed inputs ``[T, 1, ...]`` (padding removed,
    see :func:`is_packed`) are attended row by row, each row over its own tokens only.
    """

    first_query_only = False  # see PostLNTransformerLayer.keep_first_token_only

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        dropout_p = self.dropout_p if self.training else 0.0
        # Heads are split across TP ranks, so their dropout masks must differ: use the
        # model-parallel RNG stream (under sequence parallelism the block already forked it).
        forked = dropout_p > 0 and not self.config.sequence_parallel
        args = (query, key, value, attention_mask, dropout_p, self.softmax_scale, self.first_query_only, forked)
        if torch.compiler.is_compiling() and (forked or is_packed(query, attention_mask)):
            return opaque_sdpa(*args)  # compiled mode: what torch.compile cannot trace, as one op
        return sdpa(*args)


def sdpa(query, key, value, attention_mask, dropout_p: float, scale, first_query_only: bool, forked: bool):
    """:class:`SDPAttention`'s computation: ``(s, b, nh, hd)`` in, ``(s, b, nh*hd)`` out (``(1, b, nh*hd)`` with
    ``first_query_only``); packed inputs ``(T, 1, nh, hd)`` row by row. ``forked``: draw the attention dropout from
    megatron's model-parallel RNG stream."""
    with tensor_parallel.get_cuda_rng_tracker().fork() if forked else nullcontext():
        if is_packed(query, attention_mask):
            return _packed(query, key, value, attention_mask, dropout_p, scale, first_query_only)
        if first_query_only:
            query = query[:1]  # (1, b, nh, hd): keys and values keep every position
        s, b, nh, hd = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # (b, nh, s, hd)
        keep = None if attention_mask is None else ~attention_mask  # SDPA: True = attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=scale)
        return out.permute(2, 0, 1, 3).reshape(s, b, nh * hd)  # (s, b, nh*hd)


def _packed(query, key, value, attention_mask, dropout_p, scale, first_query_only):
    """Attention row by row over packed tokens ``(T, 1, nh, hd)``: no mask, no padding keys.
    Returns ``(T, 1, nh*hd)``, or ``(b, 1, nh*hd)`` for each row's first token only."""
    starts, lengths = row_starts(attention_mask)
    outs = []
    for start, n in zip(starts, lengths):
        q = query[start:start + (1 if first_query_only else n)]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, key[start:start + n], value[start:start + n]))  # (1, nh, n, hd)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
        outs.append(out[0].transpose(0, 1))  # (n, nh, hd), a view: cat makes the one copy
    packed = torch.cat(outs)
    return packed.reshape(packed.shape[0], 1, -1)


# ---- compiled mode: the attention torch.compile cannot trace, as one opaque op with its own backward.
# Packed rows are a Python loop over data-dependent lengths, and megatron's RNG tracker swaps generator states; a
# graph break there would fall inside megatron's SelfAttention (within its activation-offloading context, where
# torch.compile cannot resume), leaving the rest of the attention block uncompiled. The op computes the attention
# eagerly (SDPA without dropout; with dropout the math form, as SDPA on a CPU does, with the mask drawn from a
# saved generator state) and its backward is the attention's gradient formula, the dropout mask drawn again from
# that state.

def _segments(query, key, value, mask, first_query_only: bool):
    """``(q, k, v, keep, rows, keys, out)`` per attention problem: ``q, k, v`` ``(B, nh, s, hd)`` for the whole
    batch, or one per packed row; ``rows``/``keys``: the slices of ``query``/``key`` they come from, ``out``: the
    slice of the op's output their result fills (first dimension)."""
    if not is_packed(query, mask):
        rows = slice(0, 1 if first_query_only else query.shape[0])
        keep = None if mask is None else ~mask  # (b, 1, 1, s)
        yield (*(t.permute(1, 2, 0, 3) for t in (query[rows], key, value)), keep, rows, slice(None), slice(None))
        return
    starts, lengths = row_starts(mask)
    for i, (start, n) in enumerate(zip(starts, lengths)):
        rows, keys = slice(start, start + (1 if first_query_only else n)), slice(start, start + n)
        yield (*(t.permute(1, 2, 0, 3) for t in (query[rows], key[keys], value[keys])), None, rows, keys,
               slice(i, i + 1) if first_query_only else rows)


def _dropout_masks(segments, dropout_p: float) -> list:
    """Scaled keep-masks ``(B, nh, sq, sk)`` for each segment, drawn in order from the current generator."""
    if dropout_p == 0:
        return [None] * len(segments)
    return [torch.empty(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=q.dtype, device=q.device)
            .bernoulli_(1 - dropout_p).div_(1 - dropout_p) for q, k, *_ in segments]


def _probs(q, k, keep, scale):
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, sq, sk)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores.softmax(-1)


def _assemble(outs, packed: bool):
    """Per-segment outputs ``(B, nh, sq, hd)`` -> ``(s, b, nh*hd)``, or ``(T, 1, nh*hd)`` packed."""
    if not packed:
        out = outs[0]
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)
    packed_rows = torch.cat([out[0].transpose(0, 1) for out in outs])  # (T, nh, hd)
    return packed_rows.reshape(packed_rows.shape[0], 1, -1)


@torch.library.custom_op("zhnlp::opaque_sdpa", mutates_args=())
def _opaque_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                 dropout_p: float, scale: float, first_query_only: bool,
                 forked: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sdpa` -> (output, the state of the generator its dropout drew from; empty without dropout)."""
    if dropout_p == 0:
        return sdpa(query, key, value, mask, 0.0, scale, first_query_only, False), query.new_empty(0, dtype=torch.uint8)
    with tensor_parallel.get_cuda_rng_tracker().fork() if forked else nullcontext():
        state = _generator_state(query.device)
        segments = list(_segments(query, key, value, mask, first_query_only))
        drops = _dropout_masks(segments, dropout_p)
    outs = [(_probs(q, k, keep, scale) * drop) @ v for (q, k, v, keep, *_), drop in zip(segments, drops)]
    return _assemble(outs, is_packed(query, mask)), state


@_opaque_sdpa.register_fake
def _(query, key, value, mask, dropout_p, scale, first_query_only, forked):
    rows = query.shape[0]
    if first_query_only:
        rows = mask.shape[0] if is_packed(query, mask) else 1
    state = query.new_empty(0 if dropout_p == 0 else _generator_state(query.device).numel(), dtype=torch.uint8)
    return query.new_empty(rows, query.shape[1], query.shape[2] * query.shape[3]), state


@torch.library.custom_op("zhnlp::opaque_sdpa_backward", mutates_args=())
def _opaque_sdpa_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          mask: torch.Tensor | None, state: torch.Tensor, dropout_p: float, scale: float,
                          first_query_only: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`_opaque_sdpa` for ``query``, ``key``, ``value`` (the attention's formula)."""
    segments = list(_segments(query, key, value, mask, first_query_only))
    if dropout_p > 0:
        current = _generator_state(query.device)
        _set_generator_state(query.device, state)  # the forward's masks, drawn again
        try:
            drops = _dropout_masks(segments, dropout_p)
        finally:
            _set_generator_state(query.device, current)
    else:
        drops = [None] * len(segments)
    grads = [torch.zeros_like(t) for t in (query, key, value)]  # (s, b, nh, hd); rows without queries stay 0
    for (q, k, v, keep, rows, keys, out), drop in zip(segments, drops):
        g = grad[out]  # (sq, b, nh*hd) -> (B, nh, sq, hd)
        g = g.reshape(g.shape[0], g.shape[1], q.shape[1], q.shape[3]).permute(1, 2, 0, 3)
        probs = _probs(q, k, keep, scale)
        weights = probs if drop is None else probs * drop
        d_weights = g @ v.transpose(-2, -1)  # (B, nh, sq, sk)
        d_probs = d_weights if drop is None else d_weights * drop
        d_scores = probs * (d_probs - (d_probs * probs).sum(-1, keepdim=True))  # softmax's backward
        grads[0][rows] += ((d_scores @ k) * scale).permute(2, 0, 1, 3)
        grads[1][keys] += ((d_scores.transpose(-2, -1) @ q) * scale).permute(2, 0, 1, 3)
        grads[2][keys] += (weights.transpose(-2, -1) @ g).permute(2, 0, 1, 3)
    return tuple(grads)


@_opaque_sdpa_backward.register_fake
def _(grad, query, key, value, mask, state, dropout_p, scale, first_query_only):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup_opaque(ctx, inputs, output):
    query, key, value, mask, dropout_p, scale, first_query_only, _ = inputs
    ctx.save_for_backward(query, key, value, mask, output[1])
    ctx.options = (dropout_p, scale, first_query_only)


def _backward_opaque(ctx, grad, _grad_state):
    query, key, value, mask, state = ctx.saved_tensors
    grads = _opaque_sdpa_backward(grad.contiguous(), query, key, value, mask, state, *ctx.options)
    return (*grads, None, None, None, None, None)


_opaque_sdpa.register_autograd(_backward_opaque, setup_context=_setup_opaque)


def _generator_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_generator_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def opaque_sdpa(query, key, value, attention_mask, dropout_p, scale, first_query_only, forked):
    """:func:`sdpa` as one op for ``torch.compile`` (compiled mode; see above)."""
    scale = float(scale) if scale is not None else query.shape[-1] ** -0.5
    return _opaque_sdpa(query, key, value, attention_mask, float(dropout_p), scale, first_query_only, forked)[0]


@dataclass
class PostLNLayerSubmodules(TransformerLayerSubmodules):
    """megatron's layer submodules plus the two norms a post-LN layer applies after its residuals."""

    post_attention_layernorm: ModuleSpec | type | None = None
    post_mlp_layernorm: ModuleSpec | type | None = None


class PostLNTransformerLayer(TransformerLayer):
    """A BERT-style layer: ``x = LN(x + Attn(x)); x = LN(x + MLP(x))``.

    megatron-core's layers are pre-LN (and 0.16 ignores
    ``apply_residual_connection_post_layernorm``); this subclass reuses its SelfAttention and
    MLP submodules and its bias-dropout-add, and places the norms after the residual adds.
    """

    def __init__(self, config, submodules: PostLNLayerSubmodules, layer_number: int = 1, **kwargs):
        super().__init__(config=config, submodules=submodules, layer_number=layer_number, **kwargs)
        eps = config.layernorm_epsilon
        self.post_attention_layernorm = build_module(submodules.post_attention_layernorm, config=config,
                                                     hidden_size=config.hidden_size, eps=eps)
        self.post_mlp_layernorm = build_module(submodules.post_mlp_layernorm, config=config,
                                               hidden_size=config.hidden_size, eps=eps)

    first_token_only = False

    def keep_first_token_only(self) -> None:
        """Compute this layer's output for position 0 only (its keys and values still cover
        the whole sequence). For the last layer under a head that reads only [CLS]: the
        result there is unchanged and the attention output, FFN and norms shrink from s
        positions to one. Not for sequence parallelism, where position 0 lives on one rank."""
        self.set_first_token_only(True)

    def set_first_token_only(self, on: bool) -> None:
        self.first_token_only = on
        self.self_attention.core_attention.first_query_only = on

    def forward(self, hidden_states, attention_mask=None, context=None, rotary_pos_emb=None, **_unused):
        # hidden_states: (s, b, h), or (s/tp, b, h) under sequence parallelism. rotary_pos_emb: whatever the
        # block was given for the self-attention (RoFormer's rotary cos/sin; None for ERNIE/BERT)
        bda = self.self_attn_bda(self.training, self.config.bias_dropout_fusion)
        attn_out_with_bias = self.self_attention(hidden_states, attention_mask=attention_mask,
                                                 rotary_pos_emb=rotary_pos_emb)
        residual = hidden_states
        if self.first_token_only:  # keep [CLS]: (1, b, h), or (b, 1, h) when packed
            if is_packed(hidden_states, attention_mask):
                lengths = (~attention_mask[:, 0, 0, :]).sum(1)  # (b,): computed on the tensor, no host sync
                residual = hidden_states.index_select(0, lengths.cumsum(0) - lengths)  # each row's first token
            else:
                residual = hidden_states[:1]
        with self.bias_dropout_add_exec_handler():
            hidden_states = bda(attn_out_with_bias, residual, self.hidden_dropout)
        hidden_states = self.post_attention_layernorm(hidden_states)

        mlp_out_with_bias = self.mlp(hidden_states)
        bda = self.mlp_bda(self.training, self.config.bias_dropout_fusion)
        with self.bias_dropout_add_exec_handler():
            hidden_states = bda(mlp_out_with_bias, hidden_states, self.hidden_dropout)
        hidden_states = self.post_mlp_layernorm(hidden_states)
        # The pipeline schedules free output tensors in place; they must not be views.
        return make_viewless_tensor(hidden_states, requires_grad=hidden_states.requires_grad, keep_graph=True), context
