"""Cross-entropy over a large vocabulary without vocabulary-sized temporaries.

``F.cross_entropy`` on ``(N, V)`` logits allocates three more ``(N, V)`` tensors in a training step: the
log-softmax it keeps for backward, the one-hot gradient of the NLL and the gradient of the log-softmax. With a
100k vocabulary each is hundreds of megabytes of fresh memory, and on a CPU much of their cost is the kernel
zero-filling new pages. :func:`cross_entropy` computes the same loss from the logits themselves: forward runs
torch's fused log-softmax block by block and keeps only the log-sum-exp of each row (``(N,)``, float32) and the
logits it was given (which the caller holds anyway); backward writes ``softmax(x) - onehot(t)`` straight into the
one gradient tensor it returns. Both walk the rows in blocks of a few megabytes, so every temporary is small and
reused.

The numbers are those of ``F.cross_entropy(logits.float(), target, ignore_index=-100)`` (mean over the rows whose
target is not ``ignore_index``; NaN when there is none, as torch gives) up to float32 rounding: the same
max-shifted log-sum-exp, summed in another order.
"""

from __future__ import annotations

import torch

BLOCK_ELEMENTS = 1 << 21  # elements per block of rows (8 MB in float32)


def _blocks(rows: int, columns: int):
    """Slices of whole rows holding about :data:`BLOCK_ELEMENTS` elements of ``columns`` each."""
    step = max(1, BLOCK_ELEMENTS // max(columns, 1))
    return (slice(start, start + step) for start in range(0, rows, step))


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, columns: int, ignore_index: int):
        # logits (N, Vp) with the real vocabulary in columns [:columns]; target (N,) int64
        rows = logits.shape[0]
        valid = target != ignore_index  # (N,)
        bad = valid & ((target < 0) | (target >= columns))
        if bool(bad.any()):
            raise IndexError(f"label {int(target[bad][0])} is out of range for a vocabulary of {columns} "
                             f"(labels are token ids, or {ignore_index} for no label)")
        safe = target.masked_fill(~valid, 0).unsqueeze(1)  # (N, 1): any column for ignored rows
        picked = torch.empty(rows, dtype=torch.float32, device=logits.device)  # log p(target) per row
        for block in _blocks(rows, columns):
            # torch's fused log-softmax on a block: the temporary is the block, not the whole batch
            log_probs = torch.log_softmax(logits[block, :columns].float(), dim=-1)
            picked[block] = log_probs.gather(1, safe[block]).squeeze(1)
        lse = logits.gather(1, safe).squeeze(1).float() - picked  # (N,) log-sum-exp of each row
        count = valid.sum()
        loss = -torch.where(valid, picked, 0.0).sum() / count
        ctx.save_for_backward(logits, lse, safe, valid, count)
        ctx.columns = columns
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        logits, lse, safe, valid, count = ctx.saved_tensors
        columns, rows = ctx.columns, logits.shape[0]
        # d loss / d logit = (softmax - onehot) * scale with scale = grad / count on counted rows, 0 elsewhere
        # (also when nothing is counted). softmax * scale = exp(x - (lse - log scale)): one pass to subtract, one exp.
        scale = torch.where(valid, grad_loss.float() / count, 0.0)  # (N,)
        shift = (lse - scale.log()).unsqueeze(1)  # (N, 1); +inf where scale is 0 -> exp gives 0
        grad = torch.empty_like(logits)
        if columns < logits.shape[1]:  # padded vocabulary columns: no part in the softmax, no gradient
            grad[:, columns:] = 0
        direct = logits.dtype == torch.float32
        for block in _blocks(rows, columns):
            out = grad[block, :columns]
            probs = torch.sub(logits[block, :columns].float(), shift[block], out=out if direct else None).exp_()
            probs.scatter_add_(1, safe[block], -scale[block, None])
            if not direct:
                out.copy_(probs)
        return grad, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, columns: int | None = None,
                  ignore_index: int = -100) -> torch.Tensor:
    """Mean float32 cross-entropy of ``logits`` ``(N, Vp)`` (any float dtype; the gradient has the logits'
    dtype) against ``target`` ``(N,)``, over the first ``columns`` columns (default all: the rest is vocabulary
    padding) and the rows whose target is not ``ignore_index``. See the module docstring for why."""
    columns = logits.shape[-1] if columns is None else columns
    return _CrossEntropy.apply(logits, target, columns, ignore_index)
