"""Run under torchrun (gloo): zhnlp's reduce-scatter and all-gather that free on the calling thread
(zhnlp.distributed.cpu) against torch's own, and what the trainer's peak meter sees of a loop of them; per rank to
``OUT/rank<r>.json``.

    gloo_release_worker.py OUT
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp.distributed import cpu
from zhnlp.training.peak_memory import PeakTensorMemory, peak_of_events

N = 1_000_000  # 4 MB of float32 per full tensor


def main() -> int:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    report = {}
    # the same values as torch's own collectives, SUM and AVG, sync and async, float32 and bfloat16
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.arange(4 * size, dtype=torch.float32) * (rank + 1)).to(dtype)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            ours, theirs = torch.empty(4, dtype=dtype), torch.empty(4, dtype=dtype)
            work = cpu.reduce_scatter_on_caller(ours, x.view(size, 4), op=op, async_op=True)
            work.wait()
            if op == dist.ReduceOp.SUM:
                dist.reduce_scatter_single(theirs, x, op=op)
            else:  # gloo has no AVG: the sum over the ranks, divided
                dist.reduce_scatter_single(theirs, x, op=dist.ReduceOp.SUM)
                theirs /= size
            report[f"reduce_scatter {dtype} {op}"] = torch.equal(ours, theirs)
        gathered = torch.empty(4 * size, dtype=dtype)
        assert cpu.all_gather_on_caller(gathered, x[:4].contiguous()) is None
        report[f"all_gather {dtype}"] = torch.equal(gathered.view(size, 4)[rank], x[:4])
    # a loop of collectives on temporaries: every block is freed where the profiler sees it
    meter = PeakTensorMemory(window=1)
    meter.start()
    profiler = meter.profiler
    for _ in range(10):
        x = torch.empty(N).fill_(rank + 1.0)  # 4 MB
        shard = torch.empty(N // size)  # 4 / size MB
        cpu.reduce_scatter_on_caller(shard, x)  # + a 4 MB copy while it runs
        gathered = torch.empty(N)  # 4 MB
        cpu.all_gather_on_caller(gathered, shard)
        del x, shard, gathered
    meter.close()
    report["peak"] = meter.peak
    report["event_sum_peak"] = peak_of_events(profiler.profiler.kineto_results.events())
    report["bound"] = 4 * N * (3 + 1 / size)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
