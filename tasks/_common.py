"""What every recipe script shares: ``python tasks/NAME.py --model DIR [--output DIR] [--set key=value ...]``.

A recipe is a function ``recipe(model, output) -> FinetuneConfig`` that fetches its data (the
first time) and fills in the settings that suit the dataset; ``--set`` overrides any field of
:class:`zhnlp.training.finetune.FinetuneConfig` (``--set epochs=1 --set tp=2``). Runs under
torchrun like ``zhnlp finetune``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing


def _value(field: dataclasses.Field, text: str):
    kind = str(field.type)
    if "bool" in kind:
        return text.lower() in ("1", "true", "yes")
    if "int" in kind and "float" not in kind:
        return int(text)
    if "float" in kind:
        return float(text)
    if "list" in kind:
        return [x for x in text.split(",") if x]
    return text


def main(recipe, description: str) -> int:
    from zhnlp.training.finetune import FinetuneConfig, finetune

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", required=True, help="pretrained model directory, name or hub id")
    ap.add_argument("--output", help="run directory (new or empty unless --overwrite)")
    ap.add_argument("--overwrite", action="store_true", help="replace an earlier run's results in --output")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a FinetuneConfig field, e.g. --set epochs=1")
    args = ap.parse_args()
    cfg = dataclasses.replace(recipe(args.model, args.output), overwrite=args.overwrite)
    fields = {f.name: f for f in dataclasses.fields(FinetuneConfig)}
    for item in args.set:
        key, _, text = item.partition("=")
        if key not in fields:
            ap.error(f"--set {item}: no setting {key!r}; settings: {', '.join(fields)}")
        cfg = dataclasses.replace(cfg, **{key: _value(fields[key], text)})
    from zhnlp.cli import user_error

    try:
        result = finetune(cfg)
    except Exception as e:  # the same one-line report as `zhnlp finetune`
        message = user_error(e)
        if message is None:
            raise
        print(f"zhnlp: error: {message}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(json.dumps({"dev": result["dev"], "test": result["test"], "output": cfg.output}, ensure_ascii=False))
    return 0
