"""Model cards: ``zhnlp/model_cards/<name>.md`` (package data, so installed with zhnlp), Markdown with YAML
front matter.

The front matter is data: family, hub repo and revision, architecture (transformers'
config.json fields), tokenizer, licence, tasks and published results with their sources.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from zhnlp.errors import ModelNotFoundError

REQUIRED = ("name", "family", "hub_repo", "revision", "license", "description", "tokenizer", "tasks", "config",
            "results")


@dataclass(frozen=True)
class ModelCard:
    name: str
    family: str
    hub_repo: str
    revision: str
    license: str
    description: str
    tokenizer: dict
    tasks: tuple[str, ...]
    config: dict
    results: tuple[dict, ...] = ()
    body: str = field(default="", repr=False)
    path: Path | None = field(default=None, repr=False)

    @property
    def parameters(self) -> int:
        """Parameter count from the config: an encoder's embeddings + layers + pooler, or a decoder's
        (ERNIE 4.5, dense or MoE) embeddings + layers + final norm + untied output layer."""
        c = self.config
        if c["model_type"] in ("ernie4_5", "ernie4_5_moe"):
            return decoder_parameters(c)
        h, f, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        emb = (c["vocab_size"] + c["max_position_embeddings"] + c.get("type_vocab_size", 0)
               + (c.get("task_type_vocab_size", 0) if c.get("use_task_id") else 0)) * h + 2 * h
        layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        return emb + n * layer + h * h + h


def decoder_parameters(c: dict) -> int:
    """Parameters of an ERNIE 4.5 decoder described by config.json fields ``c`` (transformers' names)."""
    h, n, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv, hd = c.get("num_key_value_heads") or heads, c.get("head_dim") or h // heads
    bias = bool(c.get("use_bias"))
    attention = h * hd * (heads + 2 * kv) + heads * hd * h + (hd * (heads + 2 * kv) + h if bias else 0)

    def swiglu(width: int) -> int:  # gate, up (h -> width) and down (width -> h)
        return 3 * h * width + (2 * width + h if bias else 0)

    total = vocab * h * (1 if c.get("tie_word_embeddings", True) else 2) + h  # embeddings (+ output), final norm
    for layer in range(n):
        mlp = swiglu(c["intermediate_size"])
        if c["model_type"] == "ernie4_5_moe":
            end = c.get("moe_layer_end_index", -1)
            end = n - 1 if end == -1 else end
            if (layer + 1) % c.get("moe_layer_interval", 1) == 0 and c.get("moe_layer_start_index", 0) <= layer <= end:
                experts, width = c["moe_num_experts"], c["moe_intermediate_size"]
                shared = c.get("moe_num_shared_experts", 0)
                # routed experts (no biases), the router's weight and correction bias, the shared experts
                mlp = experts * 3 * h * width + experts * h + experts + (swiglu(width * shared) if shared else 0)
        total += attention + mlp + 2 * h  # two RMSNorms
    return total


def cards_dir() -> Path:
    """``$ZHNLP_MODEL_CARDS`` or the ``model_cards/`` folder inside the installed package."""
    env = os.environ.get("ZHNLP_MODEL_CARDS")
    return Path(env) if env else Path(__file__).resolve().parent / "model_cards"


def parse_card(path: Path) -> ModelCard:
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---"):
        raise ValueError(f"{path}: a model card starts with YAML front matter between '---' lines.")
    _, front, body = text.split("---", 2)
    data = yaml.safe_load(front) or {}
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{path}: front matter lacks {missing}.")
    return ModelCard(name=data["name"], family=data["family"], hub_repo=data["hub_repo"],
                     revision=str(data["revision"]), license=data["license"], description=data["description"],
                     tokenizer=data["tokenizer"], tasks=tuple(data["tasks"]), config=data["config"],
                     results=tuple(data["results"] or ()), body=body.strip(), path=path)


@lru_cache(maxsize=None)
def _all_cards(directory: str) -> dict[str, ModelCard]:
    cards = {}
    for path in sorted(Path(directory).glob("*.md")):
        card = parse_card(path)
        if card.name != path.stem:
            raise ValueError(f"{path}: card name {card.name!r} differs from its file name.")
        cards[card.name] = card
    return cards


def list_models() -> list[ModelCard]:
    """Every model in the zoo, sorted by name."""
    return list(_all_cards(str(cards_dir())).values())


def get_card(name: str) -> ModelCard | None:
    """The card called ``name``, or None."""
    return _all_cards(str(cards_dir())).get(name)


def require_card(name: str) -> ModelCard:
    card = get_card(name)
    if card is None:
        import difflib

        names = [c.name for c in list_models()]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ModelNotFoundError(f"unknown model name {name!r}.{hint} Known names: {', '.join(names)} "
                                 "(or pass a local directory or a hub repo id like 'org/name').")
    return card
