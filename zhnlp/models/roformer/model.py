"""The RoFormer encoder on megatron-core, written as if for one device.

A post-LN BERT-style encoder (zhnlp's shared embeddings, layer spec and heads) with transformers' RoFormer
specifics: no position table; sinusoidal rotary position embeddings turn the queries and keys (and the values with
``rotary_value``) inside every self-attention, in the interleaved layout RoFormer uses (feature pairs
``(x0, x1), (x2, x3), ...`` turned by the angles ``pos / 10000^(2i/head_dim)``, megatron's ``rotary_interleaved``
convention); embedding tables ``embedding_size`` wide, projected to the hidden size when narrower; transformers'
heads (no pooler on the base model unless config.json names junnyu's ``pooler_activation``; the sequence classifier
is ``RoFormerClassificationHead`` on the first token). Parallelism comes from outside, as for ERNIE.

The rotary angles are applied with cosines and sines computed once in float64 and rounded to float32, exactly the
table transformers builds, rather than megatron's float32 angles (whose sines drift by ~1e-5 at position 500).
"""

from __future__ import annotations

import numpy as np
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.enums import ModelType
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import init_method_normal

from zhnlp.models.common import heads as H
from zhnlp.models.common.activations import ACTIVATIONS, ffn_activation
from zhnlp.models.common.embeddings import EncoderEmbeddings
from zhnlp.models.common.encoder_model import EncoderStages
from zhnlp.models.common.layers import real_token_index
from zhnlp.models.common.linear import ColumnLinear
from zhnlp.models.common.specs import post_ln_encoder_layer_spec, run_layout_options
from zhnlp.models.roformer.config import RoFormerConfig


def transformer_config(arch: RoFormerConfig, *, tp: int = 1, pp: int = 1, vpp: int | None = None,
                       **run_options) -> TransformerConfig:
    """Meet point of the architecture and the run: megatron's TransformerConfig (``run_options`` as for ERNIE)."""
    arch.check_layout(tp, pp, vpp)
    init = init_method_normal(arch.initializer_range)
    params_dtype = run_options.pop("params_dtype", torch.float32)
    options = dict(
        num_layers=arch.num_hidden_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        ffn_hidden_size=arch.intermediate_size,
        kv_channels=arch.head_dim,
        hidden_dropout=arch.hidden_dropout_prob,
        attention_dropout=arch.attention_probs_dropout_prob,
        layernorm_epsilon=arch.layer_norm_eps,
        activation_func=ffn_activation(arch.hidden_act),
        add_bias_linear=True,
        gated_linear_unit=False,
        init_method=init,
        output_layer_init_method=init,  # transformers initialises every linear alike (no depth scaling)
        init_method_std=arch.initializer_range,
        **run_layout_options(tp, pp, vpp, params_dtype),
    )
    options.update(run_options)
    return TransformerConfig(**options)


