"""save_pretrained's sharding (huggingface_hub's splitter) and push_to_hub (huggingface_hub's upload)."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

import zhnlp
from zhnlp.models.common.saving import PushToHubError
from tests.tiny import hf_model


@pytest.fixture
def mlm(tmp_path):
    hf = hf_model("ernie3", "mlm")
    hf.save_pretrained(tmp_path / "hf")
    return hf, zhnlp.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf")


def files(directory):
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("size", ["30KB", 40_000, "1GB"])
def test_shards_are_the_ones_transformers_writes(tmp_path, mlm, size):
    hf, model = mlm
    model.save_pretrained(tmp_path / "ours", max_shard_size=size)
    hf.save_pretrained(tmp_path / "theirs", max_shard_size=size)
    weights = [f for f in files(tmp_path / "theirs") if f.startswith("model")]
    assert [f for f in files(tmp_path / "ours") if f.startswith("model")] == weights
    if "model.safetensors.index.json" in weights:
        assert len(weights) > 2
        ours = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
        theirs = json.loads((tmp_path / "theirs" / "model.safetensors.index.json").read_text())
        # the same split rule over tensors in megatron's module order (transformers' own order differs a little)
        assert ours["weight_map"].keys() == theirs["weight_map"].keys()
        assert ours["metadata"]["total_size"] == theirs["metadata"]["total_size"]
        limit = size if isinstance(size, int) else 30_000
        for shard in weights[:-1]:
            tensors = load_file(str(tmp_path / "ours" / shard))
            size_of = sum(t.numel() * t.element_size() for t in tensors.values())
            assert size_of <= limit or len(tensors) == 1  # a tensor larger than the limit gets a shard of its own
    back = transformers.ErnieForMaskedLM.from_pretrained(tmp_path / "ours").state_dict()
    for k, v in hf.state_dict().items():
        assert torch.equal(back[k], v), k


def test_resaving_unsharded_removes_the_old_shards(tmp_path, mlm):
    _, model = mlm
    out = tmp_path / "out"
    model.save_pretrained(out, max_shard_size="30KB")
    assert "model.safetensors.index.json" in files(out)
    (out / "tokenizer_config.json").write_text("{}")  # not ours to remove
    (out / "model_backup.safetensors").write_bytes(b"")  # nor this
    model.save_pretrained(out)
    assert files(out) == ["config.json", "model.safetensors", "model_backup.safetensors", "tokenizer_config.json"]
    assert zhnlp.AutoModelForMaskedLM.from_pretrained(out).num_parameters() == model.num_parameters()


def test_save_mistakes(tmp_path, mlm):
    _, model = mlm
    with pytest.raises(ValueError, match="zhnlp writes safetensors only"):
        model.save_pretrained(tmp_path / "x", safe_serialization=False)
    with pytest.raises(TypeError, match="they are for push_to_hub=True"):
        model.save_pretrained(tmp_path / "x", repo_id="me/model")
    with pytest.raises(TypeError, match="unexpected arguments \\['colour'\\]"):
        model.save_pretrained(tmp_path / "x", push_to_hub=True, colour="red")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        model.save_pretrained(tmp_path / "file")


class FakeApi:
    """Records what huggingface_hub's HfApi was asked to do; fails when told to."""

    calls: list = []
    fail = False

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, repo_id, **kw):
        FakeApi.calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, *, repo_id, folder_path, **kw):
        from pathlib import Path

        if FakeApi.fail:
            raise ConnectionError("hub unreachable")
        FakeApi.calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir()), kw))
        return type("Info", (), {"commit_url": f"https://hub/{repo_id}/commit/1"})()


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub

    FakeApi.calls, FakeApi.fail = [], False
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    return FakeApi


def test_push_to_hub_uploads_the_saved_directory(tmp_path, mlm, fake_hub):
    _, model = mlm
    model.save_pretrained(tmp_path / "tiny-ernie", push_to_hub=True, private=True, token="hf_x",
                          commit_message="first")
    (create, repo, kw), (upload, repo2, uploaded, kw2) = fake_hub.calls
    assert (create, repo, kw["private"], kw["exist_ok"]) == ("create_repo", "tiny-ernie", True, True)
    assert (upload, repo2, kw2["commit_message"], kw2["token"]) == ("upload_folder", "tiny-ernie", "first", "hf_x")
    assert uploaded == ["config.json", "model.safetensors"]
    fake_hub.calls = []
    assert model.push_to_hub("me/tiny", max_shard_size="30KB") == "https://hub/me/tiny/commit/1"
    assert "model.safetensors.index.json" in fake_hub.calls[1][2]


def test_a_failed_push_leaves_the_local_save(tmp_path, mlm, fake_hub):
    _, model = mlm
    fake_hub.fail = True
    with pytest.raises(PushToHubError, match=r"saved in .*tiny, but pushing it to hub repo 'me/tiny' failed "
                                             r"\(ConnectionError: hub unreachable\).*hf upload me/tiny"):
        model.save_pretrained(tmp_path / "tiny", push_to_hub=True, repo_id="me/tiny")
    assert files(tmp_path / "tiny") == ["config.json", "model.safetensors"]
    transformers.ErnieForMaskedLM.from_pretrained(tmp_path / "tiny")
