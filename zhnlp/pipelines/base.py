"""The pipeline base class: five steps from raw text to plain Python results.

Every task follows the same five steps (the shape of PaddleNLP's Taskflow):

1. construct the model (a zhnlp Auto class, ``from_pretrained``),
2. construct the tokenizer (``zhnlp.AutoTokenizer``),
3. preprocess: check each input, then turn a chunk of inputs into features (one or more per input: long
   question-answering contexts and NER texts become several windows),
4. run: batched forwards in eval mode under ``torch.no_grad``, each batch padded to its longest feature,
5. postprocess: features' outputs -> one plain-Python result per input (no tensors), with character offsets
   into the caller's string.

Inputs are consumed ``batch_size`` at a time (``iter_results``), so an input stream of any length runs in bounded
memory; ``__call__`` returns what transformers' pipeline of the task returns for one input (``single_result``)
and a list of per-input results for a non-empty list.

A model whose task head was freshly initialised (a checkpoint without the head's weights, e.g. a masked-LM
checkpoint given to the sentiment pipeline) gives random outputs: building the pipeline refuses it unless
``allow_untrained=True``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable, Iterator

import torch

logger = logging.getLogger("zhnlp")

# The tensors a feature hands to the model; anything else in a feature (offsets, indices) stays on the host.
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")

UNSET = object()  # an option the caller did not pass (top_k=None means "all labels", not "default")


def is_positive_int(value) -> bool:
    """True for an int >= 1 (``True`` is an int to Python, never a size here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def refuse_json_object(text: str, task: str, takes: str) -> None:
    """Refuse a text that is a whole JSON object (a jsonl line of training data or a question-answering input
    given to a task that takes plain text): classifying the braces and keys would be silent nonsense."""
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return
    try:
        item = json.loads(stripped)
    except json.JSONDecodeError:
        return
    if isinstance(item, dict):
        hint = (" ({'question', 'context'} inputs are for the question-answering pipeline)"
                if {"question", "context"} & set(item) else "")
        raise ValueError(f"the input is a JSON object with keys {sorted(item)}, but {task} takes {takes}{hint}; "
                         f"pass the text itself, e.g. the value of its 'text' key.")


class _DropFreshWeightsNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "freshly initialised" not in record.getMessage()


class Pipeline:
    """Base of the task pipelines; subclasses set the class attributes and implement steps 3 and 5.

    Args:
        model: a model name (``zhnlp.list_models()``), hub repo id or directory written by ``save_pretrained``;
            or a zhnlp model object with this task's head (``zhnlp.AutoModelFor...from_pretrained(...)``).
        tokenizer: a tokenizer object or where to load one from; defaults to the model's directory (for a model
            object, its ``name_or_path``, which ``from_pretrained`` sets).
        batch_size: inputs per forward (features per forward where one input gives several windows).
        max_length: most tokens per feature, special tokens included; capped at the model's
            ``max_position_embeddings``.
        allow_untrained: run a model whose task head is freshly initialised (its outputs are random); by
            default such a model is refused with :class:`~zhnlp.errors.CheckpointError`.
        device, dtype: where and in what precision the model runs (see :mod:`zhnlp.pipelines.placement`);
            given to ``from_pretrained`` for a name, checked against a model object.
        options: the task's options (see each task's docstring); ``__call__`` may override them per call.
    """

    task = ""
    auto_class: str | None = None  # name of the zhnlp Auto class that builds the model; None: no model
    default_model: str | None = None
    head = ""  # what the task head is, for messages ("sequence-classification head")
    finetune_task = ""  # the `zhnlp finetune` task that trains the head; "" when fine-tuning does not apply
    default_options: dict = {}
    # Model outputs kept per feature, and whether each has a sequence dimension to trim the padding from.
    output_names: dict[str, bool] = {}

    def __init__(self, model=None, *, tokenizer=None, batch_size: int = 8, max_length: int = 512,
                 allow_untrained: bool = False, device=None, dtype=None, **options):
        from zhnlp.pipelines.placement import resolve_device, resolve_dtype

        if not is_positive_int(batch_size):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if not is_positive_int(max_length) or max_length < 8:
            raise ValueError(f"max_length must be an integer of at least 8 tokens, got {max_length!r}.")
        self.batch_size = batch_size
        self.options = self._merge_options(options)
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        is_object = isinstance(model, torch.nn.Module)
        # refused below with a fuller message, so from_pretrained's own notice of fresh weights would be a repeat
        quiet = _DropFreshWeightsNotice() if not allow_untrained else None
        if quiet:
            logger.addFilter(quiet)
        try:
            self.model = (self._model_object(model, dtype, device) if is_object
                          else self._construct_model(model, dtype, device))
        finally:
            if quiet:
                logger.removeFilter(quiet)
        if is_object:
            name = getattr(model, "name_or_path", None) or f"the {type(model).__name__} object given as model="
        else:
            name = os.fspath(model if model is not None else self.default_model)
        if not allow_untrained:
            self._refuse_untrained(name)
        if is_object and tokenizer is None:
            tokenizer = getattr(model, "name_or_path", None) or None  # from_config sets ""
            if tokenizer is None:
                raise ValueError(f"the {self.task!r} pipeline was given a model object without name_or_path, so "
                                 f"it cannot find the model's tokenizer; pass tokenizer= (a tokenizer object or "
                                 f"the directory it was saved in).")
        self.tokenizer = self._construct_tokenizer(model, tokenizer)
        from zhnlp.tokenizers.auto import check_tokenizer_fits

        where = tokenizer if isinstance(tokenizer, (str, os.PathLike)) else name if tokenizer is None else ""
        check_tokenizer_fits(self.tokenizer, self.model.config, os.fspath(where))
        self.max_length = self._cap_max_length(max_length)

    @property
    def device(self) -> torch.device:
        """The device the model's parameters are on (inputs are moved there)."""
        from zhnlp.pipelines.placement import parameters_device

        return parameters_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's parameters."""
        from zhnlp.pipelines.placement import parameters_dtype

        return parameters_dtype(self.model)

    # ------------------------------------------------------------------ steps 1 and 2
    def _construct_model(self, model, dtype=None, device=None):
        """Step 1: load the model with this task's Auto class, in eval mode (``dtype``/``device`` given to
        ``from_pretrained``, which builds it there)."""
        import zhnlp.auto

        name = model if model is not None else self.default_model
        if name is None:
            raise ValueError(f"the {self.task!r} pipeline needs a fine-tuned model: pass its directory (one written by "
                             f"save_pretrained or `zhnlp export`) or hub repo id as model= (--model on the command "
                             f"line).")
        kwargs = {key: value for key, value in (("dtype", dtype), ("device", device)) if value is not None}
        return getattr(zhnlp.auto, self.auto_class).from_pretrained(name, **kwargs).eval()

    def _model_object(self, model, dtype, device):
        """Step 1 for an already-built model: a zhnlp model with this task's head, put in eval mode."""
        import zhnlp.auto

        auto = getattr(zhnlp.auto, self.auto_class)
        head = getattr(model, "head", None)
        if head is None or not hasattr(model, "config"):
            raise TypeError(f"model= is a {type(model).__module__}.{type(model).__name__}; zhnlp pipelines run zhnlp "
                            f"models: pass zhnlp.{self.auto_class}.from_pretrained(...) or the model's directory "
                            f"(a transformers model: save_pretrained it and pass that directory).")
        if head != auto.head:
            raise ValueError(f"the {self.task!r} pipeline needs a model with the {self.head} "
                             f"(zhnlp.{self.auto_class}), got one with the {head!r} head.")
        from zhnlp.pipelines.placement import parameters_device, parameters_dtype, same_device

        if dtype not in (None, "auto") and parameters_dtype(model) != dtype:
            raise ValueError(f"dtype={dtype} was asked but the model object's parameters are "
                             f"{parameters_dtype(model)}; load it with from_pretrained(..., dtype=...) or drop dtype=.")
        if device is not None and not same_device(parameters_device(model), device):
            raise ValueError(f"device={str(device)!r} was asked but the model object is on {parameters_device(model)} "
                             f"(zhnlp runs a model on the device it was loaded for); load it with "
                             f"from_pretrained(..., device=...) or drop device=.")
        return model.eval()

    def _refuse_untrained(self, name: str) -> None:
        """Refuse a model whose task head was freshly initialised rather than loaded: its outputs are random."""
        from zhnlp.errors import CheckpointError

        fresh = list(getattr(self.model, "fresh_weights", []) or [])
        if not fresh:
            return
        shown = ", ".join(fresh[:6]) + (f" and {len(fresh) - 6} more" if len(fresh) > 6 else "")
        fix = (f"fine-tune it first (zhnlp finetune {self.finetune_task} --model {name} ...) and load the result"
               if self.finetune_task else f"load a checkpoint saved with its {self.head}"
               + (f" (such as {self.default_model})" if self.default_model else ""))
        raise CheckpointError(f"{name} has no weights for the {self.head} of the {self.task!r} pipeline ({shown} "
                              f"would be freshly initialised, so its outputs would be random); {fix}, or pass "
                              f"allow_untrained=True (zhnlp predict --allow-untrained) to run it untrained.")

    def _construct_tokenizer(self, model, tokenizer):
        """Step 2: the tokenizer object given, or the one saved with the model (or at ``tokenizer``)."""
        if tokenizer is None:
            tokenizer = model if model is not None else self.default_model
        if isinstance(tokenizer, (str, os.PathLike)):
            from zhnlp.tokenizers import AutoTokenizer

            return AutoTokenizer.from_pretrained(tokenizer)
        return tokenizer

    def _cap_max_length(self, max_length: int) -> int:
        # Position ids beyond the table would index out of range inside the model; say so once and cap.
        limit = self.model.config.max_position_embeddings
        if max_length > limit:
            logger.debug("%s: max_length %d capped at the model's max_position_embeddings (%d).",
                        self.task, max_length, limit)
            return limit
        return max_length

    # ------------------------------------------------------------------ steps 3 to 5 (per task)
    def check_input(self, item) -> Any:
        """Step 3a: validate one raw input and return it in the form ``preprocess`` takes.
        Raises ValueError/TypeError naming the problem (the CLI adds the input's line number)."""
        raise NotImplementedError

    def preprocess(self, items: list, options: dict) -> list[dict]:
        """Step 3b: checked inputs -> features, each a dict with MODEL_INPUTS lists and ``example_index``."""
        raise NotImplementedError

    def postprocess(self, items: list, features: list[dict], outputs: list[dict], options: dict) -> list:
        """Step 5: one plain-Python result per input from the features and their outputs."""
        raise NotImplementedError

    # ------------------------------------------------------------------ step 4
    def run(self, features: list[dict], options: dict) -> list[dict]:
        """Step 4: forward the features ``batch_size`` at a time; per feature, the outputs in ``output_names``
        as float32 CPU tensors with the padding cut off."""
        from zhnlp.data.tasks import collate

        results: list[dict] = []
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = self.device
        with torch.no_grad():
            for i in range(0, len(features), self.batch_size):
                chunk = features[i:i + self.batch_size]
                batch = collate([{k: f[k] for k in MODEL_INPUTS if k in f} for f in chunk], pad_token_id=pad_id)
                out = self.model(**{k: batch[k].to(device) for k in MODEL_INPUTS if k in batch})
                results.extend(self.split_outputs(out, chunk, options))
        return results

    def split_outputs(self, out, chunk: list[dict], options: dict) -> list[dict]:
        """A batch's outputs -> one dict per feature (overridden by tasks that keep only part of the logits)."""
        per_feature = []
        for j, feature in enumerate(chunk):
            n = len(feature["input_ids"])
            per_feature.append({name: (out[name][j, :n] if per_token else out[name][j]).float().cpu()
                                for name, per_token in self.output_names.items()})
        return per_feature

    # ------------------------------------------------------------------ calling
    def __call__(self, inputs, **options):
        """One result for one input; a list of results for a list of inputs (an empty list is refused: it is
        almost always input that failed to load; ``iter_results`` takes an empty stream)."""
        single = not isinstance(inputs, list)
        if not single and not inputs:
            raise ValueError(f"the {self.task!r} pipeline got an empty list of inputs; pass at least one input "
                             f"(check that the inputs were read).")
        merged = self._merge_options(options, base=self.options)
        results = list(self._results([inputs] if single else inputs, merged))
        return self.single_result(inputs, results[0], merged) if single else results

    def single_result(self, item, result, options: dict):
        """What a call with one input (not in a list) returns, given that input's result; tasks where transformers
        shapes a single input's result differently override this (text classification)."""
        return result

    def iter_results(self, inputs: Iterable, **options) -> Iterator:
        """Results in input order, computed ``batch_size`` inputs at a time (for long streams)."""
        yield from self._results(inputs, self._merge_options(options, base=self.options))

    def _results(self, inputs: Iterable, merged: dict) -> Iterator:
        chunk: list = []
        for item in inputs:
            chunk.append(self.check_input(item))
            if len(chunk) == self.batch_size:
                yield from self._process(chunk, merged)
                chunk = []
        if chunk:
            yield from self._process(chunk, merged)

    def _process(self, items: list, options: dict) -> list:
        features = self.preprocess(items, options)
        outputs = self.run(features, options)
        return self.postprocess(items, features, outputs, options)

    def _merge_options(self, options: dict, base: dict | None = None) -> dict:
        unknown = sorted(set(options) - set(self.default_options))
        if unknown:
            known = ", ".join(sorted(self.default_options)) or "none"
            hint = (" (question= and context= are for the 'question-answering' pipeline)"
                    if {"question", "context"} & set(unknown) else "")
            raise TypeError(f"unknown option(s) {unknown} for the {self.task!r} pipeline{hint}; its options: "
                            f"{known}.")
        merged = {**(self.default_options if base is None else base), **options}
        self.check_options(merged)
        return merged

    def check_options(self, options: dict) -> None:
        """Raise ValueError for an option value the task cannot use (checked before any input is read)."""

    def __repr__(self) -> str:
        name = getattr(self.tokenizer, "name_or_path", None) if self.auto_class else None
        return f"{type(self).__name__}(task={self.task!r}, model={name!r}, batch_size={self.batch_size})"
