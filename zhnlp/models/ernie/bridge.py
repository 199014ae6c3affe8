"""transformers <-> megatron-core names for the ERNIE/BERT family: one table, read by the engine.

Left: megatron parameter names of :class:`~zhnlp.models.ernie.model.ErnieModel` (``*`` = global
layer index). Right: transformers checkpoint keys, with ``{base}`` the base-model prefix
(``ernie.`` or ``bert.``). How each weight is split across tensor-parallel ranks is not
written here: it follows from the megatron module that owns the parameter.
"""

from __future__ import annotations

from zhnlp.conversion.engine import Table
from zhnlp.conversion.mappings import FuseQKV, Ignore, Rename, Tied
from zhnlp.models.ernie.config import ErnieConfig

# The parts of a model a head brings with it; each part's weights may be freshly initialised
# (the start of fine-tuning) when the checkpoint lacks them.
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
BASE_SUBMODULES = ("embeddings.", "encoder.", "pooler.")


def base_prefix(arch: ErnieConfig) -> str:
    return f"{arch.model_type}."


def normalise_key(arch: ErnieConfig):
    """Checkpoint key -> the spelling the table uses: base-model keys saved without their prefix
    (an ``ErnieModel``/``BertModel`` checkpoint) get it; legacy LayerNorm ``gamma``/``beta``
    become ``weight``/``bias``."""
    prefix = base_prefix(arch)

    def rename(key: str) -> str:
        if key.startswith(BASE_SUBMODULES):
            key = prefix + key
        if "LayerNorm." in key:
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        return key

    return rename


def table(arch: ErnieConfig) -> Table:
    """The mapping table for one architecture (prefix and sizes filled in)."""
    b = base_prefix(arch)
    layer_hf = f"{b}encoder.layer.*."
    layer_mc = "encoder.layers.*."
    mappings = [
        Rename("embedding.word_embeddings.weight", f"{b}embeddings.word_embeddings.weight", vocab=True),
        Rename("embedding.position_embeddings.weight", f"{b}embeddings.position_embeddings.weight"),
        Rename("embedding.token_type_embeddings.weight", f"{b}embeddings.token_type_embeddings.weight"),
        Rename("embedding.task_type_embeddings.weight", f"{b}embeddings.task_type_embeddings.weight"),
        Rename("embedding.layernorm.weight", f"{b}embeddings.LayerNorm.weight"),
        Rename("embedding.layernorm.bias", f"{b}embeddings.LayerNorm.bias"),
    ]
    for kind in ("weight", "bias"):
        attn = f"{layer_hf}attention.self."
        mappings += [
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
        Ignore(f"{b}embeddings.position_ids", "a buffer (0..max_positions-1), not a weight"),
        Ignore("cls.predictions.decoder.weight", "tied to the word embeddings"),
        Ignore("cls.predictions.decoder.bias", "tied to cls.predictions.bias"),
        Ignore("cls.seq_relationship.*", "next-sentence-prediction head of the pretraining model"),
    ]
    return Table(mappings, ignores)


def _expected(arch: ErnieConfig, tbl: Table, head: str):
    """(mapping, layer) for every mapping the whole model (all layers and stages) reads, in
    checkpoint order: embeddings, then layer by layer, then the heads."""
    parts = set(HEAD_PARTS[head])
    chosen = []
    for m in tbl.mappings:
        if isinstance(m, Tied) or (m.head is not None and m.head not in parts):
            continue
        if m.megatron.startswith("embedding.task_type") and not arch.use_task_id:
            continue
        if m.megatron.startswith("embedding.token_type") and not arch.type_vocab_size:
            continue
        chosen.append(m)
    out = [(m, None) for m in chosen if "*" not in m.megatron and m.head is None]
    out += [(m, layer) for layer in range(arch.num_hidden_layers) for m in chosen if "*" in m.megatron]
    return out + [(m, None) for m in chosen if "*" not in m.megatron and m.head is not None]


