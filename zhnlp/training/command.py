"""``zhnlp pretrain``: pick a recipe, override fields, train (also under torchrun)."""

from __future__ import annotations

from zhnlp.training.config import RECIPES, override, recipe


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("pretrain", help="pretrain an ERNIE model (megatron-core engine)",
                              description="Pretrain with a recipe; run under torchrun for several processes.")
    p.add_argument("--recipe", default="ernie-debug", choices=sorted(RECIPES))
    p.add_argument("--data", help="preprocessed corpus prefix (default for ernie-debug: the demo corpus)")
    p.add_argument("--output", help="run directory (metrics.jsonl)")
    p.add_argument("--tp", type=int)
    p.add_argument("--pp", type=int)
    p.add_argument("--vpp", type=int)
    p.add_argument("--sequence-parallel", action="store_true", default=None)
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--global-batch-size", type=int)
    p.add_argument("--seq-length", type=int)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--recompute", choices=["selective", "full"])
    p.add_argument("--initial-loss-scale", type=float, help="fp16: where dynamic loss scaling starts")
    p.add_argument("--distributed-optimizer", action="store_true", default=None)
    p.add_argument("--log-interval", type=int)
    p.add_argument("--save-interval", type=int, help="steps between distributed checkpoints")
    p.add_argument("--keep", type=int, help="complete checkpoints to keep (default 3)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue from the newest complete checkpoint in --output")
    p.add_argument("--stop-at", type=int, help="end this process at this step (the schedule still spans --steps); "
                                               "with --save-interval, for time-limited jobs")
    p.add_argument("--peak-tflops", type=float, help="per-device peak for the MFU column")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from zhnlp.training.trainer import Trainer

    cfg = override(recipe(args.recipe), prefix=args.data, output=args.output, tp=args.tp, pp=args.pp, vpp=args.vpp,
                   sequence_parallel=args.sequence_parallel, steps=args.steps, seed=args.seed, lr=args.lr,
                   micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
                   seq_length=args.seq_length, precision=args.precision, recompute=args.recompute,
                   distributed_optimizer=args.distributed_optimizer, log_interval=args.log_interval,
                   peak_tflops=args.peak_tflops, save_interval=args.save_interval, keep=args.keep,
                   resume=args.resume, initial_loss_scale=args.initial_loss_scale)
    if args.output is None:
        cfg.output = f"runs/{cfg.recipe}"
    Trainer(cfg).train(steps=args.stop_at)
    return 0
