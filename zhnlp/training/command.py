"""``zhnlp pretrain`` and ``zhnlp finetune``: flags from the run configs, then train (also under torchrun)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

from zhnlp.argtypes import positive
from zhnlp.training.config import RECIPES, override, recipe


def _run_config_types() -> list:
    """The dataclasses whose fields are ``zhnlp pretrain``'s (and ``zhnlp plan``'s) flags."""
    from zhnlp.training.config import (CheckpointConfig, DataConfig, LoggingConfig, MoEConfig, OptimizerConfig,
                                       ParallelConfig, RunConfig)

    return [RunConfig, ParallelConfig, MoEConfig, OptimizerConfig, DataConfig, CheckpointConfig, LoggingConfig]


def run_flags(args) -> dict:
    """The run-configuration fields set on the command line (by name)."""
    from zhnlp import configargs

    return configargs.given(args, *_run_config_types())


def run_config_parser(subparsers, name: str, *, help: str, description: str, recipe_help: str):
    """A subcommand whose flags are the run configuration's fields (as given, over a recipe), with --recipe and
    --config FILE: ``zhnlp pretrain`` and ``zhnlp plan``."""
    p = subparsers.add_parser(name, dataclass_types=_run_config_types(), given_only=True, help=help,
                              description=description)
    p.add_argument("--recipe", default=argparse.SUPPRESS, choices=sorted(RECIPES), help=recipe_help)
    p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                   help="JSON or YAML file of settings (as `zhnlp pretrain --print-config` prints them), applied "
                        "before the flags")
    return p


def add_cli(subparsers) -> None:
    p = run_config_parser(
        subparsers, "pretrain",
        help="pretrain an ERNIE encoder (masked LM) or an ERNIE 4.5 decoder (causal LM) on the megatron-core engine",
        description="Pretrain with a recipe; run under torchrun for several processes. The flags override the "
                    "recipe's settings (--print-config shows the result; --config FILE sets them from a file). "
                    "SIGTERM or Ctrl-C finishes the current step, writes a checkpoint and exits 143 / 130; "
                    "continue with --resume.",
        recipe_help="the run to start from (default: the recipe named in --config, else ernie-debug)")
    p.add_argument("--print-config", action="store_true", default=argparse.SUPPRESS,
                   help="print the resolved configuration as JSON and exit")
    p.add_argument("--overwrite", action="store_true", default=argparse.SUPPRESS,
                   help="delete the earlier run's results in --output first")
    p.add_argument("--stop-at", type=positive, default=argparse.SUPPRESS,
                   help="end this process at this step (the schedule still spans --steps); with --save-interval, "
                        "for time-limited jobs")
    p.add_argument("--parallel", choices=["auto"], default=argparse.SUPPRESS,
                   help="auto: let the planner choose the layout (tp, pp, vpp, ep, sequence parallelism, recompute, "
                        "distributed optimizer or FSDP, micro batch) for the processes this run has; printed "
                        "before training starts (see `zhnlp plan`)")
    p.set_defaults(func=_run)


def resolve(args) -> "RunConfig":
    """The run configuration of a ``zhnlp pretrain`` command line: recipe, then --config FILE, then flags."""
    from zhnlp import configargs
    from zhnlp.training.config import RunConfig

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
    flags = run_flags(args)
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
    if getattr(args, "parallel", None) == "auto":
        import os

        from zhnlp.planning.auto import choose_layout, describe

        world = int(os.environ.get("WORLD_SIZE", "1"))
        best = choose_layout(cfg, world, run_flags(args), _changed_in_config_file(args))
        if int(os.environ.get("RANK", "0")) == 0:
            import logging

            logging.getLogger("zhnlp").info(describe(best, world))
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


def _changed_in_config_file(args) -> dict:
    """The settings a ``--config`` file changes from its recipe's values (``{name: value}``; ``--parallel auto``
    refuses the layout ones rather than silently replace them). A file written by ``--print-config`` repeats every
    setting; those equal to the recipe's are not a change."""
    path = getattr(args, "config", None)
    if not path:
        return {}
    from zhnlp import configargs
    from zhnlp.training.config import RunConfig

    data = configargs.read_config_file(path)
    base = recipe(getattr(args, "recipe", None) or data.get("recipe") or "ernie-debug")
    data.pop("model", None), data.pop("recipe", None)
    given = configargs.flatten(data, RunConfig.SECTIONS)
    defaults = configargs.flatten(dataclasses.asdict(base), RunConfig.SECTIONS)
    return {k: v for k, v in given.items() if v != defaults.get(k)}


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
    from zhnlp.training.finetune_config import ALIASES, TASK_NAMES, FinetuneConfig

    p = subparsers.add_parser(
        "finetune", dataclass_types=[FinetuneConfig], given_only=True, show_defaults=True,
        help="fine-tune a model on a task (classification, mrc, ner; sft for decoders on conversations; mlm: "
             "continued masked-LM pretraining on your own text)",
        description="Fine-tune on the engine trainer (TP/PP/DP like pretraining; run under torchrun for several "
                    "processes). Evaluates on --dev every epoch (or --eval-steps), keeps the best model in "
                    "OUTPUT/model (transformers format + tokenizer) and writes OUTPUT/metrics.json with dev and "
                    "test scores; --save-steps writes checkpoints that --resume continues from. The flags are the "
                    "fields of zhnlp.FinetuneConfig (--print-config shows them; --config FILE sets them).")
    p.add_argument("task", choices=sorted(TASK_NAMES + tuple(ALIASES)), metavar="TASK",
                   help="classification (sentiment, text-classification), mrc (cmrc2018, question-answering), "
                        "ner (token-classification), sft (chat, instruction-tuning: a decoder on conversations), "
                        "mlm (masked-lm, fill-mask: an encoder's masked LM on your own unlabelled text, whole-word "
                        "masking drawn anew every epoch; dev score: masked-token loss)")
    p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                   help="JSON or YAML file of FinetuneConfig fields (as --print-config prints them), applied "
                        "before the flags")
    p.add_argument("--print-config", action="store_true", default=argparse.SUPPRESS,
                   help="print the resolved configuration as JSON and exit")
    p.set_defaults(func=_finetune)


