"""Where a step's time goes (metrics.jsonl): compute, tensor-/pipeline-/expert-parallel communication and the
pipeline bubble, the data-parallel gradient reductions, the optimizer, the rest, the data wait before the step and
the checkpoint after it; the bytes each kind of communication moved; every rank's compute and step time, the
slowest rank named. One rank is slowed by 50 ms a micro-batch in each layout."""

import json
from pathlib import Path

import pytest

from tests.conftest import torchrun

WORKER = Path(__file__).with_name("breakdown_worker.py")
PARTS = ("compute_s", "tp_comm_s", "pp_comm_s", "pp_bubble_s", "ep_comm_s", "grad_sync_s", "optimizer_s")
KINDS = ("tp", "pp", "dp", "ep")


def run(tmp_path, layout: str, slow: int) -> tuple[list[dict], dict]:
    torchrun(WORKER, 2, tmp_path, layout, slow)
    result = json.loads((tmp_path / "breakdown.json").read_text())
    assert len(result["steps"]) == 4
    return result["steps"][1:], result["shapes"]  # the first step also builds megatron's schedule state


def check_parts(m: dict, slow: int) -> None:
    assert all(m[k] >= 0 for k in (*PARTS, "data_wait_s", "checkpoint_s")), m
    named = sum(m[k] for k in PARTS)
    assert abs(named - m["step_time_s"]) <= 0.10 * m["step_time_s"], m  # the named parts are the step
    assert m["other_s"] >= -1e-9, m
    assert m["slowest_rank"] == slow, m  # the one that computes longer; the other waits in communication
    assert m["compute_max_s"] - m["compute_min_s"] >= 0.04, m  # at least 2 micro-batches x 50 ms
    assert m["step_time_min_s"] <= m["step_time_s"] <= m["step_time_max_s"], m
    for kind in KINDS:  # bandwidth where bytes moved, and only there
        assert (f"{kind}_bytes_per_s" in m) == (m[f"{kind}_bytes"] > 0), m
        assert m.get(f"{kind}_bytes_per_s", 1) > 0, m


@pytest.mark.distributed
def test_data_parallel_slowed_rank_is_named_and_checkpoints_are_timed(tmp_path):
    steps, shapes = run(tmp_path, "dp", 1)  # rank 1 logs: its own step is the slow one
    for m in steps:
        check_parts(m, 1)
        # one all-reduce of the fp32 gradient buffer (every parameter) and the loss average's 4 bytes
        assert (m["dp_bytes"], m["tp_bytes"], m["pp_bytes"], m["ep_bytes"]) == (4 * shapes["params"] + 4, 0, 0, 0)
        assert m["tp_comm_s"] == m["pp_comm_s"] == m["pp_bubble_s"] == m["ep_comm_s"] == 0, m
        assert (m["checkpoint_s"] > 0) == (m["step"] % 2 == 0), m  # saved after steps 2 and 4
    assert (tmp_path / "run" / "checkpoints" / "step_0000004").is_dir()


@pytest.mark.distributed
def test_tensor_parallel_waits_are_tp_communication(tmp_path):
    steps, shapes = run(tmp_path, "tp", 0)  # rank 1 logs and waits for rank 0 in the all-reduces
    tokens = shapes["micro_batches"] * shapes["micro"] * shapes["seq"]
    for m, masked in zip(steps, shapes["masked"][1:]):
        check_parts(m, 0)
        assert m["tp_comm_s"] >= 0.1, m  # most of rank 0's 4 x 50 ms
        # fp32 all-reduces of (micro, seq, hidden): the embedding's, two in the forward and two in the backward of
        # each layer; the MLM head's over the masked tokens: its input gradient and the cross entropy's 3 floats
        expected = 4 * tokens * shapes["hidden"] * (1 + 4 * shapes["layers"]) + 4 * masked * (shapes["hidden"] + 3)
        assert (m["tp_bytes"], m["pp_bytes"], m["dp_bytes"], m["ep_bytes"]) == (expected, 0, 0, 0), m


@pytest.mark.distributed
def test_pipeline_waits_are_the_bubble(tmp_path):
    steps, shapes = run(tmp_path, "pp", 0)  # the last stage logs and waits for the slowed first stage
    activation = 4 * shapes["micro"] * shapes["seq"] * shapes["hidden"]  # fp32 (micro, seq, hidden)
    for m in steps:
        check_parts(m, 0)
        assert m["pp_bubble_s"] >= 0.1 and m["pp_comm_s"] > 0, m
        # every micro-batch: its activations received, their gradient sent back
        assert (m["pp_bytes"], m["tp_bytes"], m["dp_bytes"], m["ep_bytes"]) == (
            2 * shapes["micro_batches"] * activation, 0, 0, 0), m


@pytest.mark.distributed
def test_expert_parallel_waits_are_ep_communication(tmp_path):
    steps, shapes = run(tmp_path, "ep", 0)  # ernie4.5-moe-debug: 3 MoE layers, top-2
    routed = 4 * shapes["micro_batches"] * shapes["micro"] * shapes["seq"] * 2 * shapes["hidden"]
    for m in steps:
        check_parts(m, 0)
        assert m["ep_comm_s"] >= 0.05, m
        # at least, per MoE layer, this rank's routed tokens sent in the dispatch and their gradients in its backward
        assert m["ep_bytes"] >= 3 * 2 * routed and m["dp_bytes"] > 0 and m["tp_bytes"] == m["pp_bytes"] == 0, m
