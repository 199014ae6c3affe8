"""``zhnlp pretrain --parallel auto``: plan the layout for the world the run is started in, then train with it.

Every process computes the same plan (the planner is a pure function of the recipe, the world size and the
device), so no communication is needed to agree on it. The device is the local GPU (its name picks the
interconnect preset, its memory is read from the driver) or, without one, this machine's CPU with its memory
split between the local processes.
"""

from __future__ import annotations

import dataclasses
import os

from zhnlp.errors import ZhnlpError

# the flags --parallel auto chooses: a run may not also set them
CHOSEN = ("tp", "pp", "vpp", "ep", "etp", "sequence_parallel", "recompute", "distributed_optimizer", "fsdp",
          "micro_batch_size")


def local_hardware():
    """(Hardware preset of this machine's devices, bytes of memory per device, devices per node)."""
    import torch

    from zhnlp.planning.timing import hardware

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = props.name.lower()
        preset = next((key for key in ("h800", "h200", "h100", "a800", "a100", "v100", "l40s") if key in name), "h100")
        if preset == "a100" and props.total_memory < 50 * 2 ** 30:
            preset = "a100-40"
        hw = hardware(preset, gpus_per_node=max(local, 1))
        return hw, int(props.total_memory), max(local, 1)
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    memory = pages * size // max(local, 1)
    return hardware("cpu", memory_bytes=memory, gpus_per_node=max(local, 1)), memory, max(local, 1)


def choose_layout(cfg, world: int, given: dict | None = None, in_config_file: dict | None = None):
    """Set ``cfg``'s layout to the planner's best for ``world`` processes on this machine's devices; returns the
    chosen :class:`zhnlp.planning.search.Candidate`. ``given``: the command line's flags, ``in_config_file``: the
    settings a ``--config`` file changes; either naming a setting the planner chooses is refused."""
    from zhnlp.planning import search

    clash = sorted(k for k in (given or {}) if k in CHOSEN)
    if clash:
        names = ", ".join("--" + k.replace("_", "-") for k in clash)
        raise ZhnlpError(f"--parallel auto chooses the layout itself; drop {names} (or drop --parallel auto and "
                         "set the whole layout by hand).")
    clash = sorted(k for k in (in_config_file or {}) if k in CHOSEN)
    if clash:
        names = ", ".join(f"{k}={in_config_file[k]!r}" for k in clash)
        raise ZhnlpError(f"--parallel auto chooses the layout itself, but the --config file sets {names}; remove "
                         "those settings from the file (or drop --parallel auto to train with the file's layout).")
    hw, memory, per_node = local_hardware()
    d = cfg.data
    result = search.plan(cfg.architecture(), world, global_batch=d.global_batch_size, seq_length=d.seq_length,
                         hardware=hw, gpus_per_node=per_node, gpu_memory=memory, precision=cfg.precision, top=1,
                         mask_prob=d.mask_prob)
    if not result["best"]:
        raise ZhnlpError(f"--parallel auto: {result.get('needs') or 'no layout fits'}")
    best = result["best"][0]
    lay = best.layout
    cfg.parallel = dataclasses.replace(cfg.parallel, tp=lay.tp, pp=lay.pp, vpp=lay.vpp, ep=lay.ep, etp=lay.etp,
                                       sequence_parallel=lay.sequence_parallel, fsdp=lay.fsdp)
    cfg.optimizer.distributed_optimizer = lay.distributed_optimizer
    cfg.recompute = lay.recompute
    cfg.data.micro_batch_size = best.micro_batch
    return best


def describe(best, world: int) -> str:
    t = best.time or {}
    return (f"--parallel auto on {world} process{'es' if world > 1 else ''}: {best.flags()} (predicted peak "
            f"{best.memory['total'] / 2 ** 30:.2f} GiB per device, {t.get('total', float('nan')):.3g} s per step; "
            "`zhnlp plan` explains the choice)")
