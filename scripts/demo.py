"""A short tour of zhnlp (the `make demo` job until the pretraining issue replaces it).

1. List the model zoo.
2. Write a checkpoint with transformers (the ernie-3.0-nano-zh architecture with random
   weights: the hub is not reachable here, so no released weights).
3. Load it with zhnlp in this process (TP=1) and run masked-LM on Chinese sentences.
4. Load it again under tensor parallelism, TP=2 in two processes (torchrun, gloo on CPU).
5. Show that transformers, zhnlp TP=1 and zhnlp TP=2 agree, and that save_pretrained
   round-trips through transformers bit-exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SENTENCES = ["百度提出了知识增强的语义表示模型ERNIE。", "今天天气很好，我们去公园散步吧！"]


def char_vocab(path: Path) -> None:
    """A tiny character vocabulary for the demo sentences (the real tokenizers come with issue 3)."""
    chars = sorted({c for s in SENTENCES for c in s.lower()})
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars]) + "\n", encoding="utf-8")


def encode(workdir: Path):
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast(vocab_file=str(workdir / "vocab.txt"), do_lower_case=True)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    ids = enc["input_ids"].clone()
    ids[:, 3] = tok.mask_token_id  # mask the third character of each sentence
    return tok, ids, enc["attention_mask"], enc["token_type_ids"]


def worker(workdir: Path) -> None:
    """Run under torchrun: load under TP=2 and write the logits (rank 0)."""
    import transformers

    import zhnlp

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    layout = zhnlp.distributed.init(tp=2)
    _, ids, mask, types = encode(workdir)
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(workdir / "hf")
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, token_type_ids=types).logits
    model.save_pretrained(workdir / "saved-tp2")
    if layout.rank == 0:
        from safetensors.torch import save_file

        save_file({"logits": logits.contiguous()}, str(workdir / "logits-tp2.safetensors"))
    zhnlp.distributed.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0

    import transformers
    from safetensors.torch import load_file

    import zhnlp

    transformers.utils.logging.disable_progress_bar()

    print("== zhnlp model zoo ==")
    from zhnlp.cli import main as cli

    cli(["models"])

    workdir = Path(tempfile.mkdtemp(prefix="zhnlp-demo-"))
    char_vocab(workdir / "vocab.txt")
    card = next(c for c in zhnlp.list_models() if c.name == "ernie-3.0-nano-zh")
    config = dict(card.config)
    config.pop("model_type")
    print(f"\n== transformers writes a checkpoint with the {card.name} architecture "
          f"({config['num_hidden_layers']} layers, hidden {config['hidden_size']}, random weights) ==")
    torch.manual_seed(0)
    hf = transformers.ErnieForMaskedLM(transformers.ErnieConfig(**config)).eval()
    hf.save_pretrained(workdir / "hf")
    tok, ids, mask, types = encode(workdir)

    t = time.perf_counter()
    model = zhnlp.AutoModelForMaskedLM.from_pretrained(workdir / "hf")
    print(f"zhnlp loaded it at TP=1 in {time.perf_counter() - t:.2f}s")
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types).logits
        tp1 = model(ids, attention_mask=mask, token_type_ids=types).logits

    print("\n== the same checkpoint under tensor parallelism: torchrun --nproc-per-node 2, TP=2 ==")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={port}", __file__, "--worker", str(workdir)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-6000:], file=sys.stderr)
        return 1
    print(f"two processes loaded, ran and saved it in {time.perf_counter() - t:.1f}s")
    tp2 = load_file(str(workdir / "logits-tp2.safetensors"))["logits"]

    masked = ids == tok.mask_token_id
    print("\n== agreement on the masked positions ==")
    rows = [("transformers", ref), ("zhnlp TP=1", tp1), ("zhnlp TP=2", tp2)]
    for name, logits in rows:
        top = logits[masked].argmax(-1).tolist()
        print(f"  {name:<13} top-1 ids at [MASK]: {top}")
    d1 = (tp1 - ref).abs().max().item()
    d2 = (tp2 - ref).abs().max().item()
    print(f"  max |logits - transformers|: TP=1 {d1:.2e}, TP=2 {d2:.2e} (over {ref.numel():,} logits)")

    back = transformers.ErnieForMaskedLM.from_pretrained(workdir / "saved-tp2").state_dict()
    exact = all(torch.equal(v, back[k]) for k, v in hf.state_dict().items())
    print(f"  save_pretrained at TP=2 -> transformers.from_pretrained: bit-exact = {exact}")
    ok = d1 <= 1e-5 and d2 <= 1e-5 and exact
    print("\nOK: transformers, zhnlp TP=1 and zhnlp TP=2 agree." if ok else "\nMISMATCH", flush=True)
    print(json.dumps({"max_diff_tp1": d1, "max_diff_tp2": d2, "round_trip_exact": exact, "workdir": str(workdir)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
