"""Where and in what precision a pipeline runs: ``device=`` and ``dtype=`` as transformers' ``pipeline`` takes them.

``device``: ``None`` (leave the model where ``from_pretrained`` put it: the GPU when there is one, else the CPU),
a string (``"cpu"``, ``"cuda"``, ``"cuda:1"``), a :class:`torch.device`, or an int (``-1`` the CPU, ``k >= 0``
CUDA device ``k``). A CUDA device on a machine (or torch build) without one is one clear ValueError, never a
silent fallback to the CPU.

``dtype``: ``None`` or ``"auto"`` (``from_pretrained``'s default, as in transformers 5: the dtype config.json
records, else the weights' own), a string (``"float32"``/``"fp32"``, ``"bfloat16"``/``"bf16"``,
``"float16"``/``"fp16"``) or a :class:`torch.dtype`.

A model object stays where it is: zhnlp runs a model on its rank's device (megatron-core keeps one device per
process), so ``device=`` must name the device the object is on (load it with ``from_pretrained(...,
device=...)``), and ``dtype=`` its parameters' dtype.
"""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device) -> torch.device | None:
    """``device`` as a :class:`torch.device` (None stays None); refuses CUDA devices this machine lacks."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"device must be a string, a torch.device or an int, got {device!r}.")
    if isinstance(device, int):
        if device < -1:
            raise ValueError(f"device={device}: use -1 for the CPU or a CUDA device index >= 0.")
        device = torch.device("cpu") if device == -1 else torch.device("cuda", device)
    elif isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"device={device!r} is not a device torch knows; pass 'cpu', 'cuda', 'cuda:0' or an "
                             f"int (-1 for the CPU).") from None
    elif not isinstance(device, torch.device):
        raise TypeError(f"device must be a string, a torch.device or an int, got {type(device).__name__}.")
    if device.type == "cuda":
        # outside zhnlp's megatron scopes torch.cuda reports the truth (zhnlp.distributed.cpu patches it only inside)
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} was asked but torch sees no CUDA device here "
                             f"(torch.cuda.is_available() is False, torch {torch.__version__}); pass device='cpu' "
                             f"(or -1), or run on a machine with a GPU and a CUDA build of torch.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ValueError(f"device={str(device)!r} was asked but this machine has {count} CUDA device(s) "
                             f"(indices 0..{count - 1}).")
    return device


def resolve_dtype(dtype) -> torch.dtype | str | None:
    """``dtype`` as a :class:`torch.dtype`, or ``"auto"``/None as they are (for ``from_pretrained``)."""
    if dtype is None or dtype == "auto":
        return dtype
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; use torch.float32, torch.bfloat16 or torch.float16.")
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a string or a torch.dtype, got {type(dtype).__name__}.")
    name = dtype.removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; choose one of {sorted(DTYPES)} or 'auto' (the "
                         f"checkpoint's own dtype).")
    return DTYPES[name]


def same_device(actual: torch.device, wanted: torch.device) -> bool:
    """True when ``actual`` is ``wanted`` (``"cuda"`` without an index matches any CUDA device)."""
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index
                                           or actual.type == "cpu")


def parameters_device(model) -> torch.device:
    """The device of a model's parameters (the CPU for a model without parameters)."""
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def parameters_dtype(model) -> torch.dtype:
    """The dtype of a model's floating-point parameters (float32 for a model without any)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
