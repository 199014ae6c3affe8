"""Memory per rank beyond the persistent part: activations, logits and the transients of a training step.

A step's peak is reached in one of three moments, and the planner takes the largest:

* **the head's backward**, when the saved activations of every micro-batch in flight on the stage are live
  together with the output layer's logits and their gradient (the last stage);
* **the end of the backward**, on the stage holding the word embeddings: an encoder's tied output weight gets its
  gradient as three vocabulary-sized temporaries (its product, the embedding's scatter and their sum);
* **the optimizer step**: torch's single-tensor AdamW keeps two temporaries the size of the largest parameter
  (or shard, under the distributed optimizer) in fp32.

Saved activations per layer and token are counted tensor by tensor as megatron-core 0.16 saves them with the
trainer's layer specs, in elements of the activation dtype (fp32 for the statistics: norm inverses, attention
log-sum-exp); each was identified with the profiler's memory events (``scripts/validate_planner.py``'s notes):

* ERNIE/BERT encoder layer (post-LayerNorm, GELU, fused attention): the QKV projection's output (3h), the
  attention output (h), two residual sums and two LayerNorm outputs (4h), the MLP's two intermediate tensors (2f),
  attention's log-sum-exp (a per token) and the LayerNorm statistics.
* ERNIE 4.5 decoder layer (pre-RMSNorm, rotary, grouped-query attention, SwiGLU): two tensors per RMSNorm (4h), two
  residual sums (2h), the rotated queries, the keys and values expanded to all heads and the attention output
  (4 x heads x head_dim), the rotary tables (4 x head_dim), five SwiGLU intermediates (5f).
* MoE layer: the attention part as above, the shared experts' SwiGLU (5 x shared size), per routed copy of a token
  (``k`` per token) its permuted hidden state and six intermediates of the expert MLP (h + 6 x moe_f), and the
  router's probabilities, top-k and masks (about 6 x experts).

Split over tensor parallelism: everything per head or per MLP column (a/tp heads, f/tp); with sequence
parallelism the rest too (the sequence is split). Full recompute keeps each layer's input and recomputes one
layer at a time; selective recompute changes nothing here (the fused attention saves no s x s scores).
Under ``--fsdp`` the head's moment also holds the root unit's unsharded weights (embeddings, final norm,
output layer: FSDP2 keeps the root gathered from its forward to its backward; its all-gather buffer is gone
after the copy-out, and the layers are resharded after their forward), counted with two layers' unsharded
weights beside it (a layer gathered again for its backward and the one prefetched); the end of an encoder's
backward the root's unsharded gradients and their reduce-scatter input.
Attention dropout would make torch's CPU attention fall back to the unfused path, which saves the s x s
probabilities: counted (heads x s x (2 x dtype + 1 byte mask) per token) but not measured here, since the
recipes train without dropout.
"""

from __future__ import annotations

from zhnlp.planning.layout import Layout
from zhnlp.planning.memory import BYTES, static_memory
from zhnlp.planning.params import stage_layers

FP32 = 4


def _is_decoder(arch) -> bool:
    return hasattr(arch, "num_key_value_heads")


def _layer_bytes_per_token(arch, layout: Layout, layer: int, seq_length: int) -> float:
    """Saved-activation bytes per token of the micro-batch for one layer on one rank."""
    tp = layout.tp
    sp = tp if layout.sequence_parallel else 1  # the sequence-wide tensors are split too
    p = BYTES[layout.precision]
    h = arch.hidden_size
    if not _is_decoder(arch):
        a, f = arch.num_attention_heads, arch.intermediate_size
        whole = (4 * h * p + 4 * FP32) / sp  # residual sums, LayerNorm outputs, their mean and inverse std
        split = (4 * h + 2 * f) * p / tp + a * FP32 / tp  # QKV, attention output, MLP in/out; log-sum-exp
        dropout = 2 * h / sp if arch.hidden_dropout_prob else 0  # bias-dropout-add masks (one byte each)
        probs = a / tp * seq_length * (2 * p + 1) if arch.attention_probs_dropout_prob else 0
        return whole + split + dropout + probs
    a, hd = arch.num_attention_heads, arch.head_dim
    whole = (6 * h * p + 2 * FP32) / sp + 4 * hd * p  # norms, residual sums, norm inverses; rotary tables
    attention = 4 * a * hd * p / tp + a * FP32 / tp
    if getattr(arch, "is_moe", False) and arch.is_moe_layer(layer):
        k, mf, e = arch.moe_k, arch.moe_intermediate_size, arch.moe_num_experts
        shared = 5 * arch.shared_expert_size * p / tp if arch.shared_expert_size else 0
        routed = k * (h * p + 6 * mf * p / layout.expert_tp) / sp
        router = 6 * e * FP32 / sp
        return whole + attention + shared + routed + router
    return whole + attention + 5 * arch.intermediate_size * p / tp


