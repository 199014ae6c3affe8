"""Tiny random configurations of the three families the parity tests cover, and their inputs."""

from __future__ import annotations

import torch

# ERNIE 3.0 shape (task ids on, 4 token types), ERNIE 1.0 shape (relu, no task ids), BERT.
# Heads 4, FFN 48 and vocab 250 (padded to 256) split two ways; 4 layers split into 2 or 4 stages.
CONFIGS = {
    "ernie3": dict(model_type="ernie", vocab_size=250, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                   intermediate_size=48, hidden_act="gelu", max_position_embeddings=64, type_vocab_size=4,
                   use_task_id=True, task_type_vocab_size=3, layer_norm_eps=1e-5),
    "ernie1": dict(model_type="ernie", vocab_size=250, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                   intermediate_size=48, hidden_act="relu", max_position_embeddings=40, type_vocab_size=2,
                   use_task_id=False, layer_norm_eps=1e-5),
    "bert": dict(model_type="bert", vocab_size=250, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=48, hidden_act="gelu", max_position_embeddings=64, type_vocab_size=2,
                 layer_norm_eps=1e-12),
    # ELECTRA: embedding tables narrower than the encoder (embeddings_project 24 -> 32), and as wide (no projection)
    "electra_small": dict(model_type="electra", vocab_size=250, embedding_size=24, hidden_size=32, num_hidden_layers=4,
                          num_attention_heads=4, intermediate_size=48, hidden_act="gelu", max_position_embeddings=64,
                          type_vocab_size=2, layer_norm_eps=1e-12),
    "electra_base": dict(model_type="electra", vocab_size=250, embedding_size=32, hidden_size=32, num_hidden_layers=4,
                         num_attention_heads=4, intermediate_size=48, hidden_act="gelu_new", max_position_embeddings=40,
                         type_vocab_size=3, layer_norm_eps=1e-5),
    # RoFormer: rotary positions, no position table. As the real checkpoints (tables as wide as the encoder), and
    # with narrower tables (embeddings_project 24 -> 32), rotary values too and 2 heads of 16
    "roformer": dict(model_type="roformer", vocab_size=250, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=48, hidden_act="gelu", max_position_embeddings=64, type_vocab_size=2,
                     layer_norm_eps=1e-12),
    "roformer_proj": dict(model_type="roformer", vocab_size=250, embedding_size=24, hidden_size=32,
                          num_hidden_layers=4, num_attention_heads=2, intermediate_size=48, hidden_act="gelu_new",
                          max_position_embeddings=40, type_vocab_size=3, rotary_value=True, layer_norm_eps=1e-5),
    # ALBERT: tables of width 16/24 projected to 32; one group shared by all 4 layers (albert-tiny-chinese's shape),
    # and 3 groups of 2 layers over 4 applications (groups 0, 0, 1, 2 by transformers' rule: 8 layers run)
    "albert": dict(model_type="albert", vocab_size=250, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                   num_attention_heads=4, intermediate_size=48, hidden_act="gelu_new", max_position_embeddings=64,
                   type_vocab_size=2, layer_norm_eps=1e-12),
    "albert_groups": dict(model_type="albert", vocab_size=250, embedding_size=24, hidden_size=32, num_hidden_layers=4,
                          num_hidden_groups=3, inner_group_num=2, num_attention_heads=4, intermediate_size=48,
                          hidden_act="relu", max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-5),
}

# model_type -> the prefix of transformers' class names (ErnieConfig, BertForMaskedLM, ...)
HF_PREFIX = {"ernie": "Ernie", "bert": "Bert", "albert": "Albert", "roformer": "RoFormer", "electra": "Electra"}

HF_CLASSES = {
    "base": "Model",
    "mlm": "ForMaskedLM",
    "sequence_classification": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
    "question_answering": "ForQuestionAnswering",
}
# Heads only some families have (model_type -> head -> transformers class suffix), tested besides the five above
FAMILY_HEADS = {"electra": {"pretraining": "ForPreTraining"}}


def heads(name: str) -> list[str]:
    """The heads config ``name`` is tested with: every encoder's five, then its family's own."""
    return [*HF_CLASSES, *FAMILY_HEADS.get(CONFIGS[name]["model_type"], {})]


def hf_class_name(name: str, head: str) -> str:
    """transformers' class of config ``name`` with ``head`` (``BertForMaskedLM``, ``ElectraForPreTraining``, ...)."""
    model_type = CONFIGS[name]["model_type"]
    return HF_PREFIX[model_type] + {**HF_CLASSES, **FAMILY_HEADS.get(model_type, {})}[head]


# (config name, head) for every head of every config: what the table-driven parity tests run
CASES = [(name, head) for name in CONFIGS for head in heads(name)]


def hf_model(name: str, head: str, seed: int = 0, **extra):
    """A randomly initialised transformers model of config ``name`` with ``head``, in eval mode."""
    import transformers

    cfg = dict(CONFIGS[name], **extra)
    prefix = HF_PREFIX[cfg["model_type"]]
    config_cls = getattr(transformers, f"{prefix}Config")
    model_cls = getattr(transformers, hf_class_name(name, head))
    cfg.pop("model_type")
    torch.manual_seed(seed)
    model = model_cls(config_cls(**cfg)).eval()
    # Non-trivial LayerNorm and bias values, so that a mis-mapped weight cannot hide.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "LayerNorm" in n or "layer_norm" in n:  # ALBERT: full_layer_layer_norm
                p.add_(torch.randn_like(p) * 0.1)
    return model


def inputs(name: str, head: str, batch: int = 4, seq: int = 12, seed: int = 0) -> dict:
    """A padded batch with labels for ``head``."""
    cfg = CONFIGS[name]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, cfg["vocab_size"], (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, seq - 4:] = 0
    mask[2, seq - 7:] = 0
    out = {"input_ids": ids, "attention_mask": mask,
           "token_type_ids": torch.randint(0, cfg["type_vocab_size"], (batch, seq), generator=g)}
    if cfg.get("use_task_id"):
        out["task_type_ids"] = torch.randint(0, cfg["task_type_vocab_size"], (batch, seq), generator=g)
    if head == "mlm":
        labels = torch.full((batch, seq), -100)
        pick = torch.rand(batch, seq, generator=g) < 0.3
        labels[pick] = ids[pick]
        out["labels"] = labels.masked_fill(mask == 0, -100)
    elif head == "sequence_classification":
        out["labels"] = torch.randint(0, 2, (batch,), generator=g)
    elif head == "token_classification":
        out["labels"] = torch.randint(0, 2, (batch, seq), generator=g).masked_fill(mask == 0, -100)
    elif head == "pretraining":  # 1 = replaced, 0 = original; padding's labels are random too (the loss skips it)
        out["labels"] = torch.randint(0, 2, (batch, seq), generator=g)
    elif head == "question_answering":
        out["start_positions"] = torch.tensor([1, 3, 0, seq + 5])[:batch]  # the last is out of range: ignored
        out["end_positions"] = torch.tensor([2, 4, 0, 1])[:batch]
    return out
