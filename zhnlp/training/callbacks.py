"""Callbacks for fine-tuning runs, in transformers' shape.

A :class:`Callback` overrides any of ``on_train_begin``, ``on_step_end``, ``on_evaluate``,
``on_save`` and ``on_train_end``; each receives ``(config, state, control, **kwargs)``: the run's
:class:`~zhnlp.training.finetune_config.FinetuneConfig`, the :class:`TrainerState` (step, epoch,
evaluation history, best metric) and the :class:`TrainerControl`, whose ``should_stop`` (and
``should_evaluate`` / ``should_save``) a callback sets to end the run after this step (or to
evaluate / checkpoint now). ``on_evaluate`` also gets ``metrics`` (the dev scores, with what
``compute_metrics`` returned), ``on_step_end`` gets ``logs`` (the step's loss, lr, ...).

Under torchrun every rank runs the callbacks with the same values; a callback that stops must
decide the same way on every rank (the dev metrics and losses are the same everywhere).

A callback with ``state_dict()`` / ``load_state_dict(d)`` has its state saved in the run's
checkpoints and restored on resume (as :class:`EarlyStoppingCallback` does with its counter).
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

logger = logging.getLogger("zhnlp")


class EvalPrediction(NamedTuple):
    """What ``compute_metrics`` receives, as in transformers: ``predictions`` are the model outputs
    over the dev features (classification: logits ``(n, labels)``; ner: logits ``(n, seq, labels)``;
    mrc: a tuple ``(start_logits, end_logits)``, each ``(n, seq)``), ``label_ids`` the gold targets
    (classification: ``(n,)``; ner: ``(n, seq)``, -100 where the loss ignores a position; mrc:
    ``(start_positions, end_positions)``). Per-token arrays are padded to the longest feature
    (logits with -1e4, labels with -100)."""

    predictions: Any
    label_ids: Any


@dataclass
class TrainerState:
    """Where a fine-tuning run is. ``log_history`` holds one dict per evaluation (``step``, ``epoch``,
    ``train_loss``, ``dev``); ``best_metric`` / ``best_step`` the best value of the chosen metric so
    far and its step; ``epoch`` is fractional (step / steps per epoch), as in transformers."""

    global_step: int = 0
    max_steps: int = 0
    steps_per_epoch: int = 0
    epoch: float = 0.0
    metric: str = ""
    greater_is_better: bool = True
    best_metric: float | None = None
    best_step: int | None = None
    log_history: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def is_better(self, value: float, threshold: float = 0.0) -> bool:
        """True when ``value`` improves on ``best_metric`` by more than ``threshold``."""
        if self.best_metric is None:
            return True
        gain = value - self.best_metric if self.greater_is_better else self.best_metric - value
        return gain > threshold


@dataclass
class TrainerControl:
    """Flags callbacks set: ``should_stop`` ends the run after this step (the best model stays);
    ``should_evaluate`` / ``should_save`` evaluate / checkpoint after this step besides the schedule.
    The run resets the last two after acting on them."""

    should_stop: bool = False
    should_evaluate: bool = False
    should_save: bool = False


class Callback:
    """Base class: every hook does nothing. Subclass and override the ones you need."""

    def on_train_begin(self, config, state: TrainerState, control: TrainerControl, **kwargs):
        pass

    def on_step_end(self, config, state: TrainerState, control: TrainerControl, **kwargs):
        pass

    def on_evaluate(self, config, state: TrainerState, control: TrainerControl, **kwargs):
        pass

    def on_save(self, config, state: TrainerState, control: TrainerControl, **kwargs):
        pass

    def on_train_end(self, config, state: TrainerState, control: TrainerControl, **kwargs):
        pass


TrainerCallback = Callback  # transformers' name


class EarlyStoppingCallback(Callback):
    """Stop when ``metric`` (default: the run's ``metric_for_best_model``) has not improved on the best
    value by more than ``early_stopping_threshold`` for ``early_stopping_patience`` evaluations in a row."""

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float = 0.0):
        if isinstance(early_stopping_patience, bool) or not isinstance(early_stopping_patience, int) \
                or early_stopping_patience < 1:
            raise ValueError(f"early_stopping_patience must be an integer >= 1, got {early_stopping_patience!r}")
        if isinstance(early_stopping_threshold, bool) or not isinstance(early_stopping_threshold, (int, float)) \
                or early_stopping_threshold < 0:
            raise ValueError(f"early_stopping_threshold must be a number >= 0, got {early_stopping_threshold!r}")
        self.patience, self.threshold = early_stopping_patience, float(early_stopping_threshold)
        self.counter = 0
        self.best: float | None = None

    def on_evaluate(self, config, state, control, metrics=None, **kwargs):
        value = metrics[state.metric]
        better = self.best is None or ((value - self.best) if state.greater_is_better
                                       else (self.best - value)) > self.threshold
        if better:
            self.best, self.counter = value, 0
            return
        self.counter += 1
        if self.counter >= self.patience:
            logger.info("early stopping at step %d: %s has not improved on %.4f by more than %g for %d "
                        "evaluation(s)", state.global_step, state.metric, self.best, self.threshold, self.counter)
            control.should_stop = True

    def state_dict(self) -> dict:
        return {"counter": self.counter, "best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.counter, self.best = int(state["counter"]), state["best"]


class CallbackHandler:
    """Calls every callback's hook in order, with the same arguments."""

    def __init__(self, callbacks, config, state: TrainerState, control: TrainerControl):
        self.callbacks = list(callbacks or [])
        for c in self.callbacks:
            if isinstance(c, type):
                raise TypeError(f"callbacks takes instances: pass {c.__name__}(), not the class {c.__name__}")
        self.config, self.state, self.control = config, state, control

    def __call__(self, event: str, **kwargs) -> TrainerControl:
        for c in self.callbacks:
            hook = getattr(c, event, None)
            if hook is not None:
                hook(self.config, self.state, self.control, **kwargs)
        return self.control

    def state_dict(self) -> dict:
        return {f"{i}:{type(c).__name__}": c.state_dict() for i, c in enumerate(self.callbacks)
                if hasattr(c, "state_dict")}

    def load_state_dict(self, saved: dict) -> None:
        for i, c in enumerate(self.callbacks):
            key = f"{i}:{type(c).__name__}"
            if key in saved and hasattr(c, "load_state_dict"):
                c.load_state_dict(saved[key])
