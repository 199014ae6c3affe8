"""Fine-tuning batches and batched inference over task features.

Batches: every epoch shuffles the training features with ``seed + epoch`` and cuts them into
global batches (the last incomplete one is dropped; the next epoch's shuffle covers it). Each
global batch is padded to its own longest feature (a multiple of 8), the same on every rank, so
that every data-parallel and tensor-parallel layout sees the same numbers. Global batch ``step``
depends on nothing but ``step``: a resumed run sees the batches an uninterrupted one would (a
``transform(feature, epoch)``, masked LM's per-epoch masking, must be a pure function too).
Padding is done by transformers' collators (:func:`zhnlp.data.tasks.collate`).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from zhnlp import distributed
from zhnlp.errors import DataError

logger = logging.getLogger("zhnlp")

TRAIN_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "start_positions", "end_positions")


def collate_features(features: list[dict], pad_to: int, pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    from zhnlp.data.tasks import collate

    return collate([{k: f[k] for k in TRAIN_KEYS if k in f} for f in features], pad_to=pad_to,
                   pad_token_id=pad_token_id)


def pad_length(features: list[dict], multiple: int) -> int:
    longest = max(len(f["input_ids"]) for f in features)
    return int(math.ceil(longest / multiple) * multiple)


class EpochBatches:
    """``batches(step)``: this data-parallel rank's micro-batches of global batch ``step``."""

    def __init__(self, features: list[dict], global_batch: int, micro_batch: int, seed: int, multiple: int = 8,
                 pad_token_id: int = 0, collate=None, transform=None):
        """``collate(features, pad_to, pad_token_id) -> batch``: default :func:`collate_features` (packed chat
        sequences bring their own, :func:`zhnlp.data.tasks.sft.collate_packed`). ``transform(feature, epoch) ->
        feature``: applied to this rank's features of a batch before collating (masked LM: the epoch's masking)."""
        self.features, self.global_batch, self.micro_batch = features, global_batch, micro_batch
        self.seed, self.multiple, self.pad_token_id = seed, multiple, pad_token_id
        self.collate = collate or collate_features
        self.transform = transform
        self.steps_per_epoch = len(features) // global_batch
        if self.steps_per_epoch == 0:
            raise DataError(f"the training set has {len(features)} features, fewer than one batch of {global_batch}; "
                            "lower --batch-size or add data.")
        self._order: tuple[int, np.ndarray] | None = None

    def __call__(self, step: int) -> list[dict]:
        epoch, pos = divmod(step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng(self.seed + epoch).permutation(len(self.features)))
        chosen = self._order[1][pos * self.global_batch:(pos + 1) * self.global_batch]
        batch = [self.features[i] for i in chosen]
        pad_to = pad_length(batch, self.multiple)  # over the global batch: the same on every rank
        lay = distributed.layout()  # the trainer has set up the process groups by the first step
        per_rank = self.global_batch // lay.dp
        mine = batch[lay.dp_rank * per_rank:(lay.dp_rank + 1) * per_rank]
        if self.transform is not None:
            mine = [self.transform(f, epoch) for f in mine]
        return [self.collate(mine[i:i + self.micro_batch], pad_to, self.pad_token_id)
                for i in range(0, per_rank, self.micro_batch)]


