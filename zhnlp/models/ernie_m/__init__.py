"""The ERNIE-M family: Baidu's multilingual ERNIE (model_type ernie_m), as transformers 4.x stored it."""

from zhnlp.models.common.family import Family
from zhnlp.models.ernie_m import bridge
from zhnlp.models.ernie_m.config import ErnieMConfig
from zhnlp.models.ernie_m.model import ErnieMModel, transformer_config

FAMILY = Family(
    name="ernie_m",
    model_types=("ernie_m",),
    config_class=ErnieMConfig,
    model_class=ErnieMModel,
    transformer_config=transformer_config,
    bridge=bridge,
)

__all__ = ["FAMILY", "ErnieMConfig", "ErnieMModel", "transformer_config"]
