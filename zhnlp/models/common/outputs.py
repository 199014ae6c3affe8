"""Model outputs with transformers' access patterns: ``out.logits``, ``out["logits"]``, ``out[0]``."""

from __future__ import annotations

# transformers' field order: what ``out[0]`` and ``to_tuple()`` return first
ORDER = ("loss", "aux_loss", "logits", "start_logits", "end_logits", "last_hidden_state", "pooler_output",
         "hidden_states", "router_logits")


class ModelOutput(dict):
    """Outputs by transformers' names, as attributes or keys; absent fields read as None.

    An integer index counts the present fields in transformers' order (``loss`` first when labels were
    given, then the logits or hidden states), so ``model(**batch)[0]`` means what it means there.
    """

    def __init__(self, fields: dict | None = None, **kwargs):
        fields = {**(fields or {}), **kwargs}
        ordered = {k: fields[k] for k in ORDER if fields.get(k) is not None}
        ordered.update({k: v for k, v in fields.items() if k not in ordered and v is not None})
        super().__init__(ordered)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def __getitem__(self, key):
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple:
        """The present fields as a tuple, in transformers' order (what ``return_dict=False`` returns)."""
        return tuple(self.values())
