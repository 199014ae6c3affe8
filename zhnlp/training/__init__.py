"""The training engine: typed run configs, recipes, and one trainer on megatron-core."""

from zhnlp.training.config import RECIPES, RunConfig, override, recipe

__all__ = ["RECIPES", "RunConfig", "override", "recipe"]
