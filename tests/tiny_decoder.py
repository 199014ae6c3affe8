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