def resolve_finetune(args):
    """The FinetuneConfig of a ``zhnlp finetune`` command line: defaults, then --config FILE, then flags."""
    from zhnlp import configargs
    from zhnlp.training.finetune_config import ALIASES, FinetuneConfig

    fields = {}
    if getattr(args, "config", None):
        fields = configargs.read_config_file(args.config)
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(FinetuneConfig)})
        if unknown:
            raise ValueError(f"--config {args.config}: unknown settings {unknown}; see --print-config for the names.")
    fields.update(configargs.given(args, FinetuneConfig))
    fields["task"] = args.task
    if not fields.get("model"):
        raise ValueError("--model is required: a model directory, model name or hub repo id to start from (or "
                         "\"model\" in --config FILE).")
    fields.setdefault("output", f"runs/finetune-{ALIASES.get(args.task, args.task)}")
    return FinetuneConfig(**fields)


def _finetune(args) -> int:
    import json

    from zhnlp import configargs

    cfg = resolve_finetune(args)
    if getattr(args, "print_config", False):
        print(configargs.to_json(cfg))
        return 0
    import torch.distributed as dist

    from zhnlp.training.finetune import finetune

    with _process_groups():
        result = finetune(cfg)
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        if cfg.oracle:
            for split, r in result.items():
                print(json.dumps({"split": split, **{k: r[k] for k in ("em", "f1", "total", "skip")},
                                  "unreachable": len(r["unreachable"])}, ensure_ascii=False))
        else:
            print(json.dumps({"dev": result["dev"], "test": result["test"], "output": cfg.output},
                             ensure_ascii=False, default=str))
    return 0
