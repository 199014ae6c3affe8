"""Text generation: continue a prompt, or answer a chat, with a decoder model (ERNIE 4.5), as transformers does."""

from __future__ import annotations

import torch

from zhnlp.pipelines.base import Pipeline, is_positive_int

ROLES = ("system", "user", "assistant")


class Chat:
    """One conversation given to the pipeline (a list of ``{"role", "content"}`` messages), kept apart from a
    list of prompts."""

    def __init__(self, messages: list[dict]):
        self.messages = messages


def is_chat(item) -> bool:
    """True for a list of message dicts (one conversation), False for a string or a list of strings."""
    return isinstance(item, (list, tuple)) and bool(item) and all(isinstance(m, dict) for m in item)


class TextGenerationPipeline(Pipeline):
    """Continue prompts with a causal-LM model (``zhnlp.AutoModelForCausalLM``), in transformers' conventions.

    Input: a prompt string; a chat, i.e. a list of ``{"role": "system"|"user"|"assistant", "content": str}``
    messages, rendered with the tokenizer's chat template (ERNIE 4.5's writes ``<|begin_of_sentence|>``,
    ``User: ...\\n`` and ends with the ``Assistant: `` prompt); or a list of prompts or of chats.

    Output for one input: ``[{"generated_text": ...}]``; for a list of inputs, one such list per input. With
    ``return_full_text=True`` (the default) ``generated_text`` is the prompt followed by the new text, and for a
    chat the messages with the reply appended as ``{"role": "assistant", "content": new text}`` (a chat ending
    in an assistant message is continued instead: that message's content is extended); with
    ``return_full_text=False``, the new text alone. The new tokens are decoded with ``skip_special_tokens=True``
    (the eos token and padding never show).

    Options, given to ``model.generate``: ``max_new_tokens`` (256, transformers' pipeline default),
    ``do_sample`` (False: greedy, token-identical to transformers), ``temperature`` (1.0), ``top_k`` (50, as in
    transformers; 0 or None: off), ``top_p``, ``repetition_penalty``, ``eos_token_id`` / ``pad_token_id``
    (default: the model's config), ``streamer`` (an object with ``put``/``end`` such as
    :class:`zhnlp.TextStreamer`; inputs then run one at a time). Also ``return_full_text``,
    ``skip_special_tokens``, ``continue_final_message``. As in transformers, the model directory's
    ``generation_config.json`` replaces these defaults where it sets them (ERNIE-4.5-0.3B-Base's asks for sampling
    with top-p 0.8 and temperature 0.8); options given to the pipeline or per call win. Sampling draws from torch's generator: call
    ``torch.manual_seed`` first for a repeatable draw.

    Prompts of one batch (``batch_size``) are left-padded together; a prompt plus ``max_new_tokens`` must fit
    in the model's ``max_position_embeddings``.
    """

    task = "text-generation"
    auto_class = "AutoModelForCausalLM"
    head = "causal-LM head"
    default_options = {"max_new_tokens": 256, "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": None,
                       "repetition_penalty": 1.0, "eos_token_id": None, "pad_token_id": None, "streamer": None,
                       "return_full_text": True, "skip_special_tokens": True, "continue_final_message": None}

    def __init__(self, model=None, **kwargs):
        given = set(kwargs)
        super().__init__(model, **kwargs)
        # the checkpoint's generation_config.json sets the defaults the caller left alone, as in transformers
        saved = {k: v for k, v in self._saved_generation_config().items() if k not in given}
        if saved:
            self.options = {**self.options, **saved}
            self.check_options(self.options)

    def _saved_generation_config(self) -> dict:
        """The generation options in the model directory's ``generation_config.json`` ({} when there is none)."""
        import json
        import os

        from zhnlp import hub
        from zhnlp.errors import CheckpointError

        name = getattr(self.model, "name_or_path", "") or ""
        if not name:
            return {}
        directory = hub.resolve(name) if not os.path.isdir(name) else name
        file = os.path.join(directory, "generation_config.json")
        if not os.path.isfile(file):
            return {}
        try:
            with open(file, encoding="utf-8") as f:
                saved = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{file} is not valid JSON ({e}); fix or delete it (the defaults are then "
                                  f"transformers').") from None
        if not isinstance(saved, dict):
            raise CheckpointError(f"{file} holds a JSON {type(saved).__name__}, not an object; fix or delete it.")
        keys = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                "eos_token_id", "pad_token_id")
        return {k: saved[k] for k in keys if saved.get(k) is not None}

    def __call__(self, inputs, **options):
        if is_chat(inputs):
            return super().__call__(Chat(list(inputs)), **options)
        if isinstance(inputs, list):
            inputs = [Chat(list(item)) if is_chat(item) else item for item in inputs]
        return super().__call__(inputs, **options)

    def iter_results(self, inputs, **options):
        yield from super().iter_results((Chat(list(i)) if is_chat(i) else i for i in inputs), **options)

    # ------------------------------------------------------------------ step 3
    def check_input(self, item):
        if isinstance(item, Chat):
            for n, message in enumerate(item.messages):
                if not {"role", "content"} <= set(message) or message.get("role") not in ROLES or not isinstance(
                        message.get("content"), str):
                    raise ValueError(f"chat message {n} is {message!r}; each message is a dict with 'role' (one of "
                                     f"{', '.join(ROLES)}) and 'content' (a string).")
            if not self.tokenizer.chat_template:
                raise ValueError("the tokenizer has no chat template, so a chat cannot be rendered; pass a plain "
                                 "prompt string, or a tokenizer whose tokenizer_config.json has a chat_template.")
            return item
        if not isinstance(item, str):
            raise TypeError(f"text-generation takes a prompt string, a chat (a list of {{'role', 'content'}} "
                            f"messages) or a list of those, got {type(item).__name__}.")
        if not item.strip():
            raise ValueError("the prompt is empty; give the text to continue (or a chat of messages).")
        return item

    def check_options(self, options):
        n = options["max_new_tokens"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {n!r}.")
        top_k = options["top_k"]
        if top_k is not None and not (is_positive_int(top_k) or top_k == 0) or isinstance(top_k, bool):
            raise ValueError(f"top_k must be an integer >= 0 (0 or None: no top-k filtering), got {top_k!r}.")
        top_p = options["top_p"]
        if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}.")
        penalty = options["repetition_penalty"]
        if not (isinstance(penalty, (int, float)) and penalty > 0):
            raise ValueError(f"repetition_penalty must be > 0 (1.0: none), got {penalty!r}.")
        streamer = options["streamer"]
        if streamer is not None and not (callable(getattr(streamer, "put", None))
                                         and callable(getattr(streamer, "end", None))):
            raise TypeError(f"streamer must have put(ids) and end() methods (zhnlp.TextStreamer or transformers' "
                            f"TextStreamer), got {type(streamer).__name__}.")

    def _continues(self, chat: Chat, options) -> bool:
        final = options["continue_final_message"]
        return chat.messages[-1]["role"] == "assistant" if final is None else bool(final)

    def preprocess(self, items, options):
        features = []
        limit = self.model.config.max_position_embeddings
        for i, item in enumerate(items):
            if isinstance(item, Chat):
                final = self._continues(item, options)
                text = self.tokenizer.apply_chat_template(item.messages, tokenize=False,
                                                          add_generation_prompt=not final,
                                                          continue_final_message=final)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            else:
                ids = self.tokenizer(item)["input_ids"]
            if not ids:
                raise ValueError(f"the prompt {str(item)[:50]!r} gives no tokens; give text to continue.")
            if len(ids) + options["max_new_tokens"] > limit:
                raise ValueError(f"the prompt has {len(ids)} tokens and max_new_tokens is "
                                 f"{options['max_new_tokens']}, more than the model's {limit} positions; shorten "
                                 f"the prompt or lower max_new_tokens.")
            features.append({"input_ids": ids, "example_index": i})
        return features

    # ------------------------------------------------------------------ step 4
    def run(self, features, options):
        """Generate for ``batch_size`` prompts at a time (one at a time with a streamer), left-padded."""
        cfg = self.model.config
        eos = options["eos_token_id"] if options["eos_token_id"] is not None else cfg.eos_token_id
        eos_ids = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
        pad = options["pad_token_id"]
        if pad is None:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else cfg.pad_token_id
        size = 1 if options["streamer"] is not None else self.batch_size
        outputs = []
        for start in range(0, len(features), size):
            chunk = features[start:start + size]
            width = max(len(f["input_ids"]) for f in chunk)
            ids = torch.tensor([[pad] * (width - len(f["input_ids"])) + f["input_ids"] for f in chunk])
            mask = torch.tensor([[0] * (width - len(f["input_ids"])) + [1] * len(f["input_ids"]) for f in chunk])
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=options["max_new_tokens"],
                                      do_sample=options["do_sample"], temperature=options["temperature"],
                                      top_k=options["top_k"], top_p=options["top_p"],
                                      repetition_penalty=options["repetition_penalty"], eos_token_id=eos,
                                      pad_token_id=pad, streamer=options["streamer"])
            for row in out[:, width:].tolist():
                # the row ends at its eos; what follows is padding for rows that finished early
                end = next((k + 1 for k, t in enumerate(row) if t in eos_ids), len(row))
                outputs.append({"new_ids": row[:end]})
        return outputs

    # ------------------------------------------------------------------ step 5
    def postprocess(self, items, features, outputs, options):
        results = []
        for item, out in zip(items, outputs):
            text = self.tokenizer.decode(out["new_ids"], skip_special_tokens=options["skip_special_tokens"])
            if not options["return_full_text"]:
                generated = text
            elif isinstance(item, Chat):
                messages = [dict(m) for m in item.messages]
                if self._continues(item, options):
                    messages[-1]["content"] += text
                else:
                    messages.append({"role": "assistant", "content": text})
                generated = messages
            else:
                generated = item + text
            results.append([{"generated_text": generated}])
        return results
