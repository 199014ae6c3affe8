"""transformers 4.x <-> megatron-core names for ERNIE-M: one table, read by the engine.

Left: megatron parameter names of :class:`~zhnlp.models.ernie_m.model.ErnieMModel` (``*`` = global layer index).
Right: transformers 4.x's ErnieM checkpoint keys. Its layers keep PaddlePaddle's names: the attention is
``self_attn.self_attn.{q,k,v}_proj`` with ``self_attn.out_proj``, the FFN ``linear1``/``linear2``, the norms
``norm1`` (after attention) and ``norm2`` (after the FFN), the embedding norm ``layer_norm``. How each weight is
split across tensor-parallel ranks is not written here: it follows from the megatron module that owns it.
"""

from __future__ import annotations

from zhnlp.conversion.engine import Table
from zhnlp.conversion.mappings import FuseQKV, Ignore, Rename
from zhnlp.models.ernie_m.config import ErnieMConfig

BASE = "ernie_m."  # transformers' base_model_prefix
# The parts of a model a head brings with it; each part's weights may be freshly initialised
# (the start of fine-tuning) when the checkpoint lacks them. ERNIE-M's token and span models have no pooler.
HEAD_PARTS = {
    "base": ("pooler",),
    "sequence_classification": ("pooler", "classifier"),
    "token_classification": ("classifier",),
    "question_answering": ("qa",),
}
HF_CLASS = {
    "base": "ErnieMModel",
    "sequence_classification": "ErnieMForSequenceClassification",
    "token_classification": "ErnieMForTokenClassification",
    "question_answering": "ErnieMForQuestionAnswering",
}
BASE_SUBMODULES = ("embeddings.", "encoder.", "pooler.")


def normalise_key(arch: ErnieMConfig):
    """Checkpoint key -> the spelling the table uses: an ``ErnieMModel`` checkpoint saves its keys without the
    ``ernie_m.`` prefix the task models have."""

    def rename(key: str) -> str:
        return BASE + key if key.startswith(BASE_SUBMODULES) else key

    return rename


def table(arch: ErnieMConfig) -> Table:
    """The mapping table for one architecture (sizes filled in)."""
    layer_hf = f"{BASE}encoder.layers.*."
    layer_mc = "encoder.layers.*."
    mappings = [
        Rename("embedding.word_embeddings.weight", f"{BASE}embeddings.word_embeddings.weight", vocab=True),
        Rename("embedding.position_embeddings.weight", f"{BASE}embeddings.position_embeddings.weight"),
        Rename("embedding.layernorm.weight", f"{BASE}embeddings.layer_norm.weight"),
        Rename("embedding.layernorm.bias", f"{BASE}embeddings.layer_norm.bias"),
    ]
    for kind in ("weight", "bias"):
        attn = f"{layer_hf}self_attn.self_attn."
        mappings += [
            FuseQKV(f"{layer_mc}self_attention.linear_qkv.{kind}",
                    q=f"{attn}q_proj.{kind}", k=f"{attn}k_proj.{kind}", v=f"{attn}v_proj.{kind}"),
            Rename(f"{layer_mc}self_attention.linear_proj.{kind}", f"{layer_hf}self_attn.out_proj.{kind}"),
            Rename(f"{layer_mc}post_attention_layernorm.{kind}", f"{layer_hf}norm1.{kind}"),
            Rename(f"{layer_mc}mlp.linear_fc1.{kind}", f"{layer_hf}linear1.{kind}"),
            Rename(f"{layer_mc}mlp.linear_fc2.{kind}", f"{layer_hf}linear2.{kind}"),
            Rename(f"{layer_mc}post_mlp_layernorm.{kind}", f"{layer_hf}norm2.{kind}"),
            # heads
            Rename(f"pooler.dense.{kind}", f"{BASE}pooler.dense.{kind}", head="pooler"),
            Rename(f"classifier.out.{kind}", f"classifier.{kind}", head="classifier"),
            Rename(f"qa_outputs.out.{kind}", f"qa_outputs.{kind}", head="qa"),
        ]
    for m in mappings:
        if getattr(m, "vocab", False):
            m.vocab_size = arch.vocab_size
        if isinstance(m, FuseQKV):
            m.head_dim = arch.head_dim
    return Table(mappings, [])


