"""transformers <-> megatron-core names for the ERNIE 4.5 decoders (dense and MoE): one table, read by the engine.

Left: megatron parameter names of :class:`~zhnlp.models.ernie4_5.model.Ernie4_5Model` (``*`` = global
layer index). Right: keys of transformers' ``Ernie4_5ForCausalLM``. How each weight is split across
tensor-parallel ranks follows from the megatron module that owns it, as for the encoders.
"""

from __future__ import annotations

from zhnlp.conversion.engine import Table
from zhnlp.conversion.mappings import FuseGateUp, FuseGQA, Ignore, Rename, Tied, Unsqueeze, _fill
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
    """The mapping table for one architecture (sizes filled in).

    MoE layers (model_type ``ernie4_5_moe``): megatron's router ``mlp.router`` <-> ``mlp.gate`` (fp32) and
    ``mlp.moe_statics.e_score_correction_bias`` (stored ``(1, E)``); routed expert ``e`` (global index) <->
    ``mlp.experts.e.{gate,up,down}_proj`` (the layout transformers writes); shared experts <->
    ``mlp.shared_experts.*``. Dense layers of an MoE model map like the dense model's."""
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
        ]
        mappings += _mlp(f"{mc}mlp.", f"{hf}mlp.", kind, part="dense")
        if arch.is_moe:
            mappings += _mlp(f"{mc}mlp.shared_experts.", f"{hf}mlp.shared_experts.", kind, part="shared")
    if arch.is_moe:
        e_mc, e_hf = f"{mc}mlp.experts.local_experts.*.", f"{hf}mlp.experts.*."
        mappings += [
            _part(Rename(f"{mc}mlp.router.weight", f"{hf}mlp.gate.weight"), "moe"),
            _part(Unsqueeze(f"{mc}mlp.router.e_score_correction_bias",
                            f"{hf}mlp.moe_statics.e_score_correction_bias"), "moe"),
            _part(FuseGateUp(f"{e_mc}linear_fc1.weight", gate=f"{e_hf}gate_proj.weight", up=f"{e_hf}up_proj.weight",
                             expert=True), "expert"),
            _part(Rename(f"{e_mc}linear_fc2.weight", f"{e_hf}down_proj.weight"), "expert"),
        ]
    if arch.tie_word_embeddings:  # a copy on a last stage that is not also the first
        mappings.append(Tied("output_layer.weight", "model.embed_tokens.weight", vocab=True))
    else:
        mappings.append(Rename("output_layer.weight", "lm_head.weight", vocab=True))
    mappings.append(_part(Rename("output_layer.bias", "lm_head.bias", vocab=True), "bias"))
    for m in mappings:
        if getattr(m, "vocab", False):
            m.vocab_size = arch.vocab_size
    ignores = [Ignore("model.rotary_emb.inv_freq", "a buffer computed from rope_theta, not a weight")]
    if arch.tie_word_embeddings:
        ignores.append(Ignore("lm_head.weight", "tied to model.embed_tokens.weight (tie_word_embeddings)"))
    if arch.is_moe:  # as transformers: ERNIE 4.5's multi-token-prediction layers are not part of the model
        ignores += [Ignore(p, "multi-token-prediction (MTP) weights, unused by the causal LM (as in transformers)")
                    for p in ("mtp*", "model.mtp*")]
    return Table(mappings, ignores)


def _part(mapping, part: str):
    mapping.part = part  # which layers/modules own it: see _chosen
    return mapping


def _mlp(mc: str, hf: str, kind: str, part: str):
    return [_part(FuseGateUp(f"{mc}linear_fc1.{kind}", gate=f"{hf}gate_proj.{kind}", up=f"{hf}up_proj.{kind}"), part),
            _part(Rename(f"{mc}linear_fc2.{kind}", f"{hf}down_proj.{kind}"), part)]


def _chosen(arch: Ernie4_5Config, tbl: Table):
    """The mappings that have a parameter in this architecture (biases only with use_bias; lm_head's bias only
    for the MoE model with use_bias; shared experts only when there are some)."""
    out = []
    for m in tbl.mappings:
        part = getattr(m, "part", None)
        if isinstance(m, Tied) or (not arch.use_bias and m.megatron.endswith("bias") and part != "moe"):
            continue
        if part == "bias" and not arch.is_moe:
            continue
        if part == "shared" and not arch.shared_expert_size:
            continue
        out.append(m)
    return out


