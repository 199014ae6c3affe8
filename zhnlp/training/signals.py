"""Stop signals around a training loop: SIGTERM and SIGINT end a run after its current step.

``with stop_signals() as stop:`` installs handlers for SIGTERM and SIGINT (main thread only; the
previous handlers come back when the block ends). A handler only records the signal, so the step
in flight finishes undisturbed; after each step the loop asks ``stop.agreed()``, an all-reduce
(MAX) of the recorded signal number over the world group, so that a signal that reached one rank
stops every rank after the same step (a scheduler or ``kill`` may signal a single worker).

A second SIGINT while stopping (someone pressing Ctrl-C again during the save) aborts at once by
raising KeyboardInterrupt. Under torchrun one Ctrl-C reaches each worker twice, from the terminal
and forwarded by torchrun, moments apart: a SIGINT within ``REPEAT_WINDOW_S`` of the first signal
is taken as the same request. Further SIGTERMs are ignored (torchrun's own escalation is SIGKILL
after ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds, 30 by default: raise it for long saves).

Blocks nest: an inner ``stop_signals()`` (``Trainer.train`` inside a caller's epoch loop) shares
the outer block's handlers and its recorded signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Iterator

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_WINDOW_S = 2.0  # a SIGINT this soon after the first signal repeats it rather than asking to abort

_ACTIVE: "StopRequest | None" = None


class StopRequest:
    """The stop signal this process received (``signum``, 0 for none) and the agreement on it."""

    def __init__(self, announce: bool):
        self.signum = 0
        self._first_at = 0.0
        self._announce = announce  # one rank tells the terminal that the signal was seen

    def handle(self, signum: int, frame) -> None:
        """The signal handler: record the first signal; a later SIGINT (past the repeat window) aborts."""
        now = time.monotonic()
        if not self.signum:
            self.signum, self._first_at = signum, now
            if self._announce:
                # os.write, not print: the handler may run while the main thread is inside a print
                os.write(2, f"zhnlp: {signal.Signals(signum).name} received; stopping after the current step "
                            "(Ctrl-C again aborts at once)\n".encode())
        elif signum == signal.SIGINT and now - self._first_at > REPEAT_WINDOW_S:
            raise KeyboardInterrupt

    def agreed(self) -> int:
        """The largest signal number any rank received (0: none); every rank returns the same value.
        Collective over the world group: call it at the same point on every rank."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.signum
        from zhnlp import distributed

        flag = torch.tensor([self.signum], dtype=torch.int32, device=distributed.device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


@contextlib.contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """Catch SIGTERM and SIGINT for the duration of the block (see the module docstring)."""
    global _ACTIVE
    if _ACTIVE is not None:  # nested: the outer block's handlers stay in charge
        yield _ACTIVE
        return
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    request = StopRequest(announce=rank0)
    previous = {}
    if threading.current_thread() is threading.main_thread():  # Python delivers signals to the main thread only
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, request.handle)
    _ACTIVE = request
    try:
        yield request
    finally:
        _ACTIVE = None
        for sig, handler in previous.items():
            # None: a handler installed from C, which Python cannot reinstate; the default is the closest
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
