"""One decoding loop with a KV cache for every decoder family: ``model.generate(...)``, transformers' semantics.

The cache lives in the core attention of each layer (:class:`~zhnlp.models.common.decoder.CausalSDPAttention`
``.kv_cache``): keys and values after RoPE, ``(b, ng/tp, t, hd)``, appended each step. The prompt runs once,
then one token per step. Returns prompt + new ids ``(b, s + n)``; rows that produced ``eos_token_id`` are
continued with ``pad_token_id``, and the loop stops when every row has. Under TP every rank computes the same
complete logits. Under PP (with or without virtual stages) each step passes the hidden states from stage to stage
(point-to-point, in the order of the model chunks: stage 0 chunk 0, stage 1 chunk 0, ..., stage 0 chunk 1, ...),
each stage keeping the KV cache of its own layers, and the last stage broadcasts the last position's logits to its
pipeline group, so every rank picks the same token (sampling draws from ``torch``'s generator: seed it the same on
every rank). Sequence parallelism is refused: a one-token step cannot be split over the TP ranks.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def kv_cache(*chunks):
    """Give every layer's core attention (of every chunk given) an empty cache for the duration."""
    attentions = [layer.self_attention.core_attention for chunk in chunks for layer in chunk.encoder.layers]
    for a in attentions:
        a.kv_cache = {}
    try:
        yield
    finally:
        for a in attentions:
            a.kv_cache = None


def _pick(logits, ids, do_sample, temperature, top_k, top_p, repetition_penalty):
    """Next token ``(b,)`` from last-position logits ``(b, V)`` (float32), processed as transformers does:
    repetition penalty, then temperature, top-k, top-p."""
    if repetition_penalty != 1.0:
        seen = logits.gather(1, ids)
        logits = logits.scatter(1, ids, torch.where(seen < 0, seen * repetition_penalty, seen / repetition_penalty))
    if not do_sample:
        return logits.argmax(-1)
    if temperature != 1.0:
        logits = logits / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative <= 1 - top_p
        remove[:, -1] = False  # keep at least one token
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1).squeeze(1)


def _pipeline_logits(model, ids, mask, positions):
    """One decoding step through the pipeline -> the last position's logits ``(b, V)`` float32 on every rank."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from zhnlp import distributed

    lay, tconf = model.layout, model.transformer_config
    group = ps.get_pipeline_model_parallel_group()
    ranks = dist.get_process_group_ranks(group)
    before, after = ranks[(lay.pp_rank - 1) % lay.pp], ranks[(lay.pp_rank + 1) % lay.pp]
    b, s = ids.shape
    dev = distributed.device()
    logits = None
    for chunk in model.chunks:  # this stage's chunks in pipeline order
        if not chunk.pre_process:
            hidden = torch.empty((s, b, tconf.hidden_size), dtype=tconf.params_dtype, device=dev)
            dist.recv(hidden, src=before)
            chunk.set_input_tensor(hidden)
        out = chunk(ids, attention_mask=mask, position_ids=positions, last_position_only=True)
        if chunk.post_process:
            logits = out["logits"][:, -1].float().contiguous()
        else:
            dist.send(out.contiguous(), dst=after)
    if logits is None:
        logits = torch.empty((b, model.config.vocab_size), dtype=torch.float32, device=dev)
    dist.broadcast(logits, src=ranks[-1], group=group)
    return logits


@torch.no_grad()
def generate(model, input_ids, attention_mask=None, max_new_tokens: int = 20, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             repetition_penalty: float = 1.0, eos_token_id=None, pad_token_id=None, streamer=None):
    """See :meth:`PretrainedModel.generate`."""
    from zhnlp import distributed
    from zhnlp.distributed import cpu

    if model.transformer_config.sequence_parallel:
        raise NotImplementedError("generate() does not run under sequence parallelism (a one-token step cannot be "
                                  "split over the TP ranks); load the model without sequence_parallel=True.")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}.")
    if do_sample and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature!r}.")
    cfg = model.config
    eos = cfg.eos_token_id if eos_token_id is None else eos_token_id
    eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    pad = pad_token_id if pad_token_id is not None else (cfg.pad_token_id if cfg.pad_token_id is not None
                                                          else next(iter(eos), 0))
    dev = distributed.device()
    ids = input_ids.to(dev)
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.to(dev)
    # positions count real tokens only, so a left-padded prompt continues where its text ends
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    chunks = model.chunks
    was_training = model.training
    model.eval()
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=dev)
    if streamer is not None:
        streamer.put(ids.cpu())
    step_ids, step_pos = ids, positions
    try:
        with cpu.scope(), kv_cache(*chunks):
            for _ in range(max_new_tokens):
                if model.layout.pp == 1:
                    logits = chunks[0](step_ids, attention_mask=mask, position_ids=step_pos,
                                       last_position_only=True)["logits"][:, -1].float()
                else:
                    logits = _pipeline_logits(model, step_ids, mask, step_pos)
                new = _pick(logits, ids, do_sample, temperature, top_k, top_p, repetition_penalty)
                new = torch.where(done, torch.full_like(new, pad), new)
                ids = torch.cat([ids, new[:, None]], dim=1)
                if streamer is not None:
                    streamer.put(new.cpu())
                done = done | torch.isin(new, torch.tensor(sorted(eos), device=dev, dtype=new.dtype))
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                step_ids, step_pos = new[:, None], positions[:, -1:] + 1
                positions = torch.cat([positions, step_pos], dim=1)
    finally:
        model.train(was_training)
        if streamer is not None:
            streamer.end()
    return ids
