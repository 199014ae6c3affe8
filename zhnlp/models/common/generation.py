"""One decoding loop with a KV cache for every decoder family: ``model.generate(...)``, transformers' semantics.

The cache lives in the core attention of each layer (:class:`~zhnlp.models.common.decoder.CausalSDPAttention`
``.kv_cache``): keys and values after RoPE, ``(b, ng/tp, t, hd)``, appended each step. The prompt runs once,
then one token per step. Returns prompt + new ids ``(b, s + n)``; rows that produced ``eos_token_id`` are
continued with ``pad_token_id``, and the loop stops when every row has. One pipeline stage only (PP > 1
is refused for now, and so is sequence parallelism); under TP every rank computes the same complete logits,
so greedy decoding agrees everywhere (sampling draws from ``torch``'s generator: seed it the same on every rank).
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def kv_cache(chunk):
    """Give every layer's core attention an empty cache for the duration."""
    attentions = [layer.self_attention.core_attention for layer in chunk.encoder.layers]
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


@torch.no_grad()
def generate(model, input_ids, attention_mask=None, max_new_tokens: int = 20, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             repetition_penalty: float = 1.0, eos_token_id=None, pad_token_id=None, streamer=None):
    """See :meth:`PretrainedModel.generate`."""
    from zhnlp import distributed
    from zhnlp.distributed import cpu

    if model.layout.pp > 1:
        raise NotImplementedError("generate() runs on one pipeline stage for now; load the model with pp=1 "
                                  "(tensor parallelism is fine).")
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
    chunk = model.chunks[0]
    was_training = model.training
    model.eval()
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=dev)
    if streamer is not None:
        streamer.put(ids.cpu())
    step_ids, step_pos = ids, positions
    try:
        with cpu.scope(), kv_cache(chunk):
            for _ in range(max_new_tokens):
                logits = chunk(step_ids, attention_mask=mask, position_ids=step_pos)["logits"][:, -1].float()
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
