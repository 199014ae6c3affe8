"""transformers <-> megatron-core names for the RoFormer family: one table, read by the engine.

Left: megatron parameter names of :class:`~zhnlp.models.roformer.model.RoFormerModel` (``*`` = global layer
index). Right: transformers checkpoint keys, the base model under ``roformer.``. How each weight is split across
tensor-parallel ranks is not written here: it follows from the megatron module that owns the parameter.

transformers keeps RoFormer's sinusoidal position table as a frozen parameter (``encoder.embed_positions.weight``);
zhnlp computes it from the config: :func:`constant_weights` gives it to ``save_pretrained`` (so transformers finds
every weight it expects) and to ``num_parameters`` (so the count is transformers'), and loading ignores it.
"""

from __future__ import annotations

import torch

from zhnlp.conversion.engine import Table
from zhnlp.conversion.mappings import FuseQKV, Ignore, Rename, Tied
from zhnlp.models.roformer.config import RoFormerConfig

# The parts of a model a head brings with it; each part's weights may be freshly initialised
# (the start of fine-tuning) when the checkpoint lacks them. The base model has a pooler only when
# config.json names a pooler_activation (junnyu's pooler, see zhnlp.models.roformer.config).
HEAD_PARTS = {
    "base": ("pooler",),
    "mlm": ("mlm",),
    "sequence_classification": ("classification_head",),
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
BASE = "roformer."
# what a RoFormerModel checkpoint saves without the base prefix (``embeddings_project.`` is not ``embeddings.``)
BASE_SUBMODULES = ("embeddings.", "embeddings_project.", "encoder.", "pooler.")
POSITIONS = f"{BASE}encoder.embed_positions.weight"


def normalise_key(arch: RoFormerConfig):
    """Checkpoint key -> the spelling the table uses: base-model keys saved without their prefix (a
    ``RoFormerModel`` checkpoint) get it; legacy LayerNorm ``gamma``/``beta`` become ``weight``/``bias``."""

    def rename(key: str) -> str:
        if key.startswith(BASE_SUBMODULES):
            key = BASE + key
        if "LayerNorm." in key:
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        return key

    return rename


def table(arch: RoFormerConfig) -> Table:
    """The mapping table for one architecture (sizes filled in)."""
    b = BASE
    layer_hf = f"{b}encoder.layer.*."
    layer_mc = "encoder.layers.*."
    mappings = [
        Rename("embedding.word_embeddings.weight", f"{b}embeddings.word_embeddings.weight", vocab=True),
        Rename("embedding.token_type_embeddings.weight", f"{b}embeddings.token_type_embeddings.weight"),
    ]
    for kind in ("weight", "bias"):
        attn = f"{layer_hf}attention.self."
        mappings += [
            Rename(f"embedding.layernorm.{kind}", f"{b}embeddings.LayerNorm.{kind}"),
            Rename(f"embedding.projection.{kind}", f"{b}embeddings_project.{kind}"),
            FuseQKV(f"{layer_mc}self_attention.linear_qkv.{kind}",
                    q=f"{attn}query.{kind}", k=f"{attn}key.{kind}", v=f"{attn}value.{kind}"),
            Rename(f"{layer_mc}self_attention.linear_proj.{kind}", f"{layer_hf}attention.output.dense.{kind}"),
            Rename(f"{layer_mc}post_attention_layernorm.{kind}", f"{layer_hf}attention.output.LayerNorm.{kind}"),
            Rename(f"{layer_mc}mlp.linear_fc1.{kind}", f"{layer_hf}intermediate.dense.{kind}"),
            Rename(f"{layer_mc}mlp.linear_fc2.{kind}", f"{layer_hf}output.dense.{kind}"),
            Rename(f"{layer_mc}post_mlp_layernorm.{kind}", f"{layer_hf}output.LayerNorm.{kind}"),
            # heads
            Rename(f"pooler.dense.{kind}", f"{b}pooler.dense.{kind}", head="pooler"),
            Rename(f"lm_transform.dense.{kind}", f"cls.predictions.transform.dense.{kind}", head="mlm"),
            Rename(f"lm_transform.layernorm.{kind}", f"cls.predictions.transform.LayerNorm.{kind}", head="mlm"),
            Rename(f"classifier.dense.{kind}", f"classifier.dense.{kind}", head="classification_head"),
            Rename(f"classifier.out_proj.{kind}", f"classifier.out_proj.{kind}", head="classification_head"),
            Rename(f"classifier.out.{kind}", f"classifier.{kind}", head="classifier"),
            Rename(f"qa_outputs.out.{kind}", f"qa_outputs.{kind}", head="qa"),
        ]
    mappings += [
        Rename("output_layer.bias", "cls.predictions.bias", vocab=True, head="mlm"),
        Tied("output_layer.weight", f"{b}embeddings.word_embeddings.weight", vocab=True, head="mlm"),
    ]
    for m in mappings:
        if getattr(m, "vocab", False):
            m.vocab_size = arch.vocab_size
        if isinstance(m, FuseQKV):
            m.head_dim = arch.head_dim
    ignores = [
        Ignore(POSITIONS, "the sinusoidal position table, which zhnlp computes from max_position_embeddings"),
        Ignore("cls.predictions.decoder.weight", "tied to the word embeddings"),
        Ignore("cls.predictions.decoder.bias", "tied to cls.predictions.bias"),
    ]
    return Table(mappings, ignores)


def _in_model(arch: RoFormerConfig, m) -> bool:
    """Whether mapping ``m`` names a part this architecture has (whatever the head)."""
    if m.megatron.startswith("embedding.token_type"):
        return arch.type_vocab_size > 0
    if m.megatron.startswith("embedding.projection"):
        return arch.projects_embeddings
    if m.head == "pooler":
        return arch.has_pooler
    return True


def _expected(arch: RoFormerConfig, tbl: Table, head: str):
    """(mapping, layer) for every mapping the whole model (all layers and stages) reads, in
    checkpoint order: embeddings, then layer by layer, then the heads."""
    parts = set(HEAD_PARTS[head])
    chosen = [m for m in tbl.mappings if not isinstance(m, Tied) and (m.head is None or m.head in parts)
              and _in_model(arch, m)]
    out = [(m, None) for m in chosen if "*" not in m.megatron and m.head is None]
    out += [(m, layer) for layer in range(arch.num_hidden_layers) for m in chosen if "*" in m.megatron]
    return out + [(m, None) for m in chosen if "*" not in m.megatron and m.head is not None]


def expected_keys(arch: RoFormerConfig, tbl: Table, head: str) -> dict[str, str | None]:
    """Every checkpoint key the whole model (all layers and stages) reads -> owning head part."""
    return {k: m.head for m, layer in _expected(arch, tbl, head) for k in m.hf_keys(layer)}


def full_shapes(arch: RoFormerConfig) -> dict[str, tuple[int, ...]]:
    """megatron parameter name (``*`` = any layer) -> its full shape: unsplit, vocabulary padded.

    Mirrors :class:`~zhnlp.models.roformer.model.RoFormerModel`'s modules (a unit test compares the two), so that
    a checkpoint's shapes are checked for the whole model before any stage is built."""
    h, e, ffn, v = arch.hidden_size, arch.embedding_size, arch.intermediate_size, arch.padded_vocab_size
    shapes = {
        "embedding.word_embeddings.weight": (v, e),
        "embedding.token_type_embeddings.weight": (arch.type_vocab_size, e),
        "output_layer.weight": (v, e),
        "output_layer.bias": (v,),
    }
    square = ("self_attention.linear_proj", "post_attention_layernorm", "post_mlp_layernorm")
    for kind in ("weight", "bias"):
        matrix = kind == "weight"
        shapes["embedding.layernorm." + kind] = (e,)
        shapes["embedding.projection." + kind] = (h, e) if matrix else (h,)
        shapes[f"encoder.layers.*.self_attention.linear_qkv.{kind}"] = (3 * h, h) if matrix else (3 * h,)
        for name in square:
            shapes[f"encoder.layers.*.{name}.{kind}"] = (h, h) if matrix and "linear" in name else (h,)
        shapes[f"encoder.layers.*.mlp.linear_fc1.{kind}"] = (ffn, h) if matrix else (ffn,)
        shapes[f"encoder.layers.*.mlp.linear_fc2.{kind}"] = (h, ffn) if matrix else (h,)
        shapes[f"pooler.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"lm_transform.dense.{kind}"] = (e, h) if matrix else (e,)
        shapes[f"lm_transform.layernorm.{kind}"] = (e,)
        shapes[f"classifier.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"classifier.out_proj.{kind}"] = (arch.num_labels, h) if matrix else (arch.num_labels,)
        shapes[f"classifier.out.{kind}"] = (arch.num_labels, h) if matrix else (arch.num_labels,)
        shapes[f"qa_outputs.out.{kind}"] = (2, h) if matrix else (2,)
    return shapes


def expected_shapes(arch: RoFormerConfig, tbl: Table, head: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every checkpoint key the whole model reads -> (its shape, the megatron parameter it feeds)."""
    full = full_shapes(arch)
    out = {}
    for m, layer in _expected(arch, tbl, head):
        param = m.megatron if layer is None else m.megatron.replace("*", str(layer))
        for k, shape in m.hf_shapes(layer, full[m.megatron]).items():
            out[k] = (shape, param)
    return out


def other_heads_keys(arch: RoFormerConfig, tbl: Table, head: str) -> list[Ignore]:
    """Weights of heads this model does not have are ignored, with that reason (a pooler without
    ``pooler_activation`` in config.json among them, as transformers ignores it)."""
    parts = set(HEAD_PARTS[head])
    out = []
    for m in tbl.mappings:
        if m.head is None or isinstance(m, Tied):
            continue
        if m.head == "pooler" and head == "base" and not arch.has_pooler:
            why = ("junnyu's pooler, which this model has only when config.json names its pooler_activation "
                   "(e.g. \"linear\" for RoFormer-Sim)")
        elif m.head not in parts:
            why = f"belongs to the {m.head} head, which this model does not have"
        else:
            continue
        out += [Ignore(k, why) for k in m.hf_keys(None)]
    return out


def constant_weights(arch: RoFormerConfig) -> dict[str, torch.Tensor]:
    """Checkpoint keys transformers keeps as frozen embedding tables that zhnlp recomputes from the config
    (full, float32): written by save_pretrained, ignored on load, counted by ``num_parameters`` unless
    ``only_trainable`` or ``exclude_embeddings`` (transformers' count of this ``nn.Embedding``)."""
    from zhnlp.models.roformer.model import sinusoidal_table

    return {POSITIONS: sinusoidal_table(arch.max_position_embeddings, arch.head_dim)}


def hf_architecture(arch: RoFormerConfig, head: str) -> str:
    """transformers class name written to config.json (``RoFormerForMaskedLM``, ``RoFormerModel``, ...)."""
    return "RoFormer" + HF_CLASS_SUFFIX[head]


def save_prefix_rename(arch: RoFormerConfig, head: str):
    """transformers' base models save their keys without the base prefix; heads keep it."""
    if head != "base":
        return lambda k: k
    return lambda k: k[len(BASE):] if k.startswith(BASE) else k
