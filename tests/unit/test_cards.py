"""The model zoo: every card parses, builds an architecture, and states the published facts."""

import subprocess
import sys

import pytest

import zhnlp
from zhnlp.cards import ModelCard, decoder_parameters, parse_card
from zhnlp.models import family_for_model_type
from zhnlp.models.ernie.config import ErnieConfig

ERNIE45 = {"ernie-4.5-0.3b-base-pt", "ernie-4.5-0.3b-pt", "ernie-4.5-21b-a3b-pt", "ernie-4.5-300b-a47b-pt"}
EXPECTED = {
    "ernie-1.0-base-zh", "ernie-3.0-xbase-zh", "ernie-3.0-base-zh", "ernie-3.0-medium-zh", "ernie-3.0-mini-zh",
    "ernie-3.0-micro-zh", "ernie-3.0-nano-zh", "bert-base-chinese", "chinese-roberta-wwm-ext", "chinese-macbert-base",
    *ERNIE45,
}
# (layers, hidden, heads, ffn, task types) from the ERNIE 3.0 release
ERNIE3 = {
    "xbase": (20, 1024, 16, 4096, 16), "base": (12, 768, 12, 3072, 3), "medium": (6, 768, 12, 3072, 16),
    "mini": (6, 384, 12, 1536, 16), "micro": (4, 384, 12, 1536, 16), "nano": (4, 312, 12, 1248, 16),
}


def test_zoo_lists_every_released_name():
    assert {c.name for c in zhnlp.list_models()} == EXPECTED


@pytest.mark.parametrize("card", zhnlp.list_models(), ids=lambda c: c.name)
def test_card_builds_an_architecture_and_cites_its_results(card: ModelCard):
    family = family_for_model_type(card.config["model_type"])
    arch = family.config_class.from_dict(dict(card.config))  # the family's own validation of every field
    assert card.family == family.name and "/" in card.hub_repo and card.license
    if family.name == "ernie":
        assert isinstance(arch, ErnieConfig) and arch.model_type in ("ernie", "bert")
        assert card.tokenizer["vocab_size"] == arch.vocab_size
    else:
        assert card.tokenizer["type"] == "sentencepiece" and card.tokenizer["layout"] == "ernie4_5"
        assert card.tasks == ("text-generation",)
    for r in card.results:
        assert isinstance(r["value"], (int, float)) and r["source"], r


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
