"""Peak tensor memory of a training run, measured at the allocator level (not the process's RSS).

On a GPU this is ``torch.cuda.max_memory_allocated``. On a CPU torch keeps no such counter, so the profiler's
memory events are used: with ``profile_memory=True`` every allocation and free of the CPU allocator is recorded
with its size; the running sum of those sizes is the tensor memory allocated since the profiler started, and its
maximum is the peak. The profiler is started before the model is built (so parameters, gradient buffers and
optimizer states are counted) and stopped after the first ``window`` steps: the peak of a training run is reached
by then (the optimizer states exist from the first step's update on, and every later step repeats the second).
What is allocated outside torch's allocator (numpy arrays of the data pipeline, gloo's own buffers, the Python
heap) is not tensor memory and is not counted, on either device.

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
        return peak_of_events(profiler.profiler.kineto_results.events())

    @staticmethod
    def _max_over_ranks(value: int) -> int:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            t = torch.tensor([value], dtype=torch.int64)
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
