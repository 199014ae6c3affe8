"""Building blocks shared by pre-RMSNorm decoder LLMs (ERNIE 4.5, and later families) on megatron-core.

Shapes follow megatron's convention inside the stack: ``[s, b, h]`` (sequence first); under sequence
parallelism each tensor-parallel rank holds ``[s/tp, b, h]``. The layer itself is megatron's own pre-norm
:class:`TransformerLayer`; this module only supplies what megatron has no CPU-friendly version of (an
RMSNorm that accepts sequence-parallel marking, causal SDPA core attention) and the spec that wires them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from zhnlp.models.common import heads as H
from zhnlp.models.common.cross_entropy import cross_entropy
from zhnlp.models.common.layers import CoreAttention
from zhnlp.models.common.linear import ColumnLinear, RowLinear


class RMSNorm(torch.nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)``, computed in float32 and cast back, as transformers' Llama-style
    RMSNorm does. Parameters are marked ``sequence_parallel`` (their gradients are partial sums there)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, sequence_parallel: bool | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.eps = eps
        self.weight.sequence_parallel = config.sequence_parallel if sequence_parallel is None else sequence_parallel

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Fp32RopeSelfAttention(SelfAttention):
    """megatron's SelfAttention with RoPE applied in float32, as transformers' decoders apply it: megatron's
    unfused RoPE computes ``q * cos + rot(q) * sin`` in the activation dtype (bf16), transformers in float32
    and casts the result back. Query and key leave here as float32 (the rotation follows in that dtype);
    the core attention casts them back to the value's dtype. A no-op in float32."""

    def get_query_key_value_tensors(self, *args, **kwargs):
        out = super().get_query_key_value_tensors(*args, **kwargs)
        if len(out) < 3 or out[0].dtype == torch.float32:  # unsplit QKV (fused kernels), or already fp32
            return out
        return (out[0].float(), out[1].float(), *out[2:])


