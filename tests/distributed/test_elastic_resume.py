"""A checkpoint written with the distributed optimizer resumes under another DP, TP, PP and EP layout with its exact
optimizer state (main parameters, Adam moments and step): the resumed run's losses are those of a run that trained
uninterrupted in the new layout. Covered: the encoder DP=2 -> DP=1, TP=2 -> DP=2, PP=2 (its tied embedding in a
bucket of its own) -> DP=1; the decoder TP=2 (SwiGLU's fused projection split in two) -> PP=2; the mixture of
experts EP=2 (experts in an optimizer of their own) -> one process (one optimizer)."""

import json

import pytest

from tests.distributed.conftest import losses, make_corpus, pretrain

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LAYOUTS = {"dp2": (2, ()), "dp1": (1, ()), "tp2": (2, ("--tp", "2")), "pp2": (2, ("--pp", "2")),
           "ep2": (2, ("--ep", "2"))}
_full: dict[tuple, dict[int, float]] = {}


@pytest.fixture(scope="module")
def corpora(corpus, tmp_path_factory):
    return {"mlm": corpus, "causal-lm": make_corpus(tmp_path_factory.mktemp("causal"), objective="causal-lm")}


def _uninterrupted(data, tmp_path_factory, recipe: str, layout: str) -> dict[int, float]:
    if (recipe, layout) not in _full:
        nproc, flags = LAYOUTS[layout]
        run = tmp_path_factory.mktemp(f"{recipe}-{layout}")
        _full[recipe, layout] = losses(pretrain(data, run, nproc, "--recipe", recipe, "--distributed-optimizer",
                                                *flags))
    return _full[recipe, layout]


@pytest.mark.parametrize("recipe, objective, saved, resumed", [
    ("ernie-debug", "mlm", "dp2", "dp1"), ("ernie-debug", "mlm", "tp2", "dp2"), ("ernie-debug", "mlm", "pp2", "dp1"),
    ("ernie4.5-debug", "causal-lm", "tp2", "pp2"), ("ernie4.5-moe-debug", "causal-lm", "ep2", "dp1")])
def test_the_optimizer_state_reshards(corpora, tmp_path, tmp_path_factory, recipe, objective, saved, resumed):
    data = corpora[objective] / "data"
    full = _uninterrupted(data, tmp_path_factory, recipe, resumed)
    args = ("--recipe", recipe, "--distributed-optimizer")
    nproc, flags = LAYOUTS[saved]
    pretrain(data, tmp_path / "run", nproc, *args, *flags, "--save-interval", "3", "--stop-at", "3")
    info = json.loads((tmp_path / "run" / "checkpoints" / "step_0000003" / "trainer.json").read_text())
    assert info["optimizer_format"] == "model_space"
    nproc, flags = LAYOUTS[resumed]
    after = losses(pretrain(data, tmp_path / "run", nproc, *args, *flags, "--resume"))
    for step in range(4, 7):
        assert after[step] == pytest.approx(full[step], abs=1e-5), (step, after, full)
