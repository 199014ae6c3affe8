"""transformers <-> megatron-core names for the dense ERNIE 4.5 decoder: one table, read by the engine.

Left: megatron parameter names of :class:`~zhnlp.models.ernie4_5.model.Ernie4_5Model` (``*`` = global
layer index). Right: keys of transformers' ``Ernie4_5ForCausalLM``. How each weight is split across
tensor-parallel ranks follows from the megatron module that owns it, as for the encoders.
"""

from __future__ import annotations

from zhnlp.conversion.engine import Table
from zhnlp.conversion.mappings import FuseGateUp, FuseGQA, Ignore, Rename, Tied
from zhnlp.models.ernie4_5.config import Ernie4_5Config

# A causal LM brings no separately initialisable head: the output layer is the model's (tied or not).
HEAD_PARTS = {"causal_lm": ()}


def normalise_key(arch: Ernie4_5Config):
    """A base ``Ernie4_5Model`` checkpoint saves its keys without ``model.``; the table uses the prefix."""
    def rename(key: str) -> str:
        if key.startswith(("embed_tokens.", "layers.", "norm.")):
            return "model." + key
        return key

    return rename


def table(arch: Ernie4_5Config) -> Table:
    """The mapping table for one architecture (sizes filled in)."""
    hf, mc = "model.layers.*.", "encoder.layers.*."
    mappings = [
        Rename("embedding.word_embeddings.weight", "model.embed_tokens.weight", vocab=True),
        Rename(f"{mc}input_layernorm.weight", f"{hf}input_layernorm.weight"),
        Rename(f"{mc}pre_mlp_layernorm.weight", f"{hf}post_attention_layernorm.weight"),
        Rename("encoder.final_layernorm.weight", "model.norm.weight"),
    ]
    for kind in ("weight", "bias"):
        a = f"{hf}self_attn."
        mappings += [
            FuseGQA(f"{mc}self_attention.linear_qkv.{kind}", q=f"{a}q_proj.{kind}", k=f"{a}k_proj.{kind}",
                    v=f"{a}v_proj.{kind}", head_dim=arch.head_dim, num_heads=arch.num_attention_heads,
                    num_groups=arch.num_key_value_heads),
            Rename(f"{mc}self_attention.linear_proj.{kind}", f"{a}o_proj.{kind}"),
            FuseGateUp(f"{mc}mlp.linear_fc1.{kind}", gate=f"{hf}mlp.gate_proj.{kind}", up=f"{hf}mlp.up_proj.{kind}"),
            Rename(f"{mc}mlp.linear_fc2.{kind}", f"{hf}mlp.down_proj.{kind}"),
        ]
    if arch.tie_word_embeddings:  # a copy on a last stage that is not also the first
        mappings.append(Tied("output_layer.weight", "model.embed_tokens.weight", vocab=True))
    else:
        mappings.append(Rename("output_layer.weight", "lm_head.weight", vocab=True))
    for m in mappings:
        if getattr(m, "vocab", False):
            m.vocab_size = arch.vocab_size
    ignores = [Ignore("model.rotary_emb.inv_freq", "a buffer computed from rope_theta, not a weight")]
    if arch.tie_word_embeddings:
        ignores.append(Ignore("lm_head.weight", "tied to model.embed_tokens.weight (tie_word_embeddings)"))
    return Table(mappings, ignores)


def _expected(arch: Ernie4_5Config, tbl: Table):
    chosen = [m for m in tbl.mappings if not isinstance(m, Tied)
              and (arch.use_bias or not m.megatron.endswith("bias"))]
    last = ("encoder.final", "output")  # checkpoint order: embeddings, layer by layer, final norm and output
    out = [(m, None) for m in chosen if "*" not in m.megatron and not m.megatron.startswith(last)]
    out += [(m, layer) for layer in range(arch.num_hidden_layers) for m in chosen if "*" in m.megatron]
    return out + [(m, None) for m in chosen if m.megatron.startswith(last)]


def expected_keys(arch: Ernie4_5Config, tbl: Table, head: str) -> dict[str, str | None]:
    """Every checkpoint key the whole model (all layers and stages) reads -> owning head part (None)."""
    return {k: None for m, layer in _expected(arch, tbl) for k in m.hf_keys(layer)}


def full_shapes(arch: Ernie4_5Config) -> dict[str, tuple[int, ...]]:
    """megatron parameter name (``*`` = any layer) -> its full shape: unsplit, vocabulary padded."""
    h, ffn, v, hd = arch.hidden_size, arch.intermediate_size, arch.padded_vocab_size, arch.head_dim
    qkv = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * hd
    mc = "encoder.layers.*."
    return {
        "embedding.word_embeddings.weight": (v, h),
        "output_layer.weight": (v, h),
        "encoder.final_layernorm.weight": (h,),
        f"{mc}input_layernorm.weight": (h,),
        f"{mc}pre_mlp_layernorm.weight": (h,),
        f"{mc}self_attention.linear_qkv.weight": (qkv, h),
        f"{mc}self_attention.linear_qkv.bias": (qkv,),
        f"{mc}self_attention.linear_proj.weight": (h, arch.num_attention_heads * hd),
        f"{mc}self_attention.linear_proj.bias": (h,),
        f"{mc}mlp.linear_fc1.weight": (2 * ffn, h),
        f"{mc}mlp.linear_fc1.bias": (2 * ffn,),
        f"{mc}mlp.linear_fc2.weight": (h, ffn),
        f"{mc}mlp.linear_fc2.bias": (h,),
    }


def expected_shapes(arch: Ernie4_5Config, tbl: Table, head: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every checkpoint key the whole model reads -> (its shape, the megatron parameter it feeds)."""
    full = full_shapes(arch)
    out = {}
    for m, layer in _expected(arch, tbl):
        param = m.megatron if layer is None else m.megatron.replace("*", str(layer))
        for k, shape in m.hf_shapes(layer, full[m.megatron]).items():
            out[k] = (shape, param)
    return out


def other_heads_keys(arch: Ernie4_5Config, tbl: Table, head: str) -> list[Ignore]:
    return []


def hf_architecture(arch: Ernie4_5Config, head: str) -> str:
    return "Ernie4_5ForCausalLM"


def save_prefix_rename(arch: Ernie4_5Config, head: str):
    return lambda k: k
