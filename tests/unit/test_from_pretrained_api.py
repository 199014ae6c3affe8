"""from_pretrained's transformers arguments and the model methods transformers users call, against
transformers itself on tiny random checkpoints it writes."""

import json
import logging

import pytest
import torch
import transformers

import zhnlp
from zhnlp.errors import CheckpointError, ModelNotFoundError
from zhnlp.models.common.loading import UnsupportedOptionError
from tests.tiny import CONFIGS, HF_CLASSES, hf_model, inputs

AUTO = {"base": zhnlp.AutoModel, "mlm": zhnlp.AutoModelForMaskedLM,
        "sequence_classification": zhnlp.AutoModelForSequenceClassification,
        "token_classification": zhnlp.AutoModelForTokenClassification,
        "question_answering": zhnlp.AutoModelForQuestionAnswering}
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "task_type_ids")


def saved(tmp_path, name, head, **extra):
    hf = hf_model(name, head, **extra)
    hf.save_pretrained(tmp_path / f"{name}-{head}")
    return hf, tmp_path / f"{name}-{head}"


def model_inputs(name, head, **kw):
    batch = inputs(name, head, **kw)
    return {k: v for k, v in batch.items() if k in MODEL_INPUTS}, batch


# ---------------------------------------------------------------- forward: hidden states, tuples
@pytest.mark.parametrize("name,head", [("ernie3", "sequence_classification"), ("bert", "base"),
                                       ("ernie1", "token_classification"), ("ernie3", "mlm")])
def test_hidden_states_match_transformers(tmp_path, name, head):
    hf, path = saved(tmp_path, name, head)
    model = AUTO[head].from_pretrained(path)
    x, _ = model_inputs(name, head)
    with torch.no_grad():
        ours = model(**x, output_hidden_states=True)
        ref = hf(**x, output_hidden_states=True)
        plain = model(**x)
    assert len(ours.hidden_states) == CONFIGS[name]["num_hidden_layers"] + 1 == len(ref.hidden_states)
    for i, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states)):
        assert a.shape == b.shape
        assert (a - b).abs().max() <= 1e-5, f"hidden_states[{i}]"
    # recording all positions must not change the head's outputs (the [CLS]-only fast path is restored after)
    first = "logits" if head != "base" else "last_hidden_state"
    assert torch.allclose(ours[first], plain[first], atol=1e-6)
    assert model.chunks[0].encoder.layers[-1].first_token_only == (head == "sequence_classification")


def test_return_dict_false_and_integer_index_follow_transformers(tmp_path):
    hf, path = saved(tmp_path, "bert", "sequence_classification")
    model = zhnlp.AutoModelForSequenceClassification.from_pretrained(path)
    x, batch = model_inputs("bert", "sequence_classification")
    labels = batch["labels"]
    with torch.no_grad():
        ours = model(**x, labels=labels, return_dict=False)
        ref = hf(**x, labels=labels, return_dict=False)
        out = model(**x, labels=labels)
    assert isinstance(ours, tuple) and len(ours) == len(ref) == 2
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=1e-5)
    assert torch.equal(out[0], out.loss) and torch.equal(out[1], out.logits)
    loss, logits = out.to_tuple()
    assert torch.equal(logits, out["logits"])


def test_output_attentions_is_refused(ckpt):
    model = zhnlp.AutoModel.from_pretrained(ckpt)
    with pytest.raises(UnsupportedOptionError, match="output_attentions=True is not supported"):
        model(torch.ones(1, 4, dtype=torch.long), output_attentions=True)


