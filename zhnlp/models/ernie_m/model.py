"""The ERNIE-M encoder on megatron-core, written as if for one device.

The stack is BERT's post-LN layer (the shared spec: fused QKV, ``x = LN(x + Attn(x)); x = LN(x + FFN(x))``);
what is ERNIE-M's own sits around it: word + position embeddings only, positions counted from 2, a padding mask
taken from ``pad_token_id`` when the caller gives none, dropout after the FFN activation (``act_dropout``), and
transformers 4.x's heads (a tanh pooler for the base and sequence-classification models, linear token and span
heads). There is no masked-LM head. Parallelism comes from outside, as for ERNIE: the layer spec picks the
tensor-parallel classes and ``pre_process`` / ``post_process`` say whether this pipeline stage owns the
embeddings / the head.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.enums import ModelType
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import init_method_normal

from zhnlp.models.common import heads as H
from zhnlp.models.common.activations import ffn_activation
from zhnlp.models.common.embeddings import EncoderEmbeddings
from zhnlp.models.common.encoder_model import EncoderStages
from zhnlp.models.common.layers import real_token_index
from zhnlp.models.common.specs import post_ln_encoder_layer_spec, run_layout_options
from zhnlp.models.ernie_m.config import POSITION_OFFSET, ErnieMConfig

# transformers 4.x's ErnieM heads (its multiple-choice and information-extraction models are not implemented)
HEADS = ("base", "sequence_classification", "token_classification", "question_answering")


def transformer_config(arch: ErnieMConfig, *, tp: int = 1, pp: int = 1, vpp: int | None = None,
                       **run_options) -> TransformerConfig:
    """Meet point of the architecture and the run: megatron's TransformerConfig of the encoder stack.

    ``run_options`` are TransformerConfig fields chosen by the run (``sequence_parallel``, ``params_dtype``,
    ``bf16``, ``recompute_granularity``, ``perform_initialization``, ...).
    """
    arch.check_layout(tp, pp, vpp)
    init = init_method_normal(arch.initializer_range)
    params_dtype = run_options.pop("params_dtype", torch.float32)
    options = dict(
        num_layers=arch.num_hidden_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        ffn_hidden_size=arch.intermediate_size,
        kv_channels=arch.head_dim,
        hidden_dropout=arch.hidden_dropout_prob,  # the embeddings' and both residual branches' (dropout1/2)
        attention_dropout=arch.attention_probs_dropout_prob,
        layernorm_epsilon=arch.layer_norm_eps,
        activation_func=ffn_activation(arch.hidden_act),
        add_bias_linear=True,
        gated_linear_unit=False,
        init_method=init,
        output_layer_init_method=init,  # every linear initialised alike, as transformers does (no depth scaling)
        init_method_std=arch.initializer_range,
        **run_layout_options(tp, pp, vpp, params_dtype),
    )
    options.update(run_options)
    return TransformerConfig(**options)


def check_head(arch: ErnieMConfig, head: str) -> None:
    """Refuse a head ERNIE-M does not have, and a span head whose size is not 2."""
    from zhnlp.errors import CheckpointError

    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; ERNIE-M has the heads {HEADS} (no masked-LM head).")
    if head == "question_answering" and arch.num_labels != 2:
        raise CheckpointError(f"ErnieMForQuestionAnswering sizes its span layer by num_labels, which must be 2 (start "
                              f"and end logits), but the config has num_labels={arch.num_labels}; set num_labels=2.")


class ActivationDropout:
    """The FFN activation followed by dropout (ERNIE-M's ``act_dropout``), in place of megatron MLP's
    ``activation_func``. Under tensor parallelism each rank holds different FFN columns, so the mask comes from
    the model-parallel RNG stream (under sequence parallelism the block has already switched to it)."""

    def __init__(self, mlp, activation, p: float):
        self.mlp, self.activation, self.p = mlp, activation, p

    def __call__(self, x):
        x = self.activation(x)  # (s, b, ffn/tp)
        if not self.mlp.training or self.p == 0:
            return x
        if self.mlp.config.sequence_parallel:
            return F.dropout(x, p=self.p, training=True)
        return _dropout_model_parallel_rng(x, self.p)


@torch.compiler.disable  # compiled mode: the tracker swaps generator states, which torch.compile does not trace
def _dropout_model_parallel_rng(x, p: float):
    with tensor_parallel.get_cuda_rng_tracker().fork():
        return F.dropout(x, p=p, training=True)


class ErnieMModel(EncoderStages, LanguageModule):
    """One pipeline stage (or virtual chunk) of an ERNIE-M encoder with one head.

    Args:
        config: megatron TransformerConfig from :func:`transformer_config`.
        arch: the architecture (vocabulary, positions, head sizes).
        head: one of :data:`HEADS`.
        pre_process: this chunk owns the embeddings (first stage).
        post_process: this chunk owns the head (last stage).
        vp_stage: virtual pipeline index of this chunk.
    """

    def __init__(self, config: TransformerConfig, arch: ErnieMConfig, head: str = "base",
                 pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None):
        super().__init__(config=config)
        check_head(arch, head)
        self.arch, self.head = arch, head
        self.model_type = ModelType.encoder_or_decoder  # read by megatron's pipeline schedules
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        self.share_embeddings_and_output_weights = False
        dtype, h = config.params_dtype, config.hidden_size

        if pre_process:  # no token type or task type tables
            self.embedding = EncoderEmbeddings(config, arch.padded_vocab_size, arch.max_position_embeddings, 0, 0,
                                               arch.layer_norm_eps)
        self.encoder = TransformerBlock(config, post_ln_encoder_layer_spec(), post_layer_norm=False,
                                        pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
        if arch.activation_dropout > 0:
            for layer in self.encoder.layers:
                layer.mlp.activation_func = ActivationDropout(layer.mlp, layer.mlp.activation_func,
                                                              arch.activation_dropout)
        if post_process:
            if head in ("base", "sequence_classification"):
                self.pooler = H.Pooler(h, dtype)
            if head == "sequence_classification" and not config.sequence_parallel and len(self.encoder.layers):
                # Only [CLS] reaches this head: the last layer need not compute the other positions.
                self.encoder.layers[-1].keep_first_token_only()
            if head in ("sequence_classification", "token_classification"):
                self.classifier = H.LinearHead(h, arch.num_labels, arch.head_dropout, dtype)
            elif head == "question_answering":
                self.qa_outputs = H.LinearHead(h, 2, 0.0, dtype)  # transformers' span layer has no dropout
        # With the whole model on this rank and only [CLS] read, padding tokens can be dropped
        # before the encoder: every linear, norm and FFN then runs on the real tokens only.
        self.drops_padding = (pre_process and post_process and head == "sequence_classification"
                              and not config.sequence_parallel and len(self.encoder.layers) > 0)

    # -- pipeline plumbing -------------------------------------------------------------------
    def _generic_checkpoint_view(self) -> bool:
        return bool(self.post_process)  # ERNIE-M's heads have no vocabulary projection

    def output_shapes(self, batch: int, seq: int) -> dict[str, tuple[int, ...]]:
        """Shapes of the complete outputs of the last stage (for broadcasting them)."""
        h, a = self.config.hidden_size, self.arch
        return {
            "base": {"last_hidden_state": (batch, seq, h), "pooler_output": (batch, h)},
            "sequence_classification": {"logits": (batch, a.num_labels)},
            "token_classification": {"logits": (batch, seq, a.num_labels)},
            "question_answering": {"start_logits": (batch, seq), "end_logits": (batch, seq)},
        }[self.head]

    # -- forward -------------------------------------------------------------------------------
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None,
                position_ids=None, labels=None, start_positions=None, end_positions=None,
                gather_logits: bool = True):
        """Embed (first stage), encode this stage's layers, apply the head (last stage).

        Inputs are batch-first ``(b, s)``. Without ``attention_mask`` the tokens equal to ``pad_token_id`` are
        masked, as transformers' ErnieM does. ``position_ids`` count from 0 (default ``0..s-1``); the model adds
        ERNIE-M's offset of 2. ``token_type_ids`` and ``task_type_ids`` are accepted so that batches made for
        other encoders run unchanged, and ignored: ERNIE-M has no such embeddings (nor vocabulary-parallel logits:
        ``gather_logits``, which the trainer passes, changes nothing). Returns the hidden states
        ``(s, b, h)`` on stages without the head, else a dict of batch-first outputs (and ``loss`` when labels
        are given).
        """
        b, s = input_ids.shape
        if attention_mask is None:
            attention_mask = (input_ids != self.arch.pad_token_id).long()
        # (b, 1, 1, s), True = masked; an all-ones mask is dropped so SDPA can use its fast path
        mask = None if bool(attention_mask.all()) else (attention_mask == 0)[:, None, None, :]
        hidden = None
        if self.pre_process:
            if position_ids is None:
                position_ids = torch.arange(s, device=input_ids.device).expand(b, s)
            hidden = self.embedding(input_ids, position_ids + POSITION_OFFSET)
        packed = self.drops_padding and mask is not None and bool(attention_mask[:, 0].all())
        if packed:  # [CLS] at position 0 must be real (not left padding): it is what the head reads
            hidden = hidden.transpose(0, 1).reshape(b * s, -1).index_select(0, real_token_index(mask))
            hidden = hidden.unsqueeze(1)  # (T, 1, h), row after row
        hidden = self.encoder(hidden, mask)  # (s, b, h) or (s/tp, b, h) under SP; (1, b, h) for [CLS] only
        if packed:
            hidden = hidden.transpose(0, 1)  # (b, 1, h) -> (1, b, h)
        if not self.post_process:
            return hidden
        return self._head(hidden, labels, start_positions, end_positions)

    def _head(self, hidden, labels, start_positions, end_positions):
        if self.config.sequence_parallel:
            # The heads are replicated: each rank computes them on the whole sequence.
            hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        seq = hidden.transpose(0, 1)  # (b, s, h)
        out = {}
        if self.head == "base":
            out["last_hidden_state"] = seq
            out["pooler_output"] = self.pooler(hidden)
        elif self.head == "sequence_classification":
            out["logits"] = self.classifier(self.pooler(hidden))
        elif self.head == "token_classification":
            out["logits"] = self.classifier(seq)
        elif self.head == "question_answering":
            out["start_logits"], out["end_logits"] = self.qa_outputs(seq).unbind(-1)  # (b, s) each
        loss = H.head_loss(self.head, out, self.arch.num_labels, self.arch.problem_type, labels,
                           start_positions, end_positions)
        if loss is not None:
            out["loss"] = loss
        return out
