"""Distributed checkpoints with resume, written so that an interrupted save never looks complete.

Layout under ``OUTPUT/checkpoints``::

    step_0000010/              a complete checkpoint (renamed into place as the last act)
        model/                 megatron-core dist_checkpointing: model and optimizer state,
                               sharded tensors with global shapes, so any TP/PP/DP layout can load it
        trainer.json           step, data position, scheduler state, loss scaler, run config
        rng/rank_00000.safetensors   per-rank RNG state (restored when the layout is unchanged)
    step_0000020.incomplete/   a save in progress or one that crashed: ignored, removed by the next save

A save writes into ``step_N.incomplete``, waits for every rank, and rank 0 renames it to
``step_N``; then checkpoints beyond the newest ``keep`` are deleted. ``latest(dir)`` returns the
newest complete one.

The distributed optimizer's state does not go through dist_checkpointing (in megatron-core
0.16 that path asserts or drifts without apex/TransformerEngine). Its main parameters and Adam
moments are gathered to the first data-parallel rank with the optimizer's own
``get_parameter_state_dp_zero`` and written per model-parallel rank
(``distopt/mp_rank_TT_PPP.pt``, read back with ``torch.load(weights_only=True)``); they resume
together with the optimizer's common state (param groups with Adam's step count, the loss
scaler); they resume exactly under the same layout. Under another layout the model resumes and
the optimizer state restarts, with a message (megatron's reshardable route needs its
dist_checkpointing path); exact resume and resharding hold for the plain optimizer.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.distributed import cpu
from zhnlp.errors import CheckpointError

_COMPLETE = re.compile(r"^step_(\d{7})$")


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _COMPLETE.match(p.name)), key=lambda p: p.name)


def latest(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def _sharded_state(trainer, with_optimizer: bool, loading: bool = False):
    # the chunks inside megatron's DDP wrappers: their keys carry no "module." prefix
    model = {f"model{i}": chunk.module.sharded_state_dict() for i, chunk in enumerate(trainer.chunks)}
    state = dict(model)
    if with_optimizer:
        # when loading, the optimizer first creates its (empty) state so that there is a slot per tensor
        state["optimizer"] = trainer.optimizer.sharded_state_dict(model, is_loading=loading)
    return state


def _inner(optimizer) -> list:
    """The distributed optimizers inside megatron's ChainedOptimizer (or the optimizer itself)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _load_distributed_optimizer(opt, state: dict | None, common: dict) -> None:
    """Restore one distributed optimizer: param groups, loss scaler and Adam's step count from
    ``common``; main parameters and moments from ``state`` (the dp-zero gather; None off the first
    data-parallel rank, which scatters it).

    megatron's ``load_state_dict`` allocates the Adam state (zeros) and gives every parameter the
    same ``step`` tensor object, while ``load_parameter_state_from_dp_zero`` copies exactly the keys
    the state holds and has no ``step``. So: allocate, set ``step`` aside, copy the tensors, and
    give each parameter its own ``step`` (torch's Adam increments it in place per parameter)."""
    opt.load_state_dict(common)
    steps = {p: s.pop("step") for p, s in opt.optimizer.state.items() if "step" in s}
    opt.load_parameter_state_from_dp_zero(state)
    for p, step in steps.items():
        opt.optimizer.state[p]["step"] = step.detach().clone()


def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    out = {"torch": torch.get_rng_state()}
    for name, state in tensor_parallel.get_cuda_rng_tracker().get_states().items():
        out[f"tracker.{name}"] = state
    return out


def _set_rng_state(states: dict) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(states["torch"])
    tracker = {k.removeprefix("tracker."): v for k, v in states.items() if k.startswith("tracker.")}
    tensor_parallel.get_cuda_rng_tracker().set_states(tracker)


def _save_strategy():
    """megatron's torch_dist writer with one writer thread."""
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    return TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)


