"""The ERNIE 4.5 decoder family: dense (``Ernie4_5ForCausalLM``, model_type ``ernie4_5``) and mixture of experts
(``Ernie4_5_MoeForCausalLM``, ``ernie4_5_moe``)."""

from zhnlp.models.common.family import Family
from zhnlp.models.ernie4_5 import bridge
from zhnlp.models.ernie4_5.config import Ernie4_5Config, Ernie4_5MoeConfig
from zhnlp.models.ernie4_5.model import Ernie4_5Model, transformer_config

FAMILY = Family(
    name="ernie4_5",
    model_types=("ernie4_5", "ernie4_5_moe"),
    config_class=Ernie4_5Config,
    model_class=Ernie4_5Model,
    transformer_config=transformer_config,
    bridge=bridge,
)

__all__ = ["FAMILY", "Ernie4_5Config", "Ernie4_5MoeConfig", "Ernie4_5Model", "transformer_config"]
