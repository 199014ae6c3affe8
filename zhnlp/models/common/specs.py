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


def run_layout_options(tp: int, pp: int, vpp: int | None, params_dtype) -> dict:
    """The TransformerConfig fields every zhnlp family sets the same way: the parallel layout, the
    parameter dtype, megatron's fused kernels off (they need CUDA/Apex/TE; the unfused paths are exact),
    CPU initialisation (the same weights whatever the TP layout) and unbatched p2p (with vpp under gloo the
    previous and next stage can be the same peer, and batched p2p swaps them)."""
    return dict(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=True,
        batch_p2p_comm=False,
    )

