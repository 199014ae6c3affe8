"""The fine-tuning run: the engine :class:`~zhnlp.training.trainer.Trainer` with the task's head and
batches, and an ``after_step`` hook that evaluates, keeps the best model, checkpoints, runs the
callbacks and stops early.

One ``Trainer.train`` call covers the whole run (every epoch), so its progress line and ETA do too.
After step ``s`` the hook:

1. evaluates on the dev data when ``s`` ends an epoch (or is a multiple of ``eval_steps``), is
   the last step, or a callback asked for it: the task's metric plus ``compute_metrics``; the
   evaluation entry (``epoch``, ``step``, ``train_loss`` = mean step loss since the previous
   evaluation, ``dev``) goes to ``metrics.json``; a better ``metric_for_best_model`` swaps the
   model into ``OUTPUT/model``; the callbacks' ``on_evaluate`` (early stopping among them) runs;
2. checkpoints every ``save_steps`` (``OUTPUT/checkpoints``, the pretraining checkpoint format,
   ``save_total_limit`` kept) with the run's own state (evaluations, best model, pending losses,
   callback state) in ``trainer.json``, so that ``resume`` continues exactly;
3. ends the loop when a callback set ``control.should_stop``.

The decisions are agreed over every rank (an all-reduce), so a callback that decides on one rank
alone still stops, evaluates or saves every rank at the same step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from zhnlp.errors import Interrupted, ZhnlpError
from zhnlp.training.callbacks import (CallbackHandler, EarlyStoppingCallback, EvalPrediction, TrainerControl,
                                      TrainerState)
from zhnlp.training.finetune import FinetuneConfig, Task, _atomic_json, _plain, load_split

logger = logging.getLogger("zhnlp")


def _run_config(cfg: FinetuneConfig, arch: dict, world_size: int, steps: int, per_token_loss: bool = False):
    from zhnlp.training.config import (CheckpointConfig, DataConfig, LoggingConfig, MoEConfig, OptimizerConfig,
                                       ParallelConfig, RunConfig)

    dp = max(world_size // (cfg.tp * cfg.pp), 1)
    micro = cfg.micro_batch_size or max(cfg.batch_size // dp, 1)
    return RunConfig(
        recipe=f"finetune-{cfg.task}", model=arch, steps=steps, seed=cfg.seed, precision=cfg.precision,
        compile=cfg.compile, output=cfg.output, parallel=ParallelConfig(tp=cfg.tp, pp=cfg.pp, ep=cfg.ep),
        moe=MoEConfig(moe_aux_loss_coeff=cfg.moe_aux_loss_coeff),
        optimizer=OptimizerConfig(lr=cfg.lr, min_lr=0.0, warmup_steps=int(cfg.warmup_ratio * steps),
                                  decay_style="linear", weight_decay=cfg.weight_decay),
        data=DataConfig(seq_length=cfg.max_length, micro_batch_size=micro, global_batch_size=cfg.batch_size,
                        per_token_loss=per_token_loss),
        logging=LoggingConfig(log_interval=cfg.log_interval),
        # checkpoints every save_steps come from the hook (after the evaluation of their step); the
        # trainer saves on a stop signal; resuming is done here, before the run's state is restored
        checkpoint=CheckpointConfig(save_interval=0, keep=cfg.save_total_limit, resume=False, save_on_stop=True))


def _env_world_size() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def _json_safe(value):
    return json.loads(json.dumps(value, default=_plain))


def run_finetune(task: Task, cfg: FinetuneConfig, run_dir, sources: dict, compute_metrics=None,
                 callbacks=None) -> dict:
    """The run behind :func:`zhnlp.training.finetune.finetune` (its arguments already checked)."""
    from zhnlp import hub
    from zhnlp.data.tasks import hf
    from zhnlp.models import family_for_model_type
    from zhnlp.models.common.pretrained import PretrainedModel
    from zhnlp.tokenizers import AutoTokenizer
    from zhnlp.tokenizers.auto import check_tokenizer_fits
    from zhnlp.training import checkpoint
    from zhnlp.training.trainer import Trainer, run_options

    started = time.time()
    directory = hub.resolve(cfg.model)
    raw = hub.read_config_json(directory)
    family = family_for_model_type(raw.get("model_type"), str(directory / "config.json"))
    if task.head not in family.bridge.HEAD_PARTS:
        kinds = {"causal_lm": "a decoder (causal-LM) model such as ERNIE 4.5",
                 "mlm": "an encoder with a masked-LM head, such as ERNIE 3.0, BERT, RoFormer or ALBERT"}
        raise ZhnlpError(f"{cfg.model} is a {raw.get('model_type')} model, which has no {task.head} head; "
                         f"zhnlp finetune {task.name} needs {kinds.get(task.head, 'an encoder such as ERNIE 3.0')}.")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    check_tokenizer_fits(tokenizer, raw, str(directory))  # before any batch, not as an IndexError in one
    pad_id = tokenizer.pad_token_id or 0

    train_examples, train_features, labels, _ = load_split(task, cfg, tokenizer, sources["train"], cfg.labels,
                                                           "--train", limit=cfg.max_train_examples, training=True)
    dev = load_split(task, cfg, tokenizer, sources["dev"], labels, "--dev")
    test = load_split(task, cfg, tokenizer, sources["test"], labels, "--test") if sources["test"] is not None \
        else None

    overrides = {}
    if labels is not None:
        names = cfg.label_names or labels
        if len(names) != len(labels):
            raise ZhnlpError(f"label_names {names} do not match the {len(labels)} labels {labels}; give one name each.")
        overrides["id2label"] = dict(enumerate(names))
    if cfg.dropout is not None:
        if "hidden_dropout_prob" not in {f.name for f in dataclasses.fields(family.config_class)}:
            raise ZhnlpError(f"--dropout: {raw.get('model_type')} models have no dropout settings; drop --dropout.")
        overrides.update(hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    arch = family.config_class.from_dict(raw, source=str(directory / "config.json"), **overrides)

    world = dist.get_world_size() if dist.is_initialized() else _env_world_size()
    from zhnlp.training.batches import EpochBatches

    batch_features, collate = task.training_features(cfg, train_features)  # sft --packing: packed sequences
    per_epoch = len(batch_features) // cfg.batch_size
    steps = per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)
    steps = max(steps, 1)
    # conversations differ in their assistant tokens: the loss averages over the global batch's targets, so that
    # every data-parallel layout and micro-batch size gives the same numbers
    run = _run_config(cfg, arch.to_dict(), world, steps, per_token_loss=task.head == "causal_lm")
    batches = EpochBatches(batch_features, cfg.batch_size, run.data.micro_batch_size, cfg.seed,
                           multiple=8 * cfg.tp, pad_token_id=pad_id, collate=collate,
                           transform=task.epoch_transform(cfg))  # mlm: each epoch's masking
    trainer = Trainer(run, model=lambda options: PretrainedModel.from_checkpoint(
        family, arch, task.head, directory, seed=cfg.seed, **options), batches=batches,
        tokenizer_name=str(directory))
    try:  # the trainer measures peak memory from construction on: however the run ends, that stops
        rank0 = dist.get_rank() == 0
        run_dir.clear_previous()  # data and model are loaded: only now may --overwrite delete the earlier run
        out = Path(cfg.output)
        best_dir = out / "model"

        metric = cfg.best_metric or task.metric
        greater = cfg.higher_is_better
        state = TrainerState(max_steps=steps, steps_per_epoch=per_epoch, metric=metric, greater_is_better=greater)
        control = TrainerControl()
        chain = list(callbacks or [])
        if cfg.early_stopping_patience is not None:
            chain.append(EarlyStoppingCallback(cfg.early_stopping_patience, cfg.early_stopping_threshold))
        handler = CallbackHandler(chain, cfg, state, control)
        run_state = {"history": [], "best": None, "pending": []}  # what a checkpoint keeps besides the trainer's

        result = {"task": task.name, "model": cfg.model, "metric": task.metric, "metric_for_best_model": metric,
                  "greater_is_better": greater, "labels": labels, "train_examples": len(train_examples),
                  "train_features": len(train_features), "train_sequences": len(batch_features),
                  "train_left_out": task.left_out, "steps": steps,
                  "steps_per_epoch": per_epoch, "status": "running", "epochs": run_state["history"], "best_epoch": None,
                  "best_step": None, "dev": None, "test": None,
                  "data": {name: hf.describe(v) for name, v in sources.items()},
                  "config": dataclasses.asdict(cfg)}

        def write(status: str, **extra) -> None:
            # after every evaluation, right after the best model is swapped in: the file describes OUTPUT/model
            best = run_state["best"]
            result.update(status=status, epochs=run_state["history"], best_epoch=best["epoch"] if best else None,
                          best_step=best["step"] if best else None, dev=best["dev"] if best else None,
                          time_s=round(time.time() - started, 1), **extra)
            if rank0:
                _atomic_json(out / "metrics.json", result)

        # what must not change between a run and its resumption (the batches and the schedule depend on it)
        identity = {"task": task.name, "steps": steps, "batch_size": cfg.batch_size, "seed": cfg.seed,
                    "train_features": len(train_features), "labels": labels, "packing": cfg.packing}
        if task.name == "mlm":
            identity.update(mask_prob=cfg.mask_prob, whole_word_masking=cfg.whole_word_masking)

        def checkpoint_state() -> dict:
            return _json_safe({**run_state, "trainer_state": state.to_dict(), "callbacks": handler.state_dict(),
                               "run": identity})

        trainer.checkpoint_state = checkpoint_state
        if cfg.resume:
            checkpoint.resume(trainer)
            saved = getattr(trainer, "resumed_state", None)
            if saved:
                was = saved.get("run", {})
                changed = [f"{k} {was[k]!r} -> {v!r}" for k, v in _json_safe(identity).items()
                           if k in was and was[k] != v]
                if changed:
                    raise ZhnlpError(f"cannot resume {out}: the run that wrote its checkpoints differs "
                                     f"({'; '.join(changed)}); resume with the settings and data it had, or "
                                     "fine-tune into a new --output.")
                run_state.update(history=saved["history"], best=saved["best"], pending=saved["pending"])
                for key, value in saved["trainer_state"].items():
                    setattr(state, key, value)
                handler.load_state_dict(saved.get("callbacks", {}))
            elif trainer.step:
                raise ZhnlpError(f"the checkpoint in {out / 'checkpoints'} was not written by a fine-tuning run; "
                                 "resume it with zhnlp pretrain, or fine-tune into a new --output.")

        def evaluate(step: int) -> None:
            trainer.gather_params()  # --overlap-param-gather: the weights evaluated (and saved as best) are updated
            pending = run_state["pending"]
            # the loss lives on the last pipeline stage: take the logging rank's mean
            from zhnlp import distributed

            mean = torch.tensor(float(np.mean(pending)) if pending else float("nan"), dtype=torch.float64,
                                device=distributed.device())  # NCCL takes GPU tensors only
            dist.broadcast(mean, src=trainer.logging_rank)
            scores, predictions = _evaluate(task, cfg, trainer.model, dev, labels, compute_metrics, "dev", pad_id)
            key = metric if metric in scores else cfg.metric_for_best_model  # compute_metrics may say eval_x itself
            if key not in scores:
                raise ZhnlpError(f"metric_for_best_model {metric!r} is not among the dev scores "
                                 f"({', '.join(scores)}); choose one of them (compute_metrics may add more).")
            state.metric = key
            entry = {"epoch": math.ceil(step / per_epoch) if per_epoch else 1, "step": step,
                     "train_loss": float(mean), "dev": _json_safe(scores)}
            run_state["history"].append(entry)
            state.log_history = run_state["history"]
            run_state["pending"] = []
            if rank0:
                logger.info("epoch %d step %d/%d: train loss %.4f, dev %s", entry["epoch"], step, steps,
                            entry["train_loss"], ", ".join(f"{k} {v:.4f}" for k, v in scores.items()
                                                           if isinstance(v, float)))
            value = float(scores[key])
            if state.is_better(value):
                state.best_metric, state.best_step = value, step
                run_state["best"] = entry
                _save_model(trainer.model, tokenizer, best_dir)
                if rank0 and predictions is not None:
                    _atomic_json(out / "dev_predictions.json", predictions)
            handler("on_evaluate", metrics=scores)
            write("running")

        def after_step(m: dict) -> bool:
            step = m["step"]
            run_state["pending"].append(m["loss"])
            state.global_step, state.epoch = step, step / per_epoch if per_epoch else 0.0
            handler("on_step_end", logs=m)
            scheduled = step % cfg.eval_steps == 0 if cfg.eval_steps else step % per_epoch == 0
            [evaluate_now] = _agree(control.should_evaluate or scheduled or step == steps)
            if evaluate_now:
                control.should_evaluate = False
                evaluate(step)
            save_now, stop = _agree(control.should_save or bool(cfg.save_steps and step % cfg.save_steps == 0),
                                    control.should_stop)
            if save_now:
                control.should_save = False
                path = trainer.save(keep=cfg.save_total_limit)  # timed: checkpoint_s
                handler("on_save", checkpoint=path)
            return stop

        handler("on_train_begin")
        try:
            trainer.train(steps=steps, after_step=after_step)
        except Interrupted as e:  # the step in flight was finished and checkpointed; the best model stays
            write("interrupted", stopped_at_step=trainer.step)
            best = run_state["best"]
            kept = f"the best model so far (epoch {best['epoch']}) is in {best_dir}" if best else "no model was saved"
            raise Interrupted(f"{e} (epoch {math.ceil(trainer.step / per_epoch) if per_epoch else 1}); {kept}, "
                              f"metrics in {out / 'metrics.json'}.", e.signum) from None
        if trainer.step < steps:
            result["stopped_early_at_step"] = trainer.step
        if test is not None and run_state["best"] is not None:
            best_config = family.config_class.from_json_file(best_dir / "config.json")
            final = PretrainedModel.from_checkpoint(family, best_config, task.head, best_dir,
                                                    **run_options(trainer.cfg))
            if cfg.compile:
                from zhnlp.models.common.compiled import compile_layers

                compile_layers(final)
            result["test"], predictions = _evaluate(task, cfg, final, test, labels, compute_metrics, "test", pad_id)
            result["test"] = _json_safe(result["test"])
            if rank0 and predictions is not None:
                _atomic_json(out / "test_predictions.json", predictions)
        write("complete")
        handler("on_train_end")
        return result
    finally:
        trainer.peak_memory.close()


def _agree(*flags: bool) -> tuple[bool, ...]:
    """Each flag true on any rank -> true on every rank (one all-reduce)."""
    values = [bool(v) for v in flags]
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tuple(values)
    from zhnlp import distributed

    t = torch.tensor([int(v) for v in values], dtype=torch.int32, device=distributed.device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def _evaluate(task: Task, cfg: FinetuneConfig, model, split, labels, compute_metrics, what: str,
              pad_id: int) -> tuple[dict, object]:
    from zhnlp.training.batches import label_ids

    examples, features, _, reference = split
    outputs = task.run_model(cfg, model, features, what, pad_id)
    model.train()
    scores, predictions = task.score(cfg, outputs, examples, features, labels, reference)
    if compute_metrics is not None:
        if "start_logits" in outputs:
            logits = (outputs["start_logits"], outputs["end_logits"])
        else:
            logits = outputs["logits"]
        width = max(len(f["input_ids"]) for f in features)
        extra = compute_metrics(EvalPrediction(predictions=logits, label_ids=label_ids(features, width)))
        if not isinstance(extra, dict):
            raise TypeError(f"compute_metrics must return a dict of scores, got {type(extra).__name__}")
        scores = {**scores, **{k: _plain(v) if hasattr(v, "item") else v for k, v in extra.items()}}
    return scores, predictions


def _save_model(model, tokenizer, directory: Path) -> None:
    """Swap the model and its tokenizer in for the previous best (see ``save_model_directory``)."""
    from zhnlp.training.export import save_model_directory

    save_model_directory(model, tokenizer, directory)
    model.train()