def _eval_batches(features: list[dict], batch_size: int, multiple: int, pad_token_id: int, what: str):
    """The padded batches of ``features`` in order; progress (batches done / total) goes to the ``zhnlp``
    logger at INFO, about ten lines a pass."""
    total = math.ceil(len(features) / batch_size)
    every = max(1, total // 10)
    started = _now()
    for n, i in enumerate(range(0, len(features), batch_size), start=1):
        chunk = features[i:i + batch_size]
        yield collate_features(chunk, pad_length(chunk, multiple), pad_token_id)
        if (n % every == 0 or n == total) and _logging_rank():
            logger.info("evaluating %s: batch %d/%d (%d features, %.1f s)", what, n, total, len(features),
                        _now() - started)


@torch.no_grad()
def predict(model, features: list[dict], batch_size: int, multiple: int = 8, what: str = "dev",
            pad_token_id: int = 0) -> dict[str, np.ndarray]:
    """Run ``model`` (a PretrainedModel, any layout; every rank gets the outputs) over
    ``features`` in order -> ``{output name: array (num_features, ...)}``. Per-token outputs are
    padded to the longest feature with -1e4 (positions past a feature's end are never read).
    Progress (batches done / total) goes to the ``zhnlp`` logger at INFO, about ten lines a pass."""
    model.eval()
    width = max(len(f["input_ids"]) for f in features)
    parts: dict[str, list[np.ndarray]] = {}
    for batch in _eval_batches(features, batch_size, multiple, pad_token_id, what):
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        for name, value in out.items():
            if name == "loss" or value is None:
                continue
            value = value.float().cpu().numpy()
            if name in ("start_logits", "end_logits") or value.ndim == 3:  # (b, s[, labels]): per token
                value = value[:, :width]
                pad = [(0, 0), (0, width - value.shape[1])] + [(0, 0)] * (value.ndim - 2)
                value = np.pad(value, pad, constant_values=-1e4)
            parts.setdefault(name, []).append(value)
    return {name: np.concatenate(rows) for name, rows in parts.items()}


@torch.no_grad()
def loss_over(model, features: list[dict], batch_size: int, multiple: int = 8, what: str = "dev",
              pad_token_id: int = 0) -> dict[str, float]:
    """The causal-LM loss of ``model`` over ``features`` (``input_ids``, ``labels``; any layout, every rank gets
    the result) averaged over every target token of the split, not per batch -> ``{"loss", "tokens"}``."""
    from zhnlp.models.common.decoder import causal_lm_targets

    model.eval()
    total, tokens = 0.0, 0
    for batch in _eval_batches(features, batch_size, multiple, pad_token_id, what):
        k = int(causal_lm_targets(batch["labels"]))
        if k:
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
            total += float(out["loss"]) * k
            tokens += k
    return {"loss": total / tokens if tokens else float("nan"), "tokens": tokens}


@torch.no_grad()
def masked_lm_over(model, features: list[dict], batch_size: int, multiple: int = 8, what: str = "dev",
                   pad_token_id: int = 0) -> dict[str, float]:
    """The masked-LM loss of ``model`` over ``features`` (masked ``input_ids``, ``labels`` -100 off the masked
    tokens; any layout, every rank gets the result) averaged over every masked token of the split, and the
    fraction of those tokens whose original id is the top logit -> ``{"loss", "accuracy", "tokens"}``."""
    model.eval()
    total, right, tokens = 0.0, 0, 0
    for batch in _eval_batches(features, batch_size, multiple, pad_token_id, what):
        picked = batch["labels"] != -100  # (b, s)
        k = int(picked.sum())
        if k:
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"], labels=batch["labels"])
            total += float(out["loss"]) * k  # the batch's mean over its masked tokens
            predicted = out["logits"][picked.to(out["logits"].device)].argmax(-1).cpu()  # (k,)
            right += int((predicted == batch["labels"][picked]).sum())
            tokens += k
    nan = float("nan")
    return {"loss": total / tokens if tokens else nan, "accuracy": right / tokens if tokens else nan,
            "tokens": tokens}


def label_ids(features: list[dict], width: int):
    """The gold targets of ``features`` for ``EvalPrediction.label_ids``: class indices ``(n,)``,
    per-token labels ``(n, width)`` padded with -100, or ``(start_positions, end_positions)``."""
    first = features[0]
    if "start_positions" in first:
        return (np.array([f["start_positions"] for f in features]), np.array([f["end_positions"] for f in features]))
    if "labels" not in first:
        return None
    if isinstance(first["labels"], int):
        return np.array([f["labels"] for f in features])
    out = np.full((len(features), width), -100, dtype=np.int64)
    for row, f in zip(out, features):
        row[:len(f["labels"])] = f["labels"]
    return out


def _now() -> float:
    import time

    return time.perf_counter()


def _logging_rank() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0