def _expected(arch: ErnieMConfig, tbl: Table, head: str):
    """(mapping, layer) for every mapping the whole model (all layers and stages) reads, in
    checkpoint order: embeddings, then layer by layer, then the heads."""
    from zhnlp.models.ernie_m.model import check_head

    check_head(arch, head)
    parts = set(HEAD_PARTS[head])
    chosen = [m for m in tbl.mappings if m.head is None or m.head in parts]
    out = [(m, None) for m in chosen if "*" not in m.megatron and m.head is None]
    out += [(m, layer) for layer in range(arch.num_hidden_layers) for m in chosen if "*" in m.megatron]
    return out + [(m, None) for m in chosen if "*" not in m.megatron and m.head is not None]


def expected_keys(arch: ErnieMConfig, tbl: Table, head: str) -> dict[str, str | None]:
    """Every checkpoint key the whole model (all layers and stages) reads -> owning head part."""
    return {k: m.head for m, layer in _expected(arch, tbl, head) for k in m.hf_keys(layer)}


def full_shapes(arch: ErnieMConfig) -> dict[str, tuple[int, ...]]:
    """megatron parameter name (``*`` = any layer) -> its full shape: unsplit, vocabulary padded.

    Mirrors :class:`~zhnlp.models.ernie_m.model.ErnieMModel`'s modules (a unit test compares the two), so that
    a checkpoint's shapes are checked for the whole model before any stage is built."""
    h, ffn = arch.hidden_size, arch.intermediate_size
    shapes = {
        "embedding.word_embeddings.weight": (arch.padded_vocab_size, h),
        "embedding.position_embeddings.weight": (arch.max_position_embeddings, h),
    }
    for kind in ("weight", "bias"):
        matrix = kind == "weight"
        shapes["embedding.layernorm." + kind] = (h,)
        shapes[f"encoder.layers.*.self_attention.linear_qkv.{kind}"] = (3 * h, h) if matrix else (3 * h,)
        shapes[f"encoder.layers.*.self_attention.linear_proj.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"encoder.layers.*.post_attention_layernorm.{kind}"] = (h,)
        shapes[f"encoder.layers.*.mlp.linear_fc1.{kind}"] = (ffn, h) if matrix else (ffn,)
        shapes[f"encoder.layers.*.mlp.linear_fc2.{kind}"] = (h, ffn) if matrix else (h,)
        shapes[f"encoder.layers.*.post_mlp_layernorm.{kind}"] = (h,)
        shapes[f"pooler.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"classifier.out.{kind}"] = (arch.num_labels, h) if matrix else (arch.num_labels,)
        shapes[f"qa_outputs.out.{kind}"] = (2, h) if matrix else (2,)
    return shapes


def expected_shapes(arch: ErnieMConfig, tbl: Table, head: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every checkpoint key the whole model reads -> (its shape, the megatron parameter it feeds)."""
    full = full_shapes(arch)
    out = {}
    for m, layer in _expected(arch, tbl, head):
        param = m.megatron if layer is None else m.megatron.replace("*", str(layer))
        for k, shape in m.hf_shapes(layer, full[m.megatron]).items():
            out[k] = (shape, param)
    return out


def other_heads_keys(arch: ErnieMConfig, tbl: Table, head: str) -> list[Ignore]:
    """Weights of heads this model does not have are ignored, with that reason."""
    parts = set(HEAD_PARTS[head])
    return [Ignore(k, f"belongs to the {m.head} head, which this model does not have")
            for m in tbl.mappings if m.head is not None and m.head not in parts for k in m.hf_keys(None)]


def hf_architecture(arch: ErnieMConfig, head: str) -> str:
    """transformers 4.x class name written to config.json (``ErnieMModel``, ``ErnieMForQuestionAnswering``, ...)."""
    return HF_CLASS[head]


def save_prefix_rename(arch: ErnieMConfig, head: str):
    """transformers' base model saves its keys without the ``ernie_m.`` prefix; the task models keep it."""
    if head != "base":
        return lambda k: k
    return lambda k: k[len(BASE):] if k.startswith(BASE) else k
