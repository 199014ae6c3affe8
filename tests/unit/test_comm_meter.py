"""The communication meter (zhnlp.distributed.meter) in a world of one: calls counted by the kind of their group,
bytes by the moved buffer, the waits of asynchronous works timed, a call inside a counted one counted once, and
torch restored afterwards."""

import pytest
import torch
import torch.distributed as dist

import zhnlp.distributed
from zhnlp.distributed import cpu
from zhnlp.distributed.meter import CommMeter


@pytest.fixture(scope="module", autouse=True)
def world():
    zhnlp.distributed.init()


def test_calls_are_counted_by_kind_and_bytes_then_torch_is_restored():
    world = dist.group.WORLD
    originals = (dist.all_reduce, dist.isend, dist.distributed_c10d.isend, dist.all_gather_single)
    meter = CommMeter(kinds={world: "tp"}, peers={})
    with meter.measuring():
        assert dist.all_reduce is not originals[0] and dist.isend is dist.distributed_c10d.isend
        with meter.during("forward_backward"):
            dist.all_reduce(torch.ones(8), group=world)  # 32 bytes
            work = dist.all_reduce(torch.ones(4, dtype=torch.float64), group=world, async_op=True)  # 32 bytes
            assert isinstance(work, dist.distributed_c10d.Work)  # torch FSDP2 waits only on a Work
            work.wait()
            dist.all_gather_single(torch.empty(3), torch.ones(3), group=world)  # the gathered output: 12
        dist.all_reduce(torch.ones(100))  # the default group: no kind, not counted
        # a P2POp of the counting isend passes torch's check that its op is torch's isend
        dist.P2POp(dist.isend, torch.ones(1), 0, world)
    assert (dist.all_reduce, dist.isend, dist.distributed_c10d.isend, dist.all_gather_single) == originals
    assert meter.bytes == {"tp": 76, "pp": 0, "dp": 0, "ep": 0}
    assert meter.time("tp", "forward_backward") > 0 and meter.time("tp") == 0
    traffic = meter.traffic()
    assert traffic["tp_bytes"] == 76 and traffic["tp_bytes_per_s"] > 0 and "dp_bytes_per_s" not in traffic
    with meter.measuring():  # figures start again at every measurement
        pass
    assert meter.bytes["tp"] == 0 and meter.traffic() == {"tp_bytes": 0, "pp_bytes": 0, "dp_bytes": 0, "ep_bytes": 0}


def test_a_collective_inside_a_counted_one_is_counted_once():
    world = dist.group.WORLD
    meter = CommMeter(kinds={world: "dp"}, peers={})
    grads, mine = torch.ones(8), torch.empty(8)
    with cpu.device_mode():  # megatron prepared for gloo: its gradient buffers reduce-scatter with zhnlp's wrapper
        import megatron.core.distributed.param_and_grad_buffer as buffers

        assert buffers.dist_reduce_scatter_func is cpu.reduce_scatter_for_megatron
        with meter.measuring():
            # megatron's binding, replaced while measuring; zhnlp's wrapper all-reduces the whole buffer inside
            buffers.dist_reduce_scatter_func(mine, grads, group=world)
        assert buffers.dist_reduce_scatter_func is cpu.reduce_scatter_for_megatron
    assert meter.bytes["dp"] == 32  # the reduce-scatter's input, once
    assert torch.equal(mine, grads)
