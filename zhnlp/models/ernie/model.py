"""The ERNIE/BERT encoder on megatron-core, written as if for one device.

Parallelism comes from outside: the layer spec picks tensor-parallel classes, megatron's
TransformerBlock builds only this pipeline stage's layers, and ``pre_process`` /
``post_process`` say whether this stage owns the embeddings / the head.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state, tensor_parallel
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
from zhnlp.models.common.linear import ColumnLinear
from zhnlp.models.common.specs import post_ln_encoder_layer_spec, run_layout_options
from zhnlp.models.ernie.config import ErnieConfig


def transformer_config(arch: ErnieConfig, *, tp: int = 1, pp: int = 1, vpp: int | None = None,
                       **run_options) -> TransformerConfig:
    """Meet point of the architecture and the run: megatron's TransformerConfig.

    ``run_options`` are TransformerConfig fields chosen by the run (``sequence_parallel``,
    ``params_dtype``, ``bf16``, ``recompute_granularity``, ``perform_initialization``, ...).
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
        hidden_dropout=arch.hidden_dropout_prob,
        attention_dropout=arch.attention_probs_dropout_prob,
        layernorm_epsilon=arch.layer_norm_eps,
        activation_func=ffn_activation(arch.hidden_act),
        add_bias_linear=True,
        gated_linear_unit=False,
        init_method=init,
        output_layer_init_method=init,  # BERT initialises every linear alike (no depth scaling)
        init_method_std=arch.initializer_range,
        **run_layout_options(tp, pp, vpp, params_dtype),
    )
    options.update(run_options)
    return TransformerConfig(**options)


class ErnieModel(EncoderStages, LanguageModule):
    """One pipeline stage (or virtual chunk) of an ERNIE/BERT encoder with one head.

    Args:
        config: megatron TransformerConfig from :func:`transformer_config`.
        arch: the architecture (vocabulary, embeddings, head sizes).
        head: one of ``heads.HEADS``.
        pre_process: this chunk owns the embeddings (first stage).
        post_process: this chunk owns the head (last stage).
        vp_stage: virtual pipeline index of this chunk.
    """

    def __init__(self, config: TransformerConfig, arch: ErnieConfig, head: str = "base",
                 pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None):
        super().__init__(config=config)
        if head not in H.HEADS:
            raise ValueError(f"unknown head {head!r}; choose one of {H.HEADS}.")
        self.arch, self.head = arch, head
        self.model_type = ModelType.encoder_or_decoder  # read by megatron's pipeline schedules
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        self.share_embeddings_and_output_weights = head == "mlm"
        dtype, h = config.params_dtype, config.hidden_size

        if pre_process:
            self.embedding = EncoderEmbeddings(
                config, arch.padded_vocab_size, arch.max_position_embeddings, arch.type_vocab_size,
                arch.task_type_vocab_size if arch.use_task_id else 0, arch.layer_norm_eps)
        self.encoder = TransformerBlock(config, post_ln_encoder_layer_spec(), post_layer_norm=False,
                                        pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
        if post_process:
            dropout = arch.classifier_dropout if arch.classifier_dropout is not None else arch.hidden_dropout_prob
            if head in ("base", "sequence_classification"):
                self.pooler = H.Pooler(h, dtype)
            if head == "sequence_classification" and not config.sequence_parallel and len(self.encoder.layers):
                # Only [CLS] reaches this head: the last layer need not compute the other positions.
                self.encoder.layers[-1].keep_first_token_only()
            if head == "sequence_classification":
                self.classifier = H.LinearHead(h, arch.num_labels, dropout, dtype)
            elif head == "token_classification":
                self.classifier = H.LinearHead(h, arch.num_labels, dropout, dtype)
            elif head == "question_answering":
                self.qa_outputs = H.LinearHead(h, 2, 0.0, dtype)
            elif head == "mlm":
                self.lm_transform = H.MaskedLMTransform(config, arch.hidden_act, arch.layer_norm_eps)
                for p in self.lm_transform.parameters():  # applied to sequence shards under SP
                    p.sequence_parallel = config.sequence_parallel
                # The vocabulary projection is tied to the word embeddings; on a last stage that
                # is not also the first, megatron keeps a copy whose gradients it all-reduces.
                self.output_layer = ColumnLinear(
                    h, arch.padded_vocab_size, config=config, init_method=config.init_method, bias=True,
                    gather_output=False, skip_bias_add=False,
                    skip_weight_param_allocation=pre_process)
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
        return {
            "base": {"last_hidden_state": (batch, seq, h), "pooler_output": (batch, h)},
            "mlm": {"logits": (batch, seq, a.vocab_size)},
            "sequence_classification": {"logits": (batch, a.num_labels)},
            "token_classification": {"logits": (batch, seq, a.num_labels)},
            "question_answering": {"start_logits": (batch, seq), "end_logits": (batch, seq)},
        }[self.head]

    # -- forward -------------------------------------------------------------------------------
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None,
                position_ids=None, labels=None, start_positions=None, end_positions=None,
                gather_logits: bool = True):
        """Embed (first stage), encode this stage's layers, apply the head (last stage).

        Inputs are batch-first ``(b, s)``. Returns the hidden states ``(s, b, h)`` on stages
        without the head, else a dict of batch-first outputs (and ``loss`` when labels are given).
        """
        b, s = input_ids.shape
        # (b, 1, 1, s), True = masked; an all-ones mask is dropped so SDPA can use its fast path
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = (attention_mask == 0)[:, None, None, :]
        hidden = None
        if self.pre_process:
            if position_ids is None:
                position_ids = torch.arange(s, device=input_ids.device).expand(b, s)
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            if task_type_ids is None:
                task_type_ids = torch.zeros_like(input_ids)
            hidden = self.embedding(input_ids, position_ids, token_type_ids, task_type_ids)
        packed = self.drops_padding and mask is not None and bool(attention_mask[:, 0].all())
        if packed:  # [CLS] at position 0 must be real (not left padding): it is what the head reads
            hidden = hidden.transpose(0, 1).reshape(b * s, -1).index_select(0, real_token_index(mask))
            hidden = hidden.unsqueeze(1)  # (T, 1, h), row after row
        hidden = self.encoder(hidden, mask)  # (s, b, h) or (s/tp, b, h) under SP; (1, b, h) for [CLS] only
        if packed:
            hidden = hidden.transpose(0, 1)  # (b, 1, h) -> (1, b, h)
        if not self.post_process:
            return hidden
        return self._head(hidden, labels, start_positions, end_positions, gather_logits)

    def _head(self, hidden, labels, start_positions, end_positions, gather_logits):
        out = {}
        if self.head == "mlm":
            if labels is not None and not gather_logits and not self.config.sequence_parallel:
                # Training: only the predicted positions (about 15%) need the transform and the
                # vocabulary projection, the largest GEMM of a small model; the loss is unchanged.
                # (Under SP the rows are split over ranks unevenly; there all positions go.)
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
