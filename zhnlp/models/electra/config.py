"""Architecture of the ELECTRA encoder family (hfl's Chinese ELECTRA discriminators and generators, LTP's
ELECTRA backbones).

A BERT-style post-LN encoder whose embedding tables may be narrower than the encoder (``embedding_size``, projected
to ``hidden_size``). This is the architecture only, read from and written to transformers' ``config.json``; how a
run is laid out is a different type, and the two meet in :func:`zhnlp.models.electra.model.transformer_config`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from zhnlp.errors import CheckpointError
from zhnlp.models.common import labels as L
from zhnlp.models.common.activations import ACTIVATIONS
from zhnlp.models.common.config_io import LabelledConfig

MODEL_TYPE = "electra"
# Megatron pads the vocabulary so that every TP shard has the same size; a fixed multiple keeps a
# checkpoint's shapes independent of the layout (as for ERNIE).
VOCAB_PAD_MULTIPLE = 128
# Integer fields -> the least value they may take (type_vocab_size 0: no token type embeddings).
_SIZES = {"vocab_size": 1, "embedding_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
          "intermediate_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0}
_DROPOUT = (lambda x: 0 <= x < 1, "in [0, 1)")
_RATES = {"hidden_dropout_prob": _DROPOUT, "attention_probs_dropout_prob": _DROPOUT, "classifier_dropout": _DROPOUT,
          "layer_norm_eps": (lambda x: x > 0, "> 0"), "initializer_range": (lambda x: x >= 0, ">= 0")}
# config.json settings transformers' ELECTRA accepts that zhnlp does not implement: key -> (the value zhnlp has, why)
_UNSUPPORTED = {
    "position_embedding_type": ("absolute", "only absolute position embeddings are implemented"),
    "is_decoder": (False, "ELECTRA here is an encoder (ElectraForCausalLM is not implemented)"),
    "add_cross_attention": (False, "cross-attention is not implemented"),
}


@dataclass
class ElectraConfig(LabelledConfig):
    """transformers' ElectraConfig fields that define the network (the ``summary_*`` fields of its
    multiple-choice head and everything else config.json carries are kept in ``extra`` for saving)."""

    model_type: str = MODEL_TYPE
    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True  # the generator's vocabulary projection shares the word embeddings
    num_labels: int | None = None  # None: len(id2label), else 2 (transformers' default)
    id2label: dict | None = None
    problem_type: str | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type != MODEL_TYPE:
            raise CheckpointError(f"model_type {self.model_type!r} is not ELECTRA ({MODEL_TYPE!r}).")
        self._check_values()
        if self.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"hidden_act {self.hidden_act!r} is not supported; known: {sorted(ACTIVATIONS)}.")
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}.")
        for key, (ok, why) in _UNSUPPORTED.items():
            if self.extra.get(key, ok) != ok:
                raise CheckpointError(f"config.json sets {key}={self.extra[key]!r}, which zhnlp does not support "
                                      f"({why}); use transformers for this checkpoint.")
        if not isinstance(self.tie_word_embeddings, bool):
            raise CheckpointError(f"tie_word_embeddings={self.tie_word_embeddings!r} must be true or false.")
        self.num_labels, self.id2label = L.reconcile(self.num_labels, self.id2label, "ElectraConfig", ValueError)
        L.check_problem_type(self.problem_type, self.num_labels, "ElectraConfig", ValueError)

    def _check_values(self) -> None:
        """Sizes and rates of the wrong type or range are refused here, by name, instead of failing later
        inside the model."""
        for name, least in _SIZES.items():
            value = getattr(self, name)
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
    def factorised(self) -> bool:
        """Whether the embedding tables are narrower (or wider) than the encoder: transformers then adds
        ``embeddings_project`` (embedding_size -> hidden_size)."""
        return self.embedding_size != self.hidden_size

    @property
    def padded_vocab_size(self) -> int:
        m = VOCAB_PAD_MULTIPLE
        return (self.vocab_size + m - 1) // m * m

    # ------------------------------------------------------------------ transformers' config.json
    TP_SPLIT = ("num_attention_heads", "intermediate_size")  # split by TP (ConfigFiles.check_layout)
