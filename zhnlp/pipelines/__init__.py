"""Inference pipelines: text in, plain Python results out, in transformers' output conventions.

    import zhnlp
    classify = zhnlp.pipeline("sentiment-analysis", "path/to/fine-tuned-model")
    classify("这家餐厅的菜很好吃")             # [{"label": "positive", "score": 0.98}]
    qa = zhnlp.pipeline("question-answering", "path/to/cmrc-model")
    qa(question="...", context="...")        # {"score": ..., "start": ..., "end": ..., "answer": ...}
    ner = zhnlp.pipeline("ner", "path/to/ner-model", aggregation_strategy="simple")
    ner("王小明在北京工作")                     # [{"entity_group": "PER", "score": ..., "word": "王小明", ...}, ...]
    zhnlp.pipeline("word-segmentation")("我来到北京清华大学")
    sim = zhnlp.pipeline("sentence-similarity", "m3e-small")   # after `zhnlp models fetch m3e-small`
    sim({"source_sentence": "我想退款", "sentences": ["怎么申请退款", "今天下雨了"]})  # [0.9, 0.4]: cosines
    chat = zhnlp.pipeline("text-generation", "path/to/ernie-4.5-model")
    chat([{"role": "user", "content": "你好"}], max_new_tokens=64)  # [{"generated_text": [..., {"role": "assistant"...

Results use transformers' keys with transformers' meanings (NER ``entity``/``entity_group``, fill-mask ``token``
the id and ``token_str`` the text, ...); where zhnlp differs (Chinese-friendly ``word``/``sequence`` without
spaces between characters, windows over long texts) each task's class says so.

Each task is a :class:`~zhnlp.pipelines.base.Pipeline` subclass in its own module, registered below by name
and imported only when used. ``zhnlp predict TASK --model DIR TEXT...`` is the command-line front end.
"""

from __future__ import annotations

import importlib

from zhnlp.pipelines.base import Pipeline

# task name -> "module:class"; modules are imported on first use.
TASKS = {
    "sentiment-analysis": "zhnlp.pipelines.text_classification:TextClassificationPipeline",
    "question-answering": "zhnlp.pipelines.question_answering:QuestionAnsweringPipeline",
    "ner": "zhnlp.pipelines.token_classification:TokenClassificationPipeline",
    "fill-mask": "zhnlp.pipelines.fill_mask:FillMaskPipeline",
    "word-segmentation": "zhnlp.pipelines.word_segmentation:WordSegmentationPipeline",
    "text-generation": "zhnlp.pipelines.text_generation:TextGenerationPipeline",
    "feature-extraction": "zhnlp.pipelines.sentence_embeddings:FeatureExtractionPipeline",
    "sentence-similarity": "zhnlp.pipelines.sentence_embeddings:SentenceSimilarityPipeline",
}
# transformers' names and PaddleNLP Taskflow's (underscores); Taskflow's information_extraction (UIE) is not a
# zhnlp task.
ALIASES = {"text-classification": "sentiment-analysis", "token-classification": "ner",
           "sentiment_analysis": "sentiment-analysis", "text_classification": "sentiment-analysis",
           "token_classification": "ner", "question_answering": "question-answering", "fill_mask": "fill-mask",
           "word_segmentation": "word-segmentation", "text_generation": "text-generation",
           "feature_extraction": "feature-extraction", "sentence_similarity": "sentence-similarity",
           "text_similarity": "sentence-similarity"}


# Taskflow tasks without a zhnlp pipeline, named in the unknown-task error
_TASKFLOW_ONLY = {"information_extraction", "lexical_analysis", "pos_tagging", "dependency_parsing",
                  "knowledge_mining", "text_correction", "dialogue", "text_summarization",
                  "poetry_generation", "question_generation", "text_to_image", "zero_shot_text_classification"}


def task_names() -> list[str]:
    """Every name ``pipeline`` accepts: the tasks and their aliases."""
    return sorted([*TASKS, *ALIASES])