def _expected(arch: Ernie4_5Config, tbl: Table):
    """(mapping, index) of every parameter of the whole model, in checkpoint order: embeddings, layer by layer
    (dense or MoE MLP; experts by global index), final norm and output layer."""
    chosen = _chosen(arch, tbl)
    last = ("encoder.final", "output")
    out = [(m, None) for m in chosen if "*" not in m.megatron and not m.megatron.startswith(last)]
    for layer in range(arch.num_hidden_layers):
        moe = arch.is_moe_layer(layer)
        for m in chosen:
            if "*" not in m.megatron:
                continue
            part = getattr(m, "part", None)
            if part == "dense" and moe or part in ("moe", "shared") and not moe:
                continue
            if part == "expert":
                if moe:
                    out += [(m, (layer, e)) for e in range(arch.moe_num_experts)]
                continue
            out.append((m, layer))
    return out + [(m, None) for m in chosen if m.megatron.startswith(last)]


def expected_keys(arch: Ernie4_5Config, tbl: Table, head: str) -> dict[str, str | None]:
    """Every checkpoint key the whole model (all layers and stages) reads -> owning head part (None)."""
    return {k: None for m, layer in _expected(arch, tbl) for k in m.hf_keys(layer)}


def full_shapes(arch: Ernie4_5Config) -> dict[str, tuple[int, ...]]:
    """megatron parameter name (``*`` = any layer / expert) -> its full shape: unsplit, vocabulary padded."""
    h, ffn, v, hd = arch.hidden_size, arch.intermediate_size, arch.padded_vocab_size, arch.head_dim
    qkv = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * hd
    mc = "encoder.layers.*."
    out = {
        "embedding.word_embeddings.weight": (v, h),
        "output_layer.weight": (v, h),
        "output_layer.bias": (v,),
        "encoder.final_layernorm.weight": (h,),
        f"{mc}input_layernorm.weight": (h,),
        f"{mc}pre_mlp_layernorm.weight": (h,),
        f"{mc}self_attention.linear_qkv.weight": (qkv, h),
        f"{mc}self_attention.linear_qkv.bias": (qkv,),
        f"{mc}self_attention.linear_proj.weight": (h, arch.num_attention_heads * hd),
        f"{mc}self_attention.linear_proj.bias": (h,),
    }
    widths = {f"{mc}mlp.": ffn}
    if arch.is_moe:
        e, moe = arch.moe_num_experts, arch.moe_intermediate_size
        widths.update({f"{mc}mlp.shared_experts.": arch.shared_expert_size,
                       f"{mc}mlp.experts.local_experts.*.": moe})
        out.update({f"{mc}mlp.router.weight": (e, h), f"{mc}mlp.router.e_score_correction_bias": (e,)})
    for prefix, width in widths.items():
        out.update({f"{prefix}linear_fc1.weight": (2 * width, h), f"{prefix}linear_fc1.bias": (2 * width,),
                    f"{prefix}linear_fc2.weight": (h, width), f"{prefix}linear_fc2.bias": (h,)})
    return out


def expected_shapes(arch: Ernie4_5Config, tbl: Table, head: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every checkpoint key the whole model reads -> (its shape, the megatron parameter it feeds)."""
    full = full_shapes(arch)
    out = {}
    for m, layer in _expected(arch, tbl):
        param = m.megatron if layer is None else _fill(m.megatron, layer)
        for k, shape in m.hf_shapes(layer, full[m.megatron]).items():
            out[k] = (shape, param)
    return out


def other_heads_keys(arch: Ernie4_5Config, tbl: Table, head: str) -> list[Ignore]:
    return []


def hf_architecture(arch: Ernie4_5Config, head: str) -> str:
    return "Ernie4_5_MoeForCausalLM" if arch.is_moe else "Ernie4_5ForCausalLM"


def save_prefix_rename(arch: Ernie4_5Config, head: str):
    return lambda k: k
