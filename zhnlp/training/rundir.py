"""Run directories: one run per directory, never mixed with another's results.

``with run_directory(path, overwrite=..., resume=...) as run:`` (collective under torchrun) locks
the directory for the run (``OUTPUT/.zhnlp.lock``, see :class:`zhnlp.fileio.DirectoryLock`: a
second run into it fails at once, naming the holder's pid) and refuses a directory that already
holds something, unless the user says ``--overwrite`` or ``--resume`` (pretraining continues the
run that is there). With ``--overwrite`` the earlier run's results are deleted only when the new
run calls ``run.clear_previous()``, once its data and model are loaded: a run that fails before
that leaves them as they were. The check and the lock are made once, on global rank 0, and every
rank gets the same verdict.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

# What zhnlp writes into a run directory: the only names --overwrite deletes (other files are left alone).
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "metrics.json", "tensorboard", "curves.png", "model",
               "model.incomplete", "model.old", "dev_predictions.json", "test_predictions.json", "oracle.json")


class RunDirectory:
    """A claimed run directory (see the module docstring)."""

    def __init__(self, path: Path, overwrite: bool):
        self.path, self.overwrite = path, overwrite

    def clear_previous(self) -> None:
        """With ``--overwrite``: delete the earlier run's results now (collective)."""
        from zhnlp import distributed
        from zhnlp.fileio import remove_outputs

        if self.overwrite:
            removed = distributed.on_rank_zero(lambda: remove_outputs(self.path, RUN_OUTPUTS))
            if removed:
                logging.getLogger("zhnlp").info("--overwrite: removed the earlier run's %s from %s",
                                                ", ".join(removed), self.path)
            self.overwrite = False
        distributed.barrier()


@contextlib.contextmanager
def run_directory(path: str | Path, *, overwrite: bool = False, resume: bool = False) -> Iterator[RunDirectory]:
    """Hold ``path`` for one run (see the module docstring)."""
    from zhnlp import distributed
    from zhnlp.fileio import claim_directory

    if overwrite and resume:
        raise ValueError("--overwrite and --resume contradict each other: --resume continues the run in --output, "
                         "--overwrite deletes it; pass one of them.")
    lock = distributed.on_rank_zero(lambda: claim_directory(path, overwrite=overwrite, keep=resume))
    try:
        yield RunDirectory(Path(path), overwrite)
    except BaseException:
        if lock is not None:
            lock.discard()
        raise
    if lock is not None:
        lock.release()
