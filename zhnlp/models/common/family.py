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
    ``hf_architecture(arch, head)`` and ``save_prefix_rename(arch, head)``.
    """

    name: str
    model_types: tuple[str, ...]
    config_class: type
    model_class: type
    transformer_config: Callable
    bridge: ModuleType
