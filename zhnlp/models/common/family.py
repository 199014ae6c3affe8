"""What the family-independent code needs to know about a model family."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable


@dataclass(frozen=True)
class Family:
    """A model family: its architecture config, its megatron module, its conversion bridge.

    ``bridge`` is a module providing ``table(arch)``, ``expected_keys(arch, table, head)``,
    ``other_heads_keys(arch, table, head)``, ``expected_shapes(arch, table, head)`` (key ->
    (shape, megatron parameter), checked before any weight is read), ``normalise_key(arch)``, ``HEAD_PARTS``,
    ``hf_architecture(arch, head)`` and ``save_prefix_rename(arch, head)``; optionally
    ``constant_weights(arch)`` (checkpoint key -> tensor: frozen tables transformers stores as parameters but
    zhnlp recomputes from the config, e.g. RoFormer's sinusoidal positions; written by save_pretrained and
    counted by num_parameters, the bridge's table ignores them on load).
    """

    name: str
    model_types: tuple[str, ...]
    config_class: type
    model_class: type
    transformer_config: Callable
    bridge: ModuleType
    # Gradient reductions the family needs besides megatron's: ``finalize_grads(chunks)`` on this rank's (wrapped)
    # model chunks, run by the trainer on every rank after a step's backward passes and before megatron's
    # finalize_model_grads (ALBERT: sums the gradients of its shared layers' copies over chunks and stages).
    finalize_grads: Callable | None = None
