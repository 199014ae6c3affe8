"""The RoFormer encoder family (model_type ``roformer``): junnyu's Chinese RoFormer checkpoints and RoFormer-Sim."""

from zhnlp.models.common.family import Family
from zhnlp.models.roformer import bridge
from zhnlp.models.roformer.config import RoFormerConfig
from zhnlp.models.roformer.model import RoFormerModel, transformer_config

FAMILY = Family(
    name="roformer",
    model_types=("roformer",),
    config_class=RoFormerConfig,
    model_class=RoFormerModel,
    transformer_config=transformer_config,
    bridge=bridge,
)

__all__ = ["FAMILY", "RoFormerConfig", "RoFormerModel", "transformer_config"]
