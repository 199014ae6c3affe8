"""Distributed checkpoints: stop and --resume reproduces the uninterrupted run exactly (fp32),
a checkpoint saved at TP=2 resumes at TP=1, and an unfinished save is never taken for complete.
A damaged checkpoint (files missing or cut short, trainer.json unreadable) is named and the one
before it is used, by --resume and by export; when all are damaged the run stops with one line."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
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


# ---------------------------------------------------------------- damaged checkpoints
def zhnlp(*args: str) -> subprocess.CompletedProcess:
    """``python -m zhnlp ARGS`` in one process (the output is checked by the caller)."""
    return subprocess.run([sys.executable, "-m", "zhnlp", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})


def train_args(corpus, out, *args: str) -> list[str]:
    return ["pretrain", "--recipe", "ernie-debug", "--data", str(corpus / "data"), "--output", str(out),
            "--steps", "400", "--seq-length", "32", *args]


@pytest.fixture(scope="module")
def saved_run(corpus, tmp_path_factory):
    """A single-process run, checkpoints at steps 2, 4 and 6, started with --resume on a new
    directory (which must say that it starts from step 0). Tests damage copies of it."""
    out = tmp_path_factory.mktemp("saved") / "run"
    proc = zhnlp(*train_args(corpus, out, "--resume", "--save-interval", "2", "--stop-at", "6"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc, losses([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])


def copy_run(saved_run, tmp_path) -> Path:
    shutil.copytree(saved_run[0], tmp_path / "run")
    return tmp_path / "run"


def test_resume_without_a_checkpoint_says_it_starts_from_step_0(saved_run):
    out, proc, _ = saved_run
    assert f"zhnlp: --resume: no checkpoint in {out / 'checkpoints'} yet; starting from step 0\n" in proc.stderr
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_0000002", "step_0000004",
                                                                         "step_0000006"]


def _set(rel: str, value):
    def change(path: Path) -> None:
        info = json.loads((path / "trainer.json").read_text())
        info[rel] = value
        (path / "trainer.json").write_text(json.dumps(info))
    return change


def _drop_manifest(then=None):
    def change(path: Path) -> None:
        (path / "manifest.json").unlink()
        if then:
            then(path)
    return change


def _truncate(rel: str, size: int):
    return lambda path: os.truncate(path / rel, size)


DAMAGE = {
    "shard deleted": (lambda p: (p / "model" / "__0_0.distcp").unlink(), r"model/__0_0\.distcp is missing"),
    "shard truncated": (_truncate("model/__0_0.distcp", 1000),
                        r"model/__0_0\.distcp has 1,000 bytes, [\d,]+ expected"),
    "trainer.json corrupt": (lambda p: (p / "trainer.json").write_text('{"step": 6,'),
                             r"trainer\.json is not valid JSON \(Expecting property name enclosed in double quotes "
                             r"at line 1\)"),
    "trainer.json missing": (lambda p: (p / "trainer.json").unlink(), r"trainer\.json is missing"),
    "trainer.json wrong step": (_set("step", 5), r"trainer\.json says step 5, the directory step 6"),
    "rng file missing": (lambda p: (p / "rng" / "rank_00000.safetensors").unlink(),
                         r"rng/rank_00000\.safetensors is missing"),
    "distopt file missing": (_set("distributed_optimizer", True), r"distopt/mp_rank_00_000\.pt is missing"),
    "metadata truncated": (_truncate("model/.metadata", 100), r"model/\.metadata has 100 bytes, [\d,]+ expected"),
    # checkpoints written before manifests: what megatron's .metadata records is checked instead
    "no manifest, shard truncated": (_drop_manifest(_truncate("model/__0_0.distcp", 1000)),
                                     r"model/__0_0\.distcp has 1,000 bytes, at least [\d,]+ expected"),
    "no manifest, metadata damaged": (_drop_manifest(_truncate("model/.metadata", 100)),
                                      r"model/\.metadata is damaged"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_is_named(saved_run, tmp_path, kind):
    from zhnlp.training.checkpoint import newest_loadable, problem

    run = copy_run(saved_run, tmp_path)
    ckpts = run / "checkpoints"
    damage, message = DAMAGE[kind]
    assert problem(ckpts / "step_0000006") is None
    damage(ckpts / "step_0000006")
    why = problem(ckpts / "step_0000006")
    assert re.fullmatch(message, why)
    assert newest_loadable(ckpts) == (ckpts / "step_0000004", [(ckpts / "step_0000006", why)])


def test_a_checkpoint_without_manifest_that_is_whole_passes(saved_run, tmp_path):
    from zhnlp.training.checkpoint import problem

    run = copy_run(saved_run, tmp_path)
    (run / "checkpoints" / "step_0000006" / "manifest.json").unlink()
    assert problem(run / "checkpoints" / "step_0000006") is None


def test_resume_passes_over_a_damaged_newest_checkpoint(corpus, saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path)
    newest = run / "checkpoints" / "step_0000006"
    (newest / "model" / "__0_0.distcp").unlink()
    proc = zhnlp(*train_args(corpus, run, "--resume", "--stop-at", "6"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (f"zhnlp: checkpoint {newest} is damaged (model/__0_0.distcp is missing); using step_0000004 instead"
            in proc.stderr)
    assert f"zhnlp: resumed from {run / 'checkpoints' / 'step_0000004'} (step 4)" in proc.stderr
    resumed = losses([json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()])
    for step in (5, 6):
        assert resumed[step] == pytest.approx(saved_run[2][step], abs=1e-6), step


def test_resume_with_every_checkpoint_damaged_stops_with_one_line(corpus, saved_run, tmp_path):
    run = copy_run(saved_run, tmp_path)
    ckpts = run / "checkpoints"
    (ckpts / "step_0000006" / "model" / "__0_0.distcp").unlink()
    (ckpts / "step_0000004" / "trainer.json").write_text("")
    (ckpts / "step_0000002" / "rng" / "rank_00000.safetensors").unlink()
    before = (run / "metrics.jsonl").read_text()
    proc = zhnlp(*train_args(corpus, run, "--resume", "--stop-at", "8"))
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("zhnlp: error:")]
    assert errors == [f"zhnlp: error: no loadable checkpoint in {ckpts} (step_0000006: model/__0_0.distcp is "
                      "missing; step_0000004: trainer.json is not valid JSON (Expecting value at line 1); "
                      "step_0000002: rng/rank_00000.safetensors is missing); restore the damaged files, or move "
                      "these directories aside to start from step 0."]
    assert "Traceback" not in proc.stderr and (run / "metrics.jsonl").read_text() == before  # nothing trained


def test_export_names_a_damaged_checkpoint_and_takes_the_previous_one(saved_run, tmp_path, caplog):
    from zhnlp.errors import CheckpointError
    from zhnlp.training.export import export

    run = copy_run(saved_run, tmp_path)
    ckpts = run / "checkpoints"
    os.truncate(ckpts / "step_0000006" / "model" / "__0_0.distcp", 1000)
    with pytest.raises(CheckpointError, match=r"^checkpoint \S+step_0000006 is damaged \(model/__0_0\.distcp has "
                                              r"1,000 bytes, [\d,]+ expected\); export an earlier one, e.g. "
                                              r"\S+step_0000004\.$"):
        export(ckpts / "step_0000006", tmp_path / "hf6")
    assert not (tmp_path / "hf6").exists()
    out = export(run, tmp_path / "hf")
    assert (out / "config.json").is_file()
    # a warning of the zhnlp logger (on stderr as "zhnlp: checkpoint ..." under the command line)
    assert f"checkpoint {ckpts / 'step_0000006'} is damaged" in caplog.text
    # damage the files cannot show (same size, other bytes): the reader's failure becomes one line
    meta = ckpts / "step_0000004" / "model" / ".metadata"
    meta.write_bytes(b"\0" * meta.stat().st_size)
    with pytest.raises(CheckpointError, match=r"^checkpoint \S+step_0000004 cannot be read \(.*invalid load key.*\); "
                                              r"it is damaged: move it aside to use the one before it\.$"):
        export(ckpts / "step_0000004", tmp_path / "hf4")
