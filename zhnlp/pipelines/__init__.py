"""Inference pipelines: text in, plain Python results out.

    import zhnlp
    classify = zhnlp.pipeline("sentiment-analysis", "path/to/fine-tuned-model")
    classify("这家餐厅的菜很好吃")             # {"label": "positive", "score": 0.98}
    qa = zhnlp.pipeline("question-answering", "path/to/cmrc-model")
    qa(question="...", context="...")        # {"answer": ..., "start": ..., "end": ..., "score": ...}
    zhnlp.pipeline("word-segmentation")("我来到北京清华大学")

Each task is a :class:`~zhnlp.pipelines.base.Pipeline` subclass in its own module, registered below by name
and imported only when used. ``zhnlp predict TASK --model DIR TEXT...`` is the command-line front end.
"""

from __future__ import annotations

import importlib
import os

from zhnlp.pipelines.base import Pipeline

# task name -> "module:class"; modules are imported on first use.
TASKS = {
    "sentiment-analysis": "zhnlp.pipelines.text_classification:TextClassificationPipeline",
    "question-answering": "zhnlp.pipelines.question_answering:QuestionAnsweringPipeline",
    "ner": "zhnlp.pipelines.token_classification:TokenClassificationPipeline",
    "fill-mask": "zhnlp.pipelines.fill_mask:FillMaskPipeline",
    "word-segmentation": "zhnlp.pipelines.word_segmentation:WordSegmentationPipeline",
}
ALIASES = {"text-classification": "sentiment-analysis", "token-classification": "ner"}


def task_names() -> list[str]:
    """Every name ``pipeline`` accepts: the tasks and their aliases."""
    return sorted([*TASKS, *ALIASES])


def pipeline_class(task: str) -> type[Pipeline]:
    """The Pipeline subclass of ``task`` (a task name or alias)."""
    name = ALIASES.get(task, task)
    if name not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of: {', '.join(task_names())}.")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def pipeline(task: str, model: str | os.PathLike | None = None, *, tokenizer=None, batch_size: int = 8,
             max_length: int = 512, allow_untrained: bool = False, **task_options) -> Pipeline:
    """A ready-to-call pipeline for ``task``: ``p(text) -> result``, ``p([texts]) -> [results]``.

    Args:
        task: ``"sentiment-analysis"`` (alias ``"text-classification"``), ``"question-answering"``, ``"ner"``
            (alias ``"token-classification"``), ``"fill-mask"`` or ``"word-segmentation"``.
        model: a directory written by ``save_pretrained`` (zhnlp or transformers), a model name from
            ``zhnlp.list_models()`` or a hub repo id; loaded with the task's Auto class. A name that cannot be
            resolved raises :class:`zhnlp.ModelNotFoundError`. Not used by ``"word-segmentation"``.
        tokenizer: a tokenizer object or path; defaults to the tokenizer saved with the model.
        batch_size: inputs per forward pass (windows of long inputs count one each).
        max_length: most tokens per forward input (capped at the model's ``max_position_embeddings``).
        allow_untrained: run a model whose task head is freshly initialised (a checkpoint without the head's
            weights: its outputs are random). By default such a model is refused with
            :class:`zhnlp.errors.CheckpointError` naming the missing weights and how to fine-tune it.
        task_options: the task's options, e.g. ``top_k`` (classification, fill-mask, QA), ``doc_stride`` and
            ``max_answer_len`` (QA), ``hmm`` and ``userdict`` (word segmentation); see each task's class.
    """
    cls = pipeline_class(task)
    return cls(model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length,
               allow_untrained=allow_untrained, **task_options)


__all__ = ["ALIASES", "TASKS", "Pipeline", "pipeline", "pipeline_class", "task_names"]
