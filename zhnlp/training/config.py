"""Typed run configuration for the trainer, and the recipes that fill it.

A recipe is a function returning a :class:`RunConfig`; the command line picks one and
overrides fields (``zhnlp pretrain --recipe ernie-debug --tp 2 --steps 10``). The
architecture (``model``) is a config.json dict: it meets the run only when the model is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from zhnlp.errors import LayoutError


@dataclass
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    sequence_parallel: bool = False


@dataclass
class OptimizerConfig:
    lr: float = 1e-4
    min_lr: float = 1e-5
    warmup_steps: int = 0
    decay_style: str = "linear"  # constant, linear, cosine
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    distributed_optimizer: bool = False
    initial_loss_scale: float = 2.0**16  # fp16 only: dynamic loss scaling starts here


@dataclass
class DataConfig:
    prefix: str | None = None  # preprocessed corpus (zhnlp preprocess --output PREFIX)
    tokenizer: str | None = None  # directory or name; default: the corpus's tokenizer
    seq_length: int = 128
    micro_batch_size: int = 8
    global_batch_size: int = 32
    mask_prob: float = 0.15
    max_ngram: int = 1


@dataclass
class CheckpointConfig:
    save_interval: int = 0  # steps between checkpoints (0: none, except on a stop signal)
    keep: int = 3  # complete checkpoints to keep
    resume: bool = False  # continue from the newest loadable checkpoint under OUTPUT/checkpoints
    # on SIGTERM/SIGINT: save a checkpoint after the current step, then Trainer.train raises Interrupted
    # (off for callers that keep their own results, such as fine-tuning's best model)
    save_on_stop: bool = True


@dataclass
class LoggingConfig:
    log_interval: int = 1
    peak_tflops: float = 1.0  # per device, for MFU; set your accelerator's dense peak


@dataclass
class RunConfig:
    """Everything a pretraining run needs besides the data files themselves."""

    recipe: str
    model: dict  # transformers config.json fields (model_type ernie/bert)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    steps: int = 100
    seed: int = 1234
    precision: str = "fp32"  # fp32, bf16, fp16
    recompute: str | None = None  # None, selective, full
    output: str = "runs/pretrain"

    def check(self, world_size: int) -> None:
        """Fail before any work when the layout cannot work, with one message."""
        from zhnlp.models.ernie.config import ErnieConfig

        from zhnlp.argtypes import range_problem

        p, d = self.parallel, self.data
        problems = []
        o, c, log = self.optimizer, self.checkpoint, self.logging
        ranges = [("steps", self.steps, 1), ("seed", self.seed, 0), ("micro_batch_size", d.micro_batch_size, 1),
                  ("global_batch_size", d.global_batch_size, 1), ("seq_length", d.seq_length, 8),
                  ("log_interval", log.log_interval, 1), ("save_interval", c.save_interval, 0),
                  ("keep", c.keep, 0), ("warmup_steps", o.warmup_steps, 0), ("max_ngram", d.max_ngram, 1)]
        for name, value, low in ranges:
            problem = range_problem(value, "an integer", low)
            if problem:
                problems.append(f"{name} {problem}, got {value!r}")
        reals = [("lr", o.lr, 0, True), ("min_lr", o.min_lr, 0, False), ("weight_decay", o.weight_decay, 0, False),
                 ("clip_grad", o.clip_grad, 0, False), ("peak_tflops", log.peak_tflops, 0, True),
                 ("initial_loss_scale", o.initial_loss_scale, 0, True)]
        for name, value, low, open_low in reals:
            problem = range_problem(value, "a number", low, low_open=open_low)
            if problem:
                problems.append(f"{name} {problem}, got {value!r}")
        problem = range_problem(d.mask_prob, "a number", 0, 1, low_open=True, high_open=True)
        if problem:
            problems.append(f"mask_prob {problem}, got {d.mask_prob!r}")
        positions = self.model.get("max_position_embeddings")
        if isinstance(positions, int) and isinstance(d.seq_length, int) and d.seq_length > positions:
            problems.append(f"seq_length {d.seq_length} is longer than the model's max_position_embeddings "
                            f"{positions}")
        if world_size % (p.tp * p.pp):
            problems.append(f"world size {world_size} is not divisible by tp*pp = {p.tp * p.pp}")
        else:
            dp = world_size // (p.tp * p.pp)
            if d.global_batch_size % (d.micro_batch_size * dp):
                problems.append(f"global batch {d.global_batch_size} is not divisible by micro batch "
                                f"{d.micro_batch_size} x data-parallel size {dp}")
        if p.sequence_parallel and p.tp == 1:
            problems.append("sequence parallelism needs tp >= 2")
        if p.sequence_parallel and d.seq_length % p.tp:
            problems.append(f"seq_length {d.seq_length} is not divisible by tp={p.tp} (sequence parallelism)")
        if self.precision not in ("fp32", "bf16", "fp16"):
            problems.append(f"precision {self.precision!r} is not one of fp32, bf16, fp16")
        if self.recompute not in (None, "selective", "full"):
            problems.append(f"recompute {self.recompute!r} is not one of selective, full")
        try:
            ErnieConfig.from_dict(self.model).check_layout(p.tp, p.pp, p.vpp)
        except LayoutError as e:
            problems.append(str(e).removeprefix("this model does not fit the parallel layout: ").rstrip("."))
        if problems:
            raise LayoutError("this run cannot start: " + "; ".join(problems) + ".")


def _arch(layers: int, hidden: int, heads: int, ffn: int, vocab: int = 21128, task_types: int = 16) -> dict:
    """An ERNIE 3.0-style architecture (gelu, task ids) with the BERT-Chinese vocabulary, which is
    the vocabulary this machine has (the 40,000-entry ERNIE 3.0 vocabulary is not published here)."""
    return dict(model_type="ernie", vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, intermediate_size=ffn, hidden_act="gelu", max_position_embeddings=2048,
                type_vocab_size=4, use_task_id=True, task_type_vocab_size=task_types, layer_norm_eps=1e-5,
                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02, pad_token_id=0)


def ernie_debug() -> RunConfig:
    """A tiny ERNIE for tests and demos: 4 layers, hidden 64; dropout off so that every
    parallel layout gives the same losses."""
    model = _arch(4, 64, 4, 128, task_types=3)
    model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return RunConfig(recipe="ernie-debug", model=model, steps=20,
                     optimizer=OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2),
                     data=DataConfig(seq_length=64, micro_batch_size=2, global_batch_size=8))


def ernie_tiny() -> RunConfig:
    """A small ERNIE that pretrains in minutes on a CPU (4 layers, hidden 128, 4 heads, FFN 512):
    the demo and the pretrained-vs-scratch comparison use it."""
    return RunConfig(recipe="ernie-tiny", model=_arch(4, 128, 4, 512, task_types=3), steps=2000,
                     optimizer=OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_steps=100),
                     data=DataConfig(seq_length=128, micro_batch_size=16, global_batch_size=32))


def _sized(name: str, layers: int, hidden: int, heads: int, ffn: int):
    def recipe() -> RunConfig:
        return RunConfig(recipe=name, model=_arch(layers, hidden, heads, ffn), steps=100_000,
                         optimizer=OptimizerConfig(lr=5e-4 if hidden < 768 else 1e-4, warmup_steps=10_000),
                         data=DataConfig(seq_length=512, micro_batch_size=8, global_batch_size=256))
    recipe.__doc__ = f"ERNIE 3.0 {name.split('-')[-1]} shape: {layers} layers, hidden {hidden}, {heads} heads, FFN {ffn}."
    return recipe


RECIPES = {
    "ernie-debug": ernie_debug,
    "ernie-tiny": ernie_tiny,
    "ernie-3.0-nano": _sized("ernie-3.0-nano", 4, 312, 12, 1248),
    "ernie-3.0-micro": _sized("ernie-3.0-micro", 4, 384, 12, 1536),
    "ernie-3.0-mini": _sized("ernie-3.0-mini", 6, 384, 12, 1536),
    "ernie-3.0-medium": _sized("ernie-3.0-medium", 6, 768, 12, 3072),
    "ernie-3.0-base": _sized("ernie-3.0-base", 12, 768, 12, 3072),
    "ernie-3.0-xbase": _sized("ernie-3.0-xbase", 20, 1024, 16, 4096),
}


def recipe(name: str) -> RunConfig:
    if name not in RECIPES:
        raise LayoutError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}.")
    return RECIPES[name]()


def override(cfg: RunConfig, **changes) -> RunConfig:
    """Set fields by name wherever they live (``tp=2``, ``lr=1e-3``, ``steps=10``); None is ignored."""
    for key, value in changes.items():
        if value is None:
            continue
        for target in (cfg, cfg.parallel, cfg.optimizer, cfg.data, cfg.logging, cfg.checkpoint):
            if key in {f.name for f in dataclasses.fields(target)}:
                setattr(target, key, value)
                break
        else:
            raise TypeError(f"no run setting named {key!r}")
    return cfg
