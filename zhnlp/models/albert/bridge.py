"""transformers <-> megatron-core names for the ALBERT family: one table, read by the engine.

Left: megatron parameter names of :class:`~zhnlp.models.albert.model.AlbertModel` (``*`` = global applied
layer). Right: transformers checkpoint keys (``albert.`` is the base-model prefix). A layer weight is one
checkpoint key per group and layer within the group (``albert.encoder.albert_layer_groups.G.albert_layers.K.``)
feeding every megatron layer that applies it (:class:`~zhnlp.conversion.mappings.SharedLayer`): the table
lists each such key once, and saving writes it once. How each weight is split across tensor-parallel ranks
follows from the megatron module that owns the parameter.
"""

from __future__ import annotations

from zhnlp.conversion.engine import Table
from zhnlp.conversion.mappings import FuseQKV, Ignore, Rename, SharedLayer, Tied
from zhnlp.models.albert.config import AlbertConfig

HEAD_PARTS = {
    "base": ("pooler",),
    "mlm": ("mlm",),
    "sequence_classification": ("pooler", "classifier"),
    "token_classification": ("classifier",),
    "question_answering": ("qa",),
}
HF_CLASS_SUFFIX = {
    "base": "Model",
    "mlm": "ForMaskedLM",
    "sequence_classification": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
    "question_answering": "ForQuestionAnswering",
}
PREFIX = "albert."
BASE_SUBMODULES = ("embeddings.", "encoder.", "pooler.")
LAYER_HF = f"{PREFIX}encoder.albert_layer_groups.*.albert_layers.*."  # group, layer within the group
LAYER_MC = "encoder.layers.*."


def normalise_key(arch: AlbertConfig):
    """Checkpoint key -> the spelling the table uses: base-model keys saved without their prefix (an
    ``AlbertModel`` checkpoint) get it; legacy LayerNorm ``gamma``/``beta`` become ``weight``/``bias``."""

    def rename(key: str) -> str:
        if key.startswith(BASE_SUBMODULES):
            key = PREFIX + key
        if "LayerNorm." in key:
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        return key

    return rename


def _layer_mappings(arch: AlbertConfig) -> list[SharedLayer]:
    slots = arch.layer_slots
    out = []
    for kind in ("weight", "bias"):
        attn = f"{LAYER_HF}attention."
        inner = [
            FuseQKV(f"{LAYER_MC}self_attention.linear_qkv.{kind}", q=f"{attn}query.{kind}", k=f"{attn}key.{kind}",
                    v=f"{attn}value.{kind}", head_dim=arch.head_dim),
            Rename(f"{LAYER_MC}self_attention.linear_proj.{kind}", f"{attn}dense.{kind}"),
            Rename(f"{LAYER_MC}post_attention_layernorm.{kind}", f"{attn}LayerNorm.{kind}"),
            Rename(f"{LAYER_MC}mlp.linear_fc1.{kind}", f"{LAYER_HF}ffn.{kind}"),
            Rename(f"{LAYER_MC}mlp.linear_fc2.{kind}", f"{LAYER_HF}ffn_output.{kind}"),
            Rename(f"{LAYER_MC}post_mlp_layernorm.{kind}", f"{LAYER_HF}full_layer_layer_norm.{kind}"),
        ]
        out += [SharedLayer(m.megatron, inner=m, slots=slots) for m in inner]
    return out


def table(arch: AlbertConfig) -> Table:
    """The mapping table for one architecture (sizes and layer groups filled in)."""
    b = PREFIX
    mappings = [
        Rename("embedding.word_embeddings.weight", f"{b}embeddings.word_embeddings.weight", vocab=True),
        Rename("embedding.position_embeddings.weight", f"{b}embeddings.position_embeddings.weight"),
        Rename("embedding.token_type_embeddings.weight", f"{b}embeddings.token_type_embeddings.weight"),
    ]
    for kind in ("weight", "bias"):
        mappings += [
            Rename(f"embedding.layernorm.{kind}", f"{b}embeddings.LayerNorm.{kind}"),
            Rename(f"embedding.projection.{kind}", f"{b}encoder.embedding_hidden_mapping_in.{kind}"),
        ]
    mappings += _layer_mappings(arch)
    for kind in ("weight", "bias"):
        mappings += [
            Rename(f"pooler.dense.{kind}", f"{b}pooler.{kind}", head="pooler"),
            Rename(f"lm_transform.dense.{kind}", f"predictions.dense.{kind}", head="mlm"),
            Rename(f"lm_transform.layernorm.{kind}", f"predictions.LayerNorm.{kind}", head="mlm"),
            Rename(f"classifier.out.{kind}", f"classifier.{kind}", head="classifier"),
            Rename(f"qa_outputs.out.{kind}", f"qa_outputs.{kind}", head="qa"),
        ]
    mappings += [
        Rename("output_layer.bias", "predictions.bias", vocab=True, head="mlm"),
        Tied("output_layer.weight", f"{b}embeddings.word_embeddings.weight", vocab=True, head="mlm"),
    ]
    for m in mappings:
        if getattr(m, "vocab", False):
            m.vocab_size = arch.vocab_size
    ignores = [
        Ignore(f"{b}embeddings.position_ids", "a buffer (0..max_positions-1), not a weight"),
        Ignore(f"{b}embeddings.token_type_ids", "a buffer (zeros), not a weight"),
        Ignore("predictions.decoder.weight", "tied to the word embeddings"),
        Ignore("predictions.decoder.bias", "tied to predictions.bias"),
        Ignore("sop_classifier.*", "sentence-order-prediction head of the pretraining model"),
    ]
    return Table(mappings, ignores)


