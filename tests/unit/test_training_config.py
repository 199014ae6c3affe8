"""Run configuration: recipes, overrides, and layouts that fail before any work."""

import pytest

from zhnlp.errors import LayoutError
from zhnlp.training import RECIPES, override, recipe


def test_recipes_build_and_fit_one_process():
    for name in RECIPES:
        cfg = recipe(name)
        assert cfg.recipe == name
        cfg.check(world_size=1)


def test_overrides_reach_nested_fields():
    cfg = override(recipe("ernie-debug"), tp=2, lr=3e-4, steps=7, micro_batch_size=4, prefix="x", vpp=None)
    assert (cfg.parallel.tp, cfg.optimizer.lr, cfg.steps, cfg.data.micro_batch_size, cfg.data.prefix) == \
        (2, 3e-4, 7, 4, "x")
    with pytest.raises(TypeError, match="no run setting named 'learning_rate'"):
        override(cfg, learning_rate=1.0)


def test_unknown_recipe():
    with pytest.raises(LayoutError, match="unknown recipe 'ernie-huge'"):
        recipe("ernie-huge")


@pytest.mark.parametrize("changes,world,message", [
    (dict(tp=3), 3, "num_attention_heads=4 is not divisible by tp=3"),
    (dict(pp=2, vpp=4), 2, r"num_hidden_layers=4 is not divisible by pp\*vpp=8"),
    (dict(global_batch_size=6), 2, "global batch 6 is not divisible by micro batch 2 x data-parallel size 2"),
    (dict(tp=2), 3, r"world size 3 is not divisible by tp\*pp = 2"),
    (dict(sequence_parallel=True), 1, "sequence parallelism needs tp >= 2"),
    (dict(precision="fp8"), 1, "precision 'fp8' is not one of fp32, bf16, fp16"),
])
def test_layouts_that_cannot_work_fail_first(changes, world, message):
    cfg = override(recipe("ernie-debug"), **changes)
    with pytest.raises(LayoutError, match=message):
        cfg.check(world_size=world)
