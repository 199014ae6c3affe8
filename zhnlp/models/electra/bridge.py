"""transformers <-> megatron-core names for the ELECTRA family: one table, read by the engine.

Left: megatron parameter names of :class:`~zhnlp.models.electra.model.ElectraModel` (``*`` = global layer index).
Right: transformers checkpoint keys, the base model under ``electra.``. How each weight is split across
tensor-parallel ranks is not written here: it follows from the megatron module that owns the parameter.
"""

from __future__ import annotations

from zhnlp.conversion.engine import Table
from zhnlp.conversion.mappings import FuseQKV, Ignore, Rename, Tied
from zhnlp.models.electra.config import ElectraConfig

# The parts of a model a head brings with it; each part's weights may be freshly initialised
# (the start of fine-tuning) when the checkpoint lacks them. ELECTRA's base model has no pooler.
HEAD_PARTS = {
    "base": (),
    "mlm": ("generator",),
    "pretraining": ("discriminator",),
    "sequence_classification": ("classification_head",),
    "token_classification": ("classifier",),
    "question_answering": ("qa",),
}
HF_CLASS_SUFFIX = {
    "base": "Model",
    "mlm": "ForMaskedLM",
    "pretraining": "ForPreTraining",
    "sequence_classification": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
    "question_answering": "ForQuestionAnswering",
}
BASE = "electra."
# what an ElectraModel checkpoint saves without the base prefix (``embeddings_project.`` is not ``embeddings.``)
BASE_SUBMODULES = ("embeddings.", "embeddings_project.", "encoder.")


def normalise_key(arch: ElectraConfig):
    """Checkpoint key -> the spelling the table uses: base-model keys saved without their prefix (an
    ``ElectraModel`` checkpoint) get it; legacy LayerNorm ``gamma``/``beta`` become ``weight``/``bias``."""

    def rename(key: str) -> str:
        if key.startswith(BASE_SUBMODULES):
            key = BASE + key
        if "LayerNorm." in key:
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        return key

    return rename


def table(arch: ElectraConfig) -> Table:
    """The mapping table for one architecture (sizes and the generator's tying filled in)."""
    b = BASE
    layer_hf = f"{b}encoder.layer.*."
    layer_mc = "encoder.layers.*."
    mappings = [
        Rename("embedding.word_embeddings.weight", f"{b}embeddings.word_embeddings.weight", vocab=True),
        Rename("embedding.position_embeddings.weight", f"{b}embeddings.position_embeddings.weight"),
        Rename("embedding.token_type_embeddings.weight", f"{b}embeddings.token_type_embeddings.weight"),
        Rename("embedding.layernorm.weight", f"{b}embeddings.LayerNorm.weight"),
        Rename("embedding.layernorm.bias", f"{b}embeddings.LayerNorm.bias"),
    ]
    for kind in ("weight", "bias"):
        attn = f"{layer_hf}attention.self."
        mappings += [
            # embedding_size -> hidden_size (only when they differ)
            Rename(f"embedding.projection.{kind}", f"{b}embeddings_project.{kind}"),
            FuseQKV(f"{layer_mc}self_attention.linear_qkv.{kind}",
                    q=f"{attn}query.{kind}", k=f"{attn}key.{kind}", v=f"{attn}value.{kind}"),
            Rename(f"{layer_mc}self_attention.linear_proj.{kind}", f"{layer_hf}attention.output.dense.{kind}"),
            Rename(f"{layer_mc}post_attention_layernorm.{kind}", f"{layer_hf}attention.output.LayerNorm.{kind}"),
            Rename(f"{layer_mc}mlp.linear_fc1.{kind}", f"{layer_hf}intermediate.dense.{kind}"),
            Rename(f"{layer_mc}mlp.linear_fc2.{kind}", f"{layer_hf}output.dense.{kind}"),
            Rename(f"{layer_mc}post_mlp_layernorm.{kind}", f"{layer_hf}output.LayerNorm.{kind}"),
            # heads
            Rename(f"discriminator_predictions.dense.{kind}", f"discriminator_predictions.dense.{kind}",
                   head="discriminator"),
            Rename(f"discriminator_predictions.dense_prediction.{kind}",
                   f"discriminator_predictions.dense_prediction.{kind}", head="discriminator"),
            Rename(f"generator_predictions.dense.{kind}", f"generator_predictions.dense.{kind}", head="generator"),
            Rename(f"generator_predictions.layernorm.{kind}", f"generator_predictions.LayerNorm.{kind}",
                   head="generator"),
            Rename(f"classifier.dense.{kind}", f"classifier.dense.{kind}", head="classification_head"),
            Rename(f"classifier.out_proj.{kind}", f"classifier.out_proj.{kind}", head="classification_head"),
            Rename(f"classifier.out.{kind}", f"classifier.{kind}", head="classifier"),
            Rename(f"qa_outputs.out.{kind}", f"qa_outputs.{kind}", head="qa"),
        ]
    mappings.append(Rename("output_layer.bias", "generator_lm_head.bias", vocab=True, head="generator"))
    ignores = [Ignore(f"{b}embeddings.position_ids", "a buffer (0..max_positions-1), not a weight")]
    if arch.tie_word_embeddings:
        # a copy of the word embeddings, held only by a last stage that is not also the first
        mappings.append(Tied("output_layer.weight", f"{b}embeddings.word_embeddings.weight", vocab=True,
                             head="generator"))
        ignores.append(Ignore("generator_lm_head.weight", "tied to the word embeddings (tie_word_embeddings)"))
    else:
        mappings.append(Rename("output_layer.weight", "generator_lm_head.weight", vocab=True, head="generator"))
    for m in mappings:
        if getattr(m, "vocab", False):
            m.vocab_size = arch.vocab_size
        if isinstance(m, FuseQKV):
            m.head_dim = arch.head_dim
    return Table(mappings, ignores)


