"""The ELECTRA encoder family (model_type electra): hfl's Chinese ELECTRA discriminators and generators, LTP's
ELECTRA backbones."""

from zhnlp.models.common.family import Family
from zhnlp.models.electra import bridge
from zhnlp.models.electra.config import ElectraConfig
from zhnlp.models.electra.model import ElectraModel, transformer_config

FAMILY = Family(
    name="electra",
    model_types=("electra",),
    config_class=ElectraConfig,
    model_class=ElectraModel,
    transformer_config=transformer_config,
    bridge=bridge,
)

__all__ = ["FAMILY", "ElectraConfig", "ElectraModel", "transformer_config"]