# ---------------------------------------------------------------------------------------------- rotary positions
def sinusoidal_table(positions: int, head_dim: int) -> torch.Tensor:
    """transformers' RoFormer position table ``(positions, head_dim)``, float32: the sines of the angles
    ``pos / 10000^(2i/head_dim)`` (``i < head_dim/2``) in the first half, their cosines in the second. Computed in
    float64 and rounded once, as transformers does, so that a saved table equals the one it builds bit for bit."""
    pairs = np.arange(head_dim // 2)
    angles = np.arange(positions)[:, None] / np.power(10000, 2 * pairs / head_dim)[None, :]  # (positions, hd/2)
    return torch.from_numpy(np.concatenate([np.sin(angles), np.cos(angles)], axis=1)).float()


def rotate_pairs(x, cos, sin):
    """Turn each feature pair ``(x[2i], x[2i+1])`` of ``x`` (..., hd) by its angle: ``x cos + (-x[2i+1], x[2i]) sin``,
    with ``cos``/``sin`` (..., hd) holding each pair's value twice (broadcast over heads)."""
    turned = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos.to(x.dtype) + turned * sin.to(x.dtype)


class RotarySelfAttention(SelfAttention):
    """megatron's SelfAttention with RoFormer's rotary positions applied right after the QKV projection.

    ``rotary_pos_emb`` (from the layer, given to the block by the model) is one tensor ``(2, s, b, 1, hd)``: the
    cosines and sines of every token's angles, each pair's value twice (``(2, T, 1, 1, hd)`` for packed tokens);
    a single tensor because megatron's activation recompute saves the block's arguments with
    ``save_for_backward``. megatron's own rotary path is bypassed: it never rotates values (``rotary_value``) and
    takes float32 angles rather than transformers' float64-computed table.
    """

    def __init__(self, config, submodules, layer_number, attn_mask_type=None, rotary_value: bool = False, **kwargs):
        super().__init__(config, submodules, layer_number, attn_mask_type=attn_mask_type, **kwargs)
        self.rotary_value = rotary_value
        self._rope = None

    def forward(self, hidden_states, attention_mask, rotary_pos_emb=None, **kwargs):
        self._rope = rotary_pos_emb  # read by get_query_key_value_tensors during this call only
        try:
            return super().forward(hidden_states, attention_mask, **kwargs)
        finally:
            self._rope = None

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, output_gate=False, split_qkv=True):
        query, key, value = super().get_query_key_value_tensors(hidden_states, key_value_states,
                                                                output_gate=output_gate, split_qkv=split_qkv)
        if self._rope is not None:  # query, key, value: (s, b, nh/tp, hd)
            cos, sin = self._rope
            query, key = rotate_pairs(query, cos, sin), rotate_pairs(key, cos, sin)
            if self.rotary_value:
                value = rotate_pairs(value, cos, sin)
        return query, key, value


def layer_spec(arch: RoFormerConfig) -> ModuleSpec:
    """The post-LN encoder layer with the rotary self-attention."""
    spec = post_ln_encoder_layer_spec()
    attn = spec.submodules.self_attention
    spec.submodules.self_attention = ModuleSpec(module=RotarySelfAttention, submodules=attn.submodules,
                                                params={**attn.params, "rotary_value": arch.rotary_value})
    return spec


