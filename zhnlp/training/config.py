"""Typed run configuration for the trainer, and the recipes that fill it.

A recipe is a function returning a :class:`RunConfig`; the command line picks one and
overrides fields (``zhnlp pretrain --recipe ernie-debug --tp 2 --steps 10``). The
architecture (``model``) is a config.json dict: it meets the run only when the model is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from zhnlp.argtypes import integer, non_negative, number, positive
from zhnlp.errors import LayoutError


def _recompute(text: str) -> str | None:
    """``--recompute none`` is the default (no recompute)."""
    import argparse

    if text not in ("none", "selective", "full"):
        raise argparse.ArgumentTypeError(f"must be one of none, selective, full, got {text!r}")
    return None if text == "none" else text


def _f(default, help: str, **extra):
    """A field with its default and its one-line help; ``extra``: ``check`` (the zhnlp.argtypes parser of its
    flag), ``choices``, ``aliases``, ``cli=False`` (see :mod:`zhnlp.configargs`)."""
    return field(default=default, metadata={"help": help, **extra})


def _section(cls):
    return field(default_factory=cls, metadata={"cli": False})


# The pretraining objective of each family (by zhnlp.models Family.name): its head in
# PretrainedModel.from_config and the dataset the trainer builds for it. ELECTRA: its generator (ElectraForMaskedLM);
# the joint generator + discriminator objective (replaced-token detection) is not implemented.
PRETRAINING_HEADS = {"ernie": "mlm", "ernie4_5": "causal_lm", "albert": "mlm", "electra": "mlm", "roformer": "mlm"}


@dataclass
class ParallelConfig:
    tp: int = _f(1, "tensor-parallel size", check=positive)
    pp: int = _f(1, "pipeline-parallel size", check=positive)
    vpp: int | None = _f(None, "virtual pipeline chunks per stage (interleaved schedule)", check=positive)
    sequence_parallel: bool = _f(False, "split activations along the sequence over the TP ranks (needs tp >= 2)")
    ep: int = _f(1, "expert-parallel size: the experts of each MoE layer are split over this many ranks "
                    "(mixture-of-experts models only)", check=positive)
    etp: int | None = _f(None, "expert tensor-parallel size: each expert's MLP split this many ways (default: tp; "
                               "etp=1 lets tp*ep exceed the number of processes)", check=positive)
    fsdp: bool = _f(False, "fully sharded data parallelism (ZeRO-3 class, torch FSDP2 through megatron-core): "
                           "weights, gradients and optimizer states sharded over the data-parallel ranks")
    overlap_grad_reduce: bool = _f(False, "start the data-parallel gradient reduction (all-reduce, or the "
                                          "distributed optimizer's reduce-scatter) bucket by bucket during the "
                                          "backward of the last micro-batch, instead of after it (megatron DDP)")
    bucket_size: int | None = _f(None, "parameters per gradient bucket with overlap_grad_reduce (default "
                                       "megatron's: max(40M, 1M x data-parallel size))", check=positive)
    overlap_param_gather: bool = _f(False, "with the distributed optimizer: all-gather the updated parameters "
                                           "bucket by bucket during the next step's forward (each layer waits "
                                           "for its own bucket) instead of right after the optimizer step "
                                           "(megatron DDP); needs overlap_grad_reduce, whose buckets it uses")


@dataclass
class MoEConfig:
    """Mixture-of-experts training options, passed to megatron's TransformerConfig for an MoE model only."""

    moe_aux_loss_coeff: float = _f(0.0, "weight of the load-balancing auxiliary loss (MoE)", check=number(0))
    moe_expert_capacity_factor: float | None = _f(
        None, "token dropping: each expert takes at most this factor x its even share of the tokens (MoE; "
              "default: no dropping)", check=number(0, low_open=True))
    moe_token_drop_policy: str = _f("probs", "with a capacity factor: drop the tokens of lowest routing "
                                             "probability, or the last ones in the sequence (MoE)",
                                    choices=("probs", "position"))
    moe_pad_expert_input_to_capacity: bool = _f(False, "with a capacity factor: pad every expert's input to its "
                                                       "capacity (MoE)")