def save(trainer, keep: int = 3) -> Path:
    """Save the trainer's state at its current step (collective)."""
    from megatron.core import dist_checkpointing
    from safetensors.torch import save_file

    lay = trainer.layout
    root = trainer.output / "checkpoints"
    final = root / f"step_{trainer.step:07d}"
    work = root / f"{final.name}.incomplete"
    if dist.get_rank() == 0:
        if work.exists():
            shutil.rmtree(work)
        (work / "model").mkdir(parents=True)
        (work / "rng").mkdir()
    distributed.barrier()
    distopt = trainer.cfg.optimizer.distributed_optimizer
    with cpu.device_mode():
        dist_checkpointing.save(_sharded_state(trainer, with_optimizer=not distopt), str(work / "model"),
                                sharded_strategy=_save_strategy())
        if distopt:
            # per inner optimizer: the parameter state (main params, moments) gathered to the first
            # data-parallel rank, plus the common state (param groups with Adam's step count, loss scaler)
            states = [{"params": opt.get_parameter_state_dp_zero(), "common": opt.state_dict()}
                      for opt in _inner(trainer.optimizer)]
            if lay.dp_rank == 0:
                (work / "distopt").mkdir(exist_ok=True)
                torch.save(states, work / "distopt" / f"mp_rank_{lay.tp_rank:02d}_{lay.pp_rank:03d}.pt")
    save_file({k: v.contiguous() for k, v in _rng_state().items()}, str(work / "rng" / f"rank_{dist.get_rank():05d}.safetensors"))
    if dist.get_rank() == 0:
        info = {"step": trainer.step, "consumed_samples": trainer.step * trainer.cfg.data.global_batch_size,
                "scheduler": trainer.scheduler.state_dict(), "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp,
                                                                         "vpp": lay.vpp},
                "distributed_optimizer": distopt, "recipe": trainer.cfg.recipe, "model": trainer.cfg.model,
                "tokenizer": trainer.tokenizer_name}
        (work / "trainer.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    distributed.barrier()
    if dist.get_rank() == 0:  # the one step that makes the checkpoint count
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
        for old in checkpoint_dirs(root)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob("*.incomplete"):
            shutil.rmtree(stale, ignore_errors=True)
    distributed.barrier()
    return final


def load(trainer, path: Path) -> None:
    """Restore ``trainer`` from the complete checkpoint ``path`` (collective). The layout may differ
    from the one that saved it, except for the distributed optimizer's state (see module doc)."""
    from megatron.core import dist_checkpointing
    from safetensors.torch import load_file

    info_file = path / "trainer.json"
    if not info_file.is_file():
        raise CheckpointError(f"{path} is not a complete zhnlp checkpoint (no trainer.json); "
                              "point --resume at a step_NNNNNNN directory or its parent.")
    info = json.loads(info_file.read_text(encoding="utf-8"))
    if info["model"] != trainer.cfg.model:
        raise CheckpointError(f"{path} was saved for a different architecture than recipe {trainer.cfg.recipe!r}; "
                              "resume with the recipe that wrote it.")
    lay = trainer.layout
    saved = info["layout"]
    same_layout = (saved["tp"], saved["pp"], saved["dp"], saved["vpp"]) == (lay.tp, lay.pp, lay.dp, lay.vpp)
    distopt = info["distributed_optimizer"]
    with_optimizer = not distopt and not trainer.cfg.optimizer.distributed_optimizer
    with cpu.device_mode():
        state = dist_checkpointing.load(_sharded_state(trainer, with_optimizer, loading=True), str(path / "model"))
        for i, chunk in enumerate(trainer.chunks):
            chunk.module.load_state_dict(state[f"model{i}"])
        if with_optimizer:
            trainer.optimizer.load_state_dict(state["optimizer"])
        elif distopt and trainer.cfg.optimizer.distributed_optimizer and same_layout:
            file = path / "distopt" / f"mp_rank_{lay.tp_rank:02d}_{lay.pp_rank:03d}.pt"
            # every rank needs the common state; only the first data-parallel rank the parameter state
            states = torch.load(file, map_location="cpu", weights_only=True) if file.is_file() else None
            if states is None:
                raise CheckpointError(f"{file} is missing; the checkpoint's distributed-optimizer state is incomplete.")
            with torch.no_grad():  # it copies into the fp32 main parameters, which require grad
                for state, opt in zip(states, _inner(trainer.optimizer)):
                    _load_distributed_optimizer(opt, state["params"] if lay.dp_rank == 0 else None, state["common"])
        else:
            if dist.get_rank() == 0:
                print(f"zhnlp: {path} holds {'distributed-' if distopt else ''}optimizer state that cannot be "
                      f"restored in this layout (saved tp={saved['tp']} pp={saved['pp']} dp={saved['dp']}); the "
                      "model resumes, the optimizer starts fresh.", flush=True)
    trainer.scheduler.load_state_dict(info["scheduler"])
    trainer.step = info["step"]
    rng = path / "rng" / f"rank_{dist.get_rank():05d}.safetensors"
    if same_layout and rng.is_file():
        _set_rng_state(load_file(str(rng)))
    else:
        distributed.set_seed(trainer.cfg.seed + trainer.step)  # a new layout: fresh, deterministic streams
