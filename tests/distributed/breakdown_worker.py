"""Run under torchrun: ernie-debug for a few steps with one rank slowed down (a sleep in its forward step), and
the step-time figures of every step to ``OUT/breakdown.json`` (from the logging rank).

    breakdown_worker.py OUT SLOW_RANK
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.training import override, recipe, trainer
from zhnlp.training.trainer import Trainer


def main() -> int:
    out, slow = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    cfg = override(recipe("ernie-debug"), steps=4, output=str(out / "run"), memory_window=0)
    cfg.data.seq_length = 32
    t = Trainer(cfg)
    if dist.get_rank() == slow:
        forward_step = trainer.forward_step

        def slowed(*args, **kwargs):
            time.sleep(0.05)
            return forward_step(*args, **kwargs)

        trainer.forward_step = slowed
    history = t.train()
    if dist.get_rank() == t.logging_rank:
        keys = ("step_time_s", "data_wait_s", "compute_s", "grad_sync_s", "optimizer_s", "other_s", "slowest_rank",
                "step_time_min_s", "step_time_max_s", "compute_min_s", "compute_max_s")
        (out / "breakdown.json").write_text(json.dumps([{k: m[k] for k in keys} for m in history]))
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
