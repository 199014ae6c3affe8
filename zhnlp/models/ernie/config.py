"""Architecture of the ERNIE encoder family (ERNIE 1.0/2.0/3.0, BERT-Chinese, RoBERTa-wwm, MacBERT).

This is the architecture only, read from and written to transformers' ``config.json``.
How a run is laid out (TP/PP, precision, recompute) is a different type; the two meet in
:func:`zhnlp.models.ernie.model.transformer_config`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from zhnlp.errors import CheckpointError
from zhnlp.models.common.activations import ACTIVATIONS
from zhnlp.models.common import labels as L
from zhnlp.models.common.config_io import LabelledConfig

MODEL_TYPES = ("ernie", "bert")
# Megatron pads the vocabulary so that every TP shard has the same size. We pad to a fixed
# multiple (not one that grows with TP) so that a checkpoint's shapes do not depend on layout.
VOCAB_PAD_MULTIPLE = 128
# Integer fields -> the least value they may take (type_vocab_size 0: no token type embeddings).
_SIZES = {"vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
          "intermediate_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0, "task_type_vocab_size": 0}
# Real fields -> (test, the rule as the message states it).
_DROPOUT = (lambda x: 0 <= x < 1, "in [0, 1)")
_RATES = {"hidden_dropout_prob": _DROPOUT, "attention_probs_dropout_prob": _DROPOUT, "classifier_dropout": _DROPOUT,
          "layer_norm_eps": (lambda x: x > 0, "> 0"), "initializer_range": (lambda x: x >= 0, ">= 0")}


@dataclass
class ErnieConfig(LabelledConfig):
    """transformers' ErnieConfig/BertConfig fields that define the network."""

    model_type: str = "ernie"
    vocab_size: int = 40000
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    task_type_vocab_size: int = 3
    use_task_id: bool = False
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    classifier_dropout: float | None = None
    num_labels: int | None = None  # None: len(id2label), else 2 (transformers' default)
    id2label: dict | None = None
    problem_type: str | None = None
    # Everything else config.json carried (architectures, tokenizer class, ...), kept for saving.
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise CheckpointError(f"model_type {self.model_type!r} is not in the ERNIE family {MODEL_TYPES}.")
        self._check_values()
        if self.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"hidden_act {self.hidden_act!r} is not supported; known: {sorted(ACTIVATIONS)}.")
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}.")
        unsupported = {
            "position_embedding_type": ("absolute", "only absolute position embeddings are implemented"),
            "is_decoder": (False, "the ERNIE family here is an encoder"),
            "add_cross_attention": (False, "cross-attention is not implemented"),
        }
        for key, (ok, why) in unsupported.items():
            if self.extra.get(key, ok) != ok:
                raise CheckpointError(f"config.json sets {key}={self.extra[key]!r}, which zhnlp does not support "
                                      f"({why}); use transformers for this checkpoint.")
        if self.model_type == "bert":
            self.use_task_id = False
        # transformers' rule: a num_labels that contradicts id2label wins (with a warning) and
        # the label maps are rebuilt as LABEL_0..; from_dict has already done this, naming the file.
        self.num_labels, self.id2label = L.reconcile(self.num_labels, self.id2label, "ErnieConfig", ValueError)
        L.check_problem_type(self.problem_type, self.num_labels, "ErnieConfig", ValueError)

    def _check_values(self) -> None:
        """Sizes and rates of the wrong type or range (a string, a bool, 0 layers, dropout 1.5) are refused
        here, by name, instead of failing later as a TypeError or ZeroDivisionError inside the model."""
        for name, least in _SIZES.items():
            value = getattr(self, name)
            if name == "task_type_vocab_size" and self.use_task_id:
                least = 1  # use_task_id needs at least one task type embedding
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise CheckpointError(f"{name}={value!r} is not a valid size; it must be an integer >= {least}. "
                                      "Fix config.json or use the one that came with the checkpoint.")
            setattr(self, name, int(value))
        for name, (allowed, rule) in _RATES.items():
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue  # None: use hidden_dropout_prob
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not allowed(value):
                raise CheckpointError(f"{name}={value!r} is not valid; it must be a number {rule}. "
                                      "Fix config.json or use the one that came with the checkpoint.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        m = VOCAB_PAD_MULTIPLE
        return (self.vocab_size + m - 1) // m * m

    def _finish_dict(self, out: dict) -> None:
        if self.model_type == "bert":  # transformers' BertConfig has no task ids
            for k in ("task_type_vocab_size", "use_task_id"):
                out.pop(k)

    # ------------------------------------------------------------------ transformers' config.json
    TP_SPLIT = ("num_attention_heads", "intermediate_size")  # split by TP (ConfigFiles.check_layout)
