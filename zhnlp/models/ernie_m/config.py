"""Architecture of the ERNIE-M family (Baidu's multilingual ERNIE, model_type ``ernie_m``).

ERNIE-M is an XLM-R-shaped post-LN encoder: word and position embeddings (no token types; positions counted
from 2, as in PaddleNLP, so ``max_position_embeddings`` is 514 for 512 tokens), a padding mask taken from the pad
id when none is given, and a FFN with its own dropout after the activation (``act_dropout``). This is the
architecture only, read from and written to transformers 4.x's ``config.json``; how a run is laid out is a
different type, and the two meet in :func:`zhnlp.models.ernie_m.model.transformer_config`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from zhnlp.errors import CheckpointError
from zhnlp.models.common import labels as L
from zhnlp.models.common.activations import ACTIVATIONS
from zhnlp.models.common.config_io import LabelledConfig

MODEL_TYPE = "ernie_m"
# Megatron pads the vocabulary so that every TP shard has the same size; a fixed multiple keeps a
# checkpoint's shapes independent of the layout (as for ERNIE).
VOCAB_PAD_MULTIPLE = 128
# transformers' ErnieM computes position ids as 2, 3, ... (PaddleNLP's convention; rows 0 and 1 are unused).
POSITION_OFFSET = 2
# Integer fields -> the least value they may take (positions: room for the offset and one token).
_SIZES = {"vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
          "intermediate_size": 1, "max_position_embeddings": POSITION_OFFSET + 1}
_DROPOUT = (lambda x: 0 <= x < 1, "in [0, 1)")
_RATES = {"hidden_dropout_prob": _DROPOUT, "attention_probs_dropout_prob": _DROPOUT, "classifier_dropout": _DROPOUT,
          "act_dropout": _DROPOUT, "layer_norm_eps": (lambda x: x > 0, "> 0"),
          "initializer_range": (lambda x: x >= 0, ">= 0")}
_OPTIONAL = ("classifier_dropout", "act_dropout")  # None: hidden_dropout_prob, as transformers reads them
# config.json settings transformers' ErnieM reads that zhnlp does not implement: key -> (the value zhnlp has, why)
_UNSUPPORTED = {
    "position_embedding_type": ("absolute", "only absolute position embeddings are implemented"),
    "is_decoder": (False, "ERNIE-M is an encoder"),
}
# transformers' ErnieMConfig.attribute_map: older names config.json may use for two fields
_ALIASES = {"dropout": "classifier_dropout", "num_classes": "num_labels"}


@dataclass
class ErnieMConfig(LabelledConfig):
    """transformers 4.x's ErnieMConfig fields that define the network (everything else config.json carries is
    kept in ``extra`` for saving)."""

    model_type: str = MODEL_TYPE
    vocab_size: int = 250002
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 514
    initializer_range: float = 0.02
    pad_token_id: int = 1
    layer_norm_eps: float = 1e-5
    classifier_dropout: float | None = None
    act_dropout: float | None = 0.0
    num_labels: int | None = None  # None: len(id2label), else 2 (transformers' default)
    id2label: dict | None = None
    problem_type: str | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type != MODEL_TYPE:
            raise CheckpointError(f"model_type {self.model_type!r} is not ERNIE-M ({MODEL_TYPE!r}).")
        self._check_values()
        if self.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"hidden_act {self.hidden_act!r} is not supported; known: {sorted(ACTIVATIONS)}.")
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}.")
        for key, (ok, why) in _UNSUPPORTED.items():
            if self.extra.get(key, ok) != ok:
                raise CheckpointError(f"config.json sets {key}={self.extra[key]!r}, which zhnlp does not support "
                                      f"({why}); use transformers 4.x for this checkpoint.")
        self.num_labels, self.id2label = L.reconcile(self.num_labels, self.id2label, "ErnieMConfig", ValueError)
        L.check_problem_type(self.problem_type, self.num_labels, "ErnieMConfig", ValueError)

    def _check_values(self) -> None:
        """Sizes and rates of the wrong type or range are refused here, by name, instead of failing later inside
        the model."""
        for name, least in _SIZES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise CheckpointError(f"{name}={value!r} is not a valid size; it must be an integer >= {least}. "
                                      "Fix config.json or use the one that came with the checkpoint.")
            setattr(self, name, int(value))
        pad = self.pad_token_id
        if isinstance(pad, bool) or not isinstance(pad, numbers.Integral) or not 0 <= pad < self.vocab_size:
            raise CheckpointError(f"pad_token_id={pad!r} must be a token id in [0, {self.vocab_size}): ERNIE-M "
                                  "masks that id when no attention_mask is given. Fix config.json.")
        for name, (allowed, rule) in _RATES.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
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

    @property
    def activation_dropout(self) -> float:
        """The FFN's dropout after the activation (``act_dropout``, or ``hidden_dropout_prob`` when null)."""
        return self.hidden_dropout_prob if self.act_dropout is None else self.act_dropout

    @property
    def head_dropout(self) -> float:
        """The classifiers' dropout (``classifier_dropout``, or ``hidden_dropout_prob`` when null)."""
        return self.hidden_dropout_prob if self.classifier_dropout is None else self.classifier_dropout

    @classmethod
    def _normalise(cls, data: dict, where: str) -> dict:
        for old, new in _ALIASES.items():
            if old in data:
                value = data.pop(old)
                if new in data and data[new] != value:
                    raise CheckpointError(f"{where} sets both {old}={value!r} and {new}={data[new]!r}, which "
                                          f"transformers reads as the same setting; keep only {new}.")
                data[new] = value
        return data

    # ------------------------------------------------------------------ transformers' config.json
    TP_SPLIT = ("num_attention_heads", "intermediate_size")  # split by TP (ConfigFiles.check_layout)
