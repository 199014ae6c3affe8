"""The options of ``from_pretrained`` that are about where and how a model is loaded, not what it is:
dtype (``"auto"`` included), device / device_map, remote code. Each refusal is one line that says
what zhnlp does instead."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("zhnlp")

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)


class UnsupportedOptionError(ValueError):
    """A transformers ``from_pretrained`` option (or value) that zhnlp does not offer."""


def refuse_remote_code(trust_remote_code) -> None:
    if trust_remote_code:
        raise UnsupportedOptionError(
            "trust_remote_code=True: zhnlp never runs remote code; every model it loads is built from zhnlp's own "
            "families (see `zhnlp models`). Drop the argument.")


def pick_dtype(dtype, torch_dtype, config: dict, first_weight_dtype=None) -> torch.dtype:
    """The parameter dtype for ``from_pretrained``, as transformers 5 chooses it.

    ``dtype`` and its old name ``torch_dtype``: a torch dtype, its name (``"bfloat16"``, ``"bf16"``, ...) or
    ``"auto"`` (the default): config.json's ``dtype`` (or ``torch_dtype``), else the dtype of the first
    floating-point weight (``first_weight_dtype``, a callable), else float32.
    """
    if dtype is not None and torch_dtype is not None and _as_dtype(dtype, "dtype") != _as_dtype(torch_dtype,
                                                                                                "torch_dtype"):
        raise UnsupportedOptionError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; pass only dtype "
                                     "(torch_dtype is its old name).")
    chosen = dtype if dtype is not None else torch_dtype
    if chosen is None or chosen == "auto":
        stored = config.get("dtype") or config.get("torch_dtype")
        if isinstance(stored, str) and stored in DTYPES:
            return DTYPES[stored]
        found = first_weight_dtype() if first_weight_dtype is not None else None
        return found if found in SUPPORTED else torch.float32
    return _as_dtype(chosen, "dtype")


def _as_dtype(value, name: str):
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        if value.removeprefix("torch.") not in DTYPES:
            raise UnsupportedOptionError(f"{name}={value!r} is not supported; choose one of 'auto', "
                                         f"{', '.join(repr(k) for k in DTYPES)} or a torch dtype.")
        return DTYPES[value.removeprefix("torch.")]
    if value not in SUPPORTED:
        raise UnsupportedOptionError(f"{name}={value!r} is not supported; zhnlp models run in "
                                     "torch.float32, torch.bfloat16 or torch.float16.")
    return value


def pick_device(device, device_map) -> torch.device | None:
    """The one device ``device`` / ``device_map`` ask for (None: this rank's default device).

    zhnlp places a whole model, or this rank's part of it, on one device; a ``device_map`` that spreads
    modules over several devices is refused (tensor/pipeline parallelism is zhnlp's way to split a model).
    """
    wanted = [] if device is None else [_as_device(device, "device")]
    if device_map is not None:
        if isinstance(device_map, dict):
            targets = {str(_as_device(v, "device_map")) for v in device_map.values()}
            if len(targets) > 1:
                raise UnsupportedOptionError(
                    f"device_map places modules on several devices ({sorted(targets)}); zhnlp keeps a model (or "
                    "this rank's part of it) on one device and splits larger ones with tensor/pipeline "
                    "parallelism: run under torchrun with zhnlp.distributed.init(tp=..., pp=...).")
            wanted += [_as_device(v, "device_map") for v in device_map.values()][:1]
        elif device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
            pass  # one device per process: the default one
        else:
            wanted.append(_as_device(device_map, "device_map"))
    if len({str(d) for d in wanted}) > 1:
        raise UnsupportedOptionError(f"device={device!r} and device_map={device_map!r} disagree; pass one of them.")
    target = wanted[0] if wanted else None
    if target is None:
        return None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedOptionError(f"device {str(target)!r} asked for, but CUDA is not available on this "
                                     "machine; leave device out (or pass 'cpu') to run on the CPU.")
    if target.type == "cpu" and torch.cuda.is_available():
        raise UnsupportedOptionError(
            "device 'cpu' asked for on a machine with CUDA: megatron-core runs zhnlp models on the GPU there; "
            "hide the GPUs (CUDA_VISIBLE_DEVICES=) to run on the CPU.")
    if target.type not in ("cpu", "cuda"):
        raise UnsupportedOptionError(f"device {str(target)!r}: zhnlp runs on CUDA GPUs or the CPU.")
    return target


def _as_device(value, name: str) -> torch.device:
    if isinstance(value, bool):
        raise UnsupportedOptionError(f"{name}={value!r} is not a device; pass 'cpu', 'cuda', 'cuda:N' or N.")
    if isinstance(value, int):
        return torch.device("cpu") if value < 0 else torch.device("cuda", value)
    try:
        return torch.device(value)
    except (RuntimeError, TypeError):
        raise UnsupportedOptionError(f"{name}={value!r} is not a device; pass 'cpu', 'cuda', 'cuda:N' or N.") from None


def place(target: torch.device | None) -> None:
    """Make ``target`` this process's device before the model is built (a world of one on a GPU may
    choose its GPU); under ``zhnlp.distributed.init`` each rank's device is fixed, and another is refused."""
    if target is None:
        return
    from zhnlp import distributed
    from zhnlp.distributed import runtime

    if target.type == "cuda" and target.index is not None and not runtime.is_initialized():
        torch.cuda.set_device(target.index)
    current = distributed.device()
    if target.type != current.type or (target.index is not None and target.index != current.index):
        raise UnsupportedOptionError(
            f"device {str(target)!r} asked for, but this rank computes on {current} (one device per rank, chosen "
            "by zhnlp.distributed.init from LOCAL_RANK); leave device out.")
