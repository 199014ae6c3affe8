"""``zhnlp pretrain``: pick a recipe, override fields, train (also under torchrun)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

from zhnlp.argtypes import input_file, integer, non_negative, number, positive
from zhnlp.training.config import RECIPES, override, recipe


def add_cli(subparsers) -> None:
    from zhnlp.training.config import (CheckpointConfig, DataConfig, LoggingConfig, OptimizerConfig, ParallelConfig,
                                       RunConfig)

    p = subparsers.add_parser(
        "pretrain", dataclass_types=[RunConfig, ParallelConfig, OptimizerConfig, DataConfig, CheckpointConfig,
                                     LoggingConfig], given_only=True,
        help="pretrain an ERNIE model (megatron-core engine)",
        description="Pretrain with a recipe; run under torchrun for several processes. The flags override the "
                    "recipe's settings (--print-config shows the result; --config FILE sets them from a file). "
                    "SIGTERM or Ctrl-C finishes the current step, writes a checkpoint and exits 143 / 130; "
                    "continue with --resume.")
    p.add_argument("--recipe", default=argparse.SUPPRESS, choices=sorted(RECIPES),
                   help="the run to start from (default: the recipe named in --config, else ernie-debug)")
    p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                   help="JSON or YAML file of settings (as --print-config prints them), applied before the flags")
    p.add_argument("--print-config", action="store_true", default=argparse.SUPPRESS,
                   help="print the resolved configuration as JSON and exit")
    p.add_argument("--overwrite", action="store_true", default=argparse.SUPPRESS,
                   help="delete the earlier run's results in --output first")
    p.add_argument("--stop-at", type=positive, default=argparse.SUPPRESS,
                   help="end this process at this step (the schedule still spans --steps); with --save-interval, "
                        "for time-limited jobs")
    p.set_defaults(func=_run)


def resolve(args) -> "RunConfig":
    """The run configuration of a ``zhnlp pretrain`` command line: recipe, then --config FILE, then flags."""
    from zhnlp import configargs
    from zhnlp.training.config import (CheckpointConfig, DataConfig, LoggingConfig, OptimizerConfig, ParallelConfig,
                                       RunConfig)

    data = configargs.read_config_file(args.config) if getattr(args, "config", None) else None
    cfg = recipe(getattr(args, "recipe", None) or (data or {}).get("recipe") or "ernie-debug")
    if data is not None:
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(RunConfig)} - set(RunConfig.SECTIONS))
        if unknown:
            raise ValueError(f"--config {args.config}: unknown settings {unknown}; see --print-config for the names.")
        if "model" in data:
            cfg.model = dict(data.pop("model"))
        data.pop("recipe", None)
        try:
            override(cfg, **configargs.flatten(data, RunConfig.SECTIONS))
        except TypeError as e:
            raise ValueError(f"--config {args.config}: {e}; see --print-config for the names.") from None
    flags = configargs.given(args, RunConfig, ParallelConfig, OptimizerConfig, DataConfig, CheckpointConfig,
                             LoggingConfig)
    explicit_output = "output" in flags or (getattr(args, "config", None) and cfg.output != "runs/pretrain")
    override(cfg, **flags)
    if "recompute" in flags and flags["recompute"] is None:
        cfg.recompute = None  # --recompute none: override() skips None values
    if not explicit_output:
        cfg.output = f"runs/{cfg.recipe}"
    return cfg


def _run(args) -> int:
    from zhnlp import configargs
    from zhnlp.training.rundir import run_directory
    from zhnlp.training.trainer import Trainer

    cfg = resolve(args)
    if getattr(args, "print_config", False):
        print(configargs.to_json(cfg))
        return 0
    stop_at = getattr(args, "stop_at", None)
    if stop_at is not None and stop_at > cfg.steps:
        raise ValueError(f"--stop-at {stop_at} is past the end of the schedule (--steps {cfg.steps}); "
                         "lower --stop-at or raise --steps.")
    with _process_groups(), run_directory(cfg.output, overwrite=getattr(args, "overwrite", False),
                                          resume=bool(cfg.checkpoint.resume)) as run:
        trainer = Trainer(cfg)
        run.clear_previous()  # the data and the model are ready: only now may --overwrite delete the earlier run
        trainer.train(steps=stop_at)
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
