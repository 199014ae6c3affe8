"""Run under torchrun (2 processes): layouts that cannot work fail on every rank with one message,
and a layout that fits gives transformers' outputs. Each rank writes ``OUT/rank<r>.json``."""

import json
import sys
from pathlib import Path

import torch

import zhnlp
from zhnlp.errors import LayoutError


def main() -> int:
    ckpt_heads3, ckpt_ok, out = map(Path, sys.argv[1:4])
    torch.set_num_threads(1)
    report = {}
    try:
        zhnlp.distributed.init(tp=4)
    except LayoutError as e:
        report["world"] = str(e)
    lay = zhnlp.distributed.init(tp=2)
    try:
        zhnlp.AutoModel.from_pretrained(ckpt_heads3)
    except LayoutError as e:
        report["heads"] = str(e)
    ids = torch.arange(1, 25).reshape(2, 12)
    with torch.no_grad():
        report["hidden"] = zhnlp.AutoModel.from_pretrained(ckpt_ok)(ids).last_hidden_state.sum().item()
    report["layout"] = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "world": lay.world_size}
    # a fresh model is initialised identically whatever the layout
    fresh = json.loads((ckpt_ok / "config.json").read_text())
    zhnlp.AutoModelForMaskedLM.from_config(fresh).save_pretrained(out / "fresh-tp2")
    (out / f"rank{lay.rank}.json").write_text(json.dumps(report))
    zhnlp.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
