"""The pretraining batches prepared a step ahead on a background thread (zhnlp.training.trainer.Prefetch):
the same batches as made on demand, for any order of steps, errors raised in the step that needs them."""

import threading
import time

import pytest

from zhnlp.training.trainer import Prefetch


def make_recorder(delay: float = 0.0):
    made = []

    def make(step):
        time.sleep(delay)
        made.append((step, threading.current_thread().name))
        return [{"step": step}]

    return make, made


def test_the_next_step_is_made_on_the_background_thread_while_this_one_runs():
    make, made = make_recorder(delay=0.05)
    batches = Prefetch(make)
    assert batches(0) == [{"step": 0}]  # nothing prepared yet: made here
    time.sleep(0.2)  # "the step computes"
    start = time.perf_counter()
    assert batches(1) == [{"step": 1}]
    assert time.perf_counter() - start < 0.04  # it was ready
    assert made[0][1] == threading.current_thread().name and made[1][1].startswith("zhnlp-data")
    batches.close()


def test_another_step_than_the_prepared_one_is_made_for_it():
    make, made = make_recorder()
    batches = Prefetch(make)
    batches(0)
    assert batches(5) == [{"step": 5}]  # a resume: step 1 was prepared, 5 is asked for
    assert batches(6) == [{"step": 6}]
    batches.close()
    assert batches(2) == [{"step": 2}]  # usable again after close (a second train() call)
    batches.close()


def test_an_error_making_a_batch_is_raised_in_the_step_that_needs_it():
    def make(step):
        if step == 1:
            raise ValueError("sample 7 is malformed")
        return [step]

    batches = Prefetch(make)
    assert batches(0) == [0]
    with pytest.raises(ValueError, match="sample 7 is malformed"):
        batches(1)
    batches.close()


def test_trainer_batches_are_the_same_with_and_without_prefetch():
    from zhnlp.training import override, recipe
    from zhnlp.training.trainer import Trainer

    import torch

    trainers = [Trainer(override(recipe("ernie-debug"), prefetch=flag, steps=3, memory_window=0))
                for flag in (True, False)]
    assert isinstance(trainers[0].batches, Prefetch) and not isinstance(trainers[1].batches, Prefetch)
    for step in (0, 1, 2, 7, 8):
        a, b = trainers[0].batches(step), trainers[1].batches(step)
        assert len(a) == len(b) and all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
    trainers[0].batches.close()
