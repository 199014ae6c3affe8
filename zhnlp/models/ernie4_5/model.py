"""The dense ERNIE 4.5 decoder on megatron-core, written as if for one device.

Parallelism comes from outside, as for the encoders: the layer spec picks the tensor-parallel classes,
megatron's TransformerBlock builds only this stage's layers, ``pre_process`` / ``post_process`` say whether
this stage owns the embeddings / the final norm and output layer. The stack is named ``encoder`` (not
megatron's ``decoder``) because the family-independent code (conversion engine, hidden-state recorder)
addresses a chunk's layers as ``encoder.layers.*``.

ERNIE 4.5 specifics (transformers' ``modeling_ernie4_5``): RoPE rotates *interleaved* pairs
``(x0, x1), (x2, x3), ...`` (megatron's ``rotary_interleaved``), in float32; SwiGLU MLP; GQA; biases on
every linear or none (``use_bias``); no biases on the output layer.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.enums import ModelType
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_block import (TransformerBlock, TransformerBlockSubmodules,
                                                         get_num_layers_to_build)
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import init_method_normal

from zhnlp.models.common.decoder import (RMSNorm, pre_norm_decoder_layer_spec, shift_labels,
                                        vocab_parallel_causal_lm_loss)
from zhnlp.models.common.embeddings import VocabEmbedding
from zhnlp.models.common.linear import ColumnLinear, TiedWeightGrad
from zhnlp.models.common.moe import moe_mlp_spec
from zhnlp.models.common.specs import run_layout_options
from zhnlp.models.ernie4_5.config import Ernie4_5Config

HEADS = ("causal_lm",)


def transformer_config(arch: Ernie4_5Config, *, tp: int = 1, pp: int = 1, vpp: int | None = None,
                       **run_options) -> TransformerConfig:
    """Meet point of the architecture and the run: megatron's TransformerConfig."""
    arch.check_layout(tp, pp, vpp)
    init = init_method_normal(arch.initializer_range)
    params_dtype = run_options.pop("params_dtype", torch.float32)
    options = dict(
        num_layers=arch.num_hidden_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.intermediate_size,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        layernorm_epsilon=arch.rms_norm_eps,
        normalization="RMSNorm",
        activation_func=F.silu,
        gated_linear_unit=True,
        add_bias_linear=arch.use_bias,
        add_qkv_bias=arch.use_bias,
        apply_rope_fusion=False,
        rotary_interleaved=True,
        init_method=init,
        output_layer_init_method=init,  # transformers initialises every linear alike
        init_method_std=arch.initializer_range,
        **run_layout_options(tp, pp, vpp, params_dtype),
    )
    if arch.is_moe:
        ep = run_options.get("expert_model_parallel_size", 1)
        etp = run_options.get("expert_tensor_parallel_size") or tp
        arch.check_experts(ep, etp, tp)
        options.update(moe_options(arch))
    options.update(run_options)
    if arch.is_moe:
        # megatron refuses linear biases with MoE at etp > 1 because its routed experts would carry them; ours
        # never do (zhnlp.models.common.moe.RoutedExperts), so the check runs without and the biases follow.
        options["add_bias_linear"] = False
    config = TransformerConfig(**options)
    if arch.is_moe:  # read by zhnlp.models.common.moe (megatron has no fields for them)
        config.add_bias_linear = arch.use_bias
        config.moe_router_norm_min = arch.moe_norm_min
        config.zhnlp_shared_expert_size = arch.shared_expert_size
    return config


def moe_options(arch) -> dict:
    """megatron's MoE fields for ERNIE 4.5's mixture of experts. The routing itself (fp32 softmax, correction
    bias for the choice only, renormalised top-k) is zhnlp.models.common.moe's router; the shared experts
    are built there too (megatron's refuse biases), so megatron's shared-expert size stays unset. No auxiliary
    loss by default: the trainer sets ``moe_aux_loss_coeff`` from the run; the model's forward computes
    transformers' load-balancing loss itself when asked (``output_router_logits``)."""
    return dict(
        num_moe_experts=arch.moe_num_experts,
        moe_router_topk=arch.moe_k,
        moe_ffn_hidden_size=arch.moe_intermediate_size,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=True,
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        # dense and MoE layers differ in their parameters: distributed checkpoints key each layer on its own
        # (megatron stacks homogeneous layers along one axis, which dense layer 0 + MoE layers are not)
        hetereogenous_dist_checkpoint=True,
    )


