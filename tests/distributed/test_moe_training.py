"""Causal-LM pretraining of the ERNIE 4.5 mixture of experts (recipe ernie4.5-moe-debug) on the engine: without
auxiliary loss, 10 steps give the same losses (fp32, within 1e-5) and gradient norms on one process, under expert
parallelism (EP=2: each rank holds 2 of the 4 experts) and under TP=2 x EP=2 (sequence parallel, experts not
tensor-split); with an auxiliary loss, metrics.jsonl's MoE figures are there and the loss differs."""

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import torchrun
from tests.distributed.conftest import make_corpus, same_training, train_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("moe-causal"), objective="causal-lm", stride=5, longest=3, count=100)


def run(corpus: Path, tag: str, nproc: int, *args) -> dict:
    return train_run(corpus, tag, nproc, "--recipe", "ernie4.5-moe-debug", *args)


@pytest.fixture(scope="module")
def single(corpus):
    return run(corpus, "single", 1)


close = same_training


def test_single_process_learns_and_reports_expert_load(single):
    assert single["loss"][-1] < single["loss"][0] - 0.3
    moe = single["moe"][0]
    # 8 samples x 32 tokens, top-2: 512 assignments per MoE layer; the busiest expert has at least a quarter
    assert len(moe["moe_tokens_per_expert_max"]) == 3 and all(m >= 128 for m in moe["moe_tokens_per_expert_max"])
    assert "moe_aux_loss" not in moe  # no auxiliary loss in this recipe by default


@pytest.mark.parametrize("nproc,flags", [(2, ["--ep", "2"]), (2, ["--tp", "2", "--ep", "2", "--etp", "1", "--sp"])],
                         ids=["ep2", "tp2-ep2-etp1-sp"])
def test_expert_parallel_layouts_give_the_same_losses(corpus, single, nproc, flags):
    result = run(corpus, "-".join(f.strip("-") for f in flags), nproc, *flags)
    close(single, result, " ".join(flags))
    assert result["moe"][0]["moe_tokens_per_expert_max"] == single["moe"][0]["moe_tokens_per_expert_max"]


def test_aux_loss_is_trained_and_logged(corpus, single):
    result = run(corpus, "aux", 2, "--ep", "2", "--moe-aux-loss-coeff", "0.1")
    assert result["loss"][0] == pytest.approx(single["loss"][0], abs=1e-5)  # the LM loss is what is logged
    assert max(abs(x - y) for x, y in zip(result["loss"][1:], single["loss"][1:])) > 1e-4  # but training differs
    aux = [m["moe_aux_loss"] for m in result["moe"]]
    assert all(1.0 <= a < 4.0 for a in aux), aux  # E * sum(f_i p_i): 1 when even, at most E
    metrics = [json.loads(line) for line in (corpus / "aux" / "metrics.jsonl").read_text().splitlines()]
    assert [m["moe_aux_loss"] for m in metrics] == pytest.approx(aux)


def test_expert_parallel_checkpoint_resumes_and_exports(corpus, single):
    """A checkpoint written at EP=2 (each rank saves its experts) resumes to the losses of the uninterrupted run
    (on one process: the same losses at every layout), and `zhnlp export` of it gives a directory transformers' MoE model loads
    with the trained weights (its loss on a batch equals zhnlp's)."""
    import subprocess
    import sys

    import torch
    import transformers

    import zhnlp

    from tests.tiny_decoder import inputs

    main = ("-m", "zhnlp")  # torchrun -m zhnlp pretrain ...
    out = corpus / "ep2-saved"
    common = ["pretrain", "--recipe", "ernie4.5-moe-debug", "--data", corpus / "data", "--seq-length", "32",
              "--output", out, "--save-interval", "5"]
    torchrun(Path(main[0]), 2, main[1], *common, "--ep", "2", "--steps", "10")
    shutil.rmtree(out / "checkpoints" / "step_0000010")  # as if stopped after step 5's checkpoint
    torchrun(Path(main[0]), 2, main[1], *common, "--ep", "2", "--steps", "10", "--resume")
    logged = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged[-5:] == pytest.approx(single["loss"][5:], abs=1e-5)
    # at another ep the weights reshard (each expert to its new owner) and the plain optimizer's state starts fresh,
    # said once (the distributed optimizer's reshards: tests/distributed/test_elastic_resume.py)
    other = corpus / "ep1-from-ep2"
    shutil.copytree(out / "checkpoints" / "step_0000005", other / "checkpoints" / "step_0000005")
    one = [c if c != out else other for c in common]
    proc = torchrun(Path(main[0]), 1, main[1], *one, "--steps", "6", "--resume")
    said = proc.stderr + proc.stdout
    assert said.count("the optimizer state cannot be restored (saved at ep=2 etp=1: the experts' optimizer state "
                      "restores only at the same ep and etp without the distributed optimizer)") == 1, said[-3000:]
    step6 = json.loads((other / "metrics.jsonl").read_text().splitlines()[-1])
    assert step6["step"] == 6 and abs(step6["loss"] - single["loss"][5]) <= 1e-5  # step 6's loss: before its update
    subprocess.run([sys.executable, "-m", "zhnlp", "export", str(out), str(corpus / "exported")], check=True,
                   capture_output=True)
    hf = transformers.Ernie4_5_MoeForCausalLM.from_pretrained(corpus / "exported").eval()
    zh = zhnlp.AutoModelForCausalLM.from_pretrained(corpus / "exported")
    batch = inputs()
    batch = {k: v % 1000 + 1000 if k == "input_ids" else v for k, v in batch.items()}
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        assert float(zh(**batch).loss) == pytest.approx(float(hf(**batch).loss), abs=1e-5)
    assert hf.model.layers[1].mlp.experts.gate_up_proj.abs().sum() > 0
