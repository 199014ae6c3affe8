"""The ELECTRA encoder on megatron-core, written as if for one device.

The encoder is BERT's post-LN stack (the shared layer spec); what differs is around it: the embedding tables may be
narrower than the encoder (``embedding_size``, projected to ``hidden_size`` after the LayerNorm and dropout), the
base model has no pooler, and the heads are ELECTRA's own: the discriminator (one replaced-token logit per token),
the generator (a masked LM through the embedding width, tied to the word embeddings), and a sentence classifier
with a GELU hidden layer on the first token. Parallelism comes from outside, as for ERNIE: the layer spec picks
the tensor-parallel classes and ``pre_process`` / ``post_process`` say whether this pipeline stage owns the
embeddings / the head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.enums import ModelType
from megatron.core.models.common.language_module.language_module import LanguageModule
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
from zhnlp.models.electra.config import ElectraConfig

# the encoder heads, and the discriminator of ELECTRA's pretraining (transformers' ElectraForPreTraining)
HEADS = H.HEADS + ("pretraining",)


def transformer_config(arch: ElectraConfig, *, tp: int = 1, pp: int = 1, vpp: int | None = None,
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
        hidden_dropout=arch.hidden_dropout_prob,
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


class DiscriminatorHead(torch.nn.Module):
    """The replaced-token detector: ``dense`` (h -> h), the encoder's activation, ``dense_prediction`` (h -> 1).
    (s, b, h) -> (s, b), one logit per token."""

    def __init__(self, hidden_size: int, hidden_act: str, dtype):
        super().__init__()
        self.dense = torch.nn.Linear(hidden_size, hidden_size, dtype=dtype)
        self.act = ACTIVATIONS[hidden_act]
        self.dense_prediction = torch.nn.Linear(hidden_size, 1, dtype=dtype)

    def forward(self, hidden):
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)


class ElectraModel(EncoderStages, LanguageModule):
    """One pipeline stage (or virtual chunk) of an ELECTRA encoder with one head.

    Args:
        config: megatron TransformerConfig from :func:`transformer_config`.
        arch: the architecture (vocabulary, embedding width, head sizes).
        head: one of :data:`HEADS` (``"pretraining"``: the discriminator; ``"mlm"``: the generator).
        pre_process: this chunk owns the embeddings (first stage).
        post_process: this chunk owns the head (last stage).
        vp_stage: virtual pipeline index of this chunk.
    """

    def __init__(self, config: TransformerConfig, arch: ElectraConfig, head: str = "base",
                 pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None):
        super().__init__(config=config)
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; ELECTRA has the heads {HEADS}.")
        self.arch, self.head = arch, head
        self.model_type = ModelType.encoder_or_decoder  # read by megatron's pipeline schedules
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        self.share_embeddings_and_output_weights = head == "mlm" and arch.tie_word_embeddings
        dtype, h = config.params_dtype, config.hidden_size

        if pre_process:
            # (b, s) ids -> (s, b, h); tables of width embedding_size, projected when it is not hidden_size
            self.embedding = EncoderEmbeddings(
                config, arch.padded_vocab_size, arch.max_position_embeddings, arch.type_vocab_size, 0,
                arch.layer_norm_eps, embedding_size=arch.embedding_size if arch.factorised else None)
        self.encoder = TransformerBlock(config, post_ln_encoder_layer_spec(), post_layer_norm=False,
                                        pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
        if post_process:
            dropout = arch.classifier_dropout if arch.classifier_dropout is not None else arch.hidden_dropout_prob
            if head == "sequence_classification":
                # on the first token: dropout, dense, GELU (whatever hidden_act; BERT's pooler has tanh), dropout,
                # out_proj
                self.classifier = H.ClassificationHead(h, arch.num_labels, dropout, F.gelu, dtype)
                if not config.sequence_parallel and len(self.encoder.layers):
                    # Only [CLS] reaches this head: the last layer need not compute the other positions.
                    self.encoder.layers[-1].keep_first_token_only()
            elif head == "token_classification":
                self.classifier = H.LinearHead(h, arch.num_labels, dropout, dtype)
            elif head == "question_answering":
                self.qa_outputs = H.LinearHead(h, 2, 0.0, dtype)
            elif head == "pretraining":
                self.discriminator_predictions = DiscriminatorHead(h, arch.hidden_act, dtype)
            elif head == "mlm":
                # transformers' generator head: dense h -> E, GELU (whatever hidden_act), LayerNorm over E
                self.generator_predictions = H.MaskedLMTransform(config, "gelu", arch.layer_norm_eps,
                                                                 out_size=arch.embedding_size)
                for p in self.generator_predictions.parameters():  # applied to sequence shards under SP
                    p.sequence_parallel = config.sequence_parallel
                # E -> vocabulary, tied to the word embeddings unless tie_word_embeddings is false; tied on a last
                # stage that is not also the first, megatron keeps a copy whose gradients it all-reduces.
                self.output_layer = ColumnLinear(
                    arch.embedding_size, arch.padded_vocab_size, config=config, init_method=config.init_method,
                    bias=True, gather_output=False, skip_bias_add=False,
                    skip_weight_param_allocation=pre_process and self.share_embeddings_and_output_weights)
        # With the whole model on this rank and only [CLS] read, padding tokens can be dropped
        # before the encoder: every linear, norm and FFN then runs on the real tokens only.
        self.drops_padding = (pre_process and post_process and head == "sequence_classification"
                              and not config.sequence_parallel and len(self.encoder.layers) > 0)
        if self.share_embeddings_and_output_weights:
            self.setup_embeddings_and_output_layer()

    # -- pipeline plumbing -------------------------------------------------------------------
    def _generic_checkpoint_view(self) -> bool:
        # every head but the generator lacks the vocabulary projection LanguageModule's view expects
        return bool(self.post_process and not hasattr(self, "output_layer"))

    def output_shapes(self, batch: int, seq: int) -> dict[str, tuple[int, ...]]:
        """Shapes of the complete outputs of the last stage (for broadcasting them)."""
        h, a = self.config.hidden_size, self.arch
        return {
            "base": {"last_hidden_state": (batch, seq, h)},
            "mlm": {"logits": (batch, seq, a.vocab_size)},
            "pretraining": {"logits": (batch, seq)},
            "sequence_classification": {"logits": (batch, a.num_labels)},
            "token_classification": {"logits": (batch, seq, a.num_labels)},
            "question_answering": {"start_logits": (batch, seq), "end_logits": (batch, seq)},
        }[self.head]

    # -- forward -------------------------------------------------------------------------------
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None,
                position_ids=None, labels=None, start_positions=None, end_positions=None,
                gather_logits: bool = True):
        """Embed (first stage), encode this stage's layers, apply the head (last stage).

        Inputs are batch-first ``(b, s)``. Returns the hidden states ``(s, b, h)`` on stages without the head,
        else a dict of batch-first outputs (and ``loss`` when labels are given; the discriminator's ``labels``
        are 1 for a replaced token, 0 for an original one, and padding is left out of its loss).
        """
        if task_type_ids is not None:
            raise TypeError("ELECTRA has no task_type_ids (they are ERNIE 3.0's); call the model without them.")
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
            hidden = self.embedding(input_ids, position_ids, token_type_ids)
        packed = self.drops_padding and mask is not None and bool(attention_mask[:, 0].all())
        if packed:  # [CLS] at position 0 must be real (not left padding): it is what the head reads
            hidden = hidden.transpose(0, 1).reshape(b * s, -1).index_select(0, real_token_index(mask))
            hidden = hidden.unsqueeze(1)  # (T, 1, h), row after row
        hidden = self.encoder(hidden, mask)  # (s, b, h) or (s/tp, b, h) under SP; (1, b, h) for [CLS] only
        if packed:
            hidden = hidden.transpose(0, 1)  # (b, 1, h) -> (1, b, h)
        if not self.post_process:
            return hidden
        return self._head(hidden, attention_mask, labels, start_positions, end_positions, gather_logits)

    def _head(self, hidden, attention_mask, labels, start_positions, end_positions, gather_logits):
        if self.head == "mlm":
            return self._generator(hidden, labels, gather_logits)
        if self.config.sequence_parallel:
            # The heads are replicated: each rank computes them on the whole sequence.
            hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        out = {}
        seq = hidden.transpose(0, 1)  # (b, s, h)
        if self.head == "base":
            out["last_hidden_state"] = seq
        elif self.head == "pretraining":
            out["logits"] = self.discriminator_predictions(seq)  # (b, s)
        elif self.head == "sequence_classification":
            out["logits"] = self.classifier(hidden)
        elif self.head == "token_classification":
            out["logits"] = self.classifier(seq)
        elif self.head == "question_answering":
            out["start_logits"], out["end_logits"] = self.qa_outputs(seq).unbind(-1)  # (b, s) each
        loss = H.head_loss(self.head, out, self.arch.num_labels, self.arch.problem_type, labels,
                           start_positions, end_positions, attention_mask=attention_mask)
        if loss is not None:
            out["loss"] = loss
        return out

    def _generator(self, hidden, labels, gather_logits):
        """The masked-LM head: (s, b, h) -> logits over this rank's vocabulary shard, the loss without gathering."""
        if labels is not None and not gather_logits and not self.config.sequence_parallel:
            # Training: only the predicted positions need the transform and the vocabulary projection.
            # (Under SP the rows are split over ranks unevenly; there all positions go.)
            picked = (labels != -100).transpose(0, 1)  # (s, b)
            if bool(picked.any()):
                hidden = hidden[picked].unsqueeze(1)  # (n, 1, h), n = predicted positions
                labels = labels.transpose(0, 1)[picked].unsqueeze(0)  # (1, n)
        weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        logits, _ = self.output_layer(self.generator_predictions(hidden), weight=weight)  # (s, b, Vp/tp)
        out = {}
        if labels is not None:
            start = parallel_state.get_tensor_model_parallel_rank() * logits.size(-1)
            out["loss"] = H.vocab_parallel_masked_lm_loss(logits, labels, self.arch.vocab_size, start)
        if gather_logits:
            logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
            out["logits"] = logits[..., : self.arch.vocab_size].transpose(0, 1)  # (b, s, V)
        return out