def _expected(arch: ElectraConfig, tbl: Table, head: str):
    """(mapping, layer) for every mapping the whole model (all layers and stages) reads, in checkpoint order:
    embeddings, then layer by layer, then the heads."""
    parts = set(HEAD_PARTS[head])
    chosen = []
    for m in tbl.mappings:
        if isinstance(m, Tied) or (m.head is not None and m.head not in parts):
            continue
        if m.megatron.startswith("embedding.token_type") and not arch.type_vocab_size:
            continue
        if m.megatron.startswith("embedding.projection") and not arch.factorised:
            continue
        chosen.append(m)
    out = [(m, None) for m in chosen if "*" not in m.megatron and m.head is None]
    out += [(m, layer) for layer in range(arch.num_hidden_layers) for m in chosen if "*" in m.megatron]
    return out + [(m, None) for m in chosen if "*" not in m.megatron and m.head is not None]


def expected_keys(arch: ElectraConfig, tbl: Table, head: str) -> dict[str, str | None]:
    """Every checkpoint key the whole model (all layers and stages) reads -> owning head part."""
    return {k: m.head for m, layer in _expected(arch, tbl, head) for k in m.hf_keys(layer)}


def full_shapes(arch: ElectraConfig) -> dict[str, tuple[int, ...]]:
    """megatron parameter name (``*`` = any layer) -> its full shape: unsplit, vocabulary padded.

    Mirrors :class:`~zhnlp.models.electra.model.ElectraModel`'s modules (a unit test compares the two), so that
    a checkpoint's shapes are checked for the whole model before any stage is built."""
    h, e, ffn, v = arch.hidden_size, arch.embedding_size, arch.intermediate_size, arch.padded_vocab_size
    shapes = {
        "embedding.word_embeddings.weight": (v, e),
        "embedding.position_embeddings.weight": (arch.max_position_embeddings, e),
        "embedding.token_type_embeddings.weight": (arch.type_vocab_size, e),
        "embedding.projection.weight": (h, e),
        "embedding.projection.bias": (h,),
        "output_layer.weight": (v, e),
        "output_layer.bias": (v,),
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
        shapes[f"discriminator_predictions.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"discriminator_predictions.dense_prediction.{kind}"] = (1, h) if matrix else (1,)
        shapes[f"generator_predictions.dense.{kind}"] = (e, h) if matrix else (e,)
        shapes[f"generator_predictions.layernorm.{kind}"] = (e,)
        shapes[f"classifier.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"classifier.out_proj.{kind}"] = (arch.num_labels, h) if matrix else (arch.num_labels,)
        shapes[f"classifier.out.{kind}"] = (arch.num_labels, h) if matrix else (arch.num_labels,)
        shapes[f"qa_outputs.out.{kind}"] = (2, h) if matrix else (2,)
    return shapes


def expected_shapes(arch: ElectraConfig, tbl: Table, head: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every checkpoint key the whole model reads -> (its shape, the megatron parameter it feeds)."""
    full = full_shapes(arch)
    out = {}
    for m, layer in _expected(arch, tbl, head):
        param = m.megatron if layer is None else m.megatron.replace("*", str(layer))
        for k, shape in m.hf_shapes(layer, full[m.megatron]).items():
            out[k] = (shape, param)
    return out


def other_heads_keys(arch: ElectraConfig, tbl: Table, head: str) -> list[Ignore]:
    """Weights of heads this model does not have are ignored, with that reason (a discriminator checkpoint
    loads into every head; a generator's untied vocabulary projection too)."""
    parts = set(HEAD_PARTS[head])
    out = []
    for m in tbl.mappings:
        if m.head is not None and m.head not in parts and not isinstance(m, Tied):
            out += [Ignore(k, f"belongs to the {m.head} head, which this model does not have") for k in m.hf_keys(None)]
    return out


def hf_architecture(arch: ElectraConfig, head: str) -> str:
    """transformers class name written to config.json (``ElectraForPreTraining``, ``ElectraModel``, ...)."""
    return "Electra" + HF_CLASS_SUFFIX[head]


def save_prefix_rename(arch: ElectraConfig, head: str):
    """transformers' base model saves its keys without the ``electra.`` prefix; the heads keep it."""
    if head != "base":
        return lambda k: k
    return lambda k: k[len(BASE):] if k.startswith(BASE) else k
