"""Tiny random ERNIE 4.5 decoder configurations for the parity tests, and their inputs."""

from __future__ import annotations

import torch

# GQA (4 heads over 2 key/value heads), head_dim 8 != hidden/heads, odd vocabulary 251 (padded to 256),
# 3 layers; tied without biases and untied with biases.
BASE = dict(vocab_size=251, hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
CONFIGS = {
    "tied": dict(BASE, tie_word_embeddings=True, use_bias=False),
    "untied_bias": dict(BASE, tie_word_embeddings=False, use_bias=True),
}


def hf_model(name: str, seed: int = 0, **extra):
    """A randomly initialised transformers ``Ernie4_5ForCausalLM`` of config ``name``, in eval mode, fp32."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(**{**CONFIGS[name], **extra})).eval().float()
    # Non-trivial norm weights and biases, so that a mis-mapped weight cannot hide.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def inputs(batch: int = 3, seq: int = 10, seed: int = 0) -> dict:
    """A right-padded batch with causal-LM labels (-100 on padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, BASE["vocab_size"], (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, seq - 3:] = 0
    mask[2, seq - 6:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# Mixture of experts (Ernie4_5_MoeForCausalLM): 4 experts, top-2, odd expert width 12, a dense first layer and a
# non-zero correction bias (set in hf_moe_model); with shared experts (tied, no biases) and without (untied, with
# biases, MoE only on every second layer).
MOE_BASE = dict(BASE, num_hidden_layers=4, moe_num_experts=4, moe_k=2, moe_intermediate_size=12,
                moe_layer_start_index=1, moe_layer_end_index=-1, moe_norm_min=1e-12)
MOE_CONFIGS = {
    "moe_shared": dict(MOE_BASE, moe_num_shared_experts=2, moe_layer_interval=1, tie_word_embeddings=True,
                       use_bias=False),
    "moe_bias_interval": dict(MOE_BASE, moe_num_shared_experts=0, moe_layer_interval=2, tie_word_embeddings=False,
                              use_bias=True),
}


def hf_moe_model(name: str, seed: int = 0, **extra):
    """A randomly initialised transformers ``Ernie4_5_MoeForCausalLM`` of MoE config ``name``, eval mode, fp32,
    with a correction bias large enough to change which experts are chosen."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.Ernie4_5_MoeConfig(**{**MOE_CONFIGS[name], **extra})
    model = transformers.Ernie4_5_MoeForCausalLM(config).eval().float()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if n.endswith("e_score_correction_bias"):
                p.copy_(torch.randn_like(p) * 0.05)  # softmax scores of 4 experts are ~0.25 +- 0.05
    return model


def hf_moe_grads(model) -> dict:
    """transformers' in-memory gradients under the checkpoint's key names (fused 3-D expert tensors split per
    expert as save_pretrained writes them)."""
    out = {}
    for n, p in model.named_parameters():
        if p.grad is None:
            continue
        if n.endswith("mlp.experts.gate_up_proj"):
            half = p.shape[1] // 2
            for e in range(p.shape[0]):
                out[n.replace("gate_up_proj", f"{e}.gate_proj.weight")] = p.grad[e, :half]
                out[n.replace("gate_up_proj", f"{e}.up_proj.weight")] = p.grad[e, half:]
        elif n.endswith("mlp.experts.down_proj"):
            for e in range(p.shape[0]):
                out[n.replace("down_proj", f"{e}.down_proj.weight")] = p.grad[e]
        else:
            out[n] = p.grad
    return out