@dataclass
class OptimizerConfig:
    lr: float = _f(1e-4, "peak learning rate", check=number(0, low_open=True))
    min_lr: float = _f(1e-5, "learning rate at the end of the decay", check=number(0))
    warmup_steps: int = _f(0, "steps of linear warmup", check=non_negative)
    decay_style: str = _f("linear", "learning-rate decay after warmup", choices=("constant", "linear", "cosine"))
    weight_decay: float = _f(0.01, "AdamW weight decay", check=number(0))
    adam_beta1: float = _f(0.9, "Adam beta1", check=number(0, 1, high_open=True))
    adam_beta2: float = _f(0.999, "Adam beta2", check=number(0, 1, high_open=True))
    adam_eps: float = _f(1e-8, "Adam epsilon", check=number(0, low_open=True))
    clip_grad: float = _f(1.0, "clip the gradient norm to this (0: no clipping)", check=number(0))
    distributed_optimizer: bool = _f(False, "shard optimizer states over the data-parallel ranks")
    optimizer_offload: float | None = _f(
        None, "GPU runs: keep this fraction (default 1) of the optimizer states and their Adam step in host memory "
              "(megatron-core's hybrid device optimizer; needs --distributed-optimizer)",
        check=number(0, 1, low_open=True), nargs="?", const=1.0, metavar="FRACTION")
    initial_loss_scale: float = _f(2.0**16, "fp16: where dynamic loss scaling starts",
                                   check=number(0, low_open=True))


@dataclass
class DataConfig:
    prefix: str | None = _f(None, "preprocessed corpus prefix (zhnlp preprocess --output PREFIX); default for "
                                  "ernie-debug and ernie-tiny: the demo corpus", aliases=["--data"])
    tokenizer: str | None = _f(None, "tokenizer directory or name (default: the corpus's tokenizer)")
    seq_length: int = _f(128, "tokens per sample ([CLS]/[SEP] included for masked LM)", check=integer(8))
    micro_batch_size: int = _f(8, "samples per forward pass and rank", check=positive)
    global_batch_size: int = _f(32, "samples per optimizer step over all ranks", check=positive)
    mask_prob: float = _f(0.15, "fraction of tokens masked", check=number(0, 1, low_open=True, high_open=True))
    max_ngram: int = _f(1, "longest masked n-gram of whole words (1: whole-word masking)", check=positive)
    prefetch: bool = _f(True, "prepare the next step's micro-batches on a background thread while this step "
                              "computes (metrics.jsonl: data_wait_s, the time a step still waited for them)")
    reset_attention: bool = _f(False, "causal LM: attention stops at document ends (EOD) and position ids restart "
                                      "per document (default: packed windows attend across documents)")
    eod_mask_loss: bool = _f(False, "causal LM: no loss on predicting the token after an EOD (the next "
                                    "document's first token)")
    per_token_loss: bool = _f(False, "causal LM: average the loss over every target token of the global batch "
                                     "(all micro-batches and data-parallel ranks together) instead of averaging "
                                     "per-micro-batch means; fine-tuning on conversations always does")


@dataclass
class CheckpointConfig:
    save_interval: int = _f(0, "steps between distributed checkpoints (0: none, except on a stop signal)",
                            check=non_negative)
    keep: int = _f(3, "complete checkpoints to keep (0 keeps every one)", check=non_negative)
    resume: bool = _f(False, "continue from the newest loadable checkpoint under OUTPUT/checkpoints")
    async_save: bool = _f(False, "write the periodic checkpoints in the background (megatron's async "
                                 "dist_checkpointing: the state is captured at the save, a forked process writes "
                                 "it while training continues); a checkpoint counts once complete, as always")
    # on SIGTERM/SIGINT: save a checkpoint after the current step, then Trainer.train raises Interrupted
    # (off for callers that keep their own results, such as fine-tuning's best model)
    save_on_stop: bool = _f(True, "on SIGTERM/SIGINT save a checkpoint after the current step", cli=False)


@dataclass
class LoggingConfig:
    log_interval: int = _f(1, "steps between metrics lines", check=positive)
    peak_tflops: float = _f(1.0, "per-device dense peak TFLOP/s, for the MFU column", check=number(0, low_open=True))
    memory_window: int = _f(3, "CPU: measure peak_tensor_bytes with the profiler's memory events from the model's "
                               "construction to this step (0: not measured; GPUs use the allocator's counter)",
                            check=non_negative)


