"""transformers' model methods that need the whole model's view: counting parameters over every shard and
stage, and resizing the vocabulary (which moves rows between tensor-parallel ranks)."""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist

from zhnlp.conversion import engine
from zhnlp.conversion.mappings import Rename, Tied

logger = logging.getLogger("zhnlp")


def _is_embedding(name: str) -> bool:
    # transformers' exclude_embeddings drops nn.Embedding weights (word, position, token type), not the norm
    return name.startswith("embedding.") and "_embeddings." in name


def num_parameters(model, only_trainable: bool, exclude_embeddings: bool) -> int:
    table = model.family.bridge.table(model.config)
    counts: dict[str, int] = {}
    for chunk in model.chunks:
        names, dims = engine.global_param_names(chunk), engine.split_dims(chunk)
        for local, p in chunk.named_parameters():
            name = names[local]
            mapping, _ = table.find(name)
            if isinstance(mapping, Tied) or (only_trainable and not p.requires_grad):
                continue
            if exclude_embeddings and _is_embedding(name):
                continue
            n = p.numel() * (model.layout.tp if dims[local] is not None else 1)
            if getattr(mapping, "vocab", False):  # padding rows are megatron's, not the model's
                n = n // model.config.padded_vocab_size * model.config.vocab_size
            counts[name] = n
    if model.layout.pp > 1:
        from megatron.core import parallel_state as ps

        group = ps.get_pipeline_model_parallel_group()
        stages = [None] * model.layout.pp
        dist.all_gather_object(stages, counts, group=group)
        counts = {k: v for stage in stages for k, v in stage.items()}
    constants = getattr(model.family.bridge, "constant_weights", None)
    if constants is not None and not (only_trainable or exclude_embeddings):
        # frozen embedding tables transformers keeps as parameters (RoFormer's sinusoidal positions)
        counts.update({k: t.numel() for k, t in constants(model.config).items()})
    return sum(counts.values())


def resize_token_embeddings(model, new_num_tokens: int | None, pad_to_multiple_of: int | None,
                            mean_resizing: bool) -> None:
    """Rebuild ``model``'s chunks with ``vocab_size = new_num_tokens`` (rounded up to ``pad_to_multiple_of``),
    keeping every weight and the first ``min(old, new)`` vocabulary rows."""
    from megatron.core import parallel_state as ps

    old = model.config.vocab_size
    new = old if new_num_tokens is None else new_num_tokens
    for what, value in (("new_num_tokens", new), ("pad_to_multiple_of", pad_to_multiple_of or 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive integer, got {value!r}.")
    if pad_to_multiple_of:
        new = -(-new // pad_to_multiple_of) * pad_to_multiple_of
    if new == old:
        return
    lay = model.layout
    table = model.family.bridge.table(model.config)
    tensors: dict[str, torch.Tensor] = {}
    vocab_keys = set()
    for chunk in model.chunks:  # full tensors of this stage, tied copies included
        names, dims = engine.global_param_names(chunk), engine.split_dims(chunk)
        for local, p in chunk.named_parameters():
            full = p.detach()
            if dims[local] is not None and lay.tp > 1:
                pieces = [torch.empty_like(full) for _ in range(lay.tp)]
                dist.all_gather(pieces, full.contiguous(), group=ps.get_tensor_model_parallel_group())
                full = torch.cat(pieces, dim=dims[local])
            mapping, layer = table.find(names[local])
            for key, value in Rename.to_hf(mapping, full, layer).items() if isinstance(mapping, Tied) else \
                    mapping.to_hf(full, layer).items():
                tensors[key] = value.contiguous().clone()
                if getattr(mapping, "vocab", False):
                    vocab_keys.add(key)
    std = model.config.initializer_range
    for key in vocab_keys:
        value = tensors[key]
        if new < old:
            tensors[key] = value[:new].clone()
            continue
        if mean_resizing:
            added = value.float().mean(dim=0, keepdim=True).expand(new - old, *value.shape[1:])
        elif value.dim() == 1:  # a bias
            added = torch.zeros(new - old)
        else:
            gen = torch.Generator().manual_seed(1234 + new)
            added = torch.empty(new - old, *value.shape[1:]).normal_(0.0, std, generator=gen)
        tensors[key] = torch.cat([value, added.to(value.dtype)])
    arch = dataclasses.replace(model.config, vocab_size=new)
    rebuilt = type(model)(model.family, arch, model.head, {**model.run_options, "perform_initialization": False})
    new_table = model.family.bridge.table(arch)
    reader = engine.TensorReader(tensors)
    for chunk in rebuilt.chunks:
        engine.load_chunk(chunk, new_table, reader, lay.tp_rank, lay.tp, set(), expert_tp=(lay.etp_rank, lay.etp))
    rebuilt.train(model.training)
    for setting in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
        setattr(rebuilt.transformer_config, setting, getattr(model.transformer_config, setting))
    model.chunks, model.config, model.transformer_config = rebuilt.chunks, arch, rebuilt.transformer_config
    if lay.rank == 0:
        logger.info("vocabulary resized from %d to %d tokens", old, new)