def layer_spec(arch: Ernie4_5Config, layer: int):
    """The spec of global layer ``layer``: a dense SwiGLU MLP, or ERNIE's mixture of experts."""
    spec = pre_norm_decoder_layer_spec()
    if arch.is_moe_layer(layer):
        spec.submodules.mlp = moe_mlp_spec()
    return spec


class Ernie4_5Model(LanguageModule):
    """One pipeline stage (or virtual chunk) of the ERNIE 4.5 decoder with the causal-LM head."""

    def __init__(self, config: TransformerConfig, arch: Ernie4_5Config, head: str = "causal_lm",
                 pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None):
        super().__init__(config=config)
        if head not in HEADS:
            raise ValueError(f"the ERNIE 4.5 decoder has the heads {HEADS}, not {head!r}; "
                             "use zhnlp.AutoModelForCausalLM.")
        self.arch, self.head = arch, head
        self.model_type = ModelType.encoder_or_decoder
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        self.share_embeddings_and_output_weights = bool(arch.tie_word_embeddings)
        h = config.hidden_size
        if pre_process:
            self.embedding = _WordEmbedding(config, arch.padded_vocab_size)
        self.rotary_pos_emb = RotaryEmbedding(arch.head_dim, 1.0, rotary_interleaved=True,
                                              rotary_base=arch.rope_theta, use_cpu_initialization=True)
        layers = get_num_layers_to_build(config, vp_stage=vp_stage)
        first = get_transformer_layer_offset(config, vp_stage=vp_stage)  # global index of this chunk's first layer
        spec = TransformerBlockSubmodules(layer_specs=[layer_spec(arch, first + i) for i in range(layers)],
                                          layer_norm=RMSNorm)
        self.encoder = TransformerBlock(config, spec, post_layer_norm=True, pre_process=pre_process,
                                        post_process=post_process, vp_stage=vp_stage)
        if post_process:
            self.output_layer = ColumnLinear(
                h, arch.padded_vocab_size, config=config, init_method=config.init_method,
                bias=arch.is_moe and arch.use_bias,  # transformers' MoE lm_head follows use_bias, the dense one has none
                gather_output=False, skip_bias_add=False,
                skip_weight_param_allocation=pre_process and self.share_embeddings_and_output_weights)
        if self.share_embeddings_and_output_weights:
            self.setup_embeddings_and_output_layer()

    # -- pipeline plumbing -------------------------------------------------------------------
    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, (list, tuple)):
            input_tensor = input_tensor[0]
        self.encoder.set_input_tensor(input_tensor)

    def output_shapes(self, batch: int, seq: int) -> dict[str, tuple[int, ...]]:
        return {"logits": (batch, seq, self.arch.vocab_size)}

    @contextlib.contextmanager
    def all_positions(self):
        """For ``output_hidden_states`` (entered before the recorder hooks the layers): transformers' last
        hidden state is the *normed* one, so the final norm moves onto the last layer's output meanwhile."""
        norm = self.encoder.final_layernorm if self.post_process and len(self.encoder.layers) else None
        if norm is None:
            yield
            return

        def normed(_module, _inputs, output):
            hidden, context = output
            return norm(hidden), context

        handle = self.encoder.layers[-1].register_forward_hook(normed)
        self.encoder.final_layernorm = None
        try:
            yield
        finally:
            handle.remove()
            self.encoder.final_layernorm = norm

    def _rope(self, position_ids, seq: int):
        """Rotary angles ``(s, b, 1, hd)`` for ``position_ids`` (b, s), interleaved as megatron applies them."""
        table = self.rotary_pos_emb(int(position_ids.max()) + 1)[:, 0, 0, :]  # (max_pos, hd), float32
        return table[position_ids].transpose(0, 1).unsqueeze(2)

    # -- forward -------------------------------------------------------------------------------
    def forward(self, input_ids, attention_mask=None, position_ids=None, labels=None, gather_logits: bool = True,
                token_type_ids=None, task_type_ids=None, document_ids=None, last_position_only: bool = False):
        """Embed (first stage), run this stage's layers, project to the vocabulary (last stage).

        Inputs are batch-first ``(b, s)``; ``attention_mask`` 1 = real token. ``document_ids`` (packed
        pretraining with reset attention, :mod:`zhnlp.data.causal_lm`): the document number of every token;
        a token then attends only to earlier tokens of its own document (pass per-document ``position_ids``
        with it). Returns the hidden states ``(s, b, h)`` on stages without the head, else
        ``{"logits": (b, s, V)}`` (and ``loss``). ``last_position_only`` (generation; no labels, no sequence
        parallelism): project only the last position, ``{"logits": (b, 1, V)}``; the vocabulary projection of
        the other positions is most of a short prompt's cost with a large vocabulary."""
        if token_type_ids is not None or task_type_ids is not None:
            raise TypeError("ERNIE 4.5 has no token_type_ids/task_type_ids; call model(input_ids, "
                            "attention_mask=..., position_ids=..., labels=...) with keywords.")
        b, s = input_ids.shape
        mask = None  # (b, 1, 1, s) True = padding key, or (b, 1, s, s) True = key hidden from the query
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = (attention_mask == 0)[:, None, None, :]
        if document_ids is not None and bool((document_ids != document_ids[:, :1]).any()):
            other = document_ids[:, None, :, None] != document_ids[:, None, None, :]  # (b, 1, s, s)
            mask = other if mask is None else other | mask
        if position_ids is None:
            position_ids = torch.arange(s, device=input_ids.device).expand(b, s)
        # tied weights with the embedding and the output layer both here: their gradients meet in one tensor
        tied = (TiedWeightGrad() if self.pre_process and self.post_process and self.share_embeddings_and_output_weights
                and torch.is_grad_enabled() else None)
        hidden = self.embedding(input_ids, tied_grad=tied) if self.pre_process else None
        hidden = self.encoder(hidden, mask, rotary_pos_emb=self._rope(position_ids, s))  # (s, b, h)
        if not self.post_process:
            return hidden
        # megatron's shared_embedding_or_output_weight() names the embeddings whenever this stage has them
        weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        if last_position_only:
            if labels is not None or self.config.sequence_parallel:
                raise ValueError("last_position_only=True is for generation: without labels and without "
                                 "sequence parallelism (the last position lives on one rank there).")
            hidden = hidden[-1:]  # (1, b, h)
        logits, _ = self.output_layer(hidden, weight=weight, tied_grad=tied)  # (s, b, Vp/tp)
        out = {}
        if labels is not None:
            tp_rank = parallel_state.get_tensor_model_parallel_rank()
            out["loss"] = vocab_parallel_causal_lm_loss(logits, shift_labels(labels), self.arch.vocab_size,
                                                        tp_rank * logits.size(-1),
                                                        parallel_state.get_tensor_model_parallel_world_size())
        if gather_logits:
            logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
            out["logits"] = logits[..., : self.arch.vocab_size].transpose(0, 1)  # (b, s, V)
        return out


class _WordEmbedding(MegatronModule):
    """Vocabulary-parallel word embedding, output ``(s, b, h)`` (scattered under sequence parallelism).
    A MegatronModule so that distributed checkpoints reach the embedding's own sharded state (split by
    vocabulary over TP) instead of saving every rank's slice as if it were the whole."""

    def __init__(self, config, vocab_size: int):
        super().__init__(config=config)
        self.word_embeddings = VocabEmbedding(vocab_size, config.hidden_size, init_method=config.init_method,
                                              config=config)

    def forward(self, input_ids, tied_grad: TiedWeightGrad | None = None):
        x = self.word_embeddings(input_ids, tied_grad=tied_grad).transpose(0, 1).contiguous()  # (s, b, h)
        if self.config.sequence_parallel:
            x = tensor_parallel.scatter_to_sequence_parallel_region(x)  # (s/tp, b, h)
        return x