@dataclass
class RunConfig:
    """Everything a pretraining run needs besides the data files themselves."""

    recipe: str = field(metadata={"cli": False})
    model: dict = field(metadata={"cli": False})  # transformers config.json fields (model_type: the family)
    parallel: ParallelConfig = _section(ParallelConfig)
    moe: MoEConfig = _section(MoEConfig)
    optimizer: OptimizerConfig = _section(OptimizerConfig)
    data: DataConfig = _section(DataConfig)
    logging: LoggingConfig = _section(LoggingConfig)
    checkpoint: CheckpointConfig = _section(CheckpointConfig)
    steps: int = _f(100, "length of the schedule in optimizer steps", check=positive)
    seed: int = _f(1234, "seed of initialisation, data order and dropout", check=non_negative)
    precision: str = _f("fp32", "parameter precision (bf16/fp16 keep fp32 main weights)",
                        choices=("fp32", "bf16", "fp16"))
    recompute: str | None = _f(None, "activation recompute: none, selective (attention) or full (whole layers)",
                               check=_recompute, metavar="{none,selective,full}")
    compile: bool = _f(False, "torch.compile the transformer layers (norms, activations, bias and residual adds "
                              "fused; on a CPU their linears through oneDNN); the first steps include the compile "
                              "time (see zhnlp/models/common/compiled.py for what stays outside the graphs)")
    output: str = _f("runs/pretrain", "run directory (default runs/RECIPE); must be new or empty unless "
                                      "--resume or --overwrite")

    SECTIONS = ("parallel", "moe", "optimizer", "data", "logging", "checkpoint")

    @property
    def family(self):
        """The model family of ``model["model_type"]`` (zhnlp.models' registry)."""
        from zhnlp.models import family_for_model_type

        return family_for_model_type(self.model.get("model_type"), source=f"recipe {self.recipe!r}: model")

    @property
    def head(self) -> str:
        """The pretraining head of the family: masked LM for encoders, causal LM for decoders."""
        head = PRETRAINING_HEADS.get(self.family.name)
        if head is None:
            from zhnlp.errors import CheckpointError

            raise CheckpointError(f"zhnlp has no pretraining objective for the {self.family.name} family (model_type "
                                  f"{self.model.get('model_type')!r}: it has no masked-LM or causal-LM head); "
                                  f"fine-tune such a model with `zhnlp finetune` instead.")
        return head

    def architecture(self):
        """``model`` as the family's architecture config (its checks run here)."""
        return self.family.config_class.from_dict(self.model, source=f"recipe {self.recipe!r}: model")

    def to_dict(self) -> dict:
        """Every setting, nested by section: what ``--print-config`` prints and ``--config`` reads."""
        return dataclasses.asdict(self)

    def check(self, world_size: int) -> None:
        """Fail before any work when the layout cannot work, with one message."""
        from zhnlp.argtypes import range_problem
        from zhnlp.errors import CheckpointError, ModelNotFoundError

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
        if p.bucket_size is not None and not p.overlap_grad_reduce:
            problems.append("bucket_size sets the buckets of overlap_grad_reduce; without it the gradients are "
                            "reduced in one bucket after the backward (add --overlap-grad-reduce or drop "
                            "--bucket-size)")
        if c.async_save and not c.save_interval:
            problems.append("--async-save writes the periodic checkpoints in the background; without "
                            "--save-interval there are none (add --save-interval N or drop --async-save)")
        if p.overlap_grad_reduce and p.fsdp:
            problems.append("--fsdp reduce-scatters each layer's gradients during the backward already; drop "
                            "--overlap-grad-reduce")
        problems += _param_gather_problems(self)
        if self.compile and p.fsdp:
            problems.append("--compile with --fsdp: FSDP2's per-layer hooks would be traced into the compiled layers; "
                            "drop one of them")
        if p.sequence_parallel and d.seq_length % p.tp:
            problems.append(f"seq_length {d.seq_length} is not divisible by tp={p.tp} (sequence parallelism)")
        if self.precision not in ("fp32", "bf16", "fp16"):
            problems.append(f"precision {self.precision!r} is not one of fp32, bf16, fp16")
        if self.recompute not in (None, "selective", "full"):
            problems.append(f"recompute {self.recompute!r} is not one of selective, full")
        m = self.moe
        problem = range_problem(m.moe_aux_loss_coeff, "a number", 0)
        if problem:
            problems.append(f"moe_aux_loss_coeff {problem}, got {m.moe_aux_loss_coeff!r}")
        try:
            arch = self.architecture()
        except (CheckpointError, ModelNotFoundError) as e:
            problems.append(str(e).rstrip("."))
            arch = None
        moe = bool(getattr(arch, "is_moe", False))
        if arch is not None and p.ep > 1 and not moe:
            problems.append(f"ep={p.ep} needs a mixture-of-experts model; {self.model.get('model_type')!r} has no "
                            "experts (use ep=1)")
        if arch is not None and not moe and (m.moe_expert_capacity_factor is not None or m.moe_aux_loss_coeff):
            problems.append("the moe settings (moe_aux_loss_coeff, moe_expert_capacity_factor) need a "
                            "mixture-of-experts model")
        # fine-tuning runs are checked here too: a family without a pretraining head is no error here
        causal = arch is not None and PRETRAINING_HEADS.get(self.family.name) == "causal_lm"
        if arch is not None and not causal and (d.reset_attention or d.eod_mask_loss):
            problems.append("reset_attention and eod_mask_loss are causal-LM settings; this recipe's model is "
                            "pretrained with masked LM")
        if arch is not None and not causal and d.per_token_loss:
            problems.append("per_token_loss is a causal-LM setting (the masked-LM loss is averaged per micro-batch)")
        try:
            if arch is not None:
                arch.check_layout(p.tp, p.pp, p.vpp)
                if moe:
                    arch.check_experts(p.ep, p.etp or p.tp, p.tp)
                    if p.tp > 1 and not p.sequence_parallel:
                        problems.append(f"a mixture-of-experts model with tp={p.tp} needs --sequence-parallel "
                                        "(megatron-core trains MoE layers under tensor parallelism only with it)")
        except LayoutError as e:
            problems.append(str(e).removeprefix("this model does not fit the parallel layout: ").rstrip("."))
        from zhnlp.training import fsdp

        problems += fsdp.check(self)
        problems += _offload_problems(self)
        if problems:
            raise LayoutError("this run cannot start: " + "; ".join(problems) + ".")


