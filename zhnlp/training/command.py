"""``zhnlp pretrain``: pick a recipe, override fields, train (also under torchrun)."""

from __future__ import annotations

import contextlib

from zhnlp.training.config import RECIPES, override, recipe


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("pretrain", help="pretrain an ERNIE model (megatron-core engine)",
                              description="Pretrain with a recipe; run under torchrun for several processes.")
    p.add_argument("--recipe", default="ernie-debug", choices=sorted(RECIPES))
    p.add_argument("--data", help="preprocessed corpus prefix (default for ernie-debug and ernie-tiny: the demo corpus)")
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
    with _process_groups():
        Trainer(cfg).train(steps=args.stop_at)
    return 0


@contextlib.contextmanager
def _process_groups():
    """Tear the process groups down when the command ends normally: leaving them to interpreter
    exit lets gloo's threads be destroyed while still running (an abort after a finished run)."""
    from zhnlp import distributed

    try:
        yield
        distributed.barrier()
    finally:
        distributed.shutdown()


def add_finetune_cli(subparsers) -> None:
    from zhnlp.training.finetune import ALIASES, TASKS

    p = subparsers.add_parser(
        "finetune", help="fine-tune a model on a task (classification, mrc, ner)",
        description="Fine-tune on the engine trainer (TP/PP/DP like pretraining; run under torchrun for several "
                    "processes). Evaluates on --dev each epoch, keeps the best model in OUTPUT/model "
                    "(transformers format + tokenizer) and writes OUTPUT/metrics.json with dev and test scores.")
    p.add_argument("task", choices=sorted(list(TASKS) + list(ALIASES)), metavar="TASK",
                   help="classification (sentiment, text-classification), mrc (cmrc2018, question-answering), "
                        "ner (token-classification)")
    p.add_argument("--model", required=True, help="model directory, model name or hub repo id")
    p.add_argument("--train", help="training file (classification: jsonl/TSV; mrc: SQuAD json; ner: jsonl/CoNLL)")
    p.add_argument("--dev", help="development file, scored after every epoch")
    p.add_argument("--test", help="test file, scored once with the best model")
    p.add_argument("--output", default=None, help="run directory (default runs/finetune-TASK)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--batch-size", type=int, help="global batch size")
    p.add_argument("--micro-batch-size", type=int, help="per forward pass (gradient accumulation when smaller)")
    p.add_argument("--eval-batch-size", type=int)
    p.add_argument("--max-length", type=int, help="tokens per feature (mrc: per window)")
    p.add_argument("--doc-stride", type=int, help="mrc: tokens between context window starts")
    p.add_argument("--max-answer-length", type=int, help="mrc: longest answer in tokens")
    p.add_argument("--labels", help="comma-separated label set (default: the labels of --train)")
    p.add_argument("--label-names", help="comma-separated names for the labels, in the order of --labels "
                                         "(written to the model's id2label)")
    p.add_argument("--warmup-ratio", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--dropout", type=float, help="override the model's dropout")
    p.add_argument("--max-steps", type=int, help="stop after this many steps")
    p.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    p.add_argument("--seed", type=int)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--tp", type=int)
    p.add_argument("--pp", type=int)
    p.add_argument("--log-interval", type=int)
    p.add_argument("--oracle", action="store_true",
                   help="mrc: score the gold positions through windowing and span decoding (no training)")
    p.set_defaults(func=_finetune)


def _finetune(args) -> int:
    import json

    from zhnlp.training.finetune import FinetuneConfig, finetune, get_task

    fields = {k: v for k, v in vars(args).items() if k not in ("func", "command") and v is not None}
    for key in ("labels", "label_names"):
        if key in fields:
            fields[key] = [x.strip() for x in fields[key].split(",") if x.strip()]
    fields.setdefault("output", f"runs/finetune-{get_task(args.task).name}")
    import torch.distributed as dist

    with _process_groups():
        result = finetune(FinetuneConfig(**fields))
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        if args.oracle:
            for split, r in result.items():
                print(json.dumps({"split": split, **{k: r[k] for k in ("em", "f1", "total", "skip")},
                                  "unreachable": len(r["unreachable"])}, ensure_ascii=False))
        else:
            print(json.dumps({"dev": result["dev"], "test": result["test"], "output": fields["output"]},
                             ensure_ascii=False, default=str))
    return 0