def _loss_bytes(rows: int, vocab: int, tp: int, p: int, blockwise: bool) -> int:
    """The output layer's logits and the cross-entropy's vocabulary-sized tensors at the head's backward.

    * Without tensor parallelism the decoders use zhnlp's blockwise cross-entropy
      (:mod:`zhnlp.models.common.cross_entropy`): the logits and their gradient, plus three fp32 blocks of
      about 8 MB when the logits are not fp32 (the upcast block, its softmax and the previous block's).
    * Otherwise (megatron's vocab-parallel kernel on an fp32 copy of the shard, or the encoders'
      ``F.cross_entropy`` on upcast logits): the logits in their dtype and two fp32 tensors of the shard
      (the softmax kept for backward and the gradient written from it)."""
    from zhnlp.models.common.cross_entropy import BLOCK_ELEMENTS

    width = vocab // tp
    if blockwise and tp == 1:
        if p == FP32:
            return 2 * rows * width * FP32
        block = min(rows, max(1, BLOCK_ELEMENTS // width)) * width
        return 2 * rows * width * p + 3 * block * FP32
    return rows * width * (2 * FP32 + p)


def _fsdp_units(arch, layout: Layout, stage: int, layers: list[int]) -> tuple[int, int]:
    """Parameters of one rank's FSDP units before sharding: the root (the chunk: embeddings, output layer, final
    norms) and the largest transformer layer (one unit each)."""
    import dataclasses

    from zhnlp.planning.params import stage_params

    whole = dataclasses.replace(layout, fsdp=False)
    total = sum(stage_params(arch, whole, stage).values())
    middle = dataclasses.replace(whole, world=whole.world * 3 // whole.pp if whole.pp != 3 else whole.world, pp=3)
    sizes = [sum(_stage_of(arch, middle, [i]).values()) for i in layers] or [0]
    return total - sum(sizes), max(sizes)


def _stage_of(arch, layout: Layout, layers: list[int]) -> dict:
    """The parameters of ``layers`` alone (a middle pipeline stage holds neither embeddings nor head)."""
    from zhnlp.planning import params

    if _is_decoder(arch):
        return params._decoder_stage(arch, layout, 1, layers)
    return params._encoder_stage(arch, layout, 1, layers)


def _in_flight(layout: Layout, stage: int, micro_batches: int) -> int:
    """Micro-batch chunks whose activations a pipeline stage holds at once (megatron's 1F1B and interleaved
    schedules: the warm-up forwards plus the one in steady state)."""
    if layout.pp == 1:
        return 1
    vpp = layout.vpp or 1
    if vpp == 1:
        return min(layout.pp - stage, micro_batches)
    return min((layout.pp - stage - 1) * 2 + (vpp - 1) * layout.pp + 1, micro_batches * vpp)


def activation_memory(arch, layout: Layout, *, micro_batch: int, seq_length: int, global_batch: int,
                      predicted_tokens: int | None = None, mask_prob: float = 0.15) -> list[dict]:
    """Per pipeline stage: bytes of ``activations`` (saved by the micro-batches in flight), ``head`` (logits and
    their gradient in the output layer's backward: last stage), ``embedding_grad`` (an encoder's tied word
    embedding gradient at the end of the backward) and ``optimizer`` (AdamW's temporaries in the step).

    ``predicted_tokens``: positions of one micro-batch that the masked-LM head predicts (default: ``mask_prob``
    of full sequences; pass the corpus's figure to compare with a measurement). Causal LM predicts every token,
    and so does the masked-LM head under sequence parallelism (it cannot gather masked positions of a split
    sequence)."""
    dp = layout.dp
    if global_batch % (micro_batch * dp):
        raise ValueError(f"global batch {global_batch} is not a multiple of micro-batch {micro_batch} x dp {dp}")
    m = global_batch // (micro_batch * dp)
    tokens = micro_batch * seq_length
    sp = layout.tp if layout.sequence_parallel else 1
    p = BYTES[layout.precision]
    h, v, tp = arch.hidden_size, arch.padded_vocab_size, layout.tp
    chunks = layout.pp * (layout.vpp or 1)
    static = static_memory(arch, layout)
    out = []
    for stage in range(layout.pp):
        layers = stage_layers(arch.num_hidden_layers, layout, stage)
        vpp, flight = layout.vpp or 1, _in_flight(layout, stage, m)
        per_layer = [_layer_bytes_per_token(arch, layout, i, seq_length) * tokens for i in layers]
        recomputed = 0
        if layout.recompute == "full":  # each layer keeps its input; one is rematerialised in its backward
            acts = flight * len(layers) / vpp * tokens * h * p / sp
            recomputed = max(per_layer, default=0)
        else:
            acts = flight * sum(per_layer) / vpp
        if stage == 0:  # the embeddings' sum and (encoders) their LayerNorm
            acts += tokens * (2 * h * p + 2 * FP32) / sp if not _is_decoder(arch) else 0
        head = 0
        if stage == layout.pp - 1:
            if _is_decoder(arch):  # the final norm, then the logits of every token
                acts += tokens * (3 * h * p + FP32) / sp
                head = _loss_bytes(tokens, v, tp, p, blockwise=True)
            else:
                n = tokens if layout.sequence_parallel else (
                    predicted_tokens if predicted_tokens is not None else round(mask_prob * seq_length) * micro_batch)
                head = _loss_bytes(n, v, tp, p, blockwise=False) + n * (3 * h * p + 2 * FP32)  # + the transform
        head = max(head, recomputed)  # a recomputed layer lives in its own backward, after the head's
        embedding_grad = 3 * v * h // tp * p if stage == 0 and not _is_decoder(arch) else 0  # in the weights' dtype
        if layout.fsdp:  # the units' unsharded weights (see the module docstring)
            root, layer = _fsdp_units(arch, layout, stage, layers)
            head += (root + 2 * layer) * p  # the root unit, a layer and the one prefetched
            embedding_grad += 2 * root * p  # the root's unsharded gradients and their reduce-scatter input
        largest = max(v * h // tp, 3 * h * h // tp, h * getattr(arch, "intermediate_size", h) * 2 // tp)
        if layout.distributed_optimizer:
            largest = -(-static[stage]["optimizer"] // (8 + (4 if layout.precision != "fp32" else 0)))
            largest = min(largest, v * h // tp)
        optimizer = int(2 * largest * FP32 * (1 - layout.optimizer_offload))  # the offloaded part steps on the host
        out.append({"activations": int(acts), "head": int(head), "embedding_grad": int(embedding_grad),
                    "optimizer": int(optimizer), "in_flight": _in_flight(layout, stage, m), "chunks": chunks})
    return out


def peak_memory(arch, layout: Layout, **batch) -> list[dict]:
    """Per pipeline stage: the persistent parts (:func:`zhnlp.planning.memory.static_memory`), the transients
    (:func:`activation_memory`), the ``phase`` at which the peak is reached and the peak ``total`` in bytes."""
    out = []
    for static, transient in zip(static_memory(arch, layout), activation_memory(arch, layout, **batch)):
        phases = {"backward": transient["activations"] + transient["head"],
                  "embedding_grad": transient["embedding_grad"], "optimizer": transient["optimizer"]}
        phase = max(phases, key=phases.get)
        out.append({**{k: static[k] for k in ("weights", "gradients")}, "optimizer_states": static["optimizer"],
                    "activations": transient["activations"], "head": transient["head"],
                    "transient": phases[phase] - (transient["activations"] + transient["head"]
                                                  if phase == "backward" else 0),
                    "phase": phase, "total": static["total"] + phases[phase]})
    return out