def pipeline_class(task: str) -> type[Pipeline]:
    """The Pipeline subclass of ``task`` (a task name or alias)."""
    name = ALIASES.get(task, task)
    if name not in TASKS:
        other = (" (a PaddleNLP Taskflow task that zhnlp does not provide)"
                 if str(task).replace("-", "_") in _TASKFLOW_ONLY else "")
        raise ValueError(f"unknown task {task!r}{other}; choose one of: {', '.join(task_names())}.")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def pipeline(task: str, model=None, *, tokenizer=None, batch_size: int = 8, max_length: int = 512,
             allow_untrained: bool = False, device=None, dtype=None, torch_dtype=None, **task_options) -> Pipeline:
    """A ready-to-call pipeline for ``task``: ``p(text) -> result``, ``p([texts]) -> [results]``.

    Args:
        task: ``"sentiment-analysis"`` (alias ``"text-classification"``), ``"question-answering"``, ``"ner"``
            (alias ``"token-classification"``), ``"fill-mask"``, ``"word-segmentation"`` or ``"text-generation"``
            (a decoder such as ERNIE 4.5, see :class:`~zhnlp.pipelines.text_generation.TextGenerationPipeline`),
            ``"feature-extraction"`` or ``"sentence-similarity"`` (alias Taskflow's ``"text_similarity"``; see
            :mod:`zhnlp.pipelines.sentence_embeddings`);
            PaddleNLP Taskflow's spellings (``"sentiment_analysis"``, ``"word_segmentation"``,
            ``"question_answering"``, ...) too.
        model: a directory written by ``save_pretrained`` (zhnlp or transformers), a model name from
            ``zhnlp.list_models()`` or a hub repo id, loaded with the task's Auto class; or a zhnlp model
            object (``zhnlp.AutoModelFor...from_pretrained(...)``) with the task's head. A name that cannot be
            resolved raises :class:`zhnlp.ModelNotFoundError`. Not used by ``"word-segmentation"``.
        tokenizer: a tokenizer object or path; defaults to the tokenizer saved with the model (for a model
            object: the directory in its ``name_or_path``; pass ``tokenizer=`` when it has none).
        device: where the model runs: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a :class:`torch.device`, or an int
            (``-1`` the CPU, ``k`` CUDA device ``k``); None leaves it where loading put it. A CUDA device on a
            machine without one is a ValueError. See :mod:`zhnlp.pipelines.placement`.
        dtype: parameter dtype for loading by name: ``"float32"``, ``"bfloat16"``, ``"float16"``, a torch dtype, or
            ``"auto"`` (``from_pretrained``'s default: the checkpoint's own dtype). ``torch_dtype``: its old name.
        batch_size: inputs per forward pass (windows of long inputs count one each).
        max_length: most tokens per forward input (capped at the model's ``max_position_embeddings``).
        allow_untrained: run a model whose task head is freshly initialised (a checkpoint without the head's
            weights: its outputs are random). By default such a model is refused with
            :class:`zhnlp.errors.CheckpointError` naming the missing weights and how to fine-tune it.
        task_options: the task's options, as in transformers where transformers has them: ``top_k`` and
            ``function_to_apply`` (classification), ``top_k`` and ``targets`` (fill-mask),
            ``aggregation_strategy``, ``ignore_labels`` and ``stride`` (NER), ``top_k``,
            ``handle_impossible_answer``, ``doc_stride``, ``max_answer_len`` and ``max_query_len`` (QA),
            ``hmm`` and ``userdict`` (word segmentation), ``max_new_tokens``, ``do_sample``, ``temperature``,
            ``top_k``, ``top_p``, ``repetition_penalty``, ``return_full_text`` and ``streamer`` (text generation),
            ``pooling``, ``normalize`` and ``return_tensors`` (feature extraction), ``pooling`` (sentence similarity);
            see each task's class for what each result key means.
    """
    cls = pipeline_class(task)
    if torch_dtype is not None:
        if dtype is not None and dtype != torch_dtype:
            raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; pass only dtype (torch_dtype "
                             f"is its old name).")
        dtype = torch_dtype
    return cls(model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length,
               allow_untrained=allow_untrained, device=device, dtype=dtype, **task_options)


__all__ = ["ALIASES", "TASKS", "Pipeline", "pipeline", "pipeline_class", "task_names"]
