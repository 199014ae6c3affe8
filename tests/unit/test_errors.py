"""Every way from_pretrained and the runtime can be misused gives one message naming the
problem and the fix, and never damages an existing checkpoint."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

import zhnlp
from tests.tiny import hf_model, inputs
from zhnlp.errors import CheckpointError, LayoutError, ModelNotFoundError
from zhnlp.models.ernie.config import ErnieConfig


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    zhnlp.distributed.init()


# ---------------------------------------------------------------- names, paths, the hub
def test_unknown_model_name_suggests_close_names():
    with pytest.raises(ModelNotFoundError, match=r"unknown model name 'ernie-3.0-bse-zh'.*Did you mean ernie-3.0-base-zh"):
        zhnlp.AutoModel.from_pretrained("ernie-3.0-bse-zh")


def test_missing_directory():
    with pytest.raises(ModelNotFoundError, match=r"no such directory: \./nowhere/model"):
        zhnlp.AutoModel.from_pretrained("./nowhere/model")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        zhnlp.AutoModel.from_pretrained(tmp_path)


def test_uncached_name_offline_names_repo_and_fix(monkeypatch, tmp_path):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=r"nghuyong/ernie-3.0-nano-zh.*not in the local Hugging Face cache"
                                                 r".*hf download nghuyong/ernie-3.0-nano-zh"):
        zhnlp.AutoModel.from_pretrained("ernie-3.0-nano-zh")


def _fake_hub_cache(root, repo, src):
    """Lay out ``src`` as huggingface_hub's cache does: models--org--name/{refs/main,snapshots/<rev>/}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in src.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)


def test_names_and_repo_ids_resolve_through_the_hub_cache_offline(monkeypatch, tmp_path, ckpt):
    import huggingface_hub.constants as c

    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "nghuyong/ernie-3.0-nano-zh", ckpt)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids = inputs("ernie3", "base")["input_ids"]
    ref = zhnlp.AutoModel.from_pretrained(ckpt)(ids).last_hidden_state
    for name in ("ernie-3.0-nano-zh", "nghuyong/ernie-3.0-nano-zh"):
        out = zhnlp.AutoModel.from_pretrained(name)(ids).last_hidden_state
        assert torch.equal(out, ref)


# ---------------------------------------------------------------- checkpoints
def test_truncated_safetensors(ckpt):
    f = ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="not a readable safetensors file.*truncated or corrupt"):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_unexpected_key_is_named(ckpt):
    f = ckpt / "model.safetensors"
    tensors = load_file(str(f))
    tensors["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(2)
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError, match=r"unexpected weights.*ernie\.encoder\.layer\.0\.attention\.self\.rotary"):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_missing_encoder_weight_is_named(ckpt):
    f = ckpt / "model.safetensors"
    tensors = load_file(str(f))
    del tensors["encoder.layer.3.output.dense.bias"]
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError, match=r"missing weights \[ernie\.encoder\.layer\.3\.output\.dense\.bias\]"):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_config_that_does_not_describe_the_weights(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"shape mismatch for encoder\.layers\.0\.mlp\.linear_fc1\.weight"):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_invalid_config_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_unsupported_model_type(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelNotFoundError, match=r"model_type 'gpt2' is not supported.*'bert',.*'ernie'"):
        zhnlp.AutoModel.from_pretrained(ckpt)


def test_unknown_config_override(ckpt):
    with pytest.raises(TypeError, match=r"unknown config overrides \['num_lables'\]"):
        zhnlp.AutoModelForSequenceClassification.from_pretrained(ckpt, num_lables=3)


def test_new_head_is_freshly_initialised_and_named(ckpt, caplog):
    with caplog.at_level("WARNING", logger="zhnlp"):
        model = zhnlp.AutoModelForSequenceClassification.from_pretrained(ckpt, num_labels=3)
    assert "classifier.weight" in caplog.text and "freshly initialised" in caplog.text
    assert "pooler" not in caplog.text  # the checkpoint has the pooler
    assert model(**{k: v for k, v in inputs("ernie3", "base").items()}).logits.shape == (4, 3)


