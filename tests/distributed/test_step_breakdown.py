"""Where a step's time goes (metrics.jsonl): compute, the gradient reductions after the backward, the optimizer,
the rest, and the data wait before the step; every rank's compute and step time, the slowest rank named."""

import json
from pathlib import Path

import pytest

from tests.conftest import torchrun

WORKER = Path(__file__).with_name("breakdown_worker.py")


@pytest.mark.distributed
@pytest.mark.parametrize("slow", [0, 1])
def test_parts_add_up_and_a_slowed_rank_is_named(tmp_path, slow):
    torchrun(WORKER, 2, tmp_path, slow)
    steps = json.loads((tmp_path / "breakdown.json").read_text())
    assert len(steps) == 4
    for m in steps[1:]:  # the first step also builds megatron's schedule state
        named = m["compute_s"] + m["grad_sync_s"] + m["optimizer_s"]
        assert abs(named - m["step_time_s"]) <= 0.10 * m["step_time_s"], m  # the named parts are the step
        assert m["other_s"] >= -1e-9 and m["data_wait_s"] >= 0, m
        assert m["slowest_rank"] == slow, m  # the one that computes longer; the other waits in the reduction
        assert m["compute_max_s"] - m["compute_min_s"] >= 0.04, m  # ernie-debug's micro-batches x 50 ms
        assert m["step_time_min_s"] <= m["step_time_s"] <= m["step_time_max_s"], m
