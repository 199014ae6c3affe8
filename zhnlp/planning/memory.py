"""Memory per rank: the persistent part (weights, gradient buffer, optimizer states).

What megatron-core 0.16 keeps allocated between steps, as the trainer configures it
(:class:`zhnlp.training.trainer.Trainer`): the weights in the run's precision; DDP's gradient buffer in fp32
(``grad_reduce_in_fp32``) for every trained parameter; Adam's two moments in fp32 and, in bf16/fp16, an fp32
main copy of every trained parameter; with the distributed optimizer those optimizer tensors are split over the
data-parallel ranks (the routed experts' over the expert-data-parallel ranks). Frozen parameters (the MoE
router's correction bias) have weights only.

Measured on this CPU with ``scripts/validate_planner.py``'s probe: after the first optimizer step the
allocator holds exactly this figure at one process (ernie-debug 26.41 MB = 16 bytes x 1,650,944 parameters;
ernie4.5-debug 24.13 MB).
"""

from __future__ import annotations

from zhnlp.planning.layout import Layout
from zhnlp.planning.params import params_per_rank

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def static_memory(arch, layout: Layout) -> list[dict]:
    """Per pipeline stage (first to last): bytes of ``weights``, ``gradients``, ``optimizer`` and their ``total``
    on one rank of that stage."""
    out = []
    dp, edp = layout.dp, layout.expert_dp
    state = 8 + (4 if layout.precision != "fp32" else 0)  # Adam's moments (+ fp32 main parameters)
    for counts in params_per_rank(arch, layout):
        if layout.fsdp:
            out.append(fully_sharded_memory(counts, layout))
            continue
        dense, expert = counts["dense"], counts["expert"]
        weights = (dense + expert + counts["frozen"]) * BYTES[layout.precision]
        gradients = 4 * (dense + expert)
        if layout.distributed_optimizer:
            optimizer = state * (-(-dense // dp) + -(-expert // edp))
        else:
            optimizer = state * (dense + expert)
        optimizer -= int(optimizer * layout.optimizer_offload)  # that fraction lives in host memory
        out.append({"weights": weights, "gradients": gradients, "optimizer": optimizer,
                    "total": weights + gradients + optimizer})
    return out


def fully_sharded_memory(counts: dict, layout: Layout) -> dict:
    """One rank's persistent bytes under ``--fsdp`` (torch FSDP2 through megatron), from
    :func:`zhnlp.planning.params.params_per_rank`'s counts of one stage: every parameter (trained or frozen) is
    kept as its shard of ``1/dp`` of the rows; gradients are reduce-scattered into sharded ``.grad`` tensors in
    the parameters' precision (no fp32 buffer); Adam's moments (and the fp32 main parameters in bf16) are
    sharded like the parameters. A layer's all-gathered weights exist only around its forward and backward
    (transient, not counted here). Rounded up per stage, not per tensor (torch pads none: shards of uneven
    tensors are a row shorter)."""
    dp, size = layout.dp, BYTES[layout.precision]
    trained = counts["dense"] + counts["expert"]
    state = 8 + (4 if layout.precision != "fp32" else 0)
    weights = size * -(-(trained + counts["frozen"]) // dp)
    gradients = size * -(-trained // dp)
    optimizer = state * -(-trained // dp)
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer,
            "total": weights + gradients + optimizer}
