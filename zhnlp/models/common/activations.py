"""Activation functions by transformers' ``hidden_act`` names."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


# transformers' ``hidden_act`` names -> functions with the same numerics
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_python": F.gelu,
    "relu": F.relu,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "quick_gelu": _quick_gelu,
    "silu": F.silu,
    "swish": F.silu,
    "mish": F.mish,
    "tanh": torch.tanh,
}


_IN_PLACE = {"gelu": torch.ops.aten.gelu_, "gelu_python": torch.ops.aten.gelu_, "relu": torch.relu_}


def ffn_activation(name: str):
    """The activation for the FFN's intermediate, which is always a fresh tensor: when autograd
    does not need it (inference), it is overwritten in place, saving one pass over the
    largest activation of the layer."""
    fn = ACTIVATIONS[name]
    in_place = _IN_PLACE.get(name)
    if in_place is None:
        return fn

    def activation(x):
        return in_place(x) if not x.requires_grad else fn(x)

    activation.__name__ = f"{name}_in_place_at_inference"
    return activation
