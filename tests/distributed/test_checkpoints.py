"""Distributed checkpoints: stop and --resume reproduces the uninterrupted run exactly (fp32),
a checkpoint saved at TP=2 resumes at TP=1, and an unfinished save is never taken for complete."""

import pytest

from tests.distributed.conftest import losses, pretrain

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_resume_reproduces_the_uninterrupted_run(corpus, tmp_path):
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1))
    pretrain(corpus / "data", tmp_path / "cut", 1, "--save-interval", "3", "--stop-at", "3")
    assert [p.name for p in sorted((tmp_path / "cut" / "checkpoints").iterdir())] == ["step_0000003"]
    resumed = losses(pretrain(corpus / "data", tmp_path / "cut", 1, "--resume"))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


def test_distributed_optimizer_state_resumes_in_the_same_layout(corpus, tmp_path):
    full = losses(pretrain(corpus / "data", tmp_path / "full", 2, "--distributed-optimizer"))
    pretrain(corpus / "data", tmp_path / "cut", 2, "--distributed-optimizer", "--save-interval", "3", "--stop-at", "3")
    resumed = losses(pretrain(corpus / "data", tmp_path / "cut", 2, "--distributed-optimizer", "--resume"))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


def test_tp2_checkpoint_resumes_at_tp1(corpus, tmp_path):
    full = losses(pretrain(corpus / "data", tmp_path / "full", 1))
    pretrain(corpus / "data", tmp_path / "re", 2, "--tp", "2", "--save-interval", "3", "--stop-at", "3")
    resumed = losses(pretrain(corpus / "data", tmp_path / "re", 1, "--resume"))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(full[step], abs=1e-5), step


def test_an_unfinished_save_is_not_resumed(corpus, tmp_path):
    from zhnlp.training.checkpoint import latest

    pretrain(corpus / "data", tmp_path / "run", 1, "--save-interval", "2", "--stop-at", "2")
    ckpts = tmp_path / "run" / "checkpoints"
    crashed = ckpts / "step_0000004.incomplete"
    (crashed / "model").mkdir(parents=True)  # what a crash during the next save leaves
    assert latest(ckpts).name == "step_0000002"
    resumed = losses(pretrain(corpus / "data", tmp_path / "run", 1, "--resume", "--save-interval", "2"))
    assert max(resumed) == 6 and not crashed.exists()
    assert [p.name for p in sorted(ckpts.iterdir())] == ["step_0000002", "step_0000004", "step_0000006"]


def test_export_gives_a_transformers_model_with_its_tokenizer(corpus, tmp_path):
    import torch
    import transformers

    import zhnlp
    from zhnlp.training.export import export

    pretrain(corpus / "data", tmp_path / "run", 2, "--tp", "2", "--save-interval", "6")
    out = export(tmp_path / "run", tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    enc = tok(["北京是中华人民共和国的首都。"], return_tensors="pt")
    with torch.no_grad():
        ref = hf(**enc).logits
    ours = zhnlp.AutoModelForMaskedLM.from_pretrained(out)(**enc).logits
    torch.testing.assert_close(ours.cpu(), ref, rtol=0, atol=1e-5)
    assert type(hf).__name__ == "ErnieForMaskedLM"
