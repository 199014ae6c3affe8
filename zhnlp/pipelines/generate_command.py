"""``zhnlp generate --model DIR "prompt"``: text from a decoder model, written to stdout as the tokens come.

    zhnlp generate --model ./ernie-4.5-0.3b "北京是中国的" --max-new-tokens 32
    zhnlp generate --model ./ernie-4.5-0.3b --chat --system "你是一个乐于助人的助手。" "介绍一下长城"
    echo "续写：春眠不觉晓" | zhnlp generate --model DIR - --do-sample --top-p 0.8 --temperature 0.8 --seed 7

Only the generated text is written (not the prompt), followed by a newline; it equals the text-generation
pipeline's ``generated_text`` with ``return_full_text=False``. ``--chat`` renders the prompt as one user
message (after ``--system``, if given) with the tokenizer's chat template, as the pipeline does for a chat.
Flags left out keep the model's ``generation_config.json`` (ERNIE-4.5-0.3B-Base's asks for sampling with top-p
0.8 and temperature 0.8), else greedy decoding; ``--greedy`` forces greedy. This module
imports nothing heavy until the command runs.
"""

from __future__ import annotations

import argparse
import sys

from zhnlp.argtypes import integer, number


def _run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise ValueError("the prompt is empty; give the text to continue (or `-` to read it from stdin).")
    if args.system is not None and not args.chat:
        raise ValueError("--system is the system message of a chat; add --chat (or put the text in the prompt).")
    import torch

    import zhnlp
    from zhnlp.pipelines.streaming import TextStreamer

    generator = zhnlp.pipeline("text-generation", args.model, dtype=args.dtype, device=args.device)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    inputs = prompt
    if args.chat:
        inputs = ([{"role": "system", "content": args.system}] if args.system is not None else []) + [
            {"role": "user", "content": prompt}]
    streamer = TextStreamer(generator.tokenizer, skip_prompt=True)
    # flags left out keep the pipeline's defaults (the model's generation_config.json, else transformers')
    given = {key: value for key, value in (("max_new_tokens", args.max_new_tokens), ("temperature", args.temperature),
                                           ("top_k", args.top_k), ("top_p", args.top_p),
                                           ("repetition_penalty", args.repetition_penalty)) if value is not None}
    if args.do_sample or args.greedy:
        given["do_sample"] = args.do_sample
    generator(inputs, streamer=streamer, return_full_text=False, **given)
    return 0


def add_cli(subparsers) -> None:
    """Register ``generate`` on ``subparsers``."""
    p = subparsers.add_parser("generate", help="generate text with a decoder model (ERNIE 4.5), streamed as it comes",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("prompt", help="the text to continue (with --chat: the user's message); - reads stdin")
    p.add_argument("--model", required=True, help="a model directory (save_pretrained / transformers format), a "
                                                  "model name from `zhnlp models` or a hub repo id")
    p.add_argument("--max-new-tokens", type=integer(0), default=None,
                   help="most tokens to generate (default: the model's generation_config.json, else 256)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    mode.add_argument("--greedy", action="store_true",
                      help="greedy decoding even where the model's generation_config.json asks for sampling")
    p.add_argument("--temperature", type=number(0, None, low_open=True), default=None,
                   help="sampling temperature (default 1.0)")
    p.add_argument("--top-k", type=integer(0), default=None, help="sample among the k most probable tokens "
                                                                   "(default 50, 0: off)")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=None, help="nucleus sampling mass")
    p.add_argument("--repetition-penalty", type=number(0, None, low_open=True), default=None,
                   help="penalise tokens already present (default 1.0: none)")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (prompt = user message)")
    p.add_argument("--system", default=None, help="system message for --chat")
    p.add_argument("--seed", type=integer(0), default=None, help="seed torch's generator (repeatable sampling)")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                   help="parameter dtype (default: the checkpoint's)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: this machine's device)")
    p.set_defaults(func=_run)
