"""Communication accounting for a training step: where megatron's collectives and point-to-point transfers go.

While :meth:`CommMeter.measuring` is active, every ``torch.distributed`` collective and send/receive (megatron looks
them up as ``torch.distributed.X`` at call time; the few it binds at import, e.g. ``dist_all_gather_func``, are
replaced alongside) is attributed to a *kind* by its process group: ``tp`` (tensor parallel, expert tensor
parallel), ``pp`` (the pipeline's sends and receives), ``dp`` (data parallel, with context parallel, expert data
parallel) and ``ep`` (expert parallel: the MoE token dispatch). A send or receive over another group is ``pp``
when its peer is in this rank's pipeline group (megatron sends one direction of a two-stage pipeline over the
world group); other calls on other groups (the world, the tied embedding's first/last-stage group, the
model-parallel group of the gradient norm) are counted in no kind. megatron's coalescing manager (its gradient
buckets' reductions, the distributed optimizer's parameter all-gathers) is counted too: with ``async_ops``
(``--overlap-grad-reduce``, ``--overlap-param-gather``) the collectives inside only record themselves (their bytes
are counted there) and run as one call at its exit, whose time and the later ``wait()`` of its works are counted.

Per kind it adds up

* the seconds in the calls and, for asynchronous ones (``isend``/``irecv``, ``async_op=True``), in the
  ``wait()`` of the work they return; the waits of receives separately (a pipeline stage idling for its
  neighbour: the bubble);
* the bytes moved: a collective's whole buffer (the all-reduced tensor, the gathered output, the reduce-scattered
  or all-to-all input: nccl-tests' "algorithm bytes"), a send's or receive's tensor.

Each figure is also kept per *phase*, a label the caller sets (:meth:`CommMeter.during`), so that the trainer can
take the communication out of the phase it happened in. A call made inside another counted call (zhnlp's gloo
wrappers in :mod:`zhnlp.distributed.cpu` run the collective they stand for) is counted once, as the outer one.

The times are the host's. With gloo on a CPU a call returns when its data has moved; with NCCL on a GPU it returns
once queued on the device, so there the communication's time shows where the host next waits for the device
(mostly in the trainer's ``compute_s``) until it is timed with CUDA events (not done yet); the bytes are exact.

Cost, measured with gloo on a 2-core CPU: ~1.5 µs a synchronous call, ~3 µs an asynchronous one with its wait,
~10 µs to enter and leave ``measuring()``; nothing is patched outside it. The meter is for one thread: the
training step's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import time
from collections import defaultdict

import torch
import torch.distributed as dist

KINDS = ("tp", "pp", "dp", "ep")

# torch.distributed function -> its parameter holding the data moved (see the module docstring)
_MOVED = {"all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor", "all_gather": "tensor_list",
          "all_gather_into_tensor": "output_tensor", "_all_gather_base": "output_tensor",
          "all_gather_single": "output_tensor", "reduce_scatter": "input_list", "reduce_scatter_tensor": "input",
          "_reduce_scatter_base": "input", "reduce_scatter_single": "input", "all_to_all_single": "input",
          "all_to_all": "input_tensor_list", "send": "tensor", "recv": "tensor", "isend": "tensor",
          "irecv": "tensor"}
_RECEIVES = ("recv", "irecv")
_POINT_TO_POINT = ("send", "recv", "isend", "irecv")  # their second parameter is the peer's global rank
# megatron modules that bind a collective at import: attribute -> the torch function it stands for
_BOUND = {"megatron.core.tensor_parallel.mappings": {"dist_all_gather_func": "all_gather_into_tensor",
                                                      "dist_reduce_scatter_func": "reduce_scatter_tensor"},
          "megatron.core.distributed.param_and_grad_buffer": {"dist_all_gather_func": "all_gather_into_tensor",
                                                              "dist_reduce_scatter_func": "reduce_scatter_tensor"}}
# megatron's coalescing manager around its buckets' gradient reductions and parameter all-gathers: with async_ops
# (--overlap-grad-reduce, --overlap-param-gather) the collectives inside only record themselves (counted there with
# their bytes) and run as one coalesced call at the manager's exit, which a later wait() completes
_COALESCING = ("megatron.core.distributed.param_and_grad_buffer", "_coalescing_manager")


@functools.cache
def _positions(name: str) -> tuple[int, int]:
    """(position of the moved data, position of ``group``) among the arguments of ``torch.distributed.<name>``."""
    params = list(inspect.signature(getattr(dist.distributed_c10d, name)).parameters)
    return params.index(_MOVED[name]), params.index("group")


def _nbytes(moved) -> int:
    if isinstance(moved, torch.Tensor):
        return moved.numel() * moved.element_size()
    return sum(_nbytes(t) for t in moved) if isinstance(moved, (list, tuple)) else 0


def megatron_kinds() -> dict:
    """megatron-core's process groups of this rank (``parallel_state``) -> kind; groups of one rank are left out
    (nothing crosses them), and a group serving two roles keeps the first kind listed here."""
    from megatron.core import parallel_state as ps

    getters = [("tp", ps.get_tensor_model_parallel_group), ("pp", ps.get_pipeline_model_parallel_group),
               ("dp", lambda **k: ps.get_data_parallel_group(with_context_parallel=True)),
               ("dp", lambda **k: ps.get_data_parallel_group()), ("ep", ps.get_expert_model_parallel_group),
               ("ep", ps.get_expert_tensor_and_model_parallel_group), ("tp", ps.get_expert_tensor_parallel_group),
               ("dp", ps.get_expert_data_parallel_group)]
    kinds = {}
    for kind, get in getters:
        try:
            group = get(check_initialized=False)
        except AssertionError:  # megatron asserts for groups it did not build (none in the layouts zhnlp makes)
            continue
        if group is not None and dist.get_world_size(group) > 1:
            kinds.setdefault(group, kind)
    return kinds


def megatron_peers() -> dict:
    """The other ranks of this rank's pipeline group (global ranks) -> ``pp``: point-to-point calls with them are
    pipeline traffic whatever group they use."""
    from megatron.core import parallel_state as ps

    group = ps.get_pipeline_model_parallel_group(check_initialized=False)
    if group is None or dist.get_world_size(group) == 1:
        return {}
    return {rank: "pp" for rank in dist.get_process_group_ranks(group) if rank != dist.get_rank()}


class _Waited(dist.distributed_c10d.Work):
    """The work of an asynchronous call, whose ``wait()`` is timed into the meter. A ``Work`` itself, so that
    callers checking ``isinstance(work, Work)`` (torch FSDP2) still wait on it; everything else is the inner
    work's."""

    __slots__ = ("_work", "_meter", "_kind", "_receives")

    def __init__(self, work, meter: "CommMeter", kind: str, receives: bool):
        super().__init__()
        self._work, self._meter, self._kind, self._receives = work, meter, kind, receives

    def wait(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._meter._add(self._kind, time.perf_counter() - start, 0, self._receives)

    def is_completed(self):
        return self._work.is_completed()

    def is_success(self):
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def source_rank(self):
        return self._work.source_rank()

    def result(self):
        return self._work.result()

    def synchronize(self):
        return self._work.synchronize()

    def get_future(self):
        return self._work.get_future()


class CommMeter:
    """Counts this rank's communication by kind while :meth:`measuring` (see the module docstring).

    ``kinds``: process group -> kind; ``peers``: global rank -> the kind of point-to-point calls with it over a
    group not in ``kinds`` (defaults: :func:`megatron_kinds`, :func:`megatron_peers`, read when the meter is made,
    after the groups exist)."""

    def __init__(self, kinds: dict | None = None, peers: dict | None = None):
        self.kinds = megatron_kinds() if kinds is None else dict(kinds)
        self.peers = megatron_peers() if peers is None else dict(peers)
        self.phase = None  # the label the current time is charged to (see during())
        self._depth = 0  # > 0 inside a counted call
        self._saved = []  # (owner, attribute, original) while measuring
        self._wrappers = {}  # (original, torch name) -> its counting wrapper
        self.reset()

    def reset(self) -> None:
        # (phase, kind) -> seconds in calls and waits, except waits for receives; seconds waiting for receives
        self.seconds = defaultdict(float)
        self.receive_wait = defaultdict(float)
        self.bytes = dict.fromkeys(KINDS, 0)

    # ------------------------------------------------------------------------------ figures
    def time(self, kind: str, phase=None, receive_wait: bool | None = None) -> float:
        """Seconds of ``kind`` charged to ``phase`` (None: outside every labelled phase): in the waits of receives
        (``receive_wait=True``), in everything else (calls, other waits: ``False``), or in both (None)."""
        key = (phase, kind)
        if receive_wait is None:
            return self.seconds.get(key, 0.0) + self.receive_wait.get(key, 0.0)
        return (self.receive_wait if receive_wait else self.seconds).get(key, 0.0)

    def total(self, kind: str) -> float:
        """Every second of ``kind``, whatever the phase, the waits of receives included."""
        return sum(s for (_, k), s in [*self.seconds.items(), *self.receive_wait.items()] if k == kind)

    def traffic(self) -> dict:
        """``{kind}_bytes`` for every kind and, where bytes moved, ``{kind}_bytes_per_s``: the bytes over every
        second of that kind (waits for the peer included: the bandwidth the step achieved, a lower bound on the
        link's)."""
        out = {}
        for kind in KINDS:
            out[f"{kind}_bytes"] = self.bytes[kind]
            seconds = self.total(kind)
            if self.bytes[kind] and seconds > 0:
                out[f"{kind}_bytes_per_s"] = self.bytes[kind] / seconds
        return out

    def _add(self, kind: str, seconds: float, nbytes: int, receives: bool) -> None:
        (self.receive_wait if receives else self.seconds)[self.phase, kind] += seconds
        self.bytes[kind] += nbytes

    # ------------------------------------------------------------------------------ measuring
    @contextlib.contextmanager
    def during(self, phase):
        """Charge the communication inside to ``phase`` (restored on exit: phases nest)."""
        outer, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = outer

    @contextlib.contextmanager
    def measuring(self):
        """Count the communication inside (figures reset on entry, kept after exit until the next entry)."""
        if self._saved:
            raise RuntimeError("CommMeter.measuring() is not reentrant")
        self.reset()
        targets = [(dist, name, name) for name in (*_MOVED, "batch_isend_irecv") if hasattr(dist, name)]
        # torch.distributed.P2POp accepts only torch's own isend/irecv (distributed_c10d's names): megatron's
        # P2POp(torch.distributed.isend, ...) then carries the counting ones
        targets += [(dist.distributed_c10d, name, name) for name in ("isend", "irecv")]
        targets += [(module, attr, name) for module_name, bound in _BOUND.items()
                    if (module := sys.modules.get(module_name)) is not None for attr, name in bound.items()]
        if (module := sys.modules.get(_COALESCING[0])) is not None:
            targets.append((module, _COALESCING[1], _COALESCING[1]))
        for owner, attr, name in targets:
            original = getattr(owner, attr)
            # one wrapper per function (torch.distributed.isend is distributed_c10d.isend), kept for the next step
            if (original, name) not in self._wrappers:
                self._wrappers[original, name] = (self._batch(original) if name == "batch_isend_irecv"
                                                  else self._coalesced(original) if name == _COALESCING[1]
                                                  else self._counted(original, name))
            self._saved.append((owner, attr, original))
            setattr(owner, attr, self._wrappers[original, name])
        try:
            yield self
        finally:
            for owner, attr, original in reversed(self._saved):
                setattr(owner, attr, original)
            self._saved = []

    def _counted(self, fn, name: str):
        moved_at, group_at = _positions(name)
        receives = name in _RECEIVES
        peer = ("src" if receives else "dst") if name in _POINT_TO_POINT else None  # the peer's keyword

        @functools.wraps(fn)
        def counted(*args, **kwargs):
            if torch.compiler.is_compiling():  # traced into a compiled layer (--compile): runs in its graph, uncounted
                return fn(*args, **kwargs)
            group = kwargs.get("group", args[group_at] if len(args) > group_at else None)
            kind = self.kinds.get(group) if group is not None else None
            if kind is None and peer is not None:
                kind = self.peers.get(kwargs.get(peer, args[1] if len(args) > 1 else None))
            if kind is None or self._depth:
                return fn(*args, **kwargs)
            moved = args[moved_at] if len(args) > moved_at else kwargs.get(_MOVED[name])
            return self._run(fn, args, kwargs, kind, _nbytes(moved), receives)

        return counted

    def _batch(self, fn):
        @functools.wraps(fn)
        def batch(p2p_op_list, *args, **kwargs):
            kind = None
            if p2p_op_list:
                kind = self.kinds.get(p2p_op_list[0].group) or self.peers.get(p2p_op_list[0].peer)
            if kind is None or self._depth:
                return fn(p2p_op_list, *args, **kwargs)
            receives = any(getattr(op.op, "__name__", "") in _RECEIVES for op in p2p_op_list)
            return self._run(fn, (p2p_op_list, *args), kwargs, kind, sum(_nbytes(op.tensor) for op in p2p_op_list),
                             receives)

        return batch

    def _coalesced(self, manager):
        """megatron's ``_coalescing_manager`` with the time of its exit (where the coalesced collective is issued,
        and, without ``async_ops``, completed) and of the waits on the works it returns counted in the group's kind;
        the bytes are counted by the collectives inside."""

        @contextlib.contextmanager
        def coalesced(group=None, device=None, async_ops=False):
            kind = self.kinds.get(group) if group is not None else None
            if kind is None or self._depth:
                with manager(group, device=device, async_ops=async_ops) as cm:
                    yield cm
                return
            with manager(group, device=device, async_ops=async_ops) as cm:
                yield cm
                start = time.perf_counter()
            self._add(kind, time.perf_counter() - start, 0, False)
            if getattr(cm, "works", None):  # torch's _CoalescingManager: cm.wait() waits for each
                cm.works = [_Waited(w, self, kind, False) for w in cm.works]

        return coalesced

    def _run(self, fn, args, kwargs, kind: str, nbytes: int, receives: bool):
        self._depth += 1
        start = time.perf_counter()
        try:
            work = fn(*args, **kwargs)
        finally:
            self._depth -= 1
            self._add(kind, time.perf_counter() - start, nbytes, False)
        if isinstance(work, dist.distributed_c10d.Work):
            return _Waited(work, self, kind, receives)
        if isinstance(work, list):  # batch_isend_irecv
            return [_Waited(w, self, kind, receives) for w in work]
        return work
