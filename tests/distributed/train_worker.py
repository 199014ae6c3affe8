"""Run under torchrun: train a recipe (ernie-debug unless --recipe) for a few steps under the layout on the
command line and write the per-step losses and gradient norms (``OUT/<tag>.json``, from the logging rank)."""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.training import override, recipe
from zhnlp.training.trainer import Trainer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out", type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--vpp", type=int, default=None)
    ap.add_argument("--sp", action="store_true")
    ap.add_argument("--recompute", default=None)
    ap.add_argument("--distributed-optimizer", action="store_true")
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--recipe", default="ernie-debug")
    ap.add_argument("--reset-attention", action="store_true")
    ap.add_argument("--ep", type=int, default=None)
    ap.add_argument("--etp", type=int, default=None)
    ap.add_argument("--moe-aux-loss-coeff", type=float, default=None)
    ap.add_argument("--overlap-grad-reduce", action="store_true")
    ap.add_argument("--bucket-size", type=int, default=None)
    ap.add_argument("--overlap-param-gather", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = override(recipe(args.recipe), prefix=args.data, steps=args.steps, tp=args.tp, pp=args.pp, vpp=args.vpp,
                   sequence_parallel=args.sp or None, recompute=args.recompute,
                   distributed_optimizer=args.distributed_optimizer or None, output=str(args.out / args.tag),
                   reset_attention=args.reset_attention or None, ep=args.ep, etp=args.etp,
                   moe_aux_loss_coeff=args.moe_aux_loss_coeff, fsdp=args.fsdp or None,
                   overlap_grad_reduce=args.overlap_grad_reduce or None, bucket_size=args.bucket_size,
                   overlap_param_gather=args.overlap_param_gather or None)
    cfg.data.seq_length = 32
    trainer = Trainer(cfg)
    history = trainer.train()
    if dist.get_rank() == trainer.logging_rank:
        (args.out / f"{args.tag}.json").write_text(json.dumps(
            {"loss": [m["loss"] for m in history], "grad_norm": [m["grad_norm"] for m in history],
             "moe": [{k: v for k, v in m.items() if k.startswith("moe_")} for m in history]}))
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
