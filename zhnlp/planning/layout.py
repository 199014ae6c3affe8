"""A parallel layout as the planner sees it: sizes only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """``world = tp x pp x dp`` (expert parallelism reuses the data-parallel ranks: ``ep`` divides ``tp x dp``
    with ``etp``). ``vpp``: virtual chunks per pipeline stage. ``precision``: fp32, bf16 or fp16 (bf16/fp16 keep
    fp32 main parameters in the optimizer). ``distributed_optimizer``: optimizer states (and main parameters)
    sharded over the data-parallel ranks. ``fsdp``: fully sharded data parallelism (torch FSDP2): weights,
    gradients and optimizer states all sharded over the data-parallel ranks. ``optimizer_offload``: the fraction
    of the (distributed) optimizer's states kept in host memory instead (megatron's hybrid device optimizer)."""

    world: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1
    etp: int | None = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    precision: str = "fp32"
    recompute: str | None = None
    fsdp: bool = False
    optimizer_offload: float = 0.0

    @property
    def dp(self) -> int:
        if self.world % (self.tp * self.pp):
            raise ValueError(f"world size {self.world} is not divisible by tp*pp = {self.tp * self.pp}")
        return self.world // (self.tp * self.pp)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the routed experts' parameters: the ranks of one pipeline stage that hold the same
        experts (megatron's expert-data-parallel group)."""
        return self.tp * self.dp // (self.ep * self.expert_tp)

    @classmethod
    def from_run(cls, cfg, world: int) -> "Layout":
        """The layout of a :class:`zhnlp.training.config.RunConfig` on ``world`` processes."""
        p = cfg.parallel
        return cls(world=world, tp=p.tp, pp=p.pp, vpp=p.vpp, ep=p.ep, etp=p.etp,
                   sequence_parallel=p.sequence_parallel, distributed_optimizer=cfg.optimizer.distributed_optimizer,
                   precision=cfg.precision, recompute=cfg.recompute, fsdp=p.fsdp,
                   optimizer_offload=cfg.optimizer.optimizer_offload or 0.0)
