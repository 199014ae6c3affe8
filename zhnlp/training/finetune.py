"""Task fine-tuning on the engine trainer: classification, reading comprehension, NER, supervised
fine-tuning of the decoders on conversations (``sft``), and continued masked-LM pretraining of an
encoder on the user's own text (``mlm``: domain/task-adaptive pretraining, whole-word masking drawn
afresh every epoch; the saved model is a ``...ForMaskedLM`` that the other tasks start from).

``finetune(FinetuneConfig(...))`` -- or ``zhnlp.finetune(task=..., model=..., train=dataset, ...)``
-- loads a backbone with the task's head (``from_pretrained`` rules: a directory, a model-card
name or a hub id), reads and encodes the task data (files, saved datasets, ``datasets`` objects
or lists of dicts: :mod:`zhnlp.data.tasks.hf`), and trains with
:class:`zhnlp.training.trainer.Trainer` -- the same megatron-core loop, optimizer, parallel
layouts and checkpoints as pretraining; only the head and the batches differ
(:mod:`zhnlp.training.batches`). The dev set is scored with the task's official metric (plus
``compute_metrics``) after every epoch or every ``eval_steps``; the best model so far is written
to ``OUTPUT/model`` (transformers format, with its tokenizer and label names), and at the end the
test set is scored with that best model. ``OUTPUT/metrics.json`` holds the evaluations and the
best dev and test scores; ``OUTPUT/metrics.jsonl`` the per-step training log;
``OUTPUT/checkpoints`` the training checkpoints (every ``save_steps`` and on a stop signal), from
which ``resume=True`` continues the run exactly. The loop itself is in
:mod:`zhnlp.training.finetune_loop`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from zhnlp.errors import DataError, ZhnlpError
from zhnlp.training.finetune_config import ALIASES, TASK_NAMES, FinetuneConfig  # noqa: F401  (re-exported)


# ------------------------------------------------------------------------------------------ tasks
class Task:
    """What differs between tasks: head, reading, encoding and scoring."""

    name = ""
    head = ""
    metric = ""  # the dev score that picks the best epoch
    max_length = 128

    def configure(self, cfg: FinetuneConfig) -> FinetuneConfig:
        """Fill the settings the user left to the task."""
        return dataclasses.replace(cfg, max_length=cfg.max_length or self.max_length)

    left_out = 0  # training examples the reader left out (reading comprehension: no locatable answer)

    reference = None  # what the metric scores against for the split read last (mrc: the SQuAD file or dict)

    def read(self, source, labels: list[str] | None, training: bool = False, name: str = ""):
        """-> (examples, labels) ; labels is None for tasks without a label set. ``source``: a file
        Path, a ``datasets.Dataset`` or a list of dicts (:mod:`zhnlp.data.tasks.hf`); ``name`` says
        which in messages. ``training``: the data trains the model (reading comprehension then
        needs a locatable answer per question)."""
        from zhnlp.data.tasks import hf

        if isinstance(source, Path):
            examples, labels, self.reference = hf.read_file(self.name, source, labels, training)
        else:
            examples, labels, self.reference = hf.read_rows(self.name, source, labels, name, training)
        return examples, labels

    def unlabelled(self, example) -> bool:
        """True for an example without its gold answer (a prediction file's line)."""
        raise NotImplementedError

    def encode(self, cfg: FinetuneConfig, tokenizer, examples, labels) -> list[dict]:
        raise NotImplementedError

    def score(self, cfg: FinetuneConfig, outputs: dict, examples, features, labels, reference) -> tuple[dict, object]:
        """-> (scores, predictions) from the model outputs over ``features`` (``reference``: what
        :meth:`read` left in ``self.reference`` for the split)."""
        raise NotImplementedError

    def run_model(self, cfg: FinetuneConfig, model, features, what: str, pad_token_id: int) -> dict:
        """The model's outputs over ``features`` that :meth:`score` reads (default: every output, batched)."""
        from zhnlp.training.batches import predict

        return predict(model, features, cfg.eval_batch_size, multiple=8 * cfg.tp, what=what,
                       pad_token_id=pad_token_id)

    def training_features(self, cfg: FinetuneConfig, features: list[dict]):
        """-> (the features the training batches are cut from, their collate function or None for the default)."""
        return features, None

    def epoch_transform(self, cfg: FinetuneConfig):
        """-> ``f(feature, epoch) -> feature``, applied to every training feature as its batch is made (a pure
        function of its arguments, so that resumed runs see the same batches), or None."""
        return None


class ClassificationTask(Task):
    name, head, metric = "classification", "sequence_classification", "accuracy"

    def unlabelled(self, example) -> bool:
        return example.label is None

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.tasks.classification import encode_classification

        return encode_classification(tokenizer, examples, labels, max_length=cfg.max_length)

    def score(self, cfg, outputs, examples, features, labels, path):
        from zhnlp.metrics import classification_scores

        predicted = [labels[i] for i in np.argmax(outputs["logits"], axis=-1)]
        gold = [e.label for e in examples]
        return classification_scores(predicted, gold, label_set=labels), predicted


class MRCTask(Task):
    name, head, metric = "mrc", "question_answering", "f1"
    max_length = 512

    def configure(self, cfg):
        """Question budget and window stride from ``max_length`` unless given, and refused when they
        leave no context or would skip context tokens between windows."""
        cfg = super().configure(cfg)
        length = cfg.max_length
        query = cfg.max_query_length
        if query is None:  # up to 64 question tokens, leaving at least half the window and a given stride
            query = min(64, length // 2)
            if cfg.doc_stride:
                query = max(1, min(query, length - 3 - cfg.doc_stride))
        window = length - query - 3  # context tokens per window for the longest question
        if window < 1:
            raise ValueError(f"--max-length {length} leaves no room for the context after a question of up to "
                             f"--max-query-length {query} tokens and 3 special tokens; raise --max-length above "
                             f"{query + 3} or lower --max-query-length.")
        stride = cfg.doc_stride or max(1, min(128, window // 2))
        if stride > window:
            raise ValueError(f"--doc-stride {stride} is larger than the context window ({window} tokens at "
                             f"--max-length {length} with questions of up to {query} tokens): the context between "
                             f"windows would never be read; pass --doc-stride {window} or less.")
        return dataclasses.replace(cfg, max_query_length=query, doc_stride=stride)

    def read(self, source, labels, training=False, name=""):
        """Evaluation data keeps references that do not occur in the context (they are scored as
        texts); training data uses each question's first locatable answer and leaves out, with a
        warning, the questions that have none (counted in ``left_out``)."""
        examples, _ = super().read(source, None, training, name)
        if training:
            self.left_out = len(examples.unlocatable_questions)
        return examples, None

    def unlabelled(self, example) -> bool:
        return not example.answers

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.tasks.mrc import build_mrc_features

        features = build_mrc_features(tokenizer, examples, max_seq_len=cfg.max_length, doc_stride=cfg.doc_stride,
                                      max_query_len=cfg.max_query_length)
        return [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids, "attention_mask": f.attention_mask,
                 "start_positions": f.start_position, "end_positions": f.end_position, "_feature": f}
                for f in features]

    def score(self, cfg, outputs, examples, features, labels, reference):
        from zhnlp.data.tasks.mrc import decode_spans
        from zhnlp.metrics.cmrc2018 import evaluate

        spans = decode_spans(examples, [f["_feature"] for f in features], outputs["start_logits"],
                             outputs["end_logits"], max_answer_len=cfg.max_answer_length)
        predictions = {qid: s["text"] for qid, s in spans.items()}
        return evaluate(reference, predictions), predictions


class NERTask(Task):
    name, head, metric = "ner", "token_classification", "f1"

    def configure(self, cfg):
        """The window overlap from ``max_length`` unless given; refused when it fills the window."""
        cfg = super().configure(cfg)
        room = cfg.max_length - 2  # sub-tokens per window besides [CLS] and [SEP]
        stride = cfg.ner_stride if cfg.ner_stride is not None else min(32, room // 4)
        if stride >= room:
            raise ValueError(f"--ner-stride {stride} must be smaller than the {room} sub-tokens a window of "
                             f"--max-length {cfg.max_length} holds; lower --ner-stride or raise --max-length.")
        return dataclasses.replace(cfg, ner_stride=stride)

    def read(self, source, labels, training=False, name=""):
        from zhnlp.data.tasks.ner import label_list_from

        examples, declared = super().read(source, None, training, name)  # declared: a ClassLabel's tag names
        path = name
        if any(self.unlabelled(e) for e in examples):
            return examples, labels  # load_split reports it, naming the file
        found = label_list_from(examples)
        if labels is None:  # the training data: a ClassLabel's tag names in their order, else the tags found
            return examples, list(declared) if declared is not None else found
        unknown = sorted(set(found) - set(labels))
        if unknown:
            raise DataError(f"{path}: tags {unknown} are not in the training set's tags {labels}; "
                            "fix the file or train on data that has them.")
        return examples, labels

    def unlabelled(self, example) -> bool:
        return example.tags is None

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.tasks.ner import encode_ner

        return encode_ner(tokenizer, examples, {t: i for i, t in enumerate(labels)}, max_length=cfg.max_length,
                          stride=cfg.ner_stride)

    def score(self, cfg, outputs, examples, features, labels, path):
        from zhnlp.data.tasks.ner import decode_ner
        from zhnlp.metrics.ner import entity_scores

        tags = decode_ner(examples, features, outputs["logits"], dict(enumerate(labels)))
        return entity_scores(tags, [e.tags for e in examples]), tags


class SFTTask(Task):
    """Supervised fine-tuning of a decoder on conversations (:mod:`zhnlp.data.tasks.sft`): the causal-LM loss on
    the assistant's tokens only; the dev score is that loss over every target token of the dev set (and its
    perplexity), lower is better."""

    name, head, metric = "sft", "causal_lm", "loss"
    max_length = 1024
    _training = False

    def configure(self, cfg):
        cfg = super().configure(cfg)
        return dataclasses.replace(cfg, metric_for_best_model=cfg.metric_for_best_model or "loss")

    def read(self, source, labels, training=False, name=""):
        from zhnlp.data.tasks.sft import read_sft, sft_from_rows

        self._training = training
        if isinstance(source, Path):
            return read_sft(source), None
        return sft_from_rows(source, name), None

    def unlabelled(self, example) -> bool:
        return False  # the reader refuses a conversation without an assistant message

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.tasks.sft import check_chat_template, encode_sft

        check_chat_template(tokenizer, cfg.model)
        features = encode_sft(tokenizer, examples, cfg.max_length, "--train" if self._training else "dev/test data")
        if self._training:
            self.left_out = len(examples) - len(features)
        return features

    def training_features(self, cfg, features):
        if not cfg.packing:
            return features, None
        from zhnlp.data.tasks.sft import collate_packed, pack_conversations

        return pack_conversations(features, cfg.max_length, cfg.seed), collate_packed

    def run_model(self, cfg, model, features, what, pad_token_id):
        from zhnlp.training.batches import loss_over

        return loss_over(model, features, cfg.eval_batch_size, multiple=8 * cfg.tp, what=what,
                         pad_token_id=pad_token_id)

    def score(self, cfg, outputs, examples, features, labels, reference):
        loss = outputs["loss"]
        return {"loss": loss, "perplexity": float(np.exp(min(loss, 700.0))), "tokens": outputs["tokens"]}, None


class MLMTask(Task):
    """Continued masked-LM pretraining on unlabelled text (:mod:`zhnlp.data.tasks.mlm`) with the model's masked-LM
    head (freshly initialised and tied to the word embeddings when the checkpoint has none). Training features are
    masked afresh every epoch; dev/test once. The loss is the mean cross-entropy over the masked tokens (the head's,
    vocabulary-parallel under TP); the dev score is that loss over every masked dev token (lower is better), its
    perplexity and the masked-token accuracy."""

    name, head, metric = "mlm", "mlm", "loss"
    _training = False
    _special = None  # the tokenizer's special ids (SpecialTokens), known once a split is encoded

    def configure(self, cfg):
        cfg = super().configure(cfg)
        return dataclasses.replace(cfg, metric_for_best_model=cfg.metric_for_best_model or "loss",
                                   mask_prob=cfg.mask_prob if cfg.mask_prob is not None else 0.15)

    def read(self, source, labels, training=False, name=""):
        self._training = training
        examples, _ = super().read(source, None, training, name)
        return examples, None

    def unlabelled(self, example) -> bool:
        return False  # the text is the target

    def encode(self, cfg, tokenizer, examples, labels):
        from zhnlp.data.pretraining import SpecialTokens
        from zhnlp.data.tasks.mlm import Masking, encode_mlm

        if tokenizer.mask_token_id is None:
            raise DataError(f"the tokenizer of {cfg.model} has no mask token; masked-LM fine-tuning needs one "
                            "([MASK]): fine-tune an encoder with a BERT-style tokenizer.")
        self._special = SpecialTokens.from_tokenizer(tokenizer)
        features = encode_mlm(tokenizer, examples, cfg.max_length, cfg.whole_word_masking)
        return features if self._training else Masking(self._special, cfg.mask_prob, cfg.seed).fixed(features)

    def epoch_transform(self, cfg):
        from zhnlp.data.tasks.mlm import Masking

        return Masking(self._special, cfg.mask_prob, cfg.seed).for_epoch

    def run_model(self, cfg, model, features, what, pad_token_id):
        from zhnlp.training.batches import masked_lm_over

        return masked_lm_over(model, features, cfg.eval_batch_size, multiple=8 * cfg.tp, what=what,
                              pad_token_id=pad_token_id)

    def score(self, cfg, outputs, examples, features, labels, reference):
        loss = outputs["loss"]
        return {"loss": loss, "perplexity": float(np.exp(min(loss, 700.0))), "accuracy": outputs["accuracy"],
                "tokens": outputs["tokens"]}, None


TASKS = {"classification": ClassificationTask, "mrc": MRCTask, "ner": NERTask, "sft": SFTTask, "mlm": MLMTask}
assert tuple(TASKS) == TASK_NAMES


def get_task(name: str) -> Task:
    key = ALIASES.get(name, name)
    if key not in TASKS:
        raise ZhnlpError(f"unknown task {name!r}; choose one of {', '.join(list(TASKS) + list(ALIASES))}.")
    return TASKS[key]()


# ------------------------------------------------------------------------------------------ the run
_SPLIT_FLAGS = {"train": "--train", "dev": "--dev", "test": "--test"}


def finetune(config: FinetuneConfig | None = None, *, train=None, dev=None, test=None, compute_metrics=None,
             callbacks=None, **fields) -> dict:
    """Fine-tune, evaluate, keep the best model, score the test set; returns the contents of
    ``OUTPUT/metrics.json`` (collective under torchrun: every rank calls it).

    ``finetune(cfg)`` runs a :class:`FinetuneConfig`; ``finetune(task="classification",
    model="ernie-3.0-nano-zh", train=..., dev=..., output="runs/x", epochs=2)`` builds one from its
    fields (with ``config`` given, the fields override it).

    Args:
        train, dev, test: the data, each a file path, a ``save_to_disk`` directory, a
            ``datasets.Dataset`` or a list of dicts (see :mod:`zhnlp.data.tasks.hf` for the columns);
            a ``DatasetDict`` (or its directory) as ``train`` also supplies ``dev`` (its
            ``validation`` split) and ``test`` when they are not given. Default: the config's paths.
        compute_metrics: ``f(EvalPrediction) -> dict`` of extra dev (and test) scores, merged into
            the task's; its keys may be ``metric_for_best_model``.
        callbacks: :class:`zhnlp.training.callbacks.Callback` instances (``on_train_begin``,
            ``on_step_end``, ``on_evaluate``, ``on_save``, ``on_train_end``; set
            ``control.should_stop`` to end the run).

    ``OUTPUT`` must be new or empty unless ``overwrite`` (the earlier run's results are then
    deleted first) or ``resume`` (the run continues from its newest checkpoint), and is locked for
    the run (see :mod:`zhnlp.training.rundir`). ``metrics.json`` is rewritten after every
    evaluation and always describes the model in ``OUTPUT/model``; its ``status`` is ``running``,
    ``complete`` or ``interrupted`` (SIGTERM/SIGINT: the current step is finished, a checkpoint
    written, the best model so far kept, and :class:`zhnlp.errors.Interrupted` raised).

    A process that had no process group before the call has none after it (single-process use
    from Python leaves ``torch.distributed`` as it found it)."""
    import torch.distributed as dist

    from zhnlp.data.tasks import hf
    from zhnlp.training.rundir import run_directory

    given = {"train": train, "dev": dev, "test": test}
    if config is None:
        cfg = FinetuneConfig(**{k: str(v) if isinstance(v, Path) else v for k, v in fields.items()})
    elif fields:
        cfg = dataclasses.replace(config, **fields)
    else:
        cfg = config
    sources = {name: value if value is not None else getattr(cfg, name) for name, value in given.items()}
    if hf.is_dataset_dict(sources["train"]):  # its splits fill the ones not given
        whole = sources["train"]
        sources["train"] = hf.pick_split(whole, "train", "--train")
        for name in ("dev", "test"):
            if sources[name] is None:
                sources[name] = hf.pick_split(whole, name, f"--{name}")
    paths = {name: str(v) for name, v in sources.items() if isinstance(v, (str, Path))}
    cfg = dataclasses.replace(cfg, **{name: paths.get(name) for name in sources})

    task = get_task(cfg.task)
    cfg = task.configure(cfg)
    if cfg.oracle and task.name != "mrc":
        raise ZhnlpError("--oracle is for reading comprehension (zhnlp finetune mrc ...).")
    if cfg.packing and task.name != "sft":
        raise ZhnlpError("--packing is for supervised fine-tuning on conversations (zhnlp finetune sft ...).")
    if task.name != "mlm" and (cfg.mask_prob is not None or not cfg.whole_word_masking):
        raise ZhnlpError("--mask-prob and --no-whole-word-masking are for masked-LM fine-tuning (zhnlp finetune mlm "
                         "...).")
    if compute_metrics is not None and task.name in ("sft", "mlm"):
        raise ZhnlpError(f"compute_metrics is not available for {task.name}: its predictions would be every token's "
                         "logits over the vocabulary; score the saved model (OUTPUT/model) separately.")
    if cfg.oracle and not any(v is not None for v in sources.values()):
        raise ZhnlpError("--oracle needs at least one of --train/--dev/--test.")
    for name, value in sources.items():
        if value is not None:
            hf.check_source(_SPLIT_FLAGS[name], value)
        elif name != "test" and not cfg.oracle:
            raise ZhnlpError(f"fine-tuning needs --{name} FILE (or {name}= data in Python).")
    if compute_metrics is not None and not callable(compute_metrics):
        raise TypeError(f"compute_metrics must be a function EvalPrediction -> dict, got {compute_metrics!r}")
    owned = not dist.is_initialized()  # a process group this call creates, this call removes
    finished = False
    try:
        with run_directory(cfg.output, overwrite=cfg.overwrite, resume=cfg.resume) as run:
            if cfg.oracle:
                result = oracle(cfg, run)
            else:
                from zhnlp.training.finetune_loop import run_finetune

                result = run_finetune(task, cfg, run, sources, compute_metrics=compute_metrics, callbacks=callbacks)
        finished = True
        return result
    finally:
        if owned and dist.is_initialized():
            from zhnlp import distributed

            if finished:  # every rank is done before gloo's threads go (not after a failure: a peer may be gone)
                distributed.barrier()
            distributed.shutdown()


def load_split(task: Task, cfg: FinetuneConfig, tokenizer, source, labels, flag: str, limit: int | None = None,
               training: bool = False):
    """Read, check and encode one split -> (examples, features, labels, reference); ``limit`` keeps
    the first examples only (after all of them are checked). ``source``: a path, a saved dataset
    directory, a Dataset or a list of dicts; ``flag`` names it in messages."""
    from zhnlp.data.tasks import hf

    data = hf.open_source(source, flag)
    name = str(data) if isinstance(data, Path) else f"{flag} data"
    examples, labels = task.read(data, labels, training=training, name=name)
    reference = task.reference
    if not examples:
        raise DataError(f"{name} holds no examples.")
    missing = sum(task.unlabelled(e) for e in examples)
    if missing:
        what = {"classification": "label", "mrc": "answer", "ner": "tags", "sft": "assistant message",
                "mlm": "text"}[task.name]
        raise DataError(f"{name}: {missing} of {len(examples)} examples have no {what}; training, dev and test files "
                        f"need one on every example (this looks like a file to predict on: use zhnlp predict).")
    examples = examples[:limit] if limit else examples
    return examples, task.encode(cfg, tokenizer, examples, labels), labels, reference


def oracle(cfg: FinetuneConfig, run_dir=None) -> dict:
    """Reading comprehension: put the gold start/end positions through the same windowing and
    span decoding as a model's logits (no training) and score them with the official metric."""
    from zhnlp.data.tasks.mrc import oracle_report
    from zhnlp.tokenizers import AutoTokenizer

    task = get_task(cfg.task)
    if task.name != "mrc":
        raise ZhnlpError("--oracle is for reading comprehension (zhnlp finetune mrc ...).")
    cfg = task.configure(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)  # only the tokenizer takes part
    result = {}
    for split in ("train", "dev", "test"):
        path = getattr(cfg, split)
        if path is None:
            continue
        if Path(path).is_dir():
            raise ZhnlpError(f"--oracle reads SQuAD json files; --{split} {path} is a saved dataset.")
        result[split] = oracle_report(path, tokenizer, max_seq_len=cfg.max_length, doc_stride=cfg.doc_stride,
                                      max_answer_len=cfg.max_answer_length, max_query_len=cfg.max_query_length)
    if run_dir is not None:
        run_dir.clear_previous()
    _atomic_json(Path(cfg.output) / "oracle.json", result)
    return result


def _atomic_json(path: Path, data) -> None:
    from zhnlp.fileio import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, data, default=_plain)


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
