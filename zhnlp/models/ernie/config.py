"""Architecture of the ERNIE encoder family (ERNIE 1.0/2.0/3.0, BERT-Chinese, RoBERTa-wwm, MacBERT).

This is the architecture only, read from and written to transformers' ``config.json``.
How a run is laid out (TP/PP, precision, recompute) is a different type; the two meet in
:func:`zhnlp.models.ernie.model.transformer_config`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from zhnlp.errors import CheckpointError, LayoutError
from zhnlp.models.common.activations import ACTIVATIONS

MODEL_TYPES = ("ernie", "bert")
# Megatron pads the vocabulary so that every TP shard has the same size. We pad to a fixed
# multiple (not one that grows with TP) so that a checkpoint's shapes do not depend on layout.
VOCAB_PAD_MULTIPLE = 128


@dataclass
class ErnieConfig:
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
    num_labels: int = 2
    id2label: dict | None = None
    problem_type: str | None = None
    # Everything else config.json carried (architectures, tokenizer class, ...), kept for saving.
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise CheckpointError(f"model_type {self.model_type!r} is not in the ERNIE family {MODEL_TYPES}.")
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
        if self.id2label is not None:
            self.id2label = {int(k): v for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        m = VOCAB_PAD_MULTIPLE
        return (self.vocab_size + m - 1) // m * m

    @property
    def label2id(self) -> dict:
        return {v: k for k, v in (self.id2label or {}).items()}

    # ------------------------------------------------------------------ transformers' config.json
    @classmethod
    def from_dict(cls, data: dict, **overrides) -> "ErnieConfig":
        """Build from a config.json dict; ``overrides`` win (e.g. ``num_labels=3``)."""
        data = {**data, **overrides}
        if "num_labels" in overrides and "id2label" not in overrides:
            data["id2label"] = None
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k != "label2id"}
        return cls(**known, extra=extra)

    @classmethod
    def from_json_file(cls, path: str | Path, **overrides) -> "ErnieConfig":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path} is not valid JSON ({e}); re-download or re-save the checkpoint.") from None
        return cls.from_dict(data, **overrides)

    def to_dict(self, architecture: str | None = None) -> dict:
        """The config.json transformers reads back (its own class for ``model_type``)."""
        out = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name] = getattr(self, f.name)
        if self.id2label is None:
            out["id2label"] = {i: f"LABEL_{i}" for i in range(self.num_labels)}
        out["label2id"] = {v: k for k, v in out["id2label"].items()}
        out.pop("num_labels")
        if self.model_type == "bert":
            for k in ("task_type_vocab_size", "use_task_id"):
                out.pop(k)
        if architecture:
            out["architectures"] = [architecture]
        return out

    # ------------------------------------------------------------------ layout checks
    def check_layout(self, tp: int, pp: int, vpp: int | None = None) -> None:
        """Raise one clear LayoutError if this architecture cannot be split ``tp`` x ``pp`` ways."""
        problems = []
        if self.num_attention_heads % tp:
            problems.append(f"num_attention_heads={self.num_attention_heads} is not divisible by tp={tp}")
        if self.intermediate_size % tp:
            problems.append(f"intermediate_size (FFN width)={self.intermediate_size} is not divisible by tp={tp}")
        if self.padded_vocab_size % tp:
            problems.append(f"the padded vocabulary ({self.vocab_size} -> {self.padded_vocab_size}) "
                            f"is not divisible by tp={tp}")
        stages = pp * (vpp or 1)
        if self.num_hidden_layers % stages:
            problems.append(f"num_hidden_layers={self.num_hidden_layers} is not divisible by pp*vpp={stages}")
        if problems:
            raise LayoutError("this model does not fit the parallel layout: " + "; ".join(problems)
                              + ". Choose tp/pp/vpp that divide these sizes.")
