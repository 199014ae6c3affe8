"""The model zoo: every card parses, builds an architecture, and states the published facts."""

import subprocess
import sys

import pytest

import zhnlp
from zhnlp.cards import ModelCard, parse_card
from zhnlp.models.ernie.config import ErnieConfig

EXPECTED = {
    "ernie-1.0-base-zh", "ernie-3.0-xbase-zh", "ernie-3.0-base-zh", "ernie-3.0-medium-zh", "ernie-3.0-mini-zh",
    "ernie-3.0-micro-zh", "ernie-3.0-nano-zh", "bert-base-chinese", "chinese-roberta-wwm-ext", "chinese-macbert-base",
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
    arch = ErnieConfig.from_dict(card.config)
    assert arch.model_type in ("ernie", "bert")
    assert card.family == "ernie" and "/" in card.hub_repo and card.license
    assert card.tokenizer["vocab_size"] == arch.vocab_size
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
