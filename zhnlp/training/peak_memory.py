"""Peak tensor memory of a training run, measured at the allocator level (not the process's RSS).

On a GPU this is ``torch.cuda.max_memory_allocated``. On a CPU torch keeps no such counter, so the profiler's
memory events are used: with ``profile_memory=True`` every allocation and free of the CPU allocator is recorded
with its size; the running sum of those sizes is the tensor memory allocated since the profiler started, and its
maximum is the peak. The profiler is started before the model is built (so parameters, gradient buffers and
optimizer states are counted) and stopped after the first ``window`` steps: the peak of a training run is reached
by then (the optimizer states exist from the first step's update on, and every later step repeats the second).
What is allocated outside torch's allocator (numpy arrays of the data pipeline, gloo's own buffers, the Python
heap) is not tensor memory and is not counted, on either device.

A trap on CPU: the profiler records a free only on threads that carry its state, and gloo runs collectives on
worker threads of its own. A tensor handed to an asynchronous collective and dropped by the caller right after
(FSDP's all-gather output once copied out; the copy gloo makes of a reduce-scatter's input) is often freed by
that worker when it lets go of the work: no free is recorded and a plain running sum of the events grows step
after step (measured: +6 to +12 MiB a step under ``--fsdp`` on ``ernie-debug``, so the reported peak depended on
the step and the run, 14-28% above the truth). Two defences: the CPU runtime runs the collectives concerned so
that their tensors are freed on the calling thread (:func:`zhnlp.distributed.cpu.reduce_scatter_on_caller` and
``all_gather_on_caller``), and the sum is kept block by block, by address (:func:`peak_of_allocations`): a block
whose address is handed out again has been freed, recorded or not.

The planner's memory model (:mod:`zhnlp.planning.memory`) predicts this figure; ``metrics.jsonl`` carries it as
``peak_tensor_bytes``, the maximum over ranks.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import warnings

import torch
import torch.distributed as dist


class PeakTensorMemory:
    """``start()`` before the model is built, ``after_step(step)`` after every optimizer step: returns the peak
    (maximum over ranks, bytes) once it is known (on a CPU from step ``window`` on; on a GPU at every step),
    otherwise None. Every rank must call ``after_step`` (it reduces over the world)."""

    def __init__(self, window: int = 3):
        self.window = window
        self.cuda = torch.cuda.is_available()
        self.profiler = None
        self.peak: int | None = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        if self.window <= 0 or torch._C._autograd._profiler_enabled():
            # torch runs one profiler per process: a user's own, or another trainer's still measuring, keeps it
            # (this run then reports no peak_tensor_bytes rather than stopping the other one)
            return
        from torch.profiler import ProfilerActivity, profile

        self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        older = torch.empty(1)
        with warnings.catch_warnings(), _quiet_stderr():
            warnings.simplefilter("ignore")
            self.profiler.__enter__()
            # torch warns once per process when a block allocated before the profiler started is freed (its
            # size is unknown to the profiler, which is why such frees are not counted): let that be now, silenced
            del older
        atexit.register(self.close)  # a profiler still running when the interpreter exits crashes it

    def after_step(self, step: int) -> int | None:
        if self.cuda:
            return self._max_over_ranks(torch.cuda.max_memory_allocated())
        if self.profiler is not None and step >= self.window:
            self.peak = self._max_over_ranks(self._stop())
        return self.peak

    def close(self) -> None:
        """Stop a profiler still running (a run shorter than the window), keeping what it measured."""
        if self.profiler is not None:
            self.peak = self._stop()

    def _stop(self) -> int:
        profiler, self.profiler = self.profiler, None
        with _quiet_stderr():
            profiler.__exit__(None, None, None)
        results = profiler.profiler.kineto_results
        try:
            return peak_of_allocations(cpu_allocations(results.experimental_event_tree()))
        except (AttributeError, TypeError):  # a torch without the event tree: the plain running sum
            return peak_of_events(results.events())

    @staticmethod
    def _max_over_ranks(value: int) -> int:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            from zhnlp import distributed

            t = torch.tensor([value], dtype=torch.int64, device=distributed.device())  # NCCL takes GPU tensors
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            value = int(t.item())
        return int(value)


@contextlib.contextmanager
def _quiet_stderr():
    """Hold back file descriptor 2 for a moment and pass on what was written to it, except the profiler's own
    lines: its C++ side (kineto) prints one at every start and stop whatever its log level, and torch warns
    once about blocks older than the profiler. Anything else written meanwhile (a signal handler's message)
    still reaches stderr."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        try:
            os.dup2(held.fileno(), 2)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            noise = ("profiler_start", "profiler_stop", "allocated before the profiling started")
            kept = [line for line in held.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not any(n in line for n in noise)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def peak_of_events(events) -> int:
    """The maximum of the running sum of the CPU allocator's memory events (sizes: + allocated, - freed), in time
    order. Frees of blocks allocated before the profiler started are not reported by torch, so the sum starts at
    zero with the profiler."""
    memory = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events)
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    total = peak = 0
    for _, _, nbytes in memory:
        total += nbytes
        peak = max(peak, total)
    return peak


def cpu_allocations(tree) -> list[tuple[int, int, int]]:
    """``(time_ns, address, bytes)`` of every CPU allocator event in the profiler's event ``tree`` (``bytes`` < 0:
    a free), in time order."""
    out, stack = [], list(tree)
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation" and fields.device.type == "cpu":
            out.append((node.start_time_ns, fields.ptr, fields.alloc_size))
        stack.extend(node.children)
    out.sort()
    return out


def peak_of_allocations(allocations) -> int:
    """The peak of the bytes held by the blocks allocated since the profiler started, tracked block by block
    (``allocations``: ``(time, address, bytes)`` in time order, ``bytes`` < 0 a free). A free of an unknown block
    (allocated before the profiler) changes nothing; an allocation at the address of a block still held proves
    that block freed, where its free went unrecorded (freed on a thread the profiler does not see, see the module
    docstring)."""
    live: dict[int, int] = {}
    total = peak = 0
    for _, address, nbytes in allocations:
        total -= live.pop(address, 0)
        if nbytes > 0:
            live[address] = nbytes
            total += nbytes
            peak = max(peak, total)
    return peak

