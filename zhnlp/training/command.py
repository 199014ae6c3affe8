"""``zhnlp pretrain``: pick a recipe, override fields, train (also under torchrun)."""

from __future__ import annotations

import contextlib

from zhnlp.argtypes import input_file, integer, non_negative, number, positive
from zhnlp.training.config import RECIPES, override, recipe


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("pretrain", help="pretrain an ERNIE model (megatron-core engine)",
                              description="Pretrain with a recipe; run under torchrun for several processes. "
                                          "SIGTERM or Ctrl-C finishes the current step, writes a checkpoint "
                                          "and exits 143 / 130; continue with --resume.")
    p.add_argument("--recipe", default="ernie-debug", choices=sorted(RECIPES))
    p.add_argument("--data", help="preprocessed corpus prefix (default for ernie-debug and ernie-tiny: the demo corpus)")
    p.add_argument("--output", help="run directory (default runs/RECIPE); must be new or empty unless "
                                    "--resume or --overwrite")
    p.add_argument("--overwrite", action="store_true", help="delete the earlier run's results in --output first")
    p.add_argument("--tp", type=positive)
    p.add_argument("--pp", type=positive)
    p.add_argument("--vpp", type=positive)
    p.add_argument("--sequence-parallel", action="store_true", default=None)
    p.add_argument("--steps", type=positive, help="length of the schedule in optimizer steps")
    p.add_argument("--seed", type=non_negative)
    p.add_argument("--lr", type=number(0, low_open=True))
    p.add_argument("--micro-batch-size", type=positive)
    p.add_argument("--global-batch-size", type=positive)
    p.add_argument("--seq-length", type=integer(8), help="tokens per sample, [CLS] and [SEP] included")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--recompute", choices=["selective", "full"])
    p.add_argument("--initial-loss-scale", type=number(0, low_open=True),
                   help="fp16: where dynamic loss scaling starts")
    p.add_argument("--distributed-optimizer", action="store_true", default=None)
    p.add_argument("--log-interval", type=positive)
    p.add_argument("--save-interval", type=non_negative,
                   help="steps between distributed checkpoints (0: none, except on a stop signal)")
    p.add_argument("--keep", type=non_negative, help="complete checkpoints to keep (default 3; 0 keeps every one)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue from the newest complete checkpoint in --output")
    p.add_argument("--stop-at", type=positive, help="end this process at this step (the schedule still spans "
                                                    "--steps); with --save-interval, for time-limited jobs")
    p.add_argument("--peak-tflops", type=number(0, low_open=True), help="per-device peak for the MFU column")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from zhnlp.training.rundir import run_directory
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
    if args.stop_at is not None and args.stop_at > cfg.steps:
        raise ValueError(f"--stop-at {args.stop_at} is past the end of the schedule (--steps {cfg.steps}); "
                         "lower --stop-at or raise --steps.")
    with _process_groups(), run_directory(cfg.output, overwrite=args.overwrite,
                                          resume=bool(cfg.checkpoint.resume)) as run:
        trainer = Trainer(cfg)
        run.clear_previous()  # the data and the model are ready: only now may --overwrite delete the earlier run
        trainer.train(steps=args.stop_at)
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
    p.add_argument("--train", type=input_file,
                   help="training file (classification: jsonl/TSV; mrc: SQuAD json; ner: jsonl/CoNLL)")
    p.add_argument("--dev", type=input_file, help="development file, scored after every epoch")
    p.add_argument("--test", type=input_file, help="test file, scored once with the best model")
    p.add_argument("--output", default=None, help="run directory (default runs/finetune-TASK); must be new or "
                                                  "empty unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="delete the earlier run's results in --output first")
    p.add_argument("--epochs", type=positive)
    p.add_argument("--lr", type=number(0, low_open=True))
    p.add_argument("--batch-size", type=positive, help="global batch size")
    p.add_argument("--micro-batch-size", type=positive, help="per forward pass (gradient accumulation when smaller)")
    p.add_argument("--eval-batch-size", type=positive)
    p.add_argument("--max-length", type=integer(8), help="tokens per feature, special tokens included "
                                                         "(mrc: per window)")
    p.add_argument("--doc-stride", type=positive, help="mrc: tokens between context window starts "
                                                       "(default min(128, half the context window))")
    p.add_argument("--max-query-length", type=positive, help="mrc: question tokens kept (default min(64, half "
                                                             "of --max-length))")
    p.add_argument("--max-answer-length", type=positive, help="mrc: longest answer in tokens")
    p.add_argument("--ner-stride", type=non_negative, help="ner: sub-tokens shared by consecutive windows of a long "
                                                           "sentence (default min(32, a quarter of the window))")
    p.add_argument("--labels", help="comma-separated label set (default: the labels of --train)")
    p.add_argument("--label-names", help="comma-separated names for the labels, in the order of --labels "
                                         "(written to the model's id2label)")
    p.add_argument("--warmup-ratio", type=number(0, 1), help="fraction of the steps spent warming up")
    p.add_argument("--weight-decay", type=number(0))
    p.add_argument("--dropout", type=number(0, 1, high_open=True), help="override the model's dropout")
    p.add_argument("--max-steps", type=positive, help="stop after this many steps")
    p.add_argument("--max-train-examples", type=positive, help="use only the first N training examples")
    p.add_argument("--seed", type=non_negative)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--tp", type=positive)
    p.add_argument("--pp", type=positive)
    p.add_argument("--log-interval", type=positive)
    p.add_argument("--oracle", action="store_true",
                   help="mrc: score the gold positions through windowing and span decoding (no training)")
    p.set_defaults(func=_finetune)


def _finetune(args) -> int:
    import json

    from zhnlp.training.finetune import FinetuneConfig, finetune, get_task

    fields = {k: v for k, v in vars(args).items() if k not in ("func", "command", "debug") and v is not None}
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