def _param_gather_problems(cfg) -> list[str]:
    """What ``--overlap-param-gather`` needs and cannot be combined with (one message each)."""
    p = cfg.parallel
    if not p.overlap_param_gather:
        return []
    if p.fsdp:
        return ["--fsdp all-gathers each layer's parameters before its forward already; drop --overlap-param-gather"]
    problems = []
    if not cfg.optimizer.distributed_optimizer:
        problems.append("--overlap-param-gather all-gathers the distributed optimizer's updated shards; without "
                        "--distributed-optimizer every rank updates all its parameters and nothing is gathered "
                        "(add --distributed-optimizer or drop --overlap-param-gather)")
    elif not p.overlap_grad_reduce:
        problems.append("--overlap-param-gather needs --overlap-grad-reduce: megatron cuts the parameters into "
                        "buckets (--bucket-size) only with it, and the forward overlaps one bucket's gather with "
                        "the previous bucket's layers (add --overlap-grad-reduce)")
    if cfg.compile:
        problems.append("--compile with --overlap-param-gather: the hooks that wait for each layer's gathered "
                        "parameters would be traced into the compiled layers; drop one of them")
    return problems


def _offload_problems(cfg) -> list[str]:
    """What ``--optimizer-offload`` cannot be combined with."""
    if cfg.optimizer.optimizer_offload is None:
        return []
    import torch

    if not torch.cuda.is_available():  # one line: nothing else about the layout matters then
        return ["--optimizer-offload moves optimizer states from GPU memory to host memory; without a GPU they are "
                "in host memory already, so drop it"]
    problems = []
    if not cfg.optimizer.distributed_optimizer:
        problems.append("--optimizer-offload needs --distributed-optimizer (megatron-core offloads the distributed "
                        "optimizer's shards)")
    if cfg.parallel.fsdp:
        problems.append("--optimizer-offload with --fsdp: megatron-core offloads only the distributed optimizer; "
                        "drop one of them")
    return problems


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


