"""Run under torchrun (2 processes): a debug recipe for 4 steps in one layout with one rank slowed down (a sleep in
its forward step), and every step's metrics to ``OUT/breakdown.json`` (from the logging rank, with the model's
parameter count and the run's shapes).

    breakdown_worker.py OUT LAYOUT SLOW_RANK

LAYOUT: dp (ernie-debug, 2 data-parallel ranks; a checkpoint every 2 steps), tp (ernie-debug, TP=2), pp
(ernie-debug, PP=2) or ep (ernie4.5-moe-debug, EP=2).
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

LAYOUTS = {"dp": ("ernie-debug", {"save_interval": 2}), "tp": ("ernie-debug", {"tp": 2}),
           "pp": ("ernie-debug", {"pp": 2}), "ep": ("ernie4.5-moe-debug", {"ep": 2})}


def main() -> int:
    out, layout, slow = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    name, changes = LAYOUTS[layout]
    cfg = override(recipe(name), steps=4, output=str(out / "run"), memory_window=0, **changes)
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
        shapes = {"params": sum(p.numel() for c in t.chunks for p in c.module.parameters()),
                  "hidden": t.config.hidden_size, "seq": cfg.data.seq_length, "micro": cfg.data.micro_batch_size,
                  "micro_batches": cfg.data.global_batch_size // cfg.data.micro_batch_size // t.layout.dp,
                  "layers": t.config.num_layers}
        if name == "ernie-debug":  # the masked tokens of each step's micro-batches on this rank (the MLM head's)
            shapes["masked"] = [sum(int((b["labels"] != -100).sum()) for b in t._micro_batches(step))
                                for step in range(cfg.steps)]
        (out / "breakdown.json").write_text(json.dumps({"steps": history, "shapes": shapes}))
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
