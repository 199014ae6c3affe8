"""Compiled mode: ``torch.compile`` of the transformer layers (``zhnlp pretrain/finetune --compile``,
``from_pretrained(..., compile=True)``).

What is compiled: every megatron ``TransformerLayer`` of this rank's model chunks, one layer at a time, with
``nn.Module.compile`` (the module stays where it is: parameter names, state dicts, checkpoints, DDP's gradient
hooks and the optimizer see the same parameters). Inductor fuses what lies between the matrix products: the
norms (LayerNorm, RMSNorm), the activation, bias + dropout + residual adds, RoPE, the attention's reshapes. Layers
of one shape share one compiled graph (parameters are inputs of the graph), so a 24-layer model compiles about as
fast as a 1-layer one; a layer that differs (the last layer of a [CLS]-only head, which computes position 0 only)
compiles its own, and so do training and inference (grad mode is part of the key). On a CPU the linears inside the
compiled layers run as one oneDNN op each, forward and backward (:mod:`zhnlp.models.common.onednn`), which on this
machine's AVX-512 cores is ~2.5x MKL's GEMM; most of the speed-up comes from there.

What runs outside the compiled graphs (compiled around, not broken inside):

* the embeddings, the heads and losses, the pipeline schedule, DDP's gradient buckets and the optimizer (they are
  not layers);
* in mixture-of-experts layers, the MoE block itself (router, token dispatcher, experts: how many tokens reach
  each expert is data, and the dispatcher moves split sizes to the host); the layer's norms, attention and shared
  experts are compiled one by one instead of the whole layer;
* the encoders' attention when it cannot be traced: packed rows (padding dropped for [CLS]-only heads on one
  rank: a loop over data-dependent row lengths) and attention dropout drawn from megatron's model-parallel RNG
  stream (its tracker swaps generator states). Both run as one opaque op with its own backward
  (:func:`zhnlp.models.common.layers.opaque_sdpa`), so the layer still compiles without a graph break; a break
  there would fall inside megatron's activation-offloading context, where dynamo cannot resume.

Tensor-parallel collectives (megatron's copy / all-reduce / all-gather / reduce-scatter autograd functions, also
under sequence parallelism) trace into the graph as functional collectives: no graph break at TP > 1.

Shapes: ``dynamic=None`` (torch's default). The first sequence length compiles a static graph; a second length
recompiles once, with the sequence (and packed token) dimension symbolic, and that graph serves every later
length. All layers of all models in a process share one cache of compiled versions per layer class, whose limit
:func:`compile_layers` raises to :data:`RECOMPILE_LIMIT` (torch's default, 8, is reached by one encoder trained
and evaluated on padded and full batches). Dropout masks inside the graph come from inductor's generator (seeded from torch's, so every TP rank draws
the same hidden-dropout mask): compiled and eager runs give equal losses only without dropout (the debug recipes).

Not with ``--fsdp`` (refused: FSDP2's per-layer hooks would be traced into the graph), and not during
``generate()`` (generation runs its layers eagerly: its KV cache is mutated state that changes length every step).
"""

from __future__ import annotations

import importlib.util
import shutil

import torch
import torch._dynamo

from zhnlp.errors import ZhnlpError


RECOMPILE_LIMIT = 64  # compiled versions kept per layer code object (see compile_layers)


class CompileUnavailableError(ZhnlpError):
    """``compile=True`` / ``--compile`` where torch.compile cannot work."""


def check_available(device: torch.device) -> None:
    """Fail with one message where inductor cannot compile: on a CPU it needs a C++ compiler; on a GPU, Triton."""
    if device.type == "cpu":
        from torch._inductor import config

        cxx = config.cpp.cxx[-1] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
        if not any(shutil.which(c) for c in (cxx, "g++", "clang++") if c):
            raise CompileUnavailableError(
                "compile=True needs a C++ compiler on a CPU (torch inductor builds its kernels with it), and none was "
                "found (g++, clang++ or $CXX); install one (e.g. apt-get install g++) or drop --compile/compile=True.")
    elif device.type == "cuda" and importlib.util.find_spec("triton") is None:
        raise CompileUnavailableError("compile=True on a GPU needs Triton (pip install triton, the version of your "
                                      "torch), or drop --compile/compile=True.")


def compile_layers(model) -> int:
    """Compile the transformer layers of ``model`` (a :class:`PretrainedModel`) in place; returns how many modules
    were compiled. Mixture-of-experts layers are compiled around their MoE block (see the module docstring)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_layer import TransformerLayer

    check_available(model.device)
    # one layer's forward is one code object for every layer and model of the process; its variants (training and
    # inference, [CLS]-only or not, packed or padded, static then dynamic lengths) exceed torch's default of 8
    # compiled versions, past which it would run the layer eagerly: raised process-wide (never lowered)
    dynamo_config = torch._dynamo.config
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    count = 0
    for chunk in model.chunks:
        for layer in [m for m in chunk.modules() if isinstance(m, TransformerLayer)]:
            if isinstance(getattr(layer, "mlp", None), MoELayer):
                parts = [m for name, m in layer.named_children() if name != "mlp" and _has_compute(m)]
                shared = getattr(layer.mlp, "shared_experts", None)
                parts += [shared] if shared is not None else []
            else:
                parts = [layer]
            for part in parts:
                part.compile()
                count += 1
    model.compiled = True
    return count


def _has_compute(module: torch.nn.Module) -> bool:
    """A submodule worth a graph (megatron fills unused slots with IdentityOp / IdentityFuncOp)."""
    return any(True for _ in module.parameters())