def expected_keys(arch: ErnieConfig, tbl: Table, head: str) -> dict[str, str | None]:
    """Every checkpoint key the whole model (all layers and stages) reads -> owning head part."""
    return {k: m.head for m, layer in _expected(arch, tbl, head) for k in m.hf_keys(layer)}


def full_shapes(arch: ErnieConfig) -> dict[str, tuple[int, ...]]:
    """megatron parameter name (``*`` = any layer) -> its full shape: unsplit, vocabulary padded.

    Mirrors :class:`~zhnlp.models.ernie.model.ErnieModel`'s modules (a unit test compares the two),
    so that a checkpoint's shapes are checked for the whole model before any stage is built."""
    h, ffn, v = arch.hidden_size, arch.intermediate_size, arch.padded_vocab_size
    shapes = {
        "embedding.word_embeddings.weight": (v, h),
        "embedding.position_embeddings.weight": (arch.max_position_embeddings, h),
        "embedding.token_type_embeddings.weight": (arch.type_vocab_size, h),
        "embedding.task_type_embeddings.weight": (arch.task_type_vocab_size, h),
        "output_layer.weight": (v, h),
        "output_layer.bias": (v,),
    }
    square = ("self_attention.linear_proj", "post_attention_layernorm", "post_mlp_layernorm")
    for kind in ("weight", "bias"):
        matrix = kind == "weight"
        shapes["embedding.layernorm." + kind] = (h,)
        shapes[f"encoder.layers.*.self_attention.linear_qkv.{kind}"] = (3 * h, h) if matrix else (3 * h,)
        for name in square:
            shapes[f"encoder.layers.*.{name}.{kind}"] = (h, h) if matrix and "linear" in name else (h,)
        shapes[f"encoder.layers.*.mlp.linear_fc1.{kind}"] = (ffn, h) if matrix else (ffn,)
        shapes[f"encoder.layers.*.mlp.linear_fc2.{kind}"] = (h, ffn) if matrix else (h,)
        shapes[f"pooler.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"lm_transform.dense.{kind}"] = (h, h) if matrix else (h,)
        shapes[f"lm_transform.layernorm.{kind}"] = (h,)
        shapes[f"classifier.out.{kind}"] = (arch.num_labels, h) if matrix else (arch.num_labels,)
        shapes[f"qa_outputs.out.{kind}"] = (2, h) if matrix else (2,)
    return shapes


def expected_shapes(arch: ErnieConfig, tbl: Table, head: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every checkpoint key the whole model reads -> (its shape, the megatron parameter it feeds)."""
    full = full_shapes(arch)
    out = {}
    for m, layer in _expected(arch, tbl, head):
        param = m.megatron if layer is None else m.megatron.replace("*", str(layer))
        for k, shape in m.hf_shapes(layer, full[m.megatron]).items():
            out[k] = (shape, param)
    return out


def other_heads_keys(arch: ErnieConfig, tbl: Table, head: str) -> list[Ignore]:
    """Weights of heads this model does not have are ignored, with that reason."""
    parts = set(HEAD_PARTS[head])
    out = []
    for m in tbl.mappings:
        if m.head is not None and m.head not in parts and not isinstance(m, Tied):
            out += [Ignore(k, f"belongs to the {m.head} head, which this model does not have") for k in m.hf_keys(None)]
    return out


def hf_architecture(arch: ErnieConfig, head: str) -> str:
    """transformers class name written to config.json (``ErnieForMaskedLM``, ``BertModel``, ...)."""
    return ("Ernie" if arch.model_type == "ernie" else "Bert") + HF_CLASS_SUFFIX[head]


def save_prefix_rename(arch: ErnieConfig, head: str):
    """transformers' base models save their keys without the base prefix; heads keep it."""
    prefix = base_prefix(arch)
    if head != "base":
        return lambda k: k
    return lambda k: k[len(prefix):] if k.startswith(prefix) else k
