"""Chinese word segmentation (jieba's precise mode, through ``zhnlp.segment``); no model involved."""

from __future__ import annotations

from zhnlp.pipelines.base import Pipeline, is_positive_int
from zhnlp.tokenizers.segment import Segmenter, segment


class WordSegmentationPipeline(Pipeline):
    """Cut Chinese text into words exactly as ``zhnlp.segment`` (jieba's precise mode) does.

    Input: a string or a list of strings. Output per input: ``{"words": [...], "offsets": [(start, end), ...]}``,
    the character span of each word in the input; the words tile the text (spaces and punctuation included).

    Options: ``hmm`` (default True: jieba's HMM joins characters no dictionary word covers), ``userdict`` (path of
    a jieba user dictionary, one ``word [freq] [tag]`` per line), ``backend`` (``"auto"``, ``"rjieba"``,
    ``"jieba"``; see ``zhnlp.tokenizers.segment``). They are fixed when the pipeline is built.
    """

    task = "word-segmentation"
    auto_class = None
    default_options = {"hmm": True, "userdict": None, "backend": "auto"}

    def __init__(self, model=None, *, tokenizer=None, batch_size: int = 8, max_length: int = 512,
                 allow_untrained: bool = False, device=None, dtype=None, **options):
        # allow_untrained, device and dtype are accepted (zhnlp predict and code written for every task pass
        # them) and have nothing to act on: segmentation runs jieba on the CPU
        if model is not None or tokenizer is not None:
            raise ValueError("word-segmentation uses jieba's dictionary, not a model or tokenizer; drop model=/"
                             "tokenizer= (add your own words with userdict=PATH).")
        if not is_positive_int(batch_size):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        self.batch_size = batch_size
        self.max_length = max_length  # unused: segmentation has no length limit
        self.options = self._merge_options(options)
        self.model = self.tokenizer = None
        o = self.options
        if o["userdict"] is None and o["backend"] == "auto":
            self._cut = lambda text: segment(text, hmm=o["hmm"])  # the shared default segmenter
        else:
            self._cut = Segmenter(hmm=o["hmm"], backend=o["backend"], userdict=o["userdict"]).cut

    def _merge_options(self, options, base=None):
        if base is not None and options:  # a call's options: the segmenter was built with the pipeline's
            raise TypeError(f"word-segmentation options {sorted(options)} are fixed when the pipeline is built; "
                            "pass them to zhnlp.pipeline('word-segmentation', ...).")
        return super()._merge_options(options, base)

    def _results(self, inputs, merged):
        for item in inputs:
            yield self._segment(self.check_input(item))

    def check_input(self, item):
        if not isinstance(item, str):
            raise TypeError(f"word-segmentation takes a string (or a list of strings), got {type(item).__name__}.")
        return item

    def _segment(self, text: str) -> dict:
        words = self._cut(text)
        offsets, start = [], 0
        for word in words:
            offsets.append((start, start + len(word)))
            start += len(word)
        return {"words": words, "offsets": offsets}
