"""Run under torchrun: load each prepared transformers checkpoint with zhnlp under the layout
given on the command line, compare every output with transformers' reference, save it back.

The parent test prepares ``CASES/<name>/{hf/, inputs.safetensors, reference.safetensors}``;
each rank writes ``CASES/<name>/result-<layout>-rank<r>.json`` with the largest differences.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import zhnlp

HEADS = {
    "base": zhnlp.AutoModel,
    "mlm": zhnlp.AutoModelForMaskedLM,
    "sequence_classification": zhnlp.AutoModelForSequenceClassification,
    "token_classification": zhnlp.AutoModelForTokenClassification,
    "question_answering": zhnlp.AutoModelForQuestionAnswering,
    "pretraining": zhnlp.AutoModelForPreTraining,
}
INPUTS = ("input_ids", "attention_mask", "token_type_ids", "task_type_ids")
TARGETS = ("labels", "start_positions", "end_positions")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", type=Path)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--vpp", type=int, default=None)
    ap.add_argument("--sp", action="store_true")
    ap.add_argument("--save", action="store_true", help="also save_pretrained each model")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lay = zhnlp.distributed.init(tp=args.tp, pp=args.pp, vpp=args.vpp)
    tag = f"tp{args.tp}pp{args.pp}" + (f"vpp{args.vpp}" if args.vpp else "") + ("sp" if args.sp else "")
    for case in sorted(p for p in args.cases.iterdir() if (p / "hf").is_dir()):
        meta = json.loads((case / "meta.json").read_text())
        inputs = load_file(str(case / "inputs.safetensors"))
        ref = load_file(str(case / "reference.safetensors"))
        model = HEADS[meta["head"]].from_pretrained(case / "hf", sequence_parallel=args.sp)
        given = {k: v for k, v in inputs.items() if k in INPUTS + TARGETS}
        with torch.no_grad():
            out = dict(model(**given))
            # every layer's output, complete on every rank; the outputs above come from the fast paths
            out.update({f"hidden_states.{i}": h for i, h in
                        enumerate(model(**given, output_hidden_states=True).hidden_states)})
        diffs = {k: (out[k].float() - v.float()).abs().max().item() for k, v in ref.items() if k in out}
        missing = sorted(set(ref) - set(out))
        if args.save:
            model.save_pretrained(case / f"saved-{tag}", max_shard_size="20KB")
        result = {"diffs": diffs, "missing": missing, "num_parameters": model.num_parameters()}
        if args.save and meta["head"] == "mlm":  # vocabulary rows move between TP ranks and stages
            model.resize_token_embeddings(270)
            model.save_pretrained(case / f"resized-{tag}")
        if args.sp:  # an odd sequence length cannot be split across the TP ranks: one clear error
            try:
                model(inputs["input_ids"][:, :-1])
            except ValueError as e:
                result["odd_length_error"] = str(e)
        (case / f"result-{tag}-rank{lay.rank}.json").write_text(json.dumps(result))
    zhnlp.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
