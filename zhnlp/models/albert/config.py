"""Architecture of the ALBERT family (transformers' ``AlbertConfig``, model_type ``albert``): factorised
embeddings and transformer layers shared by groups.

This is the architecture only, read from and written to transformers' ``config.json``; the run layout meets
it in :func:`zhnlp.models.albert.model.transformer_config`. Which layer weights serve which layer is decided
here (:attr:`AlbertConfig.layer_slots`), by transformers' own rule.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from zhnlp.errors import CheckpointError
from zhnlp.models.common import labels as L
from zhnlp.models.common.activations import ACTIVATIONS
from zhnlp.models.common.config_io import LabelledConfig

MODEL_TYPES = ("albert",)
# As for the other encoders: a fixed multiple, so that checkpoint shapes never depend on the layout.
VOCAB_PAD_MULTIPLE = 128
_FIX = "Fix config.json or use the one that came with the checkpoint."
# Integer fields -> the least value they may take.
_SIZES = {"vocab_size": 1, "embedding_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_hidden_groups": 1,
          "inner_group_num": 1, "num_attention_heads": 1, "intermediate_size": 1, "max_position_embeddings": 1,
          "type_vocab_size": 1}
_DROPOUT = (lambda x: 0 <= x < 1, "in [0, 1)")
_RATES = {"hidden_dropout_prob": _DROPOUT, "attention_probs_dropout_prob": _DROPOUT,
          "classifier_dropout_prob": _DROPOUT, "layer_norm_eps": (lambda x: x > 0, "> 0"),
          "initializer_range": (lambda x: x >= 0, ">= 0")}
# config.json settings transformers' ALBERT (or the original one) has and zhnlp does not -> (the value
# zhnlp implements, why another one is refused).
_UNSUPPORTED = {
    "position_embedding_type": ("absolute", "only absolute position embeddings are implemented"),
    "is_decoder": (False, "ALBERT here is an encoder"),
    "add_cross_attention": (False, "cross-attention is not implemented"),
}


@dataclass
class AlbertConfig(LabelledConfig):
    """transformers' AlbertConfig fields that define the network.

    ``num_hidden_layers`` layers are applied, each an application of one of ``num_hidden_groups`` groups of
    ``inner_group_num`` layers (so ``num_hidden_layers x inner_group_num`` transformer layers run); the
    weights of a group are shared by every application of it.
    """

    model_type: str = "albert"
    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_size: int = 4096
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    classifier_dropout_prob: float | None = 0.1
    pad_token_id: int | None = 0
    tie_word_embeddings: bool = True
    num_labels: int | None = None  # None: len(id2label), else 2 (transformers' default)
    id2label: dict | None = None
    problem_type: str | None = None
    # Everything else config.json carried (architectures, bos/eos ids, the original ALBERT's unused
    # net_structure_type, gap_size, ...), kept for saving.
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise CheckpointError(f"model_type {self.model_type!r} is not in the ALBERT family {MODEL_TYPES}.")
        self._check_values()
        if self.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"hidden_act {self.hidden_act!r} is not supported; known: {sorted(ACTIVATIONS)}.")
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}. {_FIX}")
        if self.tie_word_embeddings is not True:
            raise CheckpointError("config.json sets tie_word_embeddings=False, which zhnlp's ALBERT does not support "
                                  "(its masked-LM decoder is the word embedding table); use transformers for this "
                                  "checkpoint.")
        for key, (ok, why) in _UNSUPPORTED.items():
            if self.extra.get(key, ok) != ok:
                raise CheckpointError(f"config.json sets {key}={self.extra[key]!r}, which zhnlp does not support "
                                      f"({why}); use transformers for this checkpoint.")
        used = {g for g, _ in self.layer_slots}
        if len(used) != self.num_hidden_groups:
            unused = sorted(set(range(self.num_hidden_groups)) - used)
            raise CheckpointError(f"num_hidden_groups={self.num_hidden_groups} with num_hidden_layers="
                                  f"{self.num_hidden_layers} leaves layer groups {unused} unused (transformers keeps "
                                  "their weights but never applies them); zhnlp refuses such a config. Use at most "
                                  "num_hidden_layers groups.")
        self.num_labels, self.id2label = L.reconcile(self.num_labels, self.id2label, "AlbertConfig", ValueError)
        L.check_problem_type(self.problem_type, self.num_labels, "AlbertConfig", ValueError)

    def _check_values(self) -> None:
        """Sizes and rates of the wrong type or range are refused here, by name, instead of failing later
        inside the model."""
        for name, least in _SIZES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise CheckpointError(f"{name}={value!r} is not a valid size; it must be an integer >= {least}. "
                                      + _FIX)
            setattr(self, name, int(value))
        for name, (allowed, rule) in _RATES.items():
            value = getattr(self, name)
            if value is None and name == "classifier_dropout_prob":
                continue  # None: hidden_dropout_prob (transformers' token classification rule)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not allowed(value):
                raise CheckpointError(f"{name}={value!r} is not valid; it must be a number {rule}. {_FIX}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        m = VOCAB_PAD_MULTIPLE
        return (self.vocab_size + m - 1) // m * m

    @property
    def classifier_dropout(self) -> float:
        """The dropout before the classifier (a sequence's, a token's)."""
        p = self.classifier_dropout_prob
        return self.hidden_dropout_prob if p is None else p

    @property
    def num_layers(self) -> int:
        """Transformer layers applied (megatron's ``num_layers``): ``num_hidden_layers x inner_group_num``."""
        return self.num_hidden_layers * self.inner_group_num

    @property
    def layer_slots(self) -> tuple[tuple[int, int], ...]:
        """For each applied layer ``j`` (0-based, ``num_layers`` of them): ``(group, inner)``, the weights it uses.

        transformers' AlbertTransformer applies, for ``i`` in ``range(num_hidden_layers)``, the whole group
        ``int(i / (num_hidden_layers / num_hidden_groups))`` (the same float expression, so that rounding
        agrees), i.e. its ``inner_group_num`` layers in order: applied layer ``j = i * inner_group_num + k``
        is the group's layer ``k``."""
        n, g = self.num_hidden_layers, self.num_hidden_groups
        return tuple((int(i / (n / g)), k) for i in range(n) for k in range(self.inner_group_num))

    def slot_owner(self, layer: int) -> int:
        """The first applied layer that uses the same weights as applied layer ``layer``: the one whose
        parameter names the weights carry on every pipeline stage."""
        return self.layer_slots.index(self.layer_slots[layer])

    def pipeline_layers(self) -> tuple[int, str]:
        return self.num_layers, (f"num_hidden_layers x inner_group_num = {self.num_hidden_layers} x "
                                 f"{self.inner_group_num} = {self.num_layers} (the layers applied)")

    # ------------------------------------------------------------------ transformers' config.json
    TP_SPLIT = ("num_attention_heads", "intermediate_size")  # split by TP (ConfigFiles.check_layout)
