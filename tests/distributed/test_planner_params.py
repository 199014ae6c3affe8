"""The planner's parameter counts per rank (zhnlp.planning.params) against the models megatron builds under the
same layouts: every rank, every group, exactly."""

import json
from pathlib import Path

import pytest

from tests.conftest import torchrun
from zhnlp.planning import Layout, stage_params
from zhnlp.training.config import recipe

WORKER = Path(__file__).with_name("planner_params_worker.py")


@pytest.mark.distributed
@pytest.mark.parametrize("name, nproc, tp, pp, vpp, ep", [
    ("ernie-debug", 4, 2, 2, 0, 1),
    ("ernie4.5-debug", 2, 1, 2, 2, 1),
    ("ernie4.5-moe-debug", 4, 2, 1, 0, 2),
    ("ernie4.5-moe-debug", 4, 1, 2, 0, 2),
])
def test_params_per_rank_match_the_built_model(tmp_path, name, nproc, tp, pp, vpp, ep):
    torchrun(WORKER, nproc, tmp_path, name, tp, pp, vpp, ep)
    layout = Layout(world=nproc, tp=tp, pp=pp, vpp=vpp or None, ep=ep)
    arch = recipe(name).architecture()
    for rank in range(nproc):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["counts"] == stage_params(arch, layout, report["stage"]), (rank, report)
