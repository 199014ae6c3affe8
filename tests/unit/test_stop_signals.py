"""Stop signals around the training loop (zhnlp.training.signals): caught only inside the block,
recorded rather than acted on, the previous handlers restored, a second Ctrl-C aborts, and the
exit code of the Interrupted error that follows is the shell's 128 + signal."""

import os
import signal
import threading

import pytest

from zhnlp.errors import Interrupted
from zhnlp.training import signals
from zhnlp.training.signals import StopRequest, stop_signals


def test_signals_are_recorded_inside_the_block_and_the_previous_handlers_come_back():
    seen = []
    previous_term = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        before_int = signal.getsignal(signal.SIGINT)
        with stop_signals() as stop:
            assert stop.agreed() == 0
            os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread before kill returns
            assert stop.signum == signal.SIGTERM and stop.agreed() == signal.SIGTERM
            assert seen == []  # the earlier handler is not called while the block is in charge
        assert signal.getsignal(signal.SIGINT) is before_int
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]  # and is back afterwards
    finally:
        signal.signal(signal.SIGTERM, previous_term)


def test_the_first_sigint_is_recorded_not_raised(capfd):
    with stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT
    assert "zhnlp: SIGINT received; stopping after the current step" in capfd.readouterr().err


def test_a_repeated_sigint_within_the_window_is_the_same_request(monkeypatch):
    """Under torchrun one Ctrl-C reaches a worker twice (terminal and launcher)."""
    clock = iter([100.0, 100.0 + signals.REPEAT_WINDOW_S / 4])
    monkeypatch.setattr(signals.time, "monotonic", lambda: next(clock))
    stop = StopRequest(announce=False)
    stop.handle(signal.SIGINT, None)
    stop.handle(signal.SIGINT, None)
    assert stop.signum == signal.SIGINT


def test_a_second_sigint_later_aborts_at_once_but_a_second_sigterm_does_not(monkeypatch):
    clock = iter([100.0, 100.0 + 2 * signals.REPEAT_WINDOW_S, 100.0 + 3 * signals.REPEAT_WINDOW_S])
    monkeypatch.setattr(signals.time, "monotonic", lambda: next(clock))
    stop = StopRequest(announce=False)
    stop.handle(signal.SIGTERM, None)
    stop.handle(signal.SIGTERM, None)  # ignored: still stopping
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)
    assert stop.signum == signal.SIGTERM


def test_blocks_nest_and_share_one_request():
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals() as outer:
        handler = signal.getsignal(signal.SIGTERM)
        with stop_signals() as inner:
            assert inner is outer and signal.getsignal(signal.SIGTERM) is handler
        assert signal.getsignal(signal.SIGTERM) is handler  # the inner block restored nothing
        os.kill(os.getpid(), signal.SIGTERM)
    assert outer.signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is before


def test_outside_the_main_thread_no_handler_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    result = {}

    def worker():
        with stop_signals() as stop:
            result["handler"] = signal.getsignal(signal.SIGTERM)
            result["agreed"] = stop.agreed()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result == {"handler": before, "agreed": 0}


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_exits_with_128_plus_the_signal(sig, code):
    assert Interrupted("stopped", sig).exit_code == code
