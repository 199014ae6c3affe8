"""Causal-LM pretraining of the dense ERNIE 4.5 decoder (recipe ernie4.5-debug) on the engine: from the same
initial weights and packed data, 10 steps give the same losses (fp32, within 1e-5) and gradient norms on one
process and under TP=2, TP=2 x PP=2 and DP=2 with the distributed optimizer (attention across documents), and
TP=2 with sequence parallelism and PP=2 with virtual stages (reset attention: per-document masks and
positions). Checkpoints: stop and --resume reproduces the uninterrupted run exactly, a TP=2 checkpoint resumes
at PP=2, and `zhnlp export` gives a directory transformers' Ernie4_5ForCausalLM loads, whose loss on the next
global batch is the loss the run logged for it."""

from pathlib import Path

import pytest

from tests.distributed.conftest import losses, make_corpus, pretrain, same_training, train_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
RECIPE = ["--recipe", "ernie4.5-debug"]


@pytest.fixture(scope="module")
def causal_corpus(tmp_path_factory):
    """The distributed tests' documents, preprocessed for causal LM (about 5,000 tokens, [SEP] as EOD)."""
    return make_corpus(tmp_path_factory.mktemp("causal"), objective="causal-lm")


def run(corpus: Path, tag: str, nproc: int, *args) -> dict:
    return train_run(corpus, tag, nproc, *RECIPE, *args)


@pytest.fixture(scope="module")
def references(causal_corpus):
    return {"plain": run(causal_corpus, "single", 1),
            "reset": run(causal_corpus, "single-reset", 1, "--reset-attention")}


close = same_training


def test_single_process_learns_and_reset_attention_changes_the_losses(references):
    plain, reset = references["plain"]["loss"], references["reset"]["loss"]
    assert plain[-1] < plain[0] - 0.3 and reset[-1] < reset[0] - 0.3
    assert max(abs(x - y) for x, y in zip(plain[1:], reset[1:])) > 1e-4  # the masks do reach the attention


@pytest.mark.parametrize("name,nproc,args", [
    ("tp2", 2, ["--tp", "2"]),
    ("dp2-distopt", 2, ["--distributed-optimizer"]),
    ("tp2xpp2", 4, ["--tp", "2", "--pp", "2"]),
    ("tp2-sp-reset", 2, ["--tp", "2", "--sp", "--reset-attention"]),
    ("pp2-vpp2-reset", 2, ["--pp", "2", "--vpp", "2", "--reset-attention"]),
])
def test_layout_gives_the_same_losses(causal_corpus, references, name, nproc, args):
    reference = references["reset" if "--reset-attention" in args else "plain"]
    close(reference, run(causal_corpus, name, nproc, *args), name)


def test_resume_reshard_and_export(causal_corpus, tmp_path):
    import numpy as np
    import torch
    import transformers

    from zhnlp.data.causal_lm import CausalLMDataset
    from zhnlp.training.export import export

    data = causal_corpus / "data"
    full = losses(pretrain(data, tmp_path / "full", 1, *RECIPE))
    pretrain(data, tmp_path / "cut", 1, *RECIPE, "--save-interval", "3", "--stop-at", "3")
    resumed = losses(pretrain(data, tmp_path / "cut", 1, *RECIPE, "--resume"))
    for step in range(4, 7):  # exact: same layout, model, optimizer and RNG state
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step
    pretrain(data, tmp_path / "re", 2, *RECIPE, "--tp", "2", "--save-interval", "3", "--stop-at", "3")
    resharded = losses(pretrain(data, tmp_path / "re", 2, *RECIPE, "--pp", "2", "--resume"))
    for step in range(4, 7):  # saved at TP=2, continued at PP=2
        assert resharded[step] == pytest.approx(full[step], abs=1e-5), step

    out = export(tmp_path / "re" / "checkpoints" / "step_0000003", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "Ernie4_5ForCausalLM" and tok.convert_ids_to_tokens(hf.config.eos_token_id) == "[SEP]"
    ds = CausalLMDataset(data, 32, seed=1234)  # ernie4.5-debug's seed; --seq-length 32, global batch 8
    batch = torch.as_tensor(np.stack([ds[i]["input_ids"] for i in range(3 * 8, 4 * 8)]))  # step 4: its global batch
    with torch.no_grad():
        loss = hf(batch, labels=batch).loss
    assert float(loss) == pytest.approx(full[4], abs=1e-5)  # what step 4 computed with the step-3 weights
