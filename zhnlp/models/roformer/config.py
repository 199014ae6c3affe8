"""Architecture of the RoFormer family (junnyu's Chinese RoFormer checkpoints, RoFormer-Sim).

A BERT-style post-LN encoder without a position table: sinusoidal rotary position embeddings turn the queries and
keys (and the values with ``rotary_value``) inside every self-attention; the embedding tables may be narrower
than the encoder (``embedding_size``, projected to ``hidden_size``). This is the architecture only, read from and
written to transformers' ``config.json``; how a run is laid out is a different type, and the two meet in
:func:`zhnlp.models.roformer.model.transformer_config`.

The pooler. transformers' ``RoFormerModel`` has none; junnyu's own ``roformer`` package (which RoFormer-Sim comes
from) adds one, ``dense`` + ``pooler_activation`` on the first token, whose output is the sim model's sentence
embedding. The rule here: **a config.json that names a** ``pooler_activation`` **has that pooler**; zhnlp's
``AutoModel`` then also returns ``pooler_output`` and reads ``roformer.pooler.dense.*`` (freshly initialised, with a
warning, when the checkpoint lacks them). Without the key the base model is transformers' (no pooler) and pooler
weights in a checkpoint are ignored, as transformers ignores them. The config decides, not the weights, because the
architecture must be known before any weight is read (shapes are checked for the whole model up front).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from zhnlp.errors import CheckpointError
from zhnlp.models.common import labels as L
from zhnlp.models.common.activations import ACTIVATIONS
from zhnlp.models.common.config_io import LabelledConfig

MODEL_TYPE = "roformer"
# Megatron pads the vocabulary so that every TP shard has the same size; a fixed multiple keeps a
# checkpoint's shapes independent of the layout (as for ERNIE).
VOCAB_PAD_MULTIPLE = 128
# junnyu's pooler activations (transformers' ACT2FN names): ours, plus "linear" (the identity, RoFormer-Sim's)
POOLER_ACTIVATIONS = (*ACTIVATIONS, "linear")
# Integer fields -> the least value they may take (type_vocab_size 0: no token type embeddings).
_SIZES = {"vocab_size": 1, "embedding_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
          "intermediate_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0}
_DROPOUT = (lambda x: 0 <= x < 1, "in [0, 1)")
_RATES = {"hidden_dropout_prob": _DROPOUT, "attention_probs_dropout_prob": _DROPOUT,
          "layer_norm_eps": (lambda x: x > 0, "> 0"), "initializer_range": (lambda x: x >= 0, ">= 0")}
_FIX = "Fix config.json or use the one that came with the checkpoint."
# config.json settings that zhnlp does not implement: key -> (the value zhnlp has, what to do instead)
_UNSUPPORTED = {
    "is_decoder": (False, "transformers' RoFormer then applies a causal (left-to-right) mask, which zhnlp does not "
                          "implement. RoFormer checkpoints used as encoders, such as RoFormer-Sim (whose package "
                          "config says is_decoder true but whose sentence embeddings are computed bidirectionally), "
                          "need \"is_decoder\": false in config.json: set it there (the configs `zhnlp models fetch` "
                          "writes already have it)"),
    "add_cross_attention": (False, "cross-attention is not implemented; use transformers for this checkpoint"),
    "tie_word_embeddings": (True, "the masked-LM decoder is always tied to the word embeddings here; use "
                                  "transformers for this checkpoint"),
    # RoFormer-V2 (junnyu's package): an RMS norm without weights and linears without biases
    "norm_type": ("layer_norm", "RoFormer-V2 is not implemented (neither by transformers' RoFormer)"),
    "use_bias": (True, "RoFormer-V2 is not implemented (neither by transformers' RoFormer)"),
}


@dataclass
class RoFormerConfig(LabelledConfig):
    """transformers' RoFormerConfig fields that define the network, plus junnyu's ``pooler_activation``
    (everything else config.json carries is kept in ``extra`` for saving)."""

    model_type: str = MODEL_TYPE
    vocab_size: int = 50000
    embedding_size: int | None = None  # None: hidden_size (transformers' rule)
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 1536
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    rotary_value: bool = False
    pooler_activation: str | None = None  # junnyu's pooler (see the module docstring); None: no pooler
    num_labels: int | None = None  # None: len(id2label), else 2 (transformers' default)
    id2label: dict | None = None
    problem_type: str | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type != MODEL_TYPE:
            raise CheckpointError(f"model_type {self.model_type!r} is not RoFormer ({MODEL_TYPE!r}).")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        self._check_values()
        if self.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"hidden_act {self.hidden_act!r} is not supported; known: {sorted(ACTIVATIONS)}.")
        if self.pooler_activation is not None and self.pooler_activation not in POOLER_ACTIVATIONS:
            raise CheckpointError(f"pooler_activation {self.pooler_activation!r} is not supported; known: "
                                  f"{sorted(POOLER_ACTIVATIONS)}. {_FIX}")
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}. {_FIX}")
        if self.head_dim % 2:
            raise CheckpointError(f"the attention head size hidden_size/num_attention_heads = {self.head_dim} is odd; "
                                  "rotary position embeddings turn pairs of features, so it must be even. " + _FIX)
        if not isinstance(self.rotary_value, bool):
            raise CheckpointError(f"rotary_value={self.rotary_value!r} must be true or false. {_FIX}")
        for key, (ok, why) in _UNSUPPORTED.items():
            if self.extra.get(key, ok) != ok:
                raise CheckpointError(f"config.json sets {key}={self.extra[key]!r}, which zhnlp does not support: "
                                      f"{why}.")
        # transformers' rule: a num_labels that contradicts id2label wins (with a warning) and
        # the label maps are rebuilt as LABEL_0..; from_dict has already done this, naming the file.
        self.num_labels, self.id2label = L.reconcile(self.num_labels, self.id2label, "RoFormerConfig", ValueError)
        L.check_problem_type(self.problem_type, self.num_labels, "RoFormerConfig", ValueError)

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
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not allowed(value):
                raise CheckpointError(f"{name}={value!r} is not valid; it must be a number {rule}. {_FIX}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def projects_embeddings(self) -> bool:
        """Whether the embeddings are narrower than the encoder (``embeddings_project`` maps them)."""
        return self.embedding_size != self.hidden_size

    @property
    def has_pooler(self) -> bool:
        return self.pooler_activation is not None

    @property
    def padded_vocab_size(self) -> int:
        m = VOCAB_PAD_MULTIPLE
        return (self.vocab_size + m - 1) // m * m

    def _finish_dict(self, out: dict) -> None:
        if self.pooler_activation is None:  # written only when set
            out.pop("pooler_activation")

    @property
    def tie_word_embeddings(self) -> bool:
        return True  # read by the initialisation: the MLM decoder starts equal to the word embeddings

    # ------------------------------------------------------------------ transformers' config.json
    TP_SPLIT = ("num_attention_heads", "intermediate_size")  # split by TP (ConfigFiles.check_layout)