def test_weights_only_pytorch_bin_loads(tmp_path):
    hf = hf_model("bert", "mlm")
    (tmp_path / "bin").mkdir()
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    hf.config.to_json_file(tmp_path / "bin" / "config.json")
    batch = inputs("bert", "mlm")
    out = zhnlp.AutoModelForMaskedLM.from_pretrained(tmp_path / "bin")(**batch)
    with torch.no_grad():
        torch.testing.assert_close(out.logits, hf(**batch).logits, rtol=0, atol=1e-5)


class _Payload:
    def __reduce__(self):
        return (print, ("this code must never run",))


def test_pickle_with_code_is_refused(tmp_path, capsys):
    (tmp_path / "evil").mkdir()
    hf_model("bert", "base").config.to_json_file(tmp_path / "evil" / "config.json")
    with open(tmp_path / "evil" / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": _Payload()}, f)
    with pytest.raises(CheckpointError, match="weights-only"):
        zhnlp.AutoModel.from_pretrained(tmp_path / "evil")
    assert "must never run" not in capsys.readouterr().out


def test_failed_save_leaves_the_previous_checkpoint_intact(ckpt, monkeypatch):
    model = zhnlp.AutoModel.from_pretrained(ckpt)
    before = (ckpt / "model.safetensors").read_bytes()

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(OSError):
        model.save_pretrained(ckpt)
    assert (ckpt / "model.safetensors").read_bytes() == before
    monkeypatch.undo()
    zhnlp.AutoModel.from_pretrained(ckpt)


# ---------------------------------------------------------------- layouts
def test_layout_that_does_not_divide_the_world():
    with pytest.raises(LayoutError, match=r"world size 1 is not divisible by tp\*pp = 2\*1 = 2"):
        zhnlp.distributed.init(tp=2)
    zhnlp.distributed.init()


def test_vpp_needs_pp():
    with pytest.raises(LayoutError, match="vpp=2 needs pipeline parallelism"):
        zhnlp.distributed.init(vpp=2)


@pytest.mark.parametrize("field,value,tp,message", [
    ("num_attention_heads", 6, 4, "num_attention_heads=6 is not divisible by tp=4"),
    ("intermediate_size", 50, 4, r"intermediate_size \(FFN width\)=50 is not divisible by tp=4"),
    ("vocab_size", 250, 3, r"the padded vocabulary \(250 -> 256\) is not divisible by tp=3"),
])
def test_architecture_that_does_not_fit_tp(field, value, tp, message):
    base = dict(hidden_size=48, num_attention_heads=12, intermediate_size=48, vocab_size=256, num_hidden_layers=6)
    base[field] = value
    with pytest.raises(LayoutError, match=message):
        ErnieConfig(**base).check_layout(tp=tp, pp=1)


def test_layers_must_divide_into_stages():
    with pytest.raises(LayoutError, match=r"num_hidden_layers=6 is not divisible by pp\*vpp=4"):
        ErnieConfig(num_hidden_layers=6).check_layout(tp=1, pp=2, vpp=2)


def test_sequence_parallel_needs_tp(ckpt):
    with pytest.raises(ValueError, match="sequence_parallel=True needs tensor parallelism"):
        zhnlp.AutoModel.from_pretrained(ckpt, sequence_parallel=True)


def test_from_config_initialises_like_transformers():
    """A fresh model: N(0, initializer_range) weights, zero biases, unit norms, zero padding rows."""
    model = zhnlp.AutoModelForMaskedLM.from_config("ernie-3.0-nano-zh")
    chunk = model.chunks[0]
    word = chunk.embedding.word_embeddings.weight
    assert word.shape == (40064, 312) and torch.all(word[40000:] == 0)
    assert abs(word[:40000].std().item() - 0.02) < 1e-3
    assert torch.all(chunk.encoder.layers[0].mlp.linear_fc1.bias == 0)
    assert torch.all(chunk.encoder.layers[0].post_mlp_layernorm.weight == 1)
    again = zhnlp.AutoModelForMaskedLM.from_config("ernie-3.0-nano-zh")
    assert torch.equal(again.chunks[0].encoder.layers[3].self_attention.linear_qkv.weight,
                       chunk.encoder.layers[3].self_attention.linear_qkv.weight)
