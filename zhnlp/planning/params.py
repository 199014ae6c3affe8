"""Parameters per rank of the recipe families (ERNIE/BERT encoders with the masked-LM head, ERNIE 4.5 decoders
dense and MoE with the causal-LM head) under a parallel layout, counted from the architecture alone.

Each pipeline stage holds ``vpp`` chunks of ``L / (pp * vpp)`` consecutive layers (chunk ``v`` of stage ``i`` is
global chunk ``v * pp + i``), the embeddings on the first stage and the head on the last; a tied output layer on
a last stage that is not the first keeps its own copy of the word embeddings (megatron all-reduces the two
gradients). Column- and row-parallel weights and the vocabulary are split over ``tp``; norms, position
embeddings and row-parallel biases are whole on every TP rank; routed experts are split ``E / ep`` per rank and
each expert's MLP over ``etp``.

Counts come in three groups, because each is treated differently by the engine: ``dense`` (gradients reduced
over the data-parallel ranks), ``expert`` (routed experts: reduced over the expert-data-parallel ranks) and
``frozen`` (no gradient, no optimizer state: the MoE router's correction bias).
"""

from __future__ import annotations

from zhnlp.planning.layout import Layout


def _encoder_layer(a, tp: int) -> int:
    h, f = a.hidden_size, a.intermediate_size
    qkv = (3 * h * h + 3 * h) // tp
    proj = h * h // tp + h
    mlp = (f * h + f) // tp + h * f // tp + h
    return qkv + proj + mlp + 4 * h  # two LayerNorms (weight and bias)


def _encoder_stage(a, layout: Layout, stage: int, layers: list[int]) -> dict:
    tp, h, v = layout.tp, a.hidden_size, a.padded_vocab_size
    dense = len(layers) * _encoder_layer(a, tp)
    if stage == 0:
        dense += v * h // tp + (a.max_position_embeddings + a.type_vocab_size) * h + 2 * h
        dense += a.task_type_vocab_size * h if a.use_task_id else 0
    if stage == layout.pp - 1:  # the masked-LM head: transform (dense + LayerNorm) and the output bias
        dense += h * h + h + 2 * h + v // tp
        dense += v * h // tp if layout.pp > 1 else 0  # the tied output weight's copy
    return {"dense": dense, "expert": 0, "frozen": 0}


def _decoder_stage(a, layout: Layout, stage: int, layers: list[int]) -> dict:
    tp, etp, h, v = layout.tp, layout.expert_tp, a.hidden_size, a.padded_vocab_size
    hd, bias = a.head_dim, bool(a.use_bias)
    q_kv = (a.num_attention_heads + 2 * a.num_key_value_heads) * hd
    attention = q_kv * h // tp + (q_kv // tp if bias else 0) + h * a.num_attention_heads * hd // tp + (h if bias else 0)
    dense = expert = frozen = 0

    def mlp(width: int) -> int:  # SwiGLU: fc1 (gate and up, 2 x width) and fc2, split over tp
        return 3 * width * h // tp + ((2 * width // tp + h) if bias else 0)

    for layer in layers:
        dense += 2 * h + attention  # input and pre-MLP RMSNorm weights
        if getattr(a, "is_moe", False) and a.is_moe_layer(layer):
            dense += a.moe_num_experts * h  # the router (replicated)
            frozen += a.moe_num_experts  # its score-correction bias
            dense += mlp(a.shared_expert_size) if a.shared_expert_size else 0
            expert += a.moe_num_experts // layout.ep * 3 * a.moe_intermediate_size * h // etp  # no biases
        else:
            dense += mlp(a.intermediate_size)
    if stage == 0:
        dense += v * h // tp
    if stage == layout.pp - 1:
        dense += h  # the final RMSNorm
        if not a.tie_word_embeddings or layout.pp > 1:
            dense += v * h // tp
        if getattr(a, "is_moe", False) and bias:
            dense += v // tp
    return {"dense": dense, "expert": expert, "frozen": frozen}


def stage_layers(num_layers: int, layout: Layout, stage: int) -> list[int]:
    """Global indices (0-based) of the layers that pipeline stage ``stage`` holds."""
    chunks = layout.pp * (layout.vpp or 1)
    per = num_layers // chunks
    return [k * per + i for k in range(stage, chunks, layout.pp) for i in range(per)]


def stage_params(arch, layout: Layout, stage: int) -> dict:
    """``{"dense", "expert", "frozen"}`` parameter counts of one rank of pipeline stage ``stage``."""
    layers = stage_layers(arch.num_hidden_layers, layout, stage)
    if hasattr(arch, "num_key_value_heads"):  # the ERNIE 4.5 decoders
        return _decoder_stage(arch, layout, stage, layers)
    if hasattr(arch, "type_vocab_size") and getattr(arch, "model_type", "ernie") in ("ernie", "bert"):
        return _encoder_stage(arch, layout, stage, layers)
    raise ValueError(f"the planner has no parameter count for model_type {getattr(arch, 'model_type', None)!r} "
                     "(it covers the recipes' families: ernie/bert encoders and the ernie4_5 decoders)")


def params_per_rank(arch, layout: Layout) -> list[dict]:
    """:func:`stage_params` of every pipeline stage, first to last."""
    return [stage_params(arch, layout, s) for s in range(layout.pp)]