def decoder_arch(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, *, head_dim: int | None = None,
                 vocab: int = 21128, positions: int = 2048, model_type: str = "ernie4_5", **extra) -> dict:
    """An ERNIE 4.5 decoder architecture (transformers' config.json fields). The default vocabulary is
    BERT-Chinese's (the demo corpus's tokenizer: [SEP] ends documents, so it is the eos token); the real
    shapes pass ERNIE 4.5's own 103,424-token vocabulary (eos ``</s>`` = 2). ``extra``: further fields
    (an MoE model's ``moe_*`` sizes)."""
    bert = vocab == 21128
    return dict(model_type=model_type, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads,
                intermediate_size=ffn, hidden_act="silu", max_position_embeddings=positions,
                initializer_range=0.02, rms_norm_eps=1e-5, rope_theta=500000.0, use_bias=False,
                tie_word_embeddings=True, pad_token_id=0, bos_token_id=101 if bert else 1,
                eos_token_id=102 if bert else 2, **extra)


def decoder_recipe(name: str, model: dict, *, steps: int, lr: float, warmup: int, seq: int, micro: int,
                   global_batch: int, doc: str, **parallel):
    """A causal-LM recipe for ``model``; ``parallel``: the default layout (ParallelConfig fields). A new
    decoder recipe (the MoE shapes) is one ``RECIPES[name] = decoder_recipe(...)`` line."""
    def recipe() -> RunConfig:
        return RunConfig(recipe=name, model=dict(model), steps=steps, parallel=ParallelConfig(**parallel),
                         optimizer=OptimizerConfig(lr=lr, min_lr=lr / 10, warmup_steps=warmup, decay_style="cosine",
                                                   weight_decay=0.1, adam_beta2=0.95),
                         data=DataConfig(seq_length=seq, micro_batch_size=micro, global_batch_size=global_batch))
    recipe.__doc__ = doc
    return recipe


ERNIE45_0_3B = decoder_arch(18, 1024, 16, 2, 3072, head_dim=128, vocab=103424, positions=131072)


def _moe(experts: int, k: int, width: int, shared: int, start: int) -> dict:
    """ERNIE 4.5's MoE fields (model_type ernie4_5_moe): MoE on every layer from ``start`` on."""
    return dict(model_type="ernie4_5_moe", moe_num_experts=experts, moe_k=k, moe_intermediate_size=width,
                moe_num_shared_experts=shared, moe_layer_start_index=start, moe_layer_end_index=-1,
                moe_layer_interval=1, moe_norm_min=1e-12, router_aux_loss_coef=0.001)


# the real shapes (see zhnlp/model_cards/ernie-4.5-21b-a3b-pt.md and -300b-a47b-pt.md for the sources)
ERNIE45_21B_A3B = decoder_arch(28, 2560, 20, 4, 12288, head_dim=128, vocab=103424, positions=131072,
                               **_moe(64, 6, 1536, 2, 1))
ERNIE45_300B_A47B = decoder_arch(54, 8192, 64, 8, 28672, head_dim=128, vocab=103424, positions=131072,
                                 **_moe(64, 8, 3584, 0, 3))

