"""The CPU runtime's reduce-scatter and all-gather over gloo (zhnlp.distributed.cpu): torch's values, and every
temporary freed on the calling thread, so that the trainer's profiler-based peak (peak_tensor_bytes) neither
misses frees nor keeps one block per collective, as it did when gloo's worker threads freed them."""

import json
from pathlib import Path

import pytest

from tests.conftest import torchrun

WORKER = Path(__file__).with_name("gloo_release_worker.py")


@pytest.mark.distributed
def test_collectives_match_torch_and_free_on_the_caller(tmp_path):
    torchrun(WORKER, 2, tmp_path)
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert all(v for k, v in report.items() if k.startswith(("reduce_scatter", "all_gather"))), report
        # input + shard + gloo's copy + the gathered tensor at most (allocator rounding aside)
        assert report["peak"] <= report["bound"] * 1.01, report
        # every free recorded: the plain running sum of the events agrees with the block-by-block one
        assert report["event_sum_peak"] == report["peak"], report