# ---------------------------------------------------------------------------------------------------- the model
class RoFormerModel(EncoderStages, LanguageModule):
    """One pipeline stage (or virtual chunk) of a RoFormer encoder with one head (``heads.HEADS``); the arguments
    are :class:`~zhnlp.models.ernie.model.ErnieModel`'s."""

    def __init__(self, config: TransformerConfig, arch: RoFormerConfig, head: str = "base",
                 pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None):
        super().__init__(config=config)
        if head not in H.HEADS:
            raise ValueError(f"unknown head {head!r}; choose one of {H.HEADS}.")
        self.arch, self.head = arch, head
        self.model_type = ModelType.encoder_or_decoder  # read by megatron's pipeline schedules
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        self.share_embeddings_and_output_weights = head == "mlm"
        dtype, h, e = config.params_dtype, config.hidden_size, arch.embedding_size

        if pre_process:
            self.embedding = EncoderEmbeddings(
                config, arch.padded_vocab_size, 0, arch.type_vocab_size, 0, arch.layer_norm_eps,
                embedding_size=e if arch.projects_embeddings else None)
        # every stage turns its layers' queries and keys: (2, positions, hd) cos and sin, each pair's value twice
        table = sinusoidal_table(arch.max_position_embeddings, arch.head_dim)
        sin, cos = table.chunk(2, dim=-1)
        self.register_buffer("rope_table", torch.stack([cos, sin]).repeat_interleave(2, dim=-1), persistent=False)
        self.encoder = TransformerBlock(config, layer_spec(arch), post_layer_norm=False,
                                        pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
        if post_process:
            if head == "base" and arch.has_pooler:
                activation = None if arch.pooler_activation == "linear" else ACTIVATIONS[arch.pooler_activation]
                self.pooler = H.Pooler(h, dtype, activation=activation)
            if head == "sequence_classification":
                if not config.sequence_parallel and len(self.encoder.layers):
                    # Only [CLS] reaches this head: the last layer need not compute the other positions.
                    self.encoder.layers[-1].keep_first_token_only()
                self.classifier = H.ClassificationHead(h, arch.num_labels, arch.hidden_dropout_prob,
                                                       ACTIVATIONS[arch.hidden_act], dtype)
            elif head == "token_classification":
                self.classifier = H.LinearHead(h, arch.num_labels, arch.hidden_dropout_prob, dtype)
            elif head == "question_answering":
                self.qa_outputs = H.LinearHead(h, 2, 0.0, dtype)
            elif head == "mlm":
                # transformers' transform maps to the embedding width; the decoder is the tied word embeddings
                self.lm_transform = H.MaskedLMTransform(config, arch.hidden_act, arch.layer_norm_eps, out_size=e)
                for p in self.lm_transform.parameters():  # applied to sequence shards under SP
                    p.sequence_parallel = config.sequence_parallel
                self.output_layer = ColumnLinear(
                    e, arch.padded_vocab_size, config=config, init_method=config.init_method, bias=True,
                    gather_output=False, skip_bias_add=False, skip_weight_param_allocation=pre_process)
        # With the whole model on this rank and only [CLS] read, padding tokens can be dropped
        # before the encoder: every linear, norm and FFN then runs on the real tokens only.
        self.drops_padding = (pre_process and post_process and head == "sequence_classification"
                              and not config.sequence_parallel and len(self.encoder.layers) > 0)
        if self.share_embeddings_and_output_weights:
            self.setup_embeddings_and_output_layer()

    # -- pipeline plumbing -------------------------------------------------------------------
    def output_shapes(self, batch: int, seq: int) -> dict[str, tuple[int, ...]]:
        """Shapes of the complete outputs of the last stage (for broadcasting them)."""
        h, a = self.config.hidden_size, self.arch
        base = {"last_hidden_state": (batch, seq, h)}
        if a.has_pooler:
            base["pooler_output"] = (batch, h)
        return {
            "base": base,
            "mlm": {"logits": (batch, seq, a.vocab_size)},
            "sequence_classification": {"logits": (batch, a.num_labels)},
            "token_classification": {"logits": (batch, seq, a.num_labels)},
            "question_answering": {"start_logits": (batch, seq), "end_logits": (batch, seq)},
        }[self.head]

    # -- forward -------------------------------------------------------------------------------
    def _rope(self, position_ids, flat_index=None):
        """Cosines and sines of ``position_ids`` (b, s): ``(2, s, b, 1, hd)``, or ``(2, T, 1, 1, hd)`` for the
        packed tokens at ``flat_index`` (row-major positions of the real tokens)."""
        if flat_index is not None:
            rope = self.rope_table[:, position_ids.reshape(-1).index_select(0, flat_index)]  # (2, T, hd)
            return rope[:, :, None, None, :]
        return self.rope_table[:, position_ids].transpose(1, 2).unsqueeze(3)  # (2, b, s, hd) -> (2, s, b, 1, hd)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None,
                position_ids=None, labels=None, start_positions=None, end_positions=None,
                gather_logits: bool = True):
        """Embed (first stage), encode this stage's layers, apply the head (last stage).

        Inputs are batch-first ``(b, s)``. Positions restart at 0 in every row (transformers' RoFormer has no
        ``position_ids`` argument; passing them, e.g. for a left-padded batch, is zhnlp's addition). Returns
        the hidden states ``(s, b, h)`` on stages without the head, else a dict of batch-first outputs (and
        ``loss`` when labels are given).
        """
        if task_type_ids is not None:
            raise ValueError("RoFormer has no task type embeddings (task_type_ids are ERNIE 3.0's); drop them.")
        b, s = input_ids.shape
        limit = self.arch.max_position_embeddings
        if position_ids is None:
            if s > limit:
                raise ValueError(f"a sequence of {s} tokens is longer than this RoFormer's max_position_embeddings "
                                 f"({limit}); truncate it (tokenizer(..., truncation=True, max_length={limit})).")
            position_ids = torch.arange(s, device=input_ids.device).expand(b, s)
        elif int(position_ids.max()) >= limit or int(position_ids.min()) < 0:
            raise ValueError(f"position_ids must lie in [0, {limit}) (max_position_embeddings), got "
                             f"{int(position_ids.min())}..{int(position_ids.max())}.")
        # (b, 1, 1, s), True = masked; an all-ones mask is dropped so SDPA can use its fast path
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = (attention_mask == 0)[:, None, None, :]
        hidden = None
        if self.pre_process:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            hidden = self.embedding(input_ids, token_type_ids=token_type_ids)
        packed = self.drops_padding and mask is not None and bool(attention_mask[:, 0].all())
        if packed:  # [CLS] at position 0 must be real (not left padding): it is what the head reads
            index = real_token_index(mask)
            hidden = hidden.transpose(0, 1).reshape(b * s, -1).index_select(0, index)
            hidden = hidden.unsqueeze(1)  # (T, 1, h), row after row
            rope = self._rope(position_ids, index)
        else:
            rope = self._rope(position_ids)
        hidden = self.encoder(hidden, mask, rotary_pos_emb=rope)  # (s, b, h) or (s/tp, b, h); (1, b, h) for [CLS]
        if packed:
            hidden = hidden.transpose(0, 1)  # (b, 1, h) -> (1, b, h)
        if not self.post_process:
            return hidden
        return self._head(hidden, labels, start_positions, end_positions, gather_logits)

    def _head(self, hidden, labels, start_positions, end_positions, gather_logits):
        out = {}
        if self.head == "mlm":
            if labels is not None and not gather_logits and not self.config.sequence_parallel:
                # Training: only the predicted positions need the transform and the vocabulary projection.
                picked = (labels != -100).transpose(0, 1)  # (s, b)
                if bool(picked.any()):
                    hidden = hidden[picked].unsqueeze(1)  # (n, 1, h), n = predicted positions
                    labels = labels.transpose(0, 1)[picked].unsqueeze(0)  # (1, n)
            logits, _ = self.output_layer(self.lm_transform(hidden), weight=self.shared_embedding_or_output_weight())
            # logits: (s, b, Vp/tp), this rank's vocabulary shard
            if labels is not None:
                start = parallel_state.get_tensor_model_parallel_rank() * logits.size(-1)
                out["loss"] = H.vocab_parallel_masked_lm_loss(logits, labels, self.arch.vocab_size, start)
            if gather_logits:
                logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
                out["logits"] = logits[..., : self.arch.vocab_size].transpose(0, 1)  # (b, s, V)
            return out

        if self.config.sequence_parallel:
            # The heads are replicated: each rank computes them on the whole sequence.
            hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        seq = hidden.transpose(0, 1)  # (b, s, h)
        if self.head == "base":
            out["last_hidden_state"] = seq
            if self.arch.has_pooler:
                out["pooler_output"] = self.pooler(hidden)
        elif self.head == "sequence_classification":
            out["logits"] = self.classifier(hidden)
        elif self.head == "token_classification":
            out["logits"] = self.classifier(seq)
        elif self.head == "question_answering":
            out["start_logits"], out["end_logits"] = self.qa_outputs(seq).unbind(-1)  # (b, s) each
        loss = H.head_loss(self.head, out, self.arch.num_labels, self.arch.problem_type, labels,
                           start_positions, end_positions)
        if loss is not None:
            out["loss"] = loss
        return out