RECIPES = {
    "ernie-debug": ernie_debug,
    "ernie-tiny": ernie_tiny,
    "ernie-3.0-nano": _sized("ernie-3.0-nano", 4, 312, 12, 1248),
    "ernie-3.0-micro": _sized("ernie-3.0-micro", 4, 384, 12, 1536),
    "ernie-3.0-mini": _sized("ernie-3.0-mini", 6, 384, 12, 1536),
    "ernie-3.0-medium": _sized("ernie-3.0-medium", 6, 768, 12, 3072),
    "ernie-3.0-base": _sized("ernie-3.0-base", 12, 768, 12, 3072),
    "ernie-3.0-xbase": _sized("ernie-3.0-xbase", 20, 1024, 16, 4096),
    "ernie4.5-debug": decoder_recipe(
        "ernie4.5-debug", decoder_arch(4, 64, 4, 2, 128, head_dim=16), steps=20, lr=1e-3, warmup=2, seq=64, micro=2,
        global_batch=8, doc="A tiny dense ERNIE 4.5 decoder for tests (4 layers, hidden 64, 4 query / 2 key-value "
                            "heads of 16, FFN 128, BERT-Chinese vocabulary); dropout-free, so every layout gives the "
                            "same losses."),
    "ernie4.5-tiny": decoder_recipe(
        "ernie4.5-tiny", decoder_arch(4, 128, 4, 2, 384, head_dim=32), steps=200, lr=2e-3, warmup=20, seq=128,
        micro=8, global_batch=16, doc="A small dense ERNIE 4.5 decoder that learns visibly in 2-3 minutes on 2 CPU "
                                      "processes (4 layers, hidden 128, 4/2 heads of 32, FFN 384)."),
    "ernie4.5-0.3b": decoder_recipe(
        "ernie4.5-0.3b", ERNIE45_0_3B, steps=100_000, lr=3e-4, warmup=2000, seq=4096, micro=2, global_batch=512,
        doc="ERNIE-4.5-0.3B's shape: 18 layers, hidden 1024, 16 query / 2 key-value heads of 128, FFN 3072, "
            "vocabulary 103,424 (ERNIE 4.5's tokenizer), rope_theta 500,000, tied embeddings; sequences of 4,096. "
            "Suggested layouts: 8 x 80 GB GPUs: data parallel (tp=1, --distributed-optimizer, micro batch 2, "
            "--precision bf16); tp=2 (kv heads 2 allow at most tp=2) once the micro batch no longer fits; "
            "pp is rarely worth it at this size (18 layers: pp=2, 3, 6 or 9)."),
    "ernie4.5-moe-debug": decoder_recipe(
        "ernie4.5-moe-debug", decoder_arch(4, 64, 4, 2, 128, head_dim=16, **_moe(4, 2, 32, 1, 1)), steps=20, lr=1e-3,
        warmup=2, seq=64, micro=2, global_batch=8,
        doc="A tiny ERNIE 4.5 mixture of experts for tests: the ernie4.5-debug shape with 4 experts of width 32, "
            "top-2, one shared expert, layer 0 dense; dropout-free and without auxiliary loss by default, so EP=2 "
            "(and TP=2 x EP=2) give the same losses as one process."),
    "ernie4.5-21b-a3b": decoder_recipe(
        "ernie4.5-21b-a3b", ERNIE45_21B_A3B, steps=100_000, lr=3e-4, warmup=2000, seq=4096, micro=1, global_batch=1024,
        doc="ERNIE-4.5-21B-A3B's shape: 28 layers (layer 0 dense, FFN 12288), hidden 2560, 20 query / 4 key-value "
            "heads of 128, 64 routed experts of width 1536 (top-6) + 2 shared, vocabulary 103,424, tied; ~21B "
            "parameters, ~3B active per token. Suggested layout, 16 x 80 GB GPUs (2 nodes) in bf16: ep=8 "
            "(8 experts per rank), tp=1, pp=2, the distributed optimizer, --moe-aux-loss-coeff 1e-3, micro batch 1; "
            "tp=2 (with --sequence-parallel, which MoE with TP needs) if attention activations do not fit."),
    "ernie4.5-300b-a47b": decoder_recipe(
        "ernie4.5-300b-a47b", ERNIE45_300B_A47B, steps=100_000, lr=2e-4, warmup=2000, seq=4096, micro=1,
        global_batch=2048,
        doc="ERNIE-4.5-300B-A47B's shape: 54 layers (layers 0-2 dense, FFN 28672), hidden 8192, 64 query / 8 "
            "key-value heads of 128, 64 routed experts of width 3584 (top-8), no shared experts, vocabulary "
            "103,424; ~300B parameters, ~47B active per token (tie_word_embeddings is reported both ways by "
            "public copies of its config.json: check the real file). Suggested layout, 256 x 80 GB GPUs (32 nodes) "
            "in bf16: tp=8 with --sequence-parallel inside a node, ep=8, pp=4 (vpp=2), the distributed "
            "optimizer, --recompute selective."),
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
        for target in (cfg, cfg.parallel, cfg.moe, cfg.optimizer, cfg.data, cfg.logging, cfg.checkpoint):
            if key in {f.name for f in dataclasses.fields(target)}:
                setattr(target, key, value)
                break
        else:
            raise TypeError(f"no run setting named {key!r}")
    return cfg
