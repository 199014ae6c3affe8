"""Chat (SFT) test data from real Chinese text: the sentiment reviews (zhnlp.data.fetch) as conversations that ask
for a review's sentiment (some with a system prompt, some with a second turn), and a tiny random ERNIE 4.5
checkpoint with an ERNIE 4.5-layout tokenizer trained on the same reviews."""

from __future__ import annotations

import json
from pathlib import Path

SYSTEM = "你是一个判断评论情感的助手。"


def reviews(n: int, offset: int = 0) -> list[dict]:
    from zhnlp.data.fetch import fetch

    rows = []
    with open(fetch("sentiment-reviews") / "train.jsonl", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= offset + n:
                break
            if i >= offset:
                rows.append(json.loads(line))
    return rows


def conversations(n: int, offset: int = 0, max_chars: int = 60) -> list[dict]:
    """``n`` conversations (``{"messages": [...]}``) over reviews ``offset ..``: every third has a system prompt,
    every fourth a second user/assistant turn."""
    out = []
    for i, row in enumerate(reviews(n, offset)):
        text = row["text"][:max_chars]
        verdict = "正面。" if int(row["label"]) == 1 else "负面。"
        messages = [{"role": "system", "content": SYSTEM}] if i % 3 == 0 else []
        messages += [{"role": "user", "content": f"这条评论的情感是正面还是负面？{text}"},
                     {"role": "assistant", "content": verdict}]
        if i % 4 == 1:
            messages += [{"role": "user", "content": "请用一句话说明理由。"},
                         {"role": "assistant", "content": f"评论写道：{text[:12]}"}]
        out.append({"messages": messages})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def chat_model(directory: Path, kind: str = "dense", seed: int = 0, vocab: int = 2500) -> Path:
    """A tiny random transformers ERNIE 4.5 checkpoint (``dense``: tied 4-layer Ernie4_5ForCausalLM; ``moe``: the
    shared-expert Ernie4_5_MoeForCausalLM) saved with an ERNIE 4.5 tokenizer trained on the reviews."""
    from tests.tiny_decoder import hf_model, hf_moe_model
    from zhnlp.tokenizers import train_ernie4_5_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(r["text"] for r in reviews(3000)) + "\n" + SYSTEM + "\n请用一句话说明理由。",
                      encoding="utf-8")
    tok = train_ernie4_5_tokenizer([corpus], directory, vocab_size=vocab, character_coverage=0.98, num_threads=1)
    corpus.unlink()
    extra = dict(vocab_size=len(tok), max_position_embeddings=256, eos_token_id=2, pad_token_id=0, bos_token_id=1)
    if kind == "moe":
        model = hf_moe_model("moe_shared", seed, **extra)
    else:
        model = hf_model("tied", seed, num_hidden_layers=4, **extra)
    model.save_pretrained(directory)
    return directory
