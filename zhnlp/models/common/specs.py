"""Layer specs: which megatron-core classes make up a post-LN encoder layer.

The parallel layer classes are chosen here, never inside model code: column-parallel for
QKV and the FFN's first linear, row-parallel for the attention output and the FFN's second
linear (megatron's classes, computed with a fused bias: :mod:`zhnlp.models.common.linear`).
The conversion engine infers how each weight is split from these classes.
"""

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec

from zhnlp.models.common.layers import LayerNorm, PostLNLayerSubmodules, PostLNTransformerLayer, SDPAttention
from zhnlp.models.common.linear import ColumnLinear, RowLinear


def post_ln_encoder_layer_spec() -> ModuleSpec:
    """Spec of one bidirectional post-LN encoder layer (BERT/ERNIE)."""
    return ModuleSpec(
        module=PostLNTransformerLayer,
        submodules=PostLNLayerSubmodules(
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.padding},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnLinear,
                    core_attention=SDPAttention,
                    linear_proj=RowLinear,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            post_attention_layernorm=LayerNorm,
            mlp=ModuleSpec(
                module=MLP,
                submodules=MLPSubmodules(linear_fc1=ColumnLinear, linear_fc2=RowLinear),
            ),
            mlp_bda=get_bias_dropout_add,
            post_mlp_layernorm=LayerNorm,
        ),
    )
