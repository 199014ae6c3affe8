"""Run under torchrun: train a recipe for a few steps eagerly, then again from the same seed with ``compile=True``
(same process, same layout), and write both runs' losses and gradient norms and the compiled run's graph breaks
(``OUT/<tag>.json``, from the logging rank)."""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.training import override, recipe
from zhnlp.training.trainer import Trainer


def run(args, compiled: bool) -> tuple[list[dict], Trainer]:
    cfg = override(recipe(args.recipe), prefix=args.data, steps=args.steps, tp=args.tp,
                   sequence_parallel=args.sp or None, output=str(args.out / f"{args.tag}-{compiled}"),
                   compile=compiled, memory_window=0)
    cfg.data.seq_length = 32
    trainer = Trainer(cfg)
    return trainer.train(), trainer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out", type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--recipe", default="ernie-debug")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--sp", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from torch._dynamo.utils import counters

    eager, _ = run(args, compiled=False)
    compiled, trainer = run(args, compiled=True)
    if dist.get_rank() == trainer.logging_rank:
        (args.out / f"{args.tag}.json").write_text(json.dumps({
            "eager": {"loss": [m["loss"] for m in eager], "grad_norm": [m["grad_norm"] for m in eager]},
            "compiled": {"loss": [m["loss"] for m in compiled], "grad_norm": [m["grad_norm"] for m in compiled]},
            "graph_breaks": sum(counters["graph_break"].values()),
            "graphs": counters["stats"]["unique_graphs"], "compiled_model": trainer.model.compiled}))
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
