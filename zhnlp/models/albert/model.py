"""ALBERT on megatron-core: factorised embeddings and layers whose weights are shared by groups.

transformers' ALBERT applies ``num_hidden_layers`` times one of ``num_hidden_groups`` groups of
``inner_group_num`` post-LN layers (:attr:`AlbertConfig.layer_slots` says which group's which layer serves
each applied layer). Here every applied layer is a megatron layer of its own (``num_hidden_layers x
inner_group_num`` of them), so megatron's pipeline split, recompute and schedules work unchanged, and the
weights are shared as follows:

* **Within a model chunk** (a pipeline stage, or one virtual chunk of one) the layers of one slot hold the
  *same* ``Parameter`` objects: after megatron's TransformerBlock has built the layers, each later layer of a
  slot has its parameters replaced by those of the chunk's first layer of that slot. Autograd then sums the
  gradients of every use, ``named_parameters()`` (and so megatron's DDP, optimizer and zhnlp's conversion)
  sees each weight once, and each layer keeps its own modules (its layer number, its [CLS]-only switch).
* **Across chunks** (pipeline stages, virtual chunks) each chunk holds its own copy of a slot's weights.
  They start equal (loaded from the same checkpoint keys, or initialised from one seed: every copy is named by
  the slot's first layer, ``shares_parameters_of``, which :func:`zhnlp.conversion.engine.global_param_names`
  reads) and stay equal because :func:`sync_shared_layer_grads` sums their gradients over the chunks of
  every pipeline stage before the optimizer step (like megatron's tied embeddings across first and last
  stage), so each copy gets the same update. The trainer runs it through ``Family.finalize_grads``, before
  megatron's ``finalize_model_grads`` (data-parallel reduction; the sums commute). Copies in chunks that do
  not hold the slot's first layer are marked megatron's ``shared``: the gradient norm counts each weight once
  (as transformers does) and ``save_pretrained`` writes each weight once.
* **Distributed checkpoints** (training resume) hold each shared weight once too, keyed by its slot rather
  than by layer (:meth:`AlbertModel.sharded_state_dict`): the owner's copy is saved, the others are replicas,
  the optimizer state follows the parameter, and any layout loads them.

Limits: the gradient sum runs before the data-parallel reduction, so megatron's ``overlap_grad_reduce`` (which
starts that reduction during the backward pass) is refused with PP or virtual chunks; a training loop other than
zhnlp's trainer must call :func:`sync_shared_layer_grads` itself under pipeline parallelism.

The rest is the ERNIE/BERT encoder (:class:`~zhnlp.models.ernie.model.ErnieModel`'s forward and heads) with
ALBERT's sizes: word/position/token-type tables of width ``embedding_size`` projected to the hidden size
(``embedding_hidden_mapping_in``), a masked-LM transform to ``embedding_size`` before the tied decoder, the
pooler (tanh) on the base model and the sequence classifier, and transformers' ALBERT layer, which adds the
FFN output to the residual without dropout.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from megatron.core.enums import ModelType
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import init_method_normal

from zhnlp.models.albert.config import AlbertConfig
from zhnlp.models.common import heads as H
from zhnlp.models.common.activations import ffn_activation
from zhnlp.models.common.embeddings import EncoderEmbeddings
from zhnlp.models.common.linear import ColumnLinear
from zhnlp.models.common.specs import post_ln_encoder_layer_spec, run_layout_options
from zhnlp.models.ernie.model import ErnieModel


def transformer_config(arch: AlbertConfig, *, tp: int = 1, pp: int = 1, vpp: int | None = None,
                       **run_options) -> TransformerConfig:
    """Meet point of the architecture and the run: megatron's TransformerConfig with one megatron layer per
    applied ALBERT layer. ``run_options`` are TransformerConfig fields chosen by the run."""
    arch.check_layout(tp, pp, vpp)
    init = init_method_normal(arch.initializer_range)
    params_dtype = run_options.pop("params_dtype", torch.float32)
    options = dict(
        num_layers=arch.num_layers,
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
        output_layer_init_method=init,
        init_method_std=arch.initializer_range,
        **run_layout_options(tp, pp, vpp, params_dtype),
    )
    options.update(run_options)
    return TransformerConfig(**options)


def _ffn_residual_add(training: bool, fused: bool):
    """The FFN's bias-dropout-add of an ALBERT layer: transformers' AlbertLayer adds the FFN output to the
    attention output without dropout (unlike BERT's), so the dropout is never applied here."""
    return get_bias_dropout_add(False, fused)


def albert_layer_spec():
    """The post-LN encoder layer with ALBERT's undropped FFN residual. The names map to transformers'
    ``attention.{query,key,value,dense,LayerNorm}``, ``ffn``, ``ffn_output`` and ``full_layer_layer_norm``."""
    spec = post_ln_encoder_layer_spec()
    spec.submodules.mlp_bda = _ffn_residual_add
    return spec


def share_layer_weights(layers, arch: AlbertConfig) -> list[int]:
    """Make the layers of one chunk that use the same weights (one slot) hold the same parameters, name every
    copy by its slot's first layer, and mark the copies the chunk holding that layer does not own. Returns, per
    layer of the chunk, the (chunk-local) index of the chunk's first layer of its slot: the one holding the
    parameters."""
    first: dict[tuple[int, int], int] = {}  # slot -> index of this chunk's first layer of it
    holders = []
    for i, layer in enumerate(layers):
        j = layer.layer_number - 1  # global, 0-based
        slot = arch.layer_slots[j]
        layer.shares_parameters_of = arch.slot_owner(j)
        holders.append(first.setdefault(slot, i))
        if holders[-1] == i:
            for name, p in layer.named_parameters():
                p.shared_layer = (*slot, name)  # read by sync_shared_layer_grads
                if layer.shares_parameters_of != j:
                    p.shared = True  # a copy of weights another chunk owns (megatron: not in the gradient norm)
            continue
        for module_name, module in layer.named_modules():
            source = layers[holders[-1]].get_submodule(module_name)
            for name, _ in list(module.named_parameters(recurse=False)):
                setattr(module, name, getattr(source, name))
    return holders


class AlbertModel(ErnieModel):
    """One pipeline stage (or virtual chunk) of an ALBERT encoder with one head.

    Args:
        config: megatron TransformerConfig from :func:`transformer_config`.
        arch: the architecture (vocabulary, embeddings, groups, head sizes).
        head: one of ``heads.HEADS`` that the bridge lists.
        pre_process: this chunk owns the embeddings (first stage).
        post_process: this chunk owns the head (last stage).
        vp_stage: virtual pipeline index of this chunk.
    """

    def __init__(self, config: TransformerConfig, arch: AlbertConfig, head: str = "base",
                 pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None):
        LanguageModule.__init__(self, config=config)  # ErnieModel's forward and heads, ALBERT's modules
        if head not in ("base", "mlm", "sequence_classification", "token_classification", "question_answering"):
            raise ValueError(f"unknown head {head!r} for ALBERT; choose base, mlm, sequence_classification, "
                             "token_classification or question_answering.")
        self.arch, self.head = arch, head
        self.model_type = ModelType.encoder_or_decoder  # read by megatron's pipeline schedules
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        self.share_embeddings_and_output_weights = head == "mlm"
        dtype, h, e = config.params_dtype, config.hidden_size, arch.embedding_size

        if pre_process:
            # tables of width e, LayerNorm and dropout, then embedding_hidden_mapping_in (e -> h)
            self.embedding = EncoderEmbeddings(config, arch.padded_vocab_size, arch.max_position_embeddings,
                                               arch.type_vocab_size, 0, arch.layer_norm_eps, embedding_size=e)
        self.encoder = TransformerBlock(config, albert_layer_spec(), post_layer_norm=False,
                                        pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
        self.layer_holders = share_layer_weights(self.encoder.layers, arch)
        if post_process:
            if head in ("base", "sequence_classification"):
                self.pooler = H.Pooler(h, dtype)
            if head == "sequence_classification" and not config.sequence_parallel and len(self.encoder.layers):
                # Only [CLS] reaches this head: the last layer need not compute the other positions.
                self.encoder.layers[-1].keep_first_token_only()
            if head in ("sequence_classification", "token_classification"):
                self.classifier = H.LinearHead(h, arch.num_labels, arch.classifier_dropout, dtype)
            elif head == "question_answering":
                self.qa_outputs = H.LinearHead(h, 2, 0.0, dtype)
            elif head == "mlm":
                # predictions.dense (h -> e), activation, predictions.LayerNorm (e)
                self.lm_transform = H.MaskedLMTransform(config, arch.hidden_act, arch.layer_norm_eps, out_size=e)
                for p in self.lm_transform.parameters():  # applied to sequence shards under SP
                    p.sequence_parallel = config.sequence_parallel
                # decoder (e -> vocabulary), tied to the word embeddings; a last stage that is not also the first
                # keeps a copy whose gradients megatron all-reduces with the first stage's
                self.output_layer = ColumnLinear(
                    e, arch.padded_vocab_size, config=config, init_method=config.init_method, bias=True,
                    gather_output=False, skip_bias_add=False, skip_weight_param_allocation=pre_process)
        self.drops_padding = (pre_process and post_process and head == "sequence_classification"
                              and not config.sequence_parallel and len(self.encoder.layers) > 0)
        if self.share_embeddings_and_output_weights:
            self.setup_embeddings_and_output_layer()

    # -- distributed checkpoints ------------------------------------------------------------------
    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """megatron's distributed-checkpoint view of this chunk, with each shared layer weight once: under the key
        of its slot (``encoder.layer_groups.G.K.<name>``, no layer axis), so that any layout saves and loads the
        same tensors. The chunk's later layers of a slot (the same parameters) are left out; a copy that another
        chunk owns is a replica (saved by the owner only, loaded like it). The optimizer's state follows."""
        out = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        for i, layer in enumerate(self.encoder.layers):
            local = f"{prefix}encoder.layers.{i}."
            g, k = self.arch.layer_slots[layer.layer_number - 1]
            copy = layer.shares_parameters_of != layer.layer_number - 1
            for name in [n for n in out if n.startswith(local) and isinstance(out[n], ShardedTensor)]:
                if self.layer_holders[i] != i:
                    del out[name]  # the same parameter as the holder's entry
                    continue
                t = out[name]  # key encoder.layers.<name>, with the layer axis prepended
                replica = t.replica_id if isinstance(t.replica_id, tuple) else (t.replica_id,)
                out[name] = dataclasses.replace(
                    t, key=f"{prefix}encoder.layer_groups.{g}.{k}.{name[len(local):]}",
                    global_shape=t.global_shape[1:], global_offset=t.global_offset[1:],
                    axis_fragmentations=t.axis_fragmentations[1:], prepend_axis_num=0,
                    replica_id=(int(copy) or replica[0], *replica[1:]))
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """A state dict from :meth:`sharded_state_dict` lacks the later layers of a slot: they hold the same
        parameters as the slot's first layer in the chunk, whose entries fill them."""
        state_dict = dict(state_dict)
        for i, layer in enumerate(self.encoder.layers):
            holder = self.layer_holders[i]
            for name, _ in layer.named_parameters(remove_duplicate=False):
                key, source = f"encoder.layers.{i}.{name}", f"encoder.layers.{holder}.{name}"
                if key not in state_dict and source in state_dict:
                    state_dict[key] = state_dict[source]
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


# ------------------------------------------------------------------------------------- training
def _unwrap(chunk) -> AlbertModel:
    """The AlbertModel inside megatron's wrappers (DistributedDataParallel, Float16Module)."""
    while not isinstance(chunk, AlbertModel):
        chunk = chunk.module
    return chunk


def _grad(p):
    """Where the gradient of ``p`` is accumulated: megatron DDP's ``main_grad`` buffer, else ``.grad``."""
    return p.main_grad if hasattr(p, "main_grad") else p.grad


def sync_shared_layer_grads(chunks) -> None:
    """Sum the gradients of every copy of a shared layer weight over this rank's model chunks and the pipeline
    stages, and give each copy the sum (collective over the pipeline-parallel group). Run after the backward
    passes of a step and before the data-parallel reduction (megatron's ``finalize_model_grads``); with one
    chunk and no pipeline it has nothing to do (the copies are one parameter)."""
    from megatron.core import parallel_state as ps

    pp = ps.get_pipeline_model_parallel_world_size()
    if pp == 1 and len(chunks) == 1:
        return
    for chunk in chunks:
        ddp = getattr(chunk, "ddp_config", None)
        if ddp is not None and ddp.overlap_grad_reduce:
            raise RuntimeError("ALBERT's shared layers need their gradients summed over the pipeline stages before "
                               "the data-parallel reduction; turn off overlap_grad_reduce.")
    models = [_unwrap(c) for c in chunks]
    copies: dict[tuple, list] = {}  # (group, inner, parameter name in the layer) -> this rank's copies
    for model in models:
        for p in model.parameters():
            key = getattr(p, "shared_layer", None)
            if key is not None:
                copies.setdefault(key, []).append(p)
    keys = _keys_held_twice(models[0], copies, pp)
    if not keys:
        return
    sizes = [_numel(models[0], key) for key in keys]
    flat = torch.zeros(sum(sizes), dtype=torch.float32, device=next(models[0].parameters()).device)
    offset = 0
    for key, n in zip(keys, sizes):
        for p in copies.get(key, ()):
            g = _grad(p)
            if g is not None:
                flat[offset:offset + n] += g.reshape(-1).float()
        offset += n
    if pp > 1:
        dist.all_reduce(flat, group=ps.get_pipeline_model_parallel_group())
    offset = 0
    for key, n in zip(keys, sizes):
        for p in copies.get(key, ()):
            total = flat[offset:offset + n].view(p.shape)
            if _grad(p) is not None:
                _grad(p).copy_(total)
            elif p.requires_grad:
                p.grad = total.to(p.dtype).clone()
        offset += n


def _numel(model: AlbertModel, key: tuple) -> int:
    """This rank's (TP shard) size of the weight ``key``: every layer has the same parameters."""
    return dict(model.encoder.layers[0].named_parameters())[key[2]].numel()


def _keys_held_twice(model: AlbertModel, copies: dict, pp: int) -> list[tuple]:
    """The shared weights that have more than one copy over the whole pipeline, in one order on every rank
    (collective over the pipeline group the first time; cached on ``model``)."""
    cached = getattr(model, "_shared_keys", None)
    if cached is not None:
        return cached
    held = {key: len(local) for key, local in copies.items()}
    if pp > 1:
        from megatron.core import parallel_state as ps

        every = [None] * pp
        dist.all_gather_object(every, held, group=ps.get_pipeline_model_parallel_group())
        held = {}
        for stage in every:
            for key, count in stage.items():
                held[key] = held.get(key, 0) + count
    model._shared_keys = sorted(key for key, count in held.items() if count > 1)
    return model._shared_keys
