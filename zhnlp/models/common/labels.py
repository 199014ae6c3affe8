"""``num_labels``, ``id2label`` and ``problem_type``: validated and reconciled as transformers does.

transformers 5 (``PreTrainedConfig.__post_init__`` and the ``num_labels`` setter) treats
``num_labels`` as the length of ``id2label``: when a ``num_labels`` is given that contradicts
``id2label`` it logs a warning, and ``num_labels`` wins, with the label maps rebuilt as
``LABEL_0 .. LABEL_{n-1}``. A ``num_labels`` equal to ``len(id2label)`` keeps the names. We do
the same, so a checkpoint reads back with the same head size in both libraries; the warning
names the file or argument and is skipped when only default ``LABEL_i`` names are replaced
(nothing is lost then). What transformers accepts silently but breaks a head later is refused
here: ``num_labels`` < 1 or not an integer, and ``id2label`` keys that are not ``0 .. n-1``.
"""

from __future__ import annotations

import logging
import numbers

logger = logging.getLogger("zhnlp")

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def reconcile(num_labels, id2label, where: str, error: type[Exception]) -> tuple[int, dict[int, str] | None]:
    """The ``(num_labels, id2label)`` a config ends with; ``id2label`` None means ``LABEL_i`` names.

    ``where`` names the source in messages (a config.json path, "the arguments"); ``error`` is
    the exception class raised for invalid values (CheckpointError for files, ValueError for
    arguments).
    """
    if num_labels is not None:
        num_labels = check_num_labels(num_labels, where, error)
    if id2label is not None:
        id2label = _checked_id2label(id2label, where, error)
    if num_labels is None:
        return (len(id2label) if id2label else 2), id2label
    if id2label is not None and len(id2label) != num_labels:
        if not _default_names(id2label):
            logger.warning("%s: num_labels=%d contradicts id2label, which names %d labels (%s); using %d labels "
                           "named LABEL_0..LABEL_%d, as transformers does. Give id2label with one name per label "
                           "to keep names.", where, num_labels, len(id2label), _names(id2label), num_labels,
                           num_labels - 1)
        return num_labels, None
    return num_labels, id2label


def override_num_labels(num_labels: int, file_id2label: dict[int, str] | None,
                        where: str) -> tuple[int, dict[int, str] | None]:
    """A ``num_labels`` argument applied to a config file's ``id2label`` (transformers' setter):
    the file's names are kept when their number matches, else replaced by ``LABEL_i``."""
    if file_id2label is not None and len(file_id2label) == num_labels:
        return num_labels, file_id2label
    if file_id2label and not _default_names(file_id2label):
        logger.warning("%s names %d labels (%s) but num_labels=%d was passed; the head gets %d labels named "
                       "LABEL_0..LABEL_%d, as transformers does. Pass id2label={0: ..., ...} to name them.",
                       where, len(file_id2label), _names(file_id2label), num_labels, num_labels, num_labels - 1)
    return num_labels, None


def check_num_labels(value, where: str, error: type[Exception] = ValueError) -> int:
    """``value`` as an int; anything but an integer >= 1 (numpy integers included) is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise error(f"{where}: num_labels={value!r} is not a valid number of labels; give an integer >= 1 "
                    "(1 for regression, 2 or more for classification).")
    return int(value)


def check_problem_type(problem_type, num_labels: int, where: str, error: type[Exception] = ValueError) -> None:
    """transformers' values for ``problem_type``; single-label classification needs two labels or more."""
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise error(f"{where}: problem_type={problem_type!r} is not one of {', '.join(PROBLEM_TYPES)}; "
                    "fix it or leave it unset (transformers then infers it from num_labels and the label dtype).")
    if problem_type == "single_label_classification" and num_labels == 1:
        raise error(f"{where}: problem_type='single_label_classification' needs num_labels >= 2, got 1; "
                    "use num_labels=2 for binary classification or problem_type='regression' for one output.")


def _checked_id2label(id2label, where: str, error: type[Exception]) -> dict[int, str]:
    if not isinstance(id2label, dict) or not id2label:
        raise error(f"{where}: id2label={_short(id2label)} must be a non-empty object mapping label ids "
                    '0..n-1 to names, e.g. {"0": "negative", "1": "positive"}.')
    out = {}
    for key, name in id2label.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            index = None
        if index is None or isinstance(key, bool) or str(index) != str(key).strip():
            raise error(f"{where}: id2label key {key!r} is not a label id; keys must be the integers 0..n-1 "
                        '(in JSON, strings such as "0").')
        out[index] = name
    if sorted(out) != list(range(len(out))):
        raise error(f"{where}: id2label has ids {sorted(out)}, but they must be 0..{len(out) - 1} without gaps "
                    "(id i names output i of the head); renumber them.")
    return dict(sorted(out.items()))


def _default_names(id2label: dict[int, str]) -> bool:
    return all(name == f"LABEL_{i}" for i, name in id2label.items())


def _names(id2label: dict[int, str], limit: int = 6) -> str:
    names = [str(id2label[i]) for i in sorted(id2label)]
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
