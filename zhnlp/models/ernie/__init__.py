"""The ERNIE encoder family: ERNIE 1.0/2.0/3.0 and the BERT-Chinese variants (model_type ernie/bert)."""

from zhnlp.models.common.family import Family
from zhnlp.models.ernie import bridge
from zhnlp.models.ernie.config import ErnieConfig
from zhnlp.models.ernie.model import ErnieModel, transformer_config

FAMILY = Family(
    name="ernie",
    model_types=("ernie", "bert"),
    config_class=ErnieConfig,
    model_class=ErnieModel,
    transformer_config=transformer_config,
    bridge=bridge,
)

__all__ = ["FAMILY", "ErnieConfig", "ErnieModel", "transformer_config"]
