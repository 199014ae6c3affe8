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
        rng = (tensor_parallel.get_cuda_rng_tracker().fork()
               if dropout_p > 0 and not self.config.sequence_parallel else nullcontext())
        if is_packed(query, attention_mask):
            with rng:
                return self._packed(query, key, value, attention_mask, dropout_p)
        if self.first_query_only:
            query = query[:1]  # (1, b, nh, hd): keys and values keep every position
        s, b, nh, hd = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # (b, nh, s, hd)
        keep = None if attention_mask is None else ~attention_mask  # SDPA: True = attend
        with rng:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p,
                                                 scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(s, b, nh * hd)  # (s, b, nh*hd)

    def _packed(self, query, key, value, attention_mask, dropout_p):
        """Attention row by row over packed tokens ``(T, 1, nh, hd)``: no mask, no padding keys.
        Returns ``(T, 1, nh*hd)``, or ``(b, 1, nh*hd)`` for each row's first token only."""
        starts, lengths = row_starts(attention_mask)
        outs = []
        for start, n in zip(starts, lengths):
            q = query[start:start + (1 if self.first_query_only else n)]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (q, key[start:start + n], value[start:start + n]))  # (1, nh, n, hd)
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.softmax_scale)
            outs.append(out[0].transpose(0, 1))  # (n, nh, hd), a view: cat makes the one copy
        packed = torch.cat(outs)
        return packed.reshape(packed.shape[0], 1, -1)


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
                starts = torch.tensor(row_starts(attention_mask)[0], device=hidden_states.device)
                residual = hidden_states.index_select(0, starts)
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