class CausalSDPAttention(CoreAttention):
    """Causal core attention through ``scaled_dot_product_attention``, with grouped-query heads.

    Takes megatron's per-partition query ``[s, b, nh/tp, hd]``, key/value ``[s, b, ng/tp, hd]`` and an
    optional mask (True = hidden), applied on top of the causal one: key padding ``[b, 1, 1, s]``, or per
    query ``[b, 1, s, s]`` (documents packed into one row that must not see each other: the model builds it
    from ``document_ids``). Returns ``[s, b, nh/tp * hd]``. A query whose every key is masked (a
    left-padding position) attends to itself, so no row is NaN.
    """

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        s, b, nh, hd = query.shape
        query, key = query.to(value.dtype), key.to(value.dtype)  # rotated in float32 (Fp32RopeSelfAttention)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # (b, heads, s, hd)
        if self.kv_cache is not None:  # generation: keys/values of earlier steps come first
            return self._cached(q, k, v, attention_mask, s, b, nh, hd)
        if k.shape[1] != nh:  # GQA: each key/value head serves nh/ng query heads
            k = k.repeat_interleave(nh // k.shape[1], dim=1)
            v = v.repeat_interleave(nh // v.shape[1], dim=1)
        dropout_p = self.dropout_p if self.training else 0.0
        if attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=self.softmax_scale)
        else:
            causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
            keep = causal & ~attention_mask  # (b, 1, s, s), True = attend (the mask: (b, 1, 1 or s, s))
            keep = keep | torch.eye(s, dtype=torch.bool, device=q.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p,
                                                 scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(s, b, nh * hd)  # (s, b, nh*hd)

    kv_cache: dict | None = None  # set by zhnlp.models.common.generation while generating

    def _cached(self, q, k, v, attention_mask, s, b, nh, hd):
        """``s`` new queries at positions ``past .. past+s-1`` over every key so far; ``attention_mask``
        ``(b, 1, 1, past+s)`` marks padding keys. The cache holds the ``ng`` key/value heads, not repeated."""
        if "k" in self.kv_cache:
            k = torch.cat([self.kv_cache["k"], k], dim=2)  # (b, ng, past+s, hd)
            v = torch.cat([self.kv_cache["v"], v], dim=2)
        self.kv_cache["k"], self.kv_cache["v"] = k, v
        total, ng = k.shape[2], k.shape[1]
        if attention_mask is None and s == 1:
            # one new query sees every key: no mask; the nh/ng query heads of a group become that group's
            # queries, so the ng cached heads are attended without repeating them: (b, ng, nh/ng, hd)
            out = F.scaled_dot_product_attention(q.reshape(b, ng, nh // ng, hd), k, v, scale=self.softmax_scale)
            return out.reshape(1, b, nh * hd)  # (b, ng, nh/ng, hd) is (b, nh, hd) in head order
        if attention_mask is None and total == s:  # the prompt: plain causal attention
            if ng != nh:
                k, v = (t.repeat_interleave(nh // ng, dim=1) for t in (k, v))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            return out.permute(2, 0, 1, 3).reshape(s, b, nh * hd)
        keep = torch.ones(s, total, dtype=torch.bool, device=q.device).tril(diagonal=total - s)
        if attention_mask is not None:  # a padding query attends to itself, so that no row is empty
            itself = torch.ones(s, total, dtype=torch.bool, device=q.device).tril(total - s).triu(total - s)
            keep = (keep & ~attention_mask) | itself  # (b, 1, s, past+s)
        if k.shape[1] != nh:
            k, v = (t.repeat_interleave(nh // t.shape[1], dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(s, b, nh * hd)


def pre_norm_decoder_layer_spec() -> ModuleSpec:
    """Spec of one causal pre-RMSNorm decoder layer: ``x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x))``
    with megatron's SelfAttention (GQA via ``num_query_groups``, RoPE passed in) and MLP (SwiGLU via
    ``gated_linear_unit``)."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=RMSNorm,
            self_attention=ModuleSpec(
                module=Fp32RopeSelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnLinear,
                    core_attention=CausalSDPAttention,
                    linear_proj=RowLinear,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=RMSNorm,
            mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnLinear, linear_fc2=RowLinear)),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def shift_labels(labels):
    """transformers' causal-LM rule: position t predicts token t+1; the last position predicts nothing.
    (b, s) -> (b, s)."""
    return F.pad(labels, (0, 1), value=-100)[:, 1:]


def causal_lm_loss(logits, labels):
    """transformers' causal-LM loss from complete logits ``(b, s, V)``: labels shifted one position left,
    float32 cross-entropy averaged over the labels that are not -100; None without labels."""
    if labels is None:
        return None
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), shift_labels(labels).reshape(-1))


def causal_lm_targets(labels) -> torch.Tensor:
    """How many tokens the causal-LM loss averages over for ``labels`` ``(b, s)``: the shifted labels that are
    not -100 (a 0-dim int64 tensor)."""
    return (labels[:, 1:] != -100).sum()


def vocab_parallel_causal_lm_loss(logits_shard, labels, vocab_size: int, vocab_start: int, tp: int):
    """Mean float32 cross-entropy of this rank's vocabulary shard ``(s, b, Vp/tp)`` against labels ``(b, s)``
    that are already shifted (-100 = no label); padded vocabulary columns (>= ``vocab_size``) are excluded.

    Without tensor parallelism the shard is the whole vocabulary and :func:`cross_entropy` computes the same
    figure blockwise from the logits, instead of megatron's vocab-parallel kernel (a private copy of the logits and
    several passes over them) or ``F.cross_entropy`` (three more vocabulary-sized tensors per step)."""
    if tp > 1:
        return H.vocab_parallel_masked_lm_loss(logits_shard, labels, vocab_size, vocab_start)
    target = labels.transpose(0, 1).reshape(-1)  # (s*b,), the logits' row order
    return cross_entropy(logits_shard.reshape(-1, logits_shard.size(-1)), target, columns=vocab_size)
