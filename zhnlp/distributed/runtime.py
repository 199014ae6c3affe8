"""Process groups for zhnlp: one call sets up torch.distributed and megatron-core.

``init(tp, pp, vpp, ep)`` works in three situations:

* under ``torchrun`` (one node or many): the world comes from the ``RANK``/``WORLD_SIZE``
  environment that torchrun sets;
* in a plain Python process: a world of one is created in-process (no ports, no files);
* again in the same process with another layout: megatron's groups are rebuilt.

Data parallelism is whatever remains of the world: ``dp = world / (tp * pp)``.
Without CUDA the backend is gloo and the CPU compatibility layer (:mod:`zhnlp.distributed.cpu`)
is switched on; with CUDA the backend is NCCL and nothing is patched.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from zhnlp.distributed import cpu
from zhnlp.errors import LayoutError


@dataclass(frozen=True)
class Layout:
    """The parallel layout of this process and its coordinates in it."""

    tp: int
    pp: int
    vpp: int | None
    ep: int
    dp: int
    world_size: int
    rank: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    backend: str
    etp: int = 1  # expert tensor parallelism: each expert split this many ways (MoE)
    ep_rank: int = 0
    etp_rank: int = 0

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


_LAYOUT: Layout | None = None


def _positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise LayoutError(f"{name}={value!r} is not a positive integer; pass e.g. {name}=1.")
    return value


def _init_world(backend: str, timeout: datetime.timedelta) -> None:
    if dist.is_initialized():
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # torchrun / Slurm-via-torchrun: MASTER_ADDR/MASTER_PORT come from the launcher.
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        # A plain Python process: a world of one needs no rendezvous.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    # A script that ends without shutdown() would leave gloo's worker threads to the interpreter's teardown,
    # which now and then aborts the process ("terminate called without an active exception") after a
    # finished job: tear the groups down first.
    atexit.register(_shutdown_at_exit)


def _shutdown_at_exit() -> None:
    try:
        shutdown()
    except Exception:  # the process is ending; a half-torn-down world must not mask its exit status
        pass


def init(
    tp: int = 1,
    pp: int = 1,
    vpp: int | None = None,
    ep: int = 1,
    *,
    etp: int | None = None,
    seed: int = 1234,
    timeout_minutes: float = 10.0,
) -> Layout:
    """Initialise torch.distributed and megatron-core's model-parallel groups.

    Args:
        tp: tensor-parallel degree (attention heads, FFN width and vocabulary are split by it).
        pp: pipeline-parallel degree (the layers are split into ``pp`` stages).
        vpp: virtual pipeline chunks per stage (interleaved schedule), or None.
        ep: expert-parallel degree (MoE models): the experts of each MoE layer are split into ``ep`` groups,
            each held by other ranks; the other weights stay split by tp/pp as usual.
        etp: expert tensor parallelism: each expert's MLP split this many ways (default: tp, as megatron).
            ``tp * ep * pp`` may exceed the world size only with ``etp`` < tp (e.g. tp=2, ep=2, etp=1 on
            2 processes: attention split by TP, experts by EP).
        seed: seeds torch and megatron's model-parallel RNG tracker on every rank.
        timeout_minutes: collective timeout, so a dead peer ends the job instead of hanging it.

    Returns:
        The :class:`Layout` of this process. ``dp`` is ``world_size // (tp * pp)``.

    Raises:
        LayoutError: the layout does not fit the world size.
    """
    global _LAYOUT
    etp = tp if etp is None else etp
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("etp", etp)):
        _positive(name, value)
    if vpp is not None:
        _positive("vpp", vpp)
        if pp < 2:
            raise LayoutError(f"vpp={vpp} needs pipeline parallelism (pp >= 2), got pp={pp}; drop vpp or raise pp.")
    if vpp == 1:
        vpp = None

    backend = ensure_world(timeout_minutes)
    world = dist.get_world_size()
    if world % (tp * pp) != 0:
        raise LayoutError(
            f"world size {world} is not divisible by tp*pp = {tp}*{pp} = {tp * pp}; "
            f"launch a multiple of {tp * pp} processes or change tp/pp."
        )
    dp = world // (tp * pp)
    if world % (etp * ep * pp) != 0:
        raise LayoutError(f"world size {world} is not divisible by etp*ep*pp = {etp}*{ep}*{pp} = {etp * ep * pp} "
                          f"(experts are split ep ways and each expert etp ways, etp defaulting to tp); launch a "
                          f"multiple of {etp * ep * pp} processes, lower ep, or pass etp=1.")

    from megatron.core import parallel_state as ps

    with cpu.device_mode():
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            distributed_timeout_minutes=max(1, int(timeout_minutes)),
        )
        set_seed(seed)
    _LAYOUT = Layout(
        tp=tp,
        pp=pp,
        vpp=vpp,
        ep=ep,
        etp=etp,
        ep_rank=ps.get_expert_model_parallel_rank(),
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        dp=dp,
        world_size=world,
        rank=dist.get_rank(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
        backend=backend,
    )
    return _LAYOUT


def ensure_world(timeout_minutes: float = 10.0) -> str:
    """Initialise torch.distributed (not megatron's groups) if it is not yet; returns the backend."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        cpu.prepare()
    _init_world(backend, datetime.timedelta(minutes=timeout_minutes))
    return backend


def on_rank_zero(fn):
    """Call ``fn()`` on global rank 0 only and return its result there (None elsewhere); when it raises,
    every rank raises the same error, so that a check made once (of a shared directory, say) stops the
    whole job with one message instead of leaving the other ranks waiting. Collective."""
    ensure_world()
    if dist.get_world_size() == 1:
        return fn()
    result, failure = None, [None]
    if dist.get_rank() == 0:
        try:
            result = fn()
        except Exception as e:
            failure = [(type(e), str(e))]
            dist.broadcast_object_list(failure, src=0)
            raise
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        kind, message = failure[0]
        try:
            error = kind(message)
        except TypeError:  # an exception class that takes other arguments
            from zhnlp.errors import ZhnlpError

            error = ZhnlpError(message)
        raise error
    return result


def set_seed(seed: int) -> None:
    """Seed torch and megatron's RNG tracker identically on every rank of a layout."""
    from megatron.core import tensor_parallel

    with cpu.scope():  # megatron's tracker seeds "CUDA" generators: the CPU one here
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def free_port() -> int:
    """A TCP port free on this host now: torchrun's ``--master-port`` for a single-node run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_initialized() -> bool:
    """True once :func:`init` has run in this process."""
    return _LAYOUT is not None


def layout() -> Layout:
    """The current layout; a world of one is initialised on first use."""
    if _LAYOUT is None:
        return init()
    return _LAYOUT


def device() -> torch.device:
    """The device this rank computes on."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Tear down megatron's groups and the process group (end of a script or a test)."""
    global _LAYOUT
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    _LAYOUT = None