# ---------------------------------------------------------------- dtype
def test_dtype_auto_reads_config_json_as_transformers_does(tmp_path):
    _, path = saved(tmp_path, "bert", "base")
    config = json.loads((path / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (path / "config.json").write_text(json.dumps(config))
    ref = transformers.AutoModel.from_pretrained(path)  # transformers 5: dtype="auto" by default
    assert ref.dtype == torch.bfloat16
    assert zhnlp.AutoModel.from_pretrained(path).dtype == torch.bfloat16
    assert zhnlp.AutoModel.from_pretrained(path, dtype="auto").dtype == torch.bfloat16
    assert zhnlp.AutoModel.from_pretrained(path, dtype=torch.float32).dtype == torch.float32
    assert zhnlp.AutoModel.from_pretrained(path, torch_dtype="float16").dtype == torch.float16
    del config["dtype"]
    (path / "config.json").write_text(json.dumps(config))
    # no config entry: the weights' own dtype (float32 here)
    assert zhnlp.AutoModel.from_pretrained(path).dtype == torch.float32


def test_dtype_mistakes_are_one_line(ckpt):
    with pytest.raises(UnsupportedOptionError, match="dtype=torch.float32 and torch_dtype=torch.bfloat16 disagree"):
        zhnlp.AutoModel.from_pretrained(ckpt, dtype=torch.float32, torch_dtype=torch.bfloat16)
    with pytest.raises(UnsupportedOptionError, match="'float64' is not supported"):
        zhnlp.AutoModel.from_pretrained(ckpt, dtype="float64")
    with pytest.raises(UnsupportedOptionError, match="torch.int8 is not supported"):
        zhnlp.AutoModel.from_pretrained(ckpt, dtype=torch.int8)


def test_bfloat16_model_is_close_to_transformers_in_bfloat16(tmp_path):
    hf, path = saved(tmp_path, "ernie3", "base")
    model = zhnlp.AutoModel.from_pretrained(path, dtype="bfloat16")
    ref = transformers.AutoModel.from_pretrained(path, dtype=torch.bfloat16).eval()
    x, _ = model_inputs("ernie3", "base")
    with torch.no_grad():
        a, b = model(**x).last_hidden_state, ref(**x).last_hidden_state
    assert a.dtype == b.dtype == torch.bfloat16
    assert (a.float() - b.float()).abs().max() < 0.1


# ---------------------------------------------------------------- device, device_map
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU cases")
def test_device_and_simple_device_maps(ckpt):
    for kw in ({"device": "cpu"}, {"device": -1}, {"device": torch.device("cpu")}, {"device_map": "auto"},
               {"device_map": "cpu"}, {"device_map": {"": "cpu"}}, {"device": "cpu", "device_map": "cpu"}):
        assert zhnlp.AutoModel.from_pretrained(ckpt, **kw).device == torch.device("cpu"), kw
    with pytest.raises(UnsupportedOptionError, match="CUDA is not available on this machine"):
        zhnlp.AutoModel.from_pretrained(ckpt, device="cuda")
    with pytest.raises(UnsupportedOptionError, match="CUDA is not available"):
        zhnlp.AutoModel.from_pretrained(ckpt, device=0)
    with pytest.raises(UnsupportedOptionError, match="several devices.*tensor/pipeline parallelism"):
        zhnlp.AutoModel.from_pretrained(ckpt, device_map={"embeddings": "cpu", "encoder": "cuda:0"})
    with pytest.raises(UnsupportedOptionError, match="is not a device"):
        zhnlp.AutoModel.from_pretrained(ckpt, device="gpu-please")
    with pytest.raises(UnsupportedOptionError, match="zhnlp runs on CUDA GPUs or the CPU"):
        zhnlp.AutoModel.from_pretrained(ckpt, device="meta")


# ---------------------------------------------------------------- heads of another size
def test_ignore_mismatched_sizes_reinitialises_the_named_head(tmp_path, caplog):
    hf, path = saved(tmp_path, "ernie3", "sequence_classification")
    with pytest.raises(CheckpointError, match="ignore_mismatched_sizes=True"):
        zhnlp.AutoModelForSequenceClassification.from_pretrained(path, num_labels=5)
    with caplog.at_level(logging.WARNING, logger="zhnlp"):
        model = zhnlp.AutoModelForSequenceClassification.from_pretrained(path, num_labels=5,
                                                                          ignore_mismatched_sizes=True)
    assert "classifier.weight: checkpoint (2, 32), model (5, 32)" in caplog.text
    assert model.fresh_weights == ["classifier.bias", "classifier.weight"]
    ref = transformers.ErnieForSequenceClassification.from_pretrained(path, num_labels=5,
                                                                      ignore_mismatched_sizes=True).eval()
    x, _ = model_inputs("ernie3", "sequence_classification")
    with torch.no_grad():
        ours, theirs = model(**x, output_hidden_states=True), ref(**x, output_hidden_states=True)
    assert ours.logits.shape == theirs.logits.shape == (4, 5)
    # everything but the new head was loaded
    assert (ours.hidden_states[-1] - theirs.hidden_states[-1]).abs().max() <= 1e-5


def test_remote_code_is_never_run(ckpt):
    with pytest.raises(UnsupportedOptionError, match="zhnlp never runs remote code"):
        zhnlp.AutoModel.from_pretrained(ckpt, trust_remote_code=True)
    with pytest.raises(UnsupportedOptionError, match="zhnlp never runs remote code"):
        zhnlp.AutoConfig.from_pretrained(ckpt, trust_remote_code=True)
    zhnlp.AutoModel.from_pretrained(ckpt, trust_remote_code=False)


# ---------------------------------------------------------------- the hub cache: cache_dir, local_files_only, token
def fake_cache(cache, repo, source):
    """A Hugging Face cache holding ``repo`` at main (the layout huggingface_hub reads)."""
    import shutil

    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = "0" * 40
    shutil.copytree(source, folder / "snapshots" / commit)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)


def test_cache_dir_local_files_only_and_token(ckpt, tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    fake_cache(cache, "someone/tiny-ernie", ckpt)
    model = zhnlp.AutoModel.from_pretrained("someone/tiny-ernie", cache_dir=cache, local_files_only=True)
    assert model.num_parameters() > 0
    assert zhnlp.AutoConfig.from_pretrained("someone/tiny-ernie", cache_dir=cache).hidden_size == 32
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache .*while local_files_only=True"):
        zhnlp.AutoModel.from_pretrained("someone/absent", cache_dir=cache, local_files_only=True)
    seen = {}

    def fake_download(repo, **kw):
        from huggingface_hub.errors import LocalEntryNotFoundError

        if kw.get("local_files_only"):
            raise LocalEntryNotFoundError("not cached")
        seen.update(kw, repo=repo)
        raise OSError("no network here")

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ModelNotFoundError, match="could not download hub repo 'someone/absent'"):
        zhnlp.AutoModel.from_pretrained("someone/absent", cache_dir=cache, token="hf_secret", revision="v1")
    assert seen["token"] == "hf_secret" and seen["revision"] == "v1" and seen["cache_dir"] == str(cache)


# ---------------------------------------------------------------- AutoConfig
def test_autoconfig_round_trips_through_transformers(tmp_path):
    _, path = saved(tmp_path, "ernie3", "sequence_classification")
    config = zhnlp.AutoConfig.from_pretrained(path, num_labels=3)
    assert type(config).__name__ == "ErnieConfig" and config.num_labels == 3 and config.use_task_id
    config.save_pretrained(tmp_path / "cfg")
    theirs = transformers.AutoConfig.from_pretrained(tmp_path / "cfg")
    assert type(theirs).__name__ == "ErnieConfig" and theirs.num_labels == 3
    assert theirs.task_type_vocab_size == config.task_type_vocab_size
    assert json.loads(config.to_json_string())["hidden_size"] == 32
    # a config object, a transformers config and a dict all build the same model
    for given in (config, theirs, theirs.to_dict()):
        model = zhnlp.AutoModelForSequenceClassification.from_config(given)
        assert model.config.num_labels == 3
    built = zhnlp.AutoConfig.for_model("bert", hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                                       intermediate_size=20, vocab_size=50)
    assert built.model_type == "bert" and built.hidden_size == 16
    with pytest.raises(TypeError, match="AutoConfig.from_pretrained"):
        zhnlp.AutoConfig()


def test_from_pretrained_with_a_config_argument(tmp_path):
    hf, path = saved(tmp_path, "bert", "base")
    config = transformers.AutoConfig.from_pretrained(path)
    config.hidden_dropout_prob = 0.3
    model = zhnlp.AutoModel.from_pretrained(path, config=config)
    assert model.config.hidden_dropout_prob == 0.3
    x, _ = model_inputs("bert", "base")
    with torch.no_grad():
        assert (model(**x).last_hidden_state - hf(**x).last_hidden_state).abs().max() <= 1e-5


# ---------------------------------------------------------------- model methods
@pytest.mark.parametrize("head", list(HF_CLASSES))
def test_num_parameters_counts_as_transformers_does(tmp_path, head):
    hf, path = saved(tmp_path, "ernie3", head)
    model = AUTO[head].from_pretrained(path)
    assert model.num_parameters() == hf.num_parameters()
    assert model.num_parameters(exclude_embeddings=True) == hf.num_parameters(exclude_embeddings=True)
    for p in model.chunks[0].embedding.parameters():
        p.requires_grad_(False)
    for p in hf.base_model.embeddings.parameters():
        p.requires_grad_(False)
    assert model.num_parameters(only_trainable=True) == hf.num_parameters(only_trainable=True)


def test_input_embeddings_device_and_dtype(tmp_path):
    hf, path = saved(tmp_path, "ernie3", "mlm")
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(path)
    emb = model.get_input_embeddings()
    vocab = CONFIGS["ernie3"]["vocab_size"]
    assert torch.equal(emb.weight[:vocab], hf.get_input_embeddings().weight)
    assert model.get_output_embeddings() is not None
    assert model.device == torch.device("cpu") and model.dtype == torch.float32


@pytest.mark.parametrize("new,multiple", [(270, None), (200, None), (251, 64)])
def test_resize_token_embeddings_keeps_rows_and_saves_for_transformers(tmp_path, new, multiple):
    hf, path = saved(tmp_path, "ernie3", "mlm")
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(path)
    x, _ = model_inputs("ernie3", "mlm")
    x["input_ids"] = x["input_ids"] % 200  # ids that exist before and after
    with torch.no_grad():
        before = model(**x).logits
    model.resize_token_embeddings(new, pad_to_multiple_of=multiple)
    size = new if multiple is None else -(-new // multiple) * multiple
    assert model.config.vocab_size == size
    with torch.no_grad():
        after = model(**x).logits
    assert after.shape[-1] == size
    kept = min(size, 250)
    if size > 250:  # new rows at the mean of the old ones, as transformers' mean_resizing
        weight = model.get_input_embeddings().weight
        assert torch.allclose(weight[250:size], weight[:250].mean(0).expand(size - 250, -1), atol=1e-6)
    else:
        assert (after[..., :kept] - before[..., :kept]).abs().max() <= 1e-5
    model.save_pretrained(tmp_path / "resized")
    back = transformers.ErnieForMaskedLM.from_pretrained(tmp_path / "resized").eval()
    assert back.config.vocab_size == size
    with torch.no_grad():
        assert (back(**x).logits - after).abs().max() <= 1e-5
    hf.resize_token_embeddings(size, mean_resizing=False)
    assert torch.equal(back.get_input_embeddings().weight[:kept], hf.get_input_embeddings().weight[:kept])


def test_gradient_checkpointing_recomputes_with_the_same_gradients(tmp_path):
    # without dropout, so that the two runs compute the same thing
    _, path = saved(tmp_path, "ernie3", "mlm", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    x, batch = model_inputs("ernie3", "mlm")
    grads, calls = [], []
    for checkpointing in (False, True):
        model = zhnlp.AutoModelForMaskedLM.from_pretrained(path)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing == checkpointing
        count = []
        model.chunks[0].encoder.layers[0].register_forward_hook(lambda *a: count.append(1))
        model(**x, labels=batch["labels"]).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        calls.append(len(count))
    assert calls == [1, 2]  # the layer ran again in the backward pass
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert (grads[0][n] - grads[1][n]).abs().max() <= 1e-6, (n, (grads[0][n] - grads[1][n]).abs().max())
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
