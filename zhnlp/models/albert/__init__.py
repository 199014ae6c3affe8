"""The ALBERT family (model_type albert): factorised embeddings and layers shared by groups, e.g. CKIP's
albert-tiny-chinese / albert-base-chinese."""

from zhnlp.models.albert import bridge
from zhnlp.models.albert.config import AlbertConfig
from zhnlp.models.albert.model import AlbertModel, sync_shared_layer_grads, transformer_config
from zhnlp.models.common.family import Family

FAMILY = Family(
    name="albert",
    model_types=("albert",),
    config_class=AlbertConfig,
    model_class=AlbertModel,
    transformer_config=transformer_config,
    bridge=bridge,
    finalize_grads=sync_shared_layer_grads,
)

__all__ = ["FAMILY", "AlbertConfig", "AlbertModel", "sync_shared_layer_grads", "transformer_config"]
