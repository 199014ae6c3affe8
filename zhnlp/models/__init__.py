"""Model families, looked up by transformers' ``model_type``."""

from __future__ import annotations

from zhnlp.errors import ModelNotFoundError
from zhnlp.models.common.family import Family


def families() -> dict[str, Family]:
    from zhnlp.models import albert, ernie, ernie4_5, ernie_m, electra, roformer

    return {f.name: f for f in (ernie.FAMILY, ernie4_5.FAMILY, electra.FAMILY, roformer.FAMILY, albert.FAMILY,
                                ernie_m.FAMILY)}


def family_for_model_type(model_type: str | None, source: str = "") -> Family:
    """The family that implements transformers' ``model_type``."""
    for fam in families().values():
        if model_type in fam.model_types:
            return fam
    known = sorted(t for f in families().values() for t in f.model_types)
    raise ModelNotFoundError(f"{source or 'config.json'}: model_type {model_type!r} is not supported by zhnlp; "
                             f"supported model types: {known}.")
