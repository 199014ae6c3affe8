"""CPU/gloo compatibility layer for megatron-core, switched on only around zhnlp's calls into megatron.

megatron-core 0.16 is written for CUDA: it allocates with ``device="cuda"`` or
``device=torch.cuda.current_device()``, seeds and forks the CUDA RNG, compares
``Tensor.type()`` with ``'torch.cuda.FloatTensor'`` and calls ``Tensor.cuda()``.
On a machine without CUDA this module makes those calls land on the CPU so that
the *real* megatron-core code (schedules, tensor-parallel layers, optimizers)
runs unchanged with the gloo backend. With CUDA every function here is a no-op.

Nothing happens at import. A few things are done for megatron itself, once, the first time zhnlp
needs megatron (:func:`prepare`); they change megatron's behaviour, never what ``torch`` or
``torch.cuda`` report to other code:

* megatron is imported with its ``jit_fuser`` (``torch.compile``) made eager: compiling its small
  fused kernels costs seconds per process on CPU and gains nothing;
* megatron's ``_get/_set_cuda_rng_state`` act on the CPU generator, so its RNG tracker forks the
  CPU generator exactly as it forks the CUDA one on a GPU (dropout under tensor parallelism and
  recompute replay behave as on a GPU; the tracker's "CPU RNG state changed within GPU RNG
  context" warning is expected and filtered for that reason);
* the gradient norm of megatron's optimizers (reported, and used for clipping) is summed in
  float64 instead of by megatron's no-apex fallback (see :func:`_l2_norm`);
* the backwards of megatron's own autograd Functions (communication ops, activation recompute)
  run inside :func:`device_mode`: the autograd engine calls them with the mode stack cleared,
  possibly after zhnlp's call has returned (a user's ``loss.backward()``). Other libraries'
  Functions are left alone;
* the distributed optimizer's reduce-scatter of gradient buckets over gloo runs as
  ``reduce_scatter_for_megatron``, which frees its temporary on the calling thread (see
  :func:`_reduce_scatter_on_caller`), outside torch's coalescing manager when the reduction is synchronous.

Everything that changes torch's own behaviour is scoped, and undone when the outermost scope ends:

* :func:`scope` (zhnlp enters it around a model's forward and around seeding): ``torch.cuda.current_device()``
  returns ``torch.device("cpu")``; ``set_device``, ``synchronize`` and the NVTX range calls are
  no-ops; the "CUDA" random generator *is* the CPU default generator (``torch.cuda.manual_seed``,
  ``get_rng_state``/``set_rng_state``); ``Tensor.cuda()`` returns the tensor itself;
  ``DeviceMesh.from_group(group, "cuda")`` (megatron's torch-FSDP2 wrapper) makes a CPU mesh;
  torch FSDP2's reduce-scatter and all-gather over gloo run as :func:`reduce_scatter_on_caller`
  and :func:`all_gather_on_caller`.
* :func:`device_mode` (around model construction, process-group setup, pipeline schedules, the
  trainer's step, checkpoint I/O): :func:`scope` plus a ``TorchFunctionMode`` that maps every CUDA
  device argument (``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``, a bare GPU index) to the CPU
  and makes ``Tensor.type()`` report ``torch.cuda.*`` names for CPU tensors. The forward of a
  model pays nothing for the mode, because it only runs in :func:`scope`.

Outside these scopes ``torch.cuda`` reports what it always does (``is_available()`` False,
``current_device()`` raising). The patches are process-global while a scope is open: another
thread of the same process sees them for that time.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.overrides import TorchFunctionMode

_PREPARED = False
_DEPTH = 0  # open scopes (scope() and device_mode() nest)
_LOCK = threading.RLock()
_SAVED: dict = {}  # (owner, attribute) -> torch's own value while a scope is open
_MISSING = object()  # the attribute was inherited (Tensor.cuda): delete it again on exit
_PATCHES: dict = {}  # built once, on the first scope
_MESH_FROM_GROUP = DeviceMesh.from_group  # torch's own


def _to_cpu_device(device):
    """Map a CUDA device spec to the CPU; leave everything else as it is."""
    if isinstance(device, torch.device):
        return torch.device("cpu") if device.type == "cuda" else device
    if isinstance(device, str):
        return "cpu" if device.startswith("cuda") else device
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"  # a bare index means a GPU in torch's factories
    return device


class _CudaToCpuMode(TorchFunctionMode):
    """Redirects CUDA device arguments to the CPU (see module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1 and not isinstance(args[1], (torch.dtype, torch.Tensor)):
            args = (args[0], _to_cpu_device(args[1]), *args[2:])
        elif func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        return func(*args, **kwargs)


def _tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    """``Tensor.cuda()`` on a machine without CUDA: the tensor stays where it is."""
    return self


@contextlib.contextmanager
def _eager_torch_compile():
    """Make ``torch.compile`` the identity while megatron binds ``jit_fuser`` to it."""

    def no_compile(model=None, **_kwargs):
        return model if model is not None else (lambda fn: fn)

    real = torch.compile
    torch.compile = no_compile
    try:
        yield
    finally:
        torch.compile = real


def _l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for apex's ``multi_tensor_l2norm`` (the norm of all tensors together, as a
    1-element float32 tensor), accumulated in float64.

    megatron's fallback takes ``torch.norm`` of each tensor, and torch's CPU norm kernel sums
    float32 squares in a few long running sums: on the word-embedding gradient (vocabulary x
    hidden) that loses about 3e-4, and a different amount on each tensor-parallel or
    distributed-optimizer shard of it, so the gradient norm (and the clipping factor) would
    depend on the parallel layout by about 1e-4 although the gradients agree to 1e-7.
    """
    squares = torch.zeros((), dtype=torch.float64)
    for t in tensor_lists[0]:
        squares += torch.linalg.vector_norm(t, dtype=torch.float64).square()
    return squares.sqrt().float().reshape(1), None


class _DropTrackerWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def _patches() -> dict:
    """``(owner, attribute) -> replacement`` for the scoped torch.cuda patches."""
    cpu = torch.device("cpu")

    def get_state(device="cuda"):
        return torch.get_rng_state()

    def set_state(state, device="cuda"):
        torch.set_rng_state(state)

    return {
        (torch.cuda, "current_device"): lambda: cpu,
        (torch.cuda, "set_device"): lambda *_a, **_k: None,
        (torch.cuda, "synchronize"): lambda *_a, **_k: None,
        # torch.manual_seed itself calls torch.cuda.manual_seed_all, so seed the generator directly.
        (torch.cuda, "manual_seed"): lambda seed: torch.default_generator.manual_seed(int(seed)),
        (torch.cuda, "get_rng_state"): get_state,
        (torch.cuda, "set_rng_state"): set_state,
        (torch.cuda.random, "get_rng_state"): get_state,
        (torch.cuda.random, "set_rng_state"): set_state,
        (torch.cuda.nvtx, "range_push"): lambda *_a, **_k: None,
        (torch.cuda.nvtx, "range_pop"): lambda *_a, **_k: None,
        (torch.Tensor, "cuda"): _tensor_cuda,
        # the MoE token dispatcher copies split sizes to the host on a side stream
        (torch.cuda, "Stream"): _HostStream,
        (torch.cuda, "current_stream"): lambda *_a, **_k: _HOST_STREAM,
        (torch.cuda, "stream"): lambda *_a, **_k: contextlib.nullcontext(),
        # megatron's torch-FSDP2 wrapper builds its device mesh with device_type "cuda"
        (DeviceMesh, "from_group"): staticmethod(_cpu_mesh_from_group),
        # FSDP2's collectives: tensors freed where the profiler sees it (peak_tensor_bytes)
        (torch.distributed, "reduce_scatter_single"): reduce_scatter_on_caller,
        (torch.distributed, "all_gather_single"): all_gather_on_caller,
    }


# torch's own collectives, kept for the cases the wrappers below pass on
_REDUCE_SCATTER_SINGLE = torch.distributed.reduce_scatter_single
_ALL_GATHER_SINGLE = torch.distributed.all_gather_single
_RELEASE_WAIT_S = 1.0  # at most this long for gloo's worker thread to let go of a finished collective


def _on_gloo_cpu(group, *tensors) -> bool:
    dist = torch.distributed
    return (all(t.device.type == "cpu" for t in tensors) and dist.get_backend(group) == dist.Backend.GLOO
            and (group or dist.group.WORLD) not in dist.distributed_c10d._world.pg_coalesce_state)


class _Finished:
    """What a coalescing manager yields when its collectives were run one by one, each complete on return."""

    works: list = []

    def wait(self) -> None:
        return None


def _coalescing_for_megatron(torch_manager):
    """megatron's ``_coalescing_manager`` around its gradient reduce-scatters and parameter all-gathers: over gloo
    and without ``async_ops`` the collectives inside simply run one after the other, each complete on return
    (what torch's manager guarantees at its exit), so that the reduce-scatters go through
    :func:`reduce_scatter_for_megatron`; otherwise torch's own manager."""

    @contextlib.contextmanager
    def manager(group=None, device=None, async_ops=False):
        dist = torch.distributed
        if async_ops or dist.get_backend(group) != dist.Backend.GLOO:
            with torch_manager(group, device=device, async_ops=async_ops) as cm:
                yield cm
            return
        yield _Finished()

    return manager


def _run_on_caller(start, tensors) -> None:
    """Start a collective on ``tensors`` (``start()`` returns its work), wait for it, drop it and wait until gloo's
    worker thread has let go of it too (each tensor back to the reference count it had before), so that what the
    work held is freed on this thread."""
    import time

    before = [t._use_count() for t in tensors]
    work = start()
    work.wait()
    del work
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while any(t._use_count() > n for t, n in zip(tensors, before)) and time.monotonic() < deadline:
        time.sleep(0)


def _done():
    from torch._C._distributed_c10d import _create_work_from_future

    future = torch.futures.Future()
    future.set_result(None)
    return _create_work_from_future(future)


def _reduce_scatter_on_caller(fallback):
    """A reduce-scatter with ``fallback``'s arguments and values that frees its temporary on the calling thread.
    gloo copies the input and reduces the copy on a worker thread of its own, which often drops the copy last: the
    profiler records no free there, and a running sum of its memory events (the trainer's ``peak_tensor_bytes`` on
    CPU) would keep a gradient-sized block per step. Here the copy is this function's: an all-reduce of it, this
    rank's part copied out, and the copy released here once gloo's thread has let go. Other backends, devices and
    operations go to ``fallback``; the result is complete on return (the returned work of ``async_op`` is already
    finished)."""

    def reduce_scatter(output, input, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
        dist = torch.distributed
        average = op == dist.ReduceOp.AVG
        if not (_on_gloo_cpu(group, output, input) and (op == dist.ReduceOp.SUM or average)):
            return fallback(output, input, op=op, group=group, async_op=async_op)
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if input.numel() != size * output.numel():
            raise ValueError(f"reduce-scatter: the input has {input.numel()} elements, not {size} x the output's "
                             f"{output.numel()}")
        full = input.detach().clone(memory_format=torch.contiguous_format)
        _run_on_caller(lambda: dist.all_reduce(full, group=group, async_op=True), [full])
        part = full.view(size, -1)[rank]
        if average:
            part.div_(size)
        output.copy_(part.view(output.shape))
        return _done() if async_op else None  # the copy is freed on this return

    return reduce_scatter


# ``torch.distributed.reduce_scatter_single`` (FSDP2's) and megatron's ``dist_reduce_scatter_func`` (the distributed
# optimizer's gradient buckets, ``torch.distributed.reduce_scatter_tensor``) freeing on the caller
reduce_scatter_on_caller = _reduce_scatter_on_caller(_REDUCE_SCATTER_SINGLE)
reduce_scatter_for_megatron = _reduce_scatter_on_caller(torch.distributed.reduce_scatter_tensor)


def all_gather_on_caller(output_tensor, input_tensor, group=None, async_op=False):
    """``torch.distributed.all_gather_single``, complete on return, that waits until gloo's worker thread has let
    go of the two tensors: FSDP drops its all-gather output right after copying it out, and a block whose last
    reference goes on gloo's thread is freed there unseen by the profiler (see :func:`_reduce_scatter_on_caller`)."""
    if not _on_gloo_cpu(group, output_tensor, input_tensor):
        return _ALL_GATHER_SINGLE(output_tensor, input_tensor, group=group, async_op=async_op)
    _run_on_caller(lambda: _ALL_GATHER_SINGLE(output_tensor, input_tensor, group=group, async_op=True),
                   [output_tensor, input_tensor])
    return _done() if async_op else None


def _cpu_mesh_from_group(group, device_type, *args, **kwargs):
    """``DeviceMesh.from_group`` with a CUDA device type mapped to the CPU (the gloo groups live there)."""
    return _MESH_FROM_GROUP(group, _to_cpu_device(device_type), *args, **kwargs)


class _HostStream:
    """Stands in for a CUDA stream on the CPU: work is already ordered, so waiting and syncing do nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return self  # an "event" whose synchronize() returns at once

    def query(self) -> bool:
        return True


_HOST_STREAM = _HostStream()


def prepare() -> None:
    """Import megatron-core and adapt it for the CPU (see the module docstring). Idempotent; a no-op
    with CUDA. Changes megatron's behaviour only, never what torch reports to other code."""
    global _PREPARED
    if _PREPARED or torch.cuda.is_available():
        return
    with _LOCK:
        if _PREPARED:
            return
        _prepare_megatron()
        _PREPARED = True


def _prepare_megatron() -> None:
    backward_apply = torch.autograd.function.BackwardCFunction.apply

    def apply_in_mode(self, *args):
        if not self._forward_cls.__module__.startswith("megatron."):
            return backward_apply(self, *args)
        with device_mode():
            return backward_apply(self, *args)

    with _eager_torch_compile():
        import megatron.core.jit  # noqa: F401  (binds jit_fuser to the eager stub)
        import megatron.core.optimizer.clip_grads as mclip
        import megatron.core.tensor_parallel.random as mrandom
        from megatron.core.utils import local_multi_tensor_l2_norm

    def get_state(device="cuda", clone=False, graph_safe=False):
        return torch.get_rng_state()

    def set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    _prepare_moe()
    import megatron.core.distributed.param_and_grad_buffer as buffers

    if buffers.dist_reduce_scatter_func in (torch.distributed.reduce_scatter_tensor,
                                            getattr(torch.distributed, "_reduce_scatter_base", None)):
        buffers.dist_reduce_scatter_func = reduce_scatter_for_megatron
        buffers._coalescing_manager = _coalescing_for_megatron(buffers._coalescing_manager)
    mrandom._get_cuda_rng_state = get_state
    mrandom._set_cuda_rng_state = set_state
    logging.getLogger(mrandom.__name__).addFilter(_DropTrackerWarning())
    if mclip.l2_norm_impl is local_multi_tensor_l2_norm:  # apex's or TE's kernel, where present, is accurate
        mclip.l2_norm_impl = _l2_norm
    # Custom autograd Functions run their backward with the mode stack cleared; megatron's
    # communication ops and checkpoint replay allocate with CUDA devices there.
    torch.autograd.function.BackwardCFunction.apply = apply_in_mode


def _prepare_moe() -> None:
    """megatron's MoE code without TransformerEngine: ``te_general_gemm`` is referenced but undefined in
    moe_utils (the router's gating GEMM then takes its torch path), and ``maybe_move_tensor_to_cpu`` turns
    only CUDA tensors into the host lists/arrays the all-to-all split sizes must be (CPU tensors would stay
    tensors)."""
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    def to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.cpu().numpy()
        return tensor.cpu() if torch.is_tensor(tensor) else tensor

    moe_utils.maybe_move_tensor_to_cpu = to_host
    dispatcher.maybe_move_tensor_to_cpu = to_host
    _uneven_collectives()


def _uneven_collectives() -> None:
    """gloo has no all_gather / reduce_scatter of pieces of different sizes, which megatron's MoE all-to-all
    dispatcher uses over the tensor-parallel group (each TP rank routes a different number of tokens to the
    local experts). Uneven gathers become an all-gather of pieces padded to the largest, uneven
    reduce-scatters an all-reduce of the whole tensor followed by this rank's slice: the same values."""
    import megatron.core.tensor_parallel.mappings as mappings

    gather, scatter = mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim

    def gather_uneven(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(n) for n in output_split_sizes]
        padded = input_.new_zeros((max(sizes), *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        pieces = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(pieces, padded.contiguous(), group=group)
        return torch.cat([piece[:n] for piece, n in zip(pieces, sizes)])

    def scatter_uneven(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return scatter(input_, group, input_split_sizes, use_global_buffer)
        total = input_.contiguous().clone()
        torch.distributed.all_reduce(total, group=group)
        return list(torch.split(total, [int(n) for n in input_split_sizes]))[group.rank()].contiguous()

    mappings._gather_along_first_dim = gather_uneven
    mappings._reduce_scatter_along_first_dim = scatter_uneven


@contextlib.contextmanager
def scope():
    """Let megatron's ``torch.cuda`` calls land on the CPU until the outermost scope ends (a no-op with CUDA).

    Cheap to enter (a few attribute swaps); zhnlp wraps a model's forward in it."""
    global _DEPTH
    if torch.cuda.is_available():
        yield
        return
    prepare()
    with _LOCK:
        if _DEPTH == 0:
            if not _PATCHES:
                _PATCHES.update(_patches())
            for (owner, name), replacement in _PATCHES.items():
                _SAVED[(owner, name)] = owner.__dict__.get(name, _MISSING)
                setattr(owner, name, replacement)
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                for (owner, name), original in _SAVED.items():
                    if original is _MISSING:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, original)
                _SAVED.clear()


@contextlib.contextmanager
def device_mode():
    """Run megatron code that assumes CUDA on the CPU: :func:`scope` plus the device-mapping mode
    (a no-op where CUDA is present)."""
    if torch.cuda.is_available():
        yield
        return
    with scope(), _CudaToCpuMode():
        yield


def installed() -> bool:
    """True when megatron has been adapted for the CPU in this process (no CUDA, and zhnlp has used megatron)."""
    return _PREPARED


def active() -> bool:
    """True inside :func:`scope` / :func:`device_mode`: ``torch.cuda`` is redirected to the CPU right now."""
    return _DEPTH > 0
