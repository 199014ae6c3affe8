"""Run under torchrun: build a recipe's model under a layout and write, per rank, its pipeline stage and the
parameters it holds by group (dense / routed expert / frozen) to ``OUT/rank<r>.json``: what
zhnlp.planning.params predicts without building anything.

    planner_params_worker.py OUT RECIPE TP PP VPP(0: none) EP
"""

import json
import sys
from pathlib import Path

import torch
from megatron.core import parallel_state as ps

import zhnlp
from zhnlp.models.common.pretrained import PretrainedModel
from zhnlp.training.config import recipe
from zhnlp.training.trainer import run_options


def main() -> int:
    out, name = Path(sys.argv[1]), sys.argv[2]
    tp, pp, vpp, ep = map(int, sys.argv[3:7])
    torch.set_num_threads(1)
    cfg = recipe(name)
    cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.vpp, cfg.parallel.ep = tp, pp, vpp or None, ep
    lay = zhnlp.distributed.init(tp=tp, pp=pp, vpp=vpp or None, ep=ep)
    model = PretrainedModel.from_config(cfg.family, cfg.architecture(), cfg.head, seed=cfg.seed, **run_options(cfg))
    counts = {"dense": 0, "expert": 0, "frozen": 0}
    for chunk in model.chunks:
        for p in chunk.parameters():
            group = "frozen" if not p.requires_grad else "dense" if getattr(p, "allreduce", True) else "expert"
            counts[group] += p.numel()
    report = {"stage": ps.get_pipeline_model_parallel_rank(), "counts": counts}
    (out / f"rank{lay.rank}.json").write_text(json.dumps(report))
    zhnlp.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
