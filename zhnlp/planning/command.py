"""``zhnlp plan``: the best parallel layouts of a recipe on a cluster, or the cost of one layout.

    zhnlp plan --recipe ernie4.5-21b-a3b --gpus 64 --gpu h100            # search
    zhnlp plan --recipe ernie4.5-0.3b --world-size 8 --tp 2 --pp 2 --json  # one layout (pretrain's flags)
"""

from __future__ import annotations

import argparse
import json
import re

from zhnlp.errors import ZhnlpError

LAYOUT_FLAGS = ("tp", "pp", "vpp", "ep", "etp", "sequence_parallel", "recompute", "distributed_optimizer", "fsdp",
                "micro_batch_size", "optimizer_offload")
GiB = 2 ** 30


def memory_size(text: str) -> int:
    """``80GB``, ``80GiB``, ``141G``, ``8e10`` -> bytes (GB = 10^9 as GPU datasheets count, GiB = 2^30)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*(gib|gb|g|mib|mb|m|tib|tb|t|b)?\s*", str(text).lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size (e.g. 80GB, 80GiB, 141G)")
    scale = {None: 1, "b": 1, "gb": 10 ** 9, "g": 10 ** 9, "gib": 2 ** 30, "mb": 10 ** 6, "m": 10 ** 6,
             "mib": 2 ** 20, "tb": 10 ** 12, "t": 10 ** 12, "tib": 2 ** 40}[m.group(2)]
    return int(float(m.group(1)) * scale)


def add_cli(subparsers) -> None:
    from zhnlp.argtypes import positive
    from zhnlp.planning.timing import PRESETS
    from zhnlp.training.command import run_config_parser

    p = run_config_parser(
        subparsers, "plan",
        help="choose the parallel layout of a recipe for a number of GPUs (predicted memory and step time)",
        description="Search the layouts (TP, PP, VPP, EP, sequence parallelism, recompute, distributed optimizer, "
                    "micro-batch) of --recipe on --gpus devices and print the fastest that fit, with the memory per "
                    "device and the step time broken down, and why others were not chosen. Given `zhnlp "
                    "pretrain`'s layout flags (--tp, --pp, ... with --world-size) it evaluates that one layout "
                    "instead. The models are checked on CPU (see the README's 'Automatic layout').",
        recipe_help="the model and batch to plan for (default: the recipe named in --config, else ernie-debug)")
    p.add_argument("--gpus", type=positive, default=argparse.SUPPRESS, help="devices to plan for")
    p.add_argument("--world-size", type=positive, default=argparse.SUPPRESS,
                   help="devices of the one layout given by the layout flags (same as --gpus)")
    p.add_argument("--gpus-per-node", type=positive, default=argparse.SUPPRESS,
                   help="devices per node (default: the --gpu preset's, 8)")
    p.add_argument("--gpu", default="h100", metavar="NAME",
                   help=f"device and interconnect preset: {', '.join(PRESETS)} (default h100)")
    p.add_argument("--gpu-memory", type=memory_size, default=argparse.SUPPRESS, metavar="SIZE",
                   help="memory per device, e.g. 80GB (default: the preset's)")
    p.add_argument("--hardware-file", default=argparse.SUPPRESS, metavar="FILE",
                   help="constants written by `zhnlp plan --calibrate` (instead of --gpu's preset)")
    p.add_argument("--top", type=positive, default=5, help="layouts to show (default 5)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--calibrate", metavar="FILE", default=argparse.SUPPRESS,
                   help="run a few short layouts of --recipe on this machine (torchrun, --gpus-per-node "
                        "processes), fit the time model's constants and write them to FILE for --hardware-file")
    p.set_defaults(func=_run)


def _hardware(args):
    from zhnlp.planning import timing

    path = getattr(args, "hardware_file", None)
    if path:
        from zhnlp.planning.calibrate import load_hardware

        return load_hardware(path)
    return timing.hardware(args.gpu)


def _run(args) -> int:
    from zhnlp.planning import Layout, search
    from zhnlp.training.command import resolve, run_flags
    cfg = resolve(args)
    hw = _hardware(args)
    if getattr(args, "calibrate", None):
        from zhnlp.planning.calibrate import calibrate_here

        return calibrate_here(cfg, hw, args.calibrate, nproc=getattr(args, "gpus_per_node", None))
    flags = run_flags(args)
    world = getattr(args, "world_size", None) or getattr(args, "gpus", None)
    per_node = getattr(args, "gpus_per_node", None) or hw.gpus_per_node
    memory = getattr(args, "gpu_memory", None) or hw.memory_bytes
    if world is None:
        raise ZhnlpError("say how many devices to plan for: --gpus N (or --world-size N with layout flags).")
    if "precision" not in flags and hw.name != "cpu":
        cfg.precision = "bf16"  # what these models train in on accelerators (the recipes' fp32 is for CPUs)
    arch, d = cfg.architecture(), cfg.data
    if any(k in flags for k in LAYOUT_FLAGS):
        offload, cfg.optimizer.optimizer_offload = cfg.optimizer.optimizer_offload, None
        cfg.check(world)  # one message naming every problem of the layout (planning for GPUs from any machine)
        if offload is not None and not cfg.optimizer.distributed_optimizer:
            raise ZhnlpError("--optimizer-offload needs --distributed-optimizer (megatron-core offloads the "
                             "distributed optimizer's shards).")
        cfg.optimizer.optimizer_offload = offload
        cand = search.evaluate(arch, Layout.from_run(cfg, world), micro_batch=d.micro_batch_size,
                               global_batch=d.global_batch_size, seq_length=d.seq_length,
                               hardware=_with_node(hw, per_node), gpu_memory=memory, mask_prob=d.mask_prob)
        result = {"recipe": cfg.recipe, "gpus": world, "hardware": hw.name, "gpu_memory_bytes": memory,
                  "usable_bytes": search.usable_memory(memory), "searched": 1, "fitting": int(cand.fits),
                  "best": [cand] if cand.fits else [], "rejected": [] if cand.fits else [cand]}
    else:
        result = search.plan(arch, world, global_batch=d.global_batch_size, seq_length=d.seq_length,
                             hardware=_with_node(hw, per_node), gpus_per_node=per_node, gpu_memory=memory,
                             precision=cfg.precision, top=args.top, mask_prob=d.mask_prob)
        result["recipe"] = cfg.recipe
    if args.json:
        out = {**result, "best": [c.to_dict() for c in result["best"]],
               "rejected": [c.to_dict() for c in result["rejected"]]}
        print(json.dumps(out, indent=1))
    else:
        print(render(cfg, result))
    return 0 if result["best"] else 1


def _with_node(hw, per_node: int):
    import dataclasses

    return dataclasses.replace(hw, gpus_per_node=per_node)


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def render(cfg, result: dict) -> str:
    """The human-readable report of :func:`zhnlp.planning.search.plan` (or of one layout)."""
    d = cfg.data
    lines = [f"{cfg.recipe} on {result['gpus']} x {result['hardware']} ({_gib(result['gpu_memory_bytes'])} GiB, "
             f"{_gib(result['usable_bytes'])} GiB usable after the reserve), global batch {d.global_batch_size} x "
             f"{d.seq_length} tokens, {cfg.precision}:",
             f"{result['searched']} layouts considered, {result['fitting']} fit."]
    for i, cand in enumerate(result["best"], 1):
        m, t = cand.memory, cand.time
        lines.append(f"\n#{i}  {cand.flags()}")
        lines.append(f"    memory/device {_gib(m['total'])} GiB = weights {_gib(m['weights'])} + gradients "
                     f"{_gib(m['gradients'])} + optimizer {_gib(m['optimizer_states'])} + activations "
                     f"{_gib(m['activations'])} + logits/loss {_gib(m['head'])} + transient {_gib(m['transient'])} "
                     f"(peak: {m['phase']})")
        parts = " + ".join(f"{k} {t[k]:.3g}" for k in ("compute", "overhead", "tp", "pp", "dp", "ep", "bubble",
                                                         "optimizer") if t.get(k))
        lines.append(f"    step {t['total']:.3g} s = {parts}; {t['tokens_per_s']:,.0f} tokens/s, MFU "
                     f"{100 * t['mfu']:.1f}%")
    if result["rejected"]:
        lines.append("\nNot chosen:")
        for cand in result["rejected"]:
            lines.append(f"  {cand.flags()}: {cand.reason}")
    if result.get("needs"):
        lines.append("\n" + result["needs"])
    return "\n".join(lines)
