"""Architecture of the ERNIE 4.5 decoders: dense (transformers' ``Ernie4_5Config``, model_type ``ernie4_5``)
and mixture-of-experts (``Ernie4_5_MoeConfig``, model_type ``ernie4_5_moe``: :class:`Ernie4_5MoeConfig`).

Architecture only, read from and written to transformers' ``config.json``; the run layout meets it in
:func:`zhnlp.models.ernie4_5.model.transformer_config`.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import ClassVar

from zhnlp.errors import CheckpointError
from zhnlp.models.common.config_io import ConfigFiles

MODEL_TYPES = ("ernie4_5", "ernie4_5_moe")
VOCAB_PAD_MULTIPLE = 128  # as for the encoders: checkpoint shapes never depend on the layout
_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "intermediate_size", "max_position_embeddings")
_FIX = "Fix config.json or use the one that came with the checkpoint."


@dataclass
class Ernie4_5Config(ConfigFiles):
    """transformers' Ernie4_5Config fields that define the network.

    ``from_dict`` returns an :class:`Ernie4_5MoeConfig` for model_type ``ernie4_5_moe``."""

    KIND: ClassVar[str] = "ernie4_5"
    model_type: str = "ernie4_5"
    vocab_size: int = 103424
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 18
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 2
    head_dim: int | None = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_bias: bool = False
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list | None = 2
    # Everything else config.json carried (architectures, dtype, use_cache, ...), kept for saving.
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type != self.KIND:
            raise CheckpointError(f"model_type {self.model_type!r} is not {self.KIND!r}: use "
                                  f"{type(self).__name__} for {self.KIND!r} only (Ernie4_5Config.from_dict picks "
                                  "the class from model_type).")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        for name in _SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise CheckpointError(f"{name}={value!r} is not a valid size; it must be an integer >= 1. {_FIX}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
                raise CheckpointError(f"{name}={value!r} is not valid; it must be a number > 0. {_FIX}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                                  f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention). {_FIX}")
        if self.hidden_act != "silu":
            raise CheckpointError(f"hidden_act {self.hidden_act!r} is not supported for ERNIE 4.5 (SwiGLU needs "
                                  "'silu'); use transformers for this checkpoint.")

    @property
    def padded_vocab_size(self) -> int:
        m = VOCAB_PAD_MULTIPLE
        return (self.vocab_size + m - 1) // m * m

    @property
    def num_labels(self) -> None:  # family-independent code asks; a causal LM has no label head
        return None

    problem_type = None
    is_moe = False

    def is_moe_layer(self, layer: int) -> bool:
        """Whether global layer ``layer`` (0-based) has a mixture-of-experts MLP (never for the dense model)."""
        return False

    # ------------------------------------------------------------------ transformers' config.json
    @classmethod
    def from_dict(cls, data: dict, *, source: str | None = None, **overrides) -> "Ernie4_5Config":
        """Build from a config.json dict; ``overrides`` win. ``source`` names the file in error messages.

        RoPE: transformers 5 writes ``rope_parameters`` ({rope_type, rope_theta}), older files ``rope_theta``
        and ``rope_scaling``; only the default (unscaled) RoPE is implemented, anything else is refused."""
        where = source or "config.json"
        if not isinstance(data, dict):
            raise CheckpointError(f"{where} must be a JSON object of model settings, got {type(data).__name__}; "
                                  "re-save the checkpoint or restore its config.json.")
        data = {**data, **overrides}
        if cls is Ernie4_5Config and data.get("model_type") == Ernie4_5MoeConfig.KIND:
            cls = Ernie4_5MoeConfig
        rope = data.pop("rope_parameters", None) or {}
        scaling = data.pop("rope_scaling", None) or {}
        for what, params in (("rope_parameters", rope), ("rope_scaling", scaling)):
            if not isinstance(params, dict):
                raise CheckpointError(f"{where}: {what}={params!r} must be an object. {_FIX}")
            kind = params.get("rope_type", params.get("type", "default"))
            if kind != "default":
                raise CheckpointError(f"{where}: {what} has rope_type {kind!r}; zhnlp implements only the default "
                                      "(unscaled) RoPE of ERNIE 4.5; use transformers for this checkpoint.")
        if "rope_theta" in rope:
            data["rope_theta"] = rope["rope_theta"]
        return cls._build(data, source, dropped=("id2label", "label2id"))

    def to_dict(self, architecture: str | None = None) -> dict:
        """The config.json transformers reads back (``rope_parameters`` as transformers 5 writes it)."""
        out = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name not in ("extra", "rope_theta"):
                out[f.name] = getattr(self, f.name)
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if architecture:
            out["architectures"] = [architecture]
        return out

    TP_SPLIT = ("num_key_value_heads", "intermediate_size")  # split by TP (ConfigFiles.check_layout)


_MOE_SIZES = ("moe_intermediate_size", "moe_k", "moe_num_experts", "moe_layer_interval")


@dataclass
class Ernie4_5MoeConfig(Ernie4_5Config):
    """transformers' Ernie4_5_MoeConfig: the dense fields plus the mixture of experts.

    Layer ``i`` (0-based) has an MoE MLP when ``(i + 1) % moe_layer_interval == 0`` and
    ``moe_layer_start_index <= i <= moe_layer_end_index``; the others a dense SwiGLU MLP of
    ``intermediate_size``. ``moe_layer_end_index = -1`` means the last layer (transformers writes it resolved)."""

    KIND: ClassVar[str] = "ernie4_5_moe"
    model_type: str = "ernie4_5_moe"
    hidden_size: int = 2560
    intermediate_size: int = 12288
    num_hidden_layers: int = 28
    num_attention_heads: int = 20
    num_key_value_heads: int | None = 4
    head_dim: int | None = None
    moe_intermediate_size: int = 1536
    moe_k: int = 6
    moe_num_experts: int = 64
    moe_num_shared_experts: int = 2
    moe_layer_start_index: int = 1
    moe_layer_end_index: int = -1
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False

    is_moe = True

    def __post_init__(self):
        super().__post_init__()
        for name in _MOE_SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise CheckpointError(f"{name}={value!r} is not valid; it must be an integer >= 1. {_FIX}")
        for name in ("moe_num_shared_experts", "moe_layer_start_index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise CheckpointError(f"{name}={value!r} is not valid; it must be an integer >= 0. {_FIX}")
        if self.moe_layer_end_index == -1:
            self.moe_layer_end_index = self.num_hidden_layers - 1
        if not isinstance(self.moe_layer_end_index, numbers.Integral) or self.moe_layer_end_index < 0:
            raise CheckpointError(f"moe_layer_end_index={self.moe_layer_end_index!r} is not valid; it must be a layer "
                                  f"index (0-based) or -1 for the last layer. {_FIX}")
        if self.moe_k > self.moe_num_experts:
            raise CheckpointError(f"moe_k={self.moe_k} chooses more experts than there are "
                                  f"(moe_num_experts={self.moe_num_experts}). {_FIX}")
        for name in ("moe_norm_min", "router_aux_loss_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
                raise CheckpointError(f"{name}={value!r} is not valid; it must be a number >= 0. {_FIX}")

    def is_moe_layer(self, layer: int) -> bool:
        return ((layer + 1) % self.moe_layer_interval == 0
                and self.moe_layer_start_index <= layer <= self.moe_layer_end_index)

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    @property
    def shared_expert_size(self) -> int:
        """Width of the shared experts' MLP (0: none)."""
        return self.moe_intermediate_size * self.moe_num_shared_experts

    TP_SPLIT = ("num_key_value_heads", "intermediate_size")

    def check_experts(self, ep: int, etp: int, tp: int) -> None:
        """Raise one LayoutError when the experts cannot be split ``ep`` ways (and each ``etp`` ways)."""
        from zhnlp.errors import LayoutError

        problems = []
        if self.moe_num_experts % ep:
            problems.append(f"moe_num_experts={self.moe_num_experts} is not divisible by ep={ep}")
        if self.moe_intermediate_size % etp:
            problems.append(f"moe_intermediate_size={self.moe_intermediate_size} is not divisible by the expert "
                            f"tensor-parallel size etp={etp}")
        if self.shared_expert_size % tp:
            problems.append(f"the shared experts' width moe_intermediate_size*moe_num_shared_experts="
                            f"{self.shared_expert_size} is not divisible by tp={tp}")
        if problems:
            raise LayoutError("this model does not fit the parallel layout: " + "; ".join(problems)
                              + ". Choose ep/etp/tp that divide these sizes.")