def _expected(arch: AlbertConfig, tbl: Table, head: str):
    """(mapping, layer) for every mapping the whole model reads, in checkpoint order: embeddings, then each
    group's layers once (at the first applied layer that uses them), then the heads."""
    parts = set(HEAD_PARTS[head])
    chosen = [m for m in tbl.mappings if not isinstance(m, Tied) and (m.head is None or m.head in parts)]
    owners = sorted({arch.slot_owner(j) for j in range(arch.num_layers)}, key=lambda j: arch.layer_slots[j])
    out = [(m, None) for m in chosen if "*" not in m.megatron and m.head is None]
    out += [(m, layer) for layer in owners for m in chosen if "*" in m.megatron]
    return out + [(m, None) for m in chosen if "*" not in m.megatron and m.head is not None]


def expected_keys(arch: AlbertConfig, tbl: Table, head: str) -> dict[str, str | None]:
    """Every checkpoint key the whole model (all layers and stages) reads -> owning head part."""
    return {k: m.head for m, layer in _expected(arch, tbl, head) for k in m.hf_keys(layer)}


def full_shapes(arch: AlbertConfig) -> dict[str, tuple[int, ...]]:
    """megatron parameter name (``*`` = any layer) -> its full shape: unsplit, vocabulary padded.

    Mirrors :class:`~zhnlp.models.albert.model.AlbertModel`'s modules (a test compares the two), so that a
    checkpoint's shapes are checked for the whole model before any stage is built."""
    h, e, ffn, v = arch.hidden_size, arch.embedding_size, arch.intermediate_size, arch.padded_vocab_size
    shapes = {
        "embedding.word_embeddings.weight": (v, e),
        "embedding.position_embeddings.weight": (arch.max_position_embeddings, e),
        "embedding.token_type_embeddings.weight": (arch.type_vocab_size, e),
        "embedding.projection.weight": (h, e),
        "embedding.projection.bias": (h,),
        "output_layer.weight": (v, e),
        "output_layer.bias": (v,),
        "lm_transform.dense.weight": (e, h),
        "lm_transform.dense.bias": (e,),
    }
    square = ("self_attention.linear_proj", "post_attention_layernorm", "post_mlp_layernorm")
    for kind in ("weight", "bias"):
        matrix = kind == "weight"
        shapes["embedding.layernorm." + kind] = (e,)
        shapes[f"encoder.layers.*.self_attention.linear_qkv.{kind}"] = (3 * h, h) if matrix else (3 * h,)
        for name in square:
            shapes[f"encoder.layers.*.{name}.{kind}"] = (h, h) if matrix and "linear" in name else (h,)
        shapes[f"encoder.layers.*.mlp.linear_fc1.{kind}"] = (ffn, h) if matrix else (ffn,)
        shapes[f"encoder.layers.*.mlp.linear_fc2.{kind}"] = (h, ffn) if matrix else (h,)
        shapes[f"pooler.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"lm_transform.layernorm.{kind}"] = (e,)
        shapes[f"classifier.out.{kind}"] = (arch.num_labels, h) if matrix else (arch.num_labels,)
        shapes[f"qa_outputs.out.{kind}"] = (2, h) if matrix else (2,)
    return shapes


def expected_shapes(arch: AlbertConfig, tbl: Table, head: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every checkpoint key the whole model reads -> (its shape, the megatron parameter it feeds)."""
    full = full_shapes(arch)
    out = {}
    for m, layer in _expected(arch, tbl, head):
        param = m.megatron if layer is None else m.megatron.replace("*", str(layer))
        for k, shape in m.hf_shapes(layer, full[m.megatron]).items():
            out[k] = (shape, param)
    return out


def other_heads_keys(arch: AlbertConfig, tbl: Table, head: str) -> list[Ignore]:
    """Weights of heads this model does not have are ignored, with that reason."""
    parts = set(HEAD_PARTS[head])
    out = []
    for m in tbl.mappings:
        if m.head is not None and m.head not in parts and not isinstance(m, Tied):
            out += [Ignore(k, f"belongs to the {m.head} head, which this model does not have") for k in m.hf_keys(None)]
    return out


def hf_architecture(arch: AlbertConfig, head: str) -> str:
    """transformers class name written to config.json (``AlbertForMaskedLM``, ``AlbertModel``, ...)."""
    return "Albert" + HF_CLASS_SUFFIX[head]


def save_prefix_rename(arch: AlbertConfig, head: str):
    """transformers' base model saves its keys without the base prefix; the heads keep it."""
    if head != "base":
        return lambda k: k
    return lambda k: k[len(PREFIX):] if k.startswith(PREFIX) else k
