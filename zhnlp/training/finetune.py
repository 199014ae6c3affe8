"""Task fine-tuning on the engine trainer: classification, reading comprehension, NER.

``finetune(FinetuneConfig(...))`` loads a backbone with the task's head (``from_pretrained``
rules: a directory, a model-card name or a hub id), reads and encodes the task data
(``zhnlp.data.tasks``), and trains with :class:`zhnlp.training.trainer.Trainer` -- the same
megatron-core loop, optimizer and parallel layouts as pretraining; only the head and the
batches differ. After each epoch the dev set is scored with the task's official metric; the
best model so far is written to ``OUTPUT/model`` (transformers format, with its tokenizer and
label names), and at the end the test set is scored with that best model. ``OUTPUT/metrics.json``
holds the per-epoch dev scores and the best dev and test scores; ``OUTPUT/metrics.jsonl`` the
per-step training log.

Batches: every epoch shuffles the training features with ``seed + epoch`` and cuts them into
global batches (the last incomplete one is dropped; the next epoch's shuffle covers it). Each
global batch is padded to its own longest feature (a multiple of 8), the same on every rank, so
that every data-parallel and tensor-parallel layout sees the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from zhnlp import distributed
from zhnlp.argtypes import check_file, check_range
from zhnlp.errors import DataError, Interrupted, ZhnlpError


@dataclass
class FinetuneConfig:
    """One fine-tuning run. ``batch_size`` is the global batch (over data-parallel ranks and
    gradient-accumulation micro-batches)."""

    task: str  # classification | mrc | ner (aliases: sentiment, text-classification, cmrc2018, ...)
    model: str  # directory, model name or hub repo id
    train: str | None = None
    dev: str | None = None
    test: str | None = None
    output: str = "runs/finetune"
    overwrite: bool = False  # replace an earlier run's results in ``output`` (else such a directory is refused)
    epochs: int = 3
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    batch_size: int = 32
    micro_batch_size: int | None = None  # default: batch_size / data-parallel size (no accumulation)
    eval_batch_size: int = 64
    max_length: int | None = None  # tokens per feature (mrc: per window); default per task
    doc_stride: int | None = None  # mrc: tokens between window starts; default min(128, half the context window)
    max_query_length: int | None = None  # mrc: question tokens kept; default min(64, max_length // 2)
    max_answer_length: int = 256  # mrc, in tokens (about 10% of CMRC2018 answers are longer than 64)
    ner_stride: int | None = None  # ner: sub-tokens shared by consecutive windows; default min(32, window // 4)
    labels: list[str] | None = None  # label set (default: from the training file)
    label_names: list[str] | None = None  # names for the model's id2label, one per label (default: the labels)
    max_steps: int | None = None  # stop early (quick runs and tests)
    max_train_examples: int | None = None
    dropout: float | None = None  # override the checkpoint's hidden/attention dropout
    seed: int = 1234
    precision: str = "fp32"
    tp: int = 1
    pp: int = 1
    log_interval: int = 10
    oracle: bool = False  # mrc: score gold positions through windowing and decoding, no training

    def __post_init__(self):
        """Refuse values outside their range where they enter (the command line checks the same)."""
        for name in ("epochs", "batch_size", "eval_batch_size", "max_answer_length", "log_interval", "tp", "pp"):
            check_range(name, getattr(self, name), low=1)
        for name in ("micro_batch_size", "max_steps", "max_train_examples", "doc_stride", "max_query_length"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), low=1)
        if self.max_length is not None:
            check_range("max_length", self.max_length, low=8)
        if self.ner_stride is not None:
            check_range("ner_stride", self.ner_stride, low=0)
        check_range("seed", self.seed, low=0)
        check_range("lr", self.lr, "a number", low=0, low_open=True)
        check_range("warmup_ratio", self.warmup_ratio, "a number", 0, 1)
        check_range("weight_decay", self.weight_decay, "a number", low=0)
        if self.dropout is not None:
            check_range("dropout", self.dropout, "a number", 0, 1, high_open=True)
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision {self.precision!r} is not one of fp32, bf16, fp16")


# ------------------------------------------------------------------------------------------ tasks
class Task:
    """What differs between tasks: head, reading, encoding and scoring."""

    name = ""
    head = ""
    metric = ""  # the dev score that picks the best epoch
    max_length = 128

    def configure(self, cfg: FinetuneConfig) -> FinetuneConfig:
        """Fill the settings the user left to the task."""
        return dataclasses.replace(cfg, max_length=cfg.max_length or self.max_length)

    left_out = 0  # training examples the reader left out (reading comprehension: no locatable answer)

    def read(self, path: str, labels: list[str] | None, training: bool = False):
        """-> (examples, labels) ; labels is None for tasks without a label set. ``training``: the
        file trains the model (reading comprehension then needs a locatable answer per question)."""
        raise NotImplementedError

    def unlabelled(self, example) -> bool:
        """True for an example without its gold answer (a prediction file's line)."""
        raise NotImplementedError

    def encode(self, cfg: FinetuneConfig, tokenizer, examples, labels) -> list[dict]:
        raise NotImplementedError

    def score(self, cfg: FinetuneConfig, outputs: dict, examples, features, labels, path: str) -> tuple[dict, object]:
        """-> (scores, predictions) from the model outputs over ``features``."""
        raise NotImplementedError


class ClassificationTask(Task):
    name, head, metric = "classification", "sequence_classification", "accuracy"

    def read(self, path, labels, training=False):
        from zhnlp.data.tasks.classification import read_classification

        return read_classification(path, label_list=labels)

    def unlabelled(self, example) -> bool:
        return example.label is None

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.tasks.classification import encode_classification

        return encode_classification(tokenizer, examples, labels, max_length=cfg.max_length)

    def score(self, cfg, outputs, examples, features, labels, path):
        from zhnlp.metrics import classification_scores

        predicted = [labels[i] for i in np.argmax(outputs["logits"], axis=-1)]
        gold = [e.label for e in examples]
        return classification_scores(predicted, gold, label_set=labels), predicted


class MRCTask(Task):
    name, head, metric = "mrc", "question_answering", "f1"
    max_length = 512

    def configure(self, cfg):
        """Question budget and window stride from ``max_length`` unless given, and refused when they
        leave no context or would skip context tokens between windows."""
        cfg = super().configure(cfg)
        length = cfg.max_length
        query = cfg.max_query_length
        if query is None:  # up to 64 question tokens, leaving at least half the window and a given stride
            query = min(64, length // 2)
            if cfg.doc_stride:
                query = max(1, min(query, length - 3 - cfg.doc_stride))
        window = length - query - 3  # context tokens per window for the longest question
        if window < 1:
            raise ValueError(f"--max-length {length} leaves no room for the context after a question of up to "
                             f"--max-query-length {query} tokens and 3 special tokens; raise --max-length above "
                             f"{query + 3} or lower --max-query-length.")
        stride = cfg.doc_stride or max(1, min(128, window // 2))
        if stride > window:
            raise ValueError(f"--doc-stride {stride} is larger than the context window ({window} tokens at "
                             f"--max-length {length} with questions of up to {query} tokens): the context between "
                             f"windows would never be read; pass --doc-stride {window} or less.")
        return dataclasses.replace(cfg, max_query_length=query, doc_stride=stride)

    def read(self, path, labels, training=False):
        """Evaluation files keep references that do not occur in the context (they are scored as
        texts); a training file uses each question's first locatable answer and leaves out, with a
        warning, the questions that have none (counted in ``left_out``)."""
        from zhnlp.data.tasks.mrc import read_squad

        examples = read_squad(path, training=training)
        if training:
            self.left_out = len(examples.unlocatable_questions)
        return examples, None

    def unlabelled(self, example) -> bool:
        return not example.answers

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.tasks.mrc import build_mrc_features

        features = build_mrc_features(tokenizer, examples, max_seq_len=cfg.max_length, doc_stride=cfg.doc_stride,
                                      max_query_len=cfg.max_query_length)
        return [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids, "attention_mask": f.attention_mask,
                 "start_positions": f.start_position, "end_positions": f.end_position, "_feature": f}
                for f in features]

    def score(self, cfg, outputs, examples, features, labels, path):
        from zhnlp.data.tasks.mrc import decode_spans
        from zhnlp.metrics.cmrc2018 import evaluate

        spans = decode_spans(examples, [f["_feature"] for f in features], outputs["start_logits"],
                             outputs["end_logits"], max_answer_len=cfg.max_answer_length)
        predictions = {qid: s["text"] for qid, s in spans.items()}
        return evaluate(path, predictions), predictions


class NERTask(Task):
    name, head, metric = "ner", "token_classification", "f1"

    def configure(self, cfg):
        """The window overlap from ``max_length`` unless given; refused when it fills the window."""
        cfg = super().configure(cfg)
        room = cfg.max_length - 2  # sub-tokens per window besides [CLS] and [SEP]
        stride = cfg.ner_stride if cfg.ner_stride is not None else min(32, room // 4)
        if stride >= room:
            raise ValueError(f"--ner-stride {stride} must be smaller than the {room} sub-tokens a window of "
                             f"--max-length {cfg.max_length} holds; lower --ner-stride or raise --max-length.")
        return dataclasses.replace(cfg, ner_stride=stride)

    def read(self, path, labels, training=False):
        from zhnlp.data.tasks.ner import label_list_from, read_ner

        examples = read_ner(path)
        if any(self.unlabelled(e) for e in examples):
            return examples, labels  # _load_split reports it, naming the file
        found = label_list_from(examples)
        if labels is None:
            return examples, found
        unknown = sorted(set(found) - set(labels))
        if unknown:
            raise DataError(f"{path}: tags {unknown} are not in the training set's tags {labels}; "
                            "fix the file or train on data that has them.")
        return examples, labels

    def unlabelled(self, example) -> bool:
        return example.tags is None

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.tasks.ner import encode_ner

        return encode_ner(tokenizer, examples, {t: i for i, t in enumerate(labels)}, max_length=cfg.max_length,
                          stride=cfg.ner_stride)

    def score(self, cfg, outputs, examples, features, labels, path):
        from zhnlp.data.tasks.ner import decode_ner
        from zhnlp.metrics.ner import entity_scores

        tags = decode_ner(examples, features, outputs["logits"], dict(enumerate(labels)))
        return entity_scores(tags, [e.tags for e in examples]), tags


TASKS = {"classification": ClassificationTask, "mrc": MRCTask, "ner": NERTask}
ALIASES = {"sentiment": "classification", "sentiment-analysis": "classification",
           "text-classification": "classification", "question-answering": "mrc", "cmrc2018": "mrc",
           "reading-comprehension": "mrc", "token-classification": "ner"}


def get_task(name: str) -> Task:
    key = ALIASES.get(name, name)
    if key not in TASKS:
        raise ZhnlpError(f"unknown task {name!r}; choose one of {', '.join(list(TASKS) + list(ALIASES))}.")
    return TASKS[key]()


# ------------------------------------------------------------------------------------------ batching
_TRAIN_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "start_positions", "end_positions")


def _collate(features: list[dict], pad_to: int) -> dict[str, torch.Tensor]:
    from zhnlp.data.tasks import collate

    return collate([{k: f[k] for k in _TRAIN_KEYS if k in f} for f in features], pad_to=pad_to)


def _pad_length(features: list[dict], multiple: int) -> int:
    longest = max(len(f["input_ids"]) for f in features)
    return int(math.ceil(longest / multiple) * multiple)


class EpochBatches:
    """``batches(step)``: this data-parallel rank's micro-batches of global batch ``step``."""

    def __init__(self, features: list[dict], global_batch: int, micro_batch: int, seed: int, multiple: int = 8):
        self.features, self.global_batch, self.micro_batch = features, global_batch, micro_batch
        self.seed, self.multiple = seed, multiple
        self.steps_per_epoch = len(features) // global_batch
        if self.steps_per_epoch == 0:
            raise DataError(f"the training set has {len(features)} features, fewer than one batch of {global_batch}; "
                            "lower --batch-size or add data.")
        self._order: tuple[int, np.ndarray] | None = None

    def __call__(self, step: int) -> list[dict]:
        epoch, pos = divmod(step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng(self.seed + epoch).permutation(len(self.features)))
        chosen = self._order[1][pos * self.global_batch:(pos + 1) * self.global_batch]
        batch = [self.features[i] for i in chosen]
        pad_to = _pad_length(batch, self.multiple)  # over the global batch: the same on every rank
        lay = distributed.layout()  # the trainer has set up the process groups by the first step
        per_rank = self.global_batch // lay.dp
        mine = batch[lay.dp_rank * per_rank:(lay.dp_rank + 1) * per_rank]
        return [_collate(mine[i:i + self.micro_batch], pad_to) for i in range(0, per_rank, self.micro_batch)]


# ------------------------------------------------------------------------------------------ inference
@torch.no_grad()
def predict(model, features: list[dict], batch_size: int, multiple: int = 8) -> dict[str, np.ndarray]:
    """Run ``model`` (a PretrainedModel, any layout; every rank gets the outputs) over
    ``features`` in order -> ``{output name: array (num_features, ...)}``. Per-token outputs are
    padded to the longest feature with -1e4 (positions past a feature's end are never read)."""
    model.eval()
    width = max(len(f["input_ids"]) for f in features)
    parts: dict[str, list[np.ndarray]] = {}
    for i in range(0, len(features), batch_size):
        chunk = features[i:i + batch_size]
        batch = _collate(chunk, _pad_length(chunk, multiple))
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        for name, value in out.items():
            if name == "loss" or value is None:
                continue
            value = value.float().cpu().numpy()
            if name in ("start_logits", "end_logits") or value.ndim == 3:  # (b, s[, labels]): per token
                value = value[:, :width]
                pad = [(0, 0), (0, width - value.shape[1])] + [(0, 0)] * (value.ndim - 2)
                value = np.pad(value, pad, constant_values=-1e4)
            parts.setdefault(name, []).append(value)
    return {name: np.concatenate(rows) for name, rows in parts.items()}


# ------------------------------------------------------------------------------------------ the run
def _load_split(task: Task, cfg: FinetuneConfig, tokenizer, path: str, labels, limit: int | None = None,
                training: bool = False):
    """Read, check and encode one split -> (examples, features, labels); ``limit`` keeps the first
    examples only (after the whole file is checked)."""
    examples, labels = task.read(path, labels, training=training)
    if not examples:
        raise DataError(f"{path} holds no examples.")
    missing = sum(task.unlabelled(e) for e in examples)
    if missing:
        what = {"classification": "label", "mrc": "answer", "ner": "tags"}[task.name]
        raise DataError(f"{path}: {missing} of {len(examples)} examples have no {what}; training, dev and test files "
                        f"need one on every example (this looks like a file to predict on: use zhnlp predict).")
    examples = examples[:limit] if limit else examples
    return examples, task.encode(cfg, tokenizer, examples, labels), labels


def _run_config(cfg: FinetuneConfig, arch: dict, world_size: int, steps: int):
    from zhnlp.training.config import (CheckpointConfig, DataConfig, LoggingConfig, OptimizerConfig,
                                       ParallelConfig, RunConfig)

    dp = max(world_size // (cfg.tp * cfg.pp), 1)
    micro = cfg.micro_batch_size or max(cfg.batch_size // dp, 1)
    return RunConfig(
        recipe=f"finetune-{cfg.task}", model=arch, steps=steps, seed=cfg.seed, precision=cfg.precision,
        output=cfg.output, parallel=ParallelConfig(tp=cfg.tp, pp=cfg.pp),
        optimizer=OptimizerConfig(lr=cfg.lr, min_lr=0.0, warmup_steps=int(cfg.warmup_ratio * steps),
                                  decay_style="linear", weight_decay=cfg.weight_decay),
        data=DataConfig(seq_length=cfg.max_length, micro_batch_size=micro, global_batch_size=cfg.batch_size),
        logging=LoggingConfig(log_interval=cfg.log_interval),
        checkpoint=CheckpointConfig(save_on_stop=False))  # a stop keeps the best model, not a checkpoint


def finetune(cfg: FinetuneConfig) -> dict:
    """Fine-tune, evaluate each epoch, keep the best model, score the test set; returns the
    contents of ``OUTPUT/metrics.json`` (collective under torchrun: every rank calls it).

    ``OUTPUT`` must be new or empty unless ``cfg.overwrite`` (the earlier run's results are then
    deleted first), and is locked for the run (see :mod:`zhnlp.training.rundir`). ``metrics.json``
    is rewritten after every epoch and always describes the model in ``OUTPUT/model``; its
    ``status`` is ``running``, ``complete`` or ``interrupted`` (SIGTERM/SIGINT: the current step is
    finished, the best model so far kept, and :class:`zhnlp.errors.Interrupted` raised)."""
    from zhnlp.training.rundir import run_directory

    task = get_task(cfg.task)
    cfg = task.configure(cfg)
    if cfg.oracle and task.name != "mrc":
        raise ZhnlpError("--oracle is for reading comprehension (zhnlp finetune mrc ...).")
    if cfg.oracle and not (cfg.train or cfg.dev or cfg.test):
        raise ZhnlpError("--oracle needs at least one of --train/--dev/--test.")
    for name in ("train", "dev", "test"):
        if getattr(cfg, name) is not None:
            check_file(f"--{name}", getattr(cfg, name))
        elif name != "test" and not cfg.oracle:
            raise ZhnlpError(f"fine-tuning needs --{name} FILE.")
    with run_directory(cfg.output, overwrite=cfg.overwrite) as run:
        return oracle(cfg, run) if cfg.oracle else _finetune(task, cfg, run)


def _finetune(task: Task, cfg: FinetuneConfig, run_dir) -> dict:
    from zhnlp import hub
    from zhnlp.models import family_for_model_type
    from zhnlp.models.common.pretrained import PretrainedModel
    from zhnlp.tokenizers import AutoTokenizer
    from zhnlp.tokenizers.auto import check_tokenizer_fits
    from zhnlp.training.signals import stop_signals
    from zhnlp.training.trainer import Trainer

    started = time.time()
    directory = hub.resolve(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    raw = hub.read_config_json(directory)
    family = family_for_model_type(raw.get("model_type"), str(directory / "config.json"))
    check_tokenizer_fits(tokenizer, raw, str(directory))  # before any batch, not as an IndexError in one

    train_examples, train_features, labels = _load_split(task, cfg, tokenizer, cfg.train, cfg.labels,
                                                         limit=cfg.max_train_examples, training=True)
    dev = _load_split(task, cfg, tokenizer, cfg.dev, labels)[:2]
    test = _load_split(task, cfg, tokenizer, cfg.test, labels)[:2] if cfg.test else None

    overrides = {}
    if labels is not None:
        names = cfg.label_names or labels
        if len(names) != len(labels):
            raise ZhnlpError(f"label_names {names} do not match the {len(labels)} labels {labels}; give one name each.")
        overrides["id2label"] = dict(enumerate(names))
    if cfg.dropout is not None:
        overrides.update(hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    arch = family.config_class.from_dict(raw, source=str(directory / "config.json"), **overrides)

    world = dist.get_world_size() if dist.is_initialized() else _env_world_size()
    per_epoch = len(train_features) // cfg.batch_size
    steps = per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)
    run = _run_config(cfg, arch.to_dict(), world, max(steps, 1))
    batches = EpochBatches(train_features, cfg.batch_size, run.data.micro_batch_size, cfg.seed, multiple=8 * cfg.tp)
    trainer = Trainer(run, model=lambda options: PretrainedModel.from_checkpoint(
        family, arch, task.head, directory, seed=cfg.seed, **options), batches=batches,
        tokenizer_name=str(directory))
    rank0 = dist.get_rank() == 0
    run_dir.clear_previous()  # data and model are loaded: only now may --overwrite delete the earlier run
    out = Path(cfg.output)
    best_dir = out / "model"
    history, best = [], None
    result = {"task": task.name, "model": cfg.model, "metric": task.metric, "labels": labels,
              "train_examples": len(train_examples), "train_features": len(train_features),
              "train_left_out": task.left_out, "steps": steps,
              "status": "running", "epochs": history, "best_epoch": None, "dev": None, "test": None,
              "config": dataclasses.asdict(cfg)}

    def write(status: str, **extra) -> None:
        # after every epoch, right after the best model is swapped in: the file always describes OUTPUT/model
        result.update(status=status, best_epoch=best["epoch"] if best else None, dev=best["dev"] if best else None,
                      time_s=round(time.time() - started, 1), **extra)
        if rank0:
            _atomic_json(out / "metrics.json", result)

    def interrupted(signum: int, why: str, epoch: int):
        write("interrupted", stopped_at_step=trainer.step)
        kept = f"the best model so far (epoch {best['epoch']}) is in {best_dir}" if best else "no model was saved"
        return Interrupted(f"{why} (epoch {epoch}); {kept}, metrics in {out / 'metrics.json'}.", signum)

    epochs = math.ceil(steps / max(per_epoch, 1)) if per_epoch else 0
    # a stop signal during evaluation or saving is recorded too, and acted on once the epoch's results are written
    with stop_signals() as stop:
        for epoch in range(1, epochs + 1):
            end = min(epoch * per_epoch, steps)
            try:
                log = trainer.train(steps=end)
            except Interrupted as e:  # the step in flight was finished; this epoch is not scored
                raise interrupted(e.signum, str(e), epoch) from None
            scores, predictions = _evaluate(task, cfg, trainer.model, dev, labels, cfg.dev)
            # the loss lives on the last pipeline stage: take the logging rank's mean
            mean = torch.tensor(float(np.mean([m["loss"] for m in log])) if log else float("nan"),
                                dtype=torch.float64)
            dist.broadcast(mean, src=trainer.logging_rank)
            history.append({"epoch": epoch, "step": end, "train_loss": float(mean), "dev": scores})
            if rank0:
                print(f"epoch {epoch}: train loss {history[-1]['train_loss']:.4f}, dev "
                      + ", ".join(f"{k} {v:.4f}" for k, v in scores.items() if isinstance(v, float)), flush=True)
            if best is None or scores[task.metric] > best["dev"][task.metric]:
                best = history[-1]
                _save_model(trainer.model, tokenizer, best_dir)
                if rank0:
                    _atomic_json(out / "dev_predictions.json", predictions)
            write("running")
            signum = stop.agreed()
            if signum and epoch < epochs:
                raise interrupted(signum, f"stopped by {signal.Signals(signum).name} after step {trainer.step}",
                                  epoch)
    if test is not None and best is not None:
        final = PretrainedModel.from_checkpoint(family, family.config_class.from_json_file(best_dir / "config.json"),
                                                task.head, best_dir, **_options(trainer))
        result["test"], predictions = _evaluate(task, cfg, final, test, labels, cfg.test)
        if rank0:
            _atomic_json(out / "test_predictions.json", predictions)
    write("complete")
    return result


def _options(trainer) -> dict:
    from zhnlp.training.trainer import run_options

    return run_options(trainer.cfg)


def _env_world_size() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def _evaluate(task: Task, cfg: FinetuneConfig, model, split, labels, path) -> tuple[dict, object]:
    examples, features = split
    outputs = predict(model, features, cfg.eval_batch_size, multiple=8 * cfg.tp)
    model.train()
    return task.score(cfg, outputs, examples, features, labels, path)


def _save_model(model, tokenizer, directory: Path) -> None:
    """Swap the model and its tokenizer in for the previous best (see ``save_model_directory``)."""
    from zhnlp.training.export import save_model_directory

    save_model_directory(model, tokenizer, directory)
    model.train()


def _atomic_json(path: Path, data) -> None:
    from zhnlp.fileio import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, data, default=_plain)


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def oracle(cfg: FinetuneConfig, run_dir=None) -> dict:
    """Reading comprehension: put the gold start/end positions through the same windowing and
    span decoding as a model's logits (no training) and score them with the official metric."""
    from zhnlp.data.tasks.mrc import oracle_report
    from zhnlp.tokenizers import AutoTokenizer

    task = get_task(cfg.task)
    if task.name != "mrc":
        raise ZhnlpError("--oracle is for reading comprehension (zhnlp finetune mrc ...).")
    cfg = task.configure(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)  # only the tokenizer takes part
    result = {}
    for split in ("train", "dev", "test"):
        path = getattr(cfg, split)
        if path is None:
            continue
        result[split] = oracle_report(path, tokenizer, max_seq_len=cfg.max_length, doc_stride=cfg.doc_stride,
                                      max_answer_len=cfg.max_answer_length, max_query_len=cfg.max_query_length)
    if run_dir is not None:
        run_dir.clear_previous()
    _atomic_json(Path(cfg.output) / "oracle.json", result)
    return result
