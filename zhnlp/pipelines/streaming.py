"""``zhnlp.TextStreamer``: print generated text as the tokens arrive.

``model.generate(..., streamer=s)`` (and the text-generation pipeline's ``streamer=`` option) calls
``s.put(prompt_ids)`` once with the prompt ``(1, s)``, then ``s.put(new_ids)`` once per generated token
``(1,)``, and ``s.end()`` when generation stops; transformers' ``TextStreamer`` works there too.

Text is emitted as soon as it is final: the tokens so far are decoded together (so SentencePiece's word-start
spaces and a character split over several byte-fallback tokens come out right) and what extends the text
already emitted is passed on, except for a trailing incomplete character (``\\ufffd``), which waits for its
remaining bytes. Chinese therefore appears character by character, not word by word.
"""

from __future__ import annotations

import sys
from typing import TextIO


class TextStreamer:
    """Write decoded text to ``stream`` (default stdout) token by token.

    Args:
        tokenizer: the tokenizer that encoded the prompt.
        skip_prompt: leave the prompt out (only the generated text is written).
        stream: a text file object; ``sys.stdout`` at the time of each write when None.
        end: written after the last token (``"\\n"``; ``""`` for none).
        decode_kwargs: given to ``tokenizer.decode`` (default ``skip_special_tokens=True``, so eos and padding
            never show).

    Subclass and override :meth:`on_text` to send the text elsewhere (a UI, a socket).
    """

    def __init__(self, tokenizer, skip_prompt: bool = False, stream: TextIO | None = None, end: str = "\n",
                 **decode_kwargs):
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.stream = stream
        self.end_text = end
        self.decode_kwargs = {"skip_special_tokens": True, **decode_kwargs}
        self._ids: list[int] = []
        self._emitted = ""
        self._prompt_pending = True

    def put(self, value) -> None:
        """Take the prompt (first call) or the next token: a tensor or list of shape (1, n), (n,) or ()."""
        ids = value.tolist() if hasattr(value, "tolist") else value
        if isinstance(ids, int):
            ids = [ids]
        if ids and isinstance(ids[0], list):
            if len(ids) != 1:
                raise ValueError(f"TextStreamer streams one sequence, got a batch of {len(ids)}; generate one "
                                 f"prompt at a time when streaming.")
            ids = ids[0]
        if self._prompt_pending:
            self._prompt_pending = False
            if self.skip_prompt:
                return
        self._ids.extend(int(i) for i in ids)
        text = self.tokenizer.decode(self._ids, **self.decode_kwargs)
        if text.endswith("\ufffd"):  # a character whose remaining bytes are still to come
            text = text.rstrip("\ufffd")
        if text.startswith(self._emitted) and len(text) > len(self._emitted):
            new, self._emitted = text[len(self._emitted):], text
            self.on_text(new, stream_end=False)

    def end(self) -> None:
        """Flush what is left (a trailing incomplete character included) and write ``end``."""
        text = self.tokenizer.decode(self._ids, **self.decode_kwargs) if self._ids else ""
        rest = text[len(self._emitted):] if text.startswith(self._emitted) else ""
        self._ids, self._emitted, self._prompt_pending = [], "", True
        self.on_text(rest + self.end_text, stream_end=True)

    def on_text(self, text: str, stream_end: bool = False) -> None:
        """Write ``text`` (called once per newly final piece of text, and once at the end)."""
        if not text:
            return
        stream = self.stream if self.stream is not None else sys.stdout
        stream.write(text)
        stream.flush()
