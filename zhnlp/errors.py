"""Exceptions zhnlp raises for problems a user can fix. Each message names the problem and the fix."""


class ZhnlpError(Exception):
    """Base class of zhnlp's user-facing errors."""


class LayoutError(ZhnlpError, ValueError):
    """A parallel layout that does not fit the world size or the model's shapes."""


class ModelNotFoundError(ZhnlpError, FileNotFoundError):
    """A model name, repo id or directory that cannot be resolved to a checkpoint."""


class CheckpointError(ZhnlpError, ValueError):
    """A checkpoint whose keys or shapes do not match the model being loaded."""


class DataError(ZhnlpError):
    """A dataset that cannot be fetched, unpacked or converted (see ``zhnlp.data.fetch``)."""


class OutputExistsError(ZhnlpError):
    """An output (run directory, export target, corpus prefix) that already holds something, or
    is in use by another run."""


class Interrupted(ZhnlpError):
    """A run stopped by SIGTERM or SIGINT after finishing its step (and, for pretraining, saving a
    checkpoint). ``exit_code`` is the shell convention: 128 + the signal number (143, 130)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class TokenizerError(ZhnlpError, ValueError):
    """A tokenizer file (vocab.txt, tokenizer.json, tokenizer_config.json, a SentencePiece model,
    a jieba user dictionary) that cannot be read or contradicts itself."""
