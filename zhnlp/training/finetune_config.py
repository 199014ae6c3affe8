"""The typed configuration of one fine-tuning run, without torch or transformers.

:class:`FinetuneConfig` is the one source of truth for ``zhnlp finetune``'s flags: every field
carries ``metadata={"help": ...}`` (and ``"choices"`` where the values are fixed), from which the
command line builds its flags, help and defaults. It imports nothing heavy, so that
``zhnlp finetune --help`` stays fast; :mod:`zhnlp.training.finetune` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zhnlp.argtypes import check_range, integer, non_negative, number, positive

TASK_NAMES = ("classification", "mrc", "ner", "sft", "mlm")
ALIASES = {"sentiment": "classification", "sentiment-analysis": "classification",
           "text-classification": "classification", "question-answering": "mrc", "cmrc2018": "mrc",
           "reading-comprehension": "mrc", "token-classification": "ner", "chat": "sft",
           "instruction-tuning": "sft", "masked-lm": "mlm", "fill-mask": "mlm"}
PRECISIONS = ("fp32", "bf16", "fp16")


def _source(text: str) -> str:
    """``--train/--dev/--test``: a data file or a ``save_to_disk`` directory (checked where it enters)."""
    from zhnlp.data.tasks.hf import data_source

    return data_source(text)


def _f(default, help: str, **extra):
    """A dataclass field with its default and its one-line help (for the generated command line)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class FinetuneConfig:
    """One fine-tuning run. ``batch_size`` is the global batch (over data-parallel ranks and
    gradient-accumulation micro-batches). ``train``/``dev``/``test`` name files or directories
    written by ``datasets``' ``save_to_disk``; in-memory data (a ``datasets.Dataset``, a
    ``DatasetDict``, a list of dicts) goes to :func:`zhnlp.finetune` beside the config."""

    task: str = _f(None, "classification, mrc, ner, sft or mlm (aliases: sentiment-analysis, text-classification, "
                         "question-answering, cmrc2018, token-classification, chat, masked-lm, ...)",
                   choices=TASK_NAMES + tuple(ALIASES), cli=False)
    model: str = _f(None, "model directory, model name or hub repo id to start from")
    train: str | None = _f(None, "training data: a file (classification: jsonl/TSV/CSV; mrc: SQuAD json; "
                                 "ner: jsonl/CoNLL; sft: jsonl of {\"messages\": [{\"role\", \"content\"}]}; "
                                 "mlm: jsonl of {\"text\"} or .txt, one text per line) or a save_to_disk dataset "
                                 "directory", check=_source)
    dev: str | None = _f(None, "development data (file or save_to_disk directory), scored at every evaluation; "
                               "default: the validation split of a DatasetDict given as train", check=_source)
    test: str | None = _f(None, "test data (file or save_to_disk directory), scored once with the best model",
                          check=_source)
    output: str = _f("runs/finetune", "run directory (zhnlp finetune: runs/finetune-TASK by default); must be new or "
                                      "empty unless --overwrite or --resume", show_default=False)
    overwrite: bool = _f(False, "delete the earlier run's results in the output directory first")
    epochs: int = _f(3, "passes over the training data", check=positive)
    lr: float = _f(5e-5, "peak learning rate (linear warmup, then linear decay to 0)", check=number(0, low_open=True))
    warmup_ratio: float = _f(0.1, "fraction of the steps spent warming up", check=number(0, 1))
    weight_decay: float = _f(0.01, "AdamW weight decay", check=number(0))
    batch_size: int = _f(32, "global batch size (over data-parallel ranks and accumulation)", check=positive)
    micro_batch_size: int | None = _f(None, "examples per forward pass (gradient accumulation when smaller); "
                                            "default: batch size / data-parallel size", check=positive)
    eval_batch_size: int = _f(64, "features per forward pass when evaluating", check=positive)
    max_length: int | None = _f(None, "tokens per feature, special tokens included (mrc, mlm: per window); "
                                      "default per task (128, mrc 512, sft 1024)", check=integer(8))
    doc_stride: int | None = _f(None, "mrc: tokens between context window starts (default min(128, half the "
                                      "context window))", check=positive)
    max_query_length: int | None = _f(None, "mrc: question tokens kept (default min(64, half of max length))",
                                      check=positive)
    max_answer_length: int = _f(256, "mrc: longest answer in tokens", check=positive)
    ner_stride: int | None = _f(None, "ner: sub-tokens shared by consecutive windows of a long sentence "
                                      "(default min(32, a quarter of the window))", check=non_negative)
    packing: bool = _f(False, "sft: pack conversations into sequences of max length (attention and positions "
                              "restart at each conversation) instead of padding each one")
    mask_prob: float | None = _f(None, "mlm: fraction of the tokens to predict, masked anew every epoch "
                                       "(default 0.15)",
                                 check=number(0, 1, low_open=True, high_open=True))
    whole_word_masking: bool = _f(True, "mlm: mask whole jieba words (Chinese whole-word masking) rather than single "
                                        "tokens")
    labels: list[str] | None = _f(None, "the label set, in order (default: the labels of the training data)",
                                  comma_list=True)
    label_names: list[str] | None = _f(None, "names for the labels, in the order of labels (the model's id2label)",
                                       comma_list=True)
    max_steps: int | None = _f(None, "stop after this many optimizer steps", check=positive)
    max_train_examples: int | None = _f(None, "use only the first N training examples", check=positive)
    dropout: float | None = _f(None, "override the model's hidden and attention dropout",
                               check=number(0, 1, high_open=True))
    seed: int = _f(1234, "seed of initialisation, shuffling and dropout", check=non_negative)
    precision: str = _f("fp32", "parameter precision", choices=PRECISIONS)
    tp: int = _f(1, "tensor-parallel size", check=positive)
    pp: int = _f(1, "pipeline-parallel size", check=positive)
    ep: int = _f(1, "expert-parallel size (mixture-of-experts models)", check=positive)
    moe_aux_loss_coeff: float = _f(0.0, "weight of the router's load-balancing loss (mixture-of-experts models)",
                                   check=number(0))
    compile: bool = _f(False, "torch.compile the transformer layers for training and evaluation (see zhnlp "
                              "pretrain --help); the first steps include the compile time")
    log_interval: int = _f(10, "steps between training log lines", check=positive)
    oracle: bool = _f(False, "mrc: score the gold positions through windowing and span decoding (no training)")
    # ---- evaluation, best model, early stopping, checkpoints (transformers' TrainingArguments names)
    eval_steps: int | None = _f(None, "evaluate on the dev data every N steps (default: after every epoch)",
                                check=positive)
    metric_for_best_model: str | None = _f(None, "dev score that picks the best model and drives early stopping "
                                                 "(default: the task's metric: accuracy, f1, loss for sft and "
                                                 "mlm; an 'eval_' prefix is accepted; compute_metrics keys too)")
    greater_is_better: bool | None = _f(None, "whether a larger metric_for_best_model is better (default: yes, "
                                              "unless its name ends in 'loss')")
    early_stopping_patience: int | None = _f(None, "stop after this many evaluations without an improvement "
                                                   "(default: never stop early)", check=positive)
    early_stopping_threshold: float = _f(0.0, "smallest improvement of metric_for_best_model that counts",
                                         check=number(0))
    save_steps: int = _f(0, "steps between training checkpoints in OUTPUT/checkpoints (0: only on a stop signal)",
                         check=non_negative)
    save_total_limit: int = _f(2, "checkpoints to keep (0: keep every one)", check=non_negative)
    resume: bool = _f(False, "continue the run in the output directory from its newest checkpoint")

    def __post_init__(self):
        """Refuse values outside their range where they enter (the command line checks the same)."""
        for name in ("task", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} is required: FinetuneConfig(task=..., model=...)")
        for name in ("epochs", "batch_size", "eval_batch_size", "max_answer_length", "log_interval", "tp", "pp", "ep"):
            check_range(name, getattr(self, name), low=1)
        for name in ("micro_batch_size", "max_steps", "max_train_examples", "doc_stride", "max_query_length",
                     "eval_steps", "early_stopping_patience"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), low=1)
        if self.max_length is not None:
            check_range("max_length", self.max_length, low=8)
        if self.ner_stride is not None:
            check_range("ner_stride", self.ner_stride, low=0)
        if self.mask_prob is not None:
            check_range("mask_prob", self.mask_prob, "a number", 0, 1, low_open=True, high_open=True)
        check_range("seed", self.seed, low=0)
        check_range("save_steps", self.save_steps, low=0)
        check_range("save_total_limit", self.save_total_limit, low=0)
        check_range("lr", self.lr, "a number", low=0, low_open=True)
        check_range("warmup_ratio", self.warmup_ratio, "a number", 0, 1)
        check_range("weight_decay", self.weight_decay, "a number", low=0)
        check_range("moe_aux_loss_coeff", self.moe_aux_loss_coeff, "a number", low=0)
        check_range("early_stopping_threshold", self.early_stopping_threshold, "a number", low=0)
        if self.dropout is not None:
            check_range("dropout", self.dropout, "a number", 0, 1, high_open=True)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.metric_for_best_model is not None and (not isinstance(self.metric_for_best_model, str)
                                                       or not self.metric_for_best_model.strip()):
            raise ValueError(f"metric_for_best_model must be a metric name such as 'accuracy' or 'f1', "
                             f"got {self.metric_for_best_model!r}")
        if self.overwrite and self.resume:
            raise ValueError("overwrite and resume contradict each other: resume continues the run in output, "
                             "overwrite deletes it; pass one of them.")
        for name in ("labels", "label_names"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, str) or not all(isinstance(x, str) for x in value)):
                raise ValueError(f"{name} must be a list of strings, got {value!r}")

    @property
    def best_metric(self) -> str:
        """``metric_for_best_model`` without transformers' ``eval_`` prefix (None: the task's)."""
        name = self.metric_for_best_model
        return name.removeprefix("eval_") if name else name

    @property
    def higher_is_better(self) -> bool:
        if self.greater_is_better is not None:
            return bool(self.greater_is_better)
        return not (self.best_metric or "").endswith("loss")
