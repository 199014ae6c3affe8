"""zhnlp.pipeline("text-generation") and `zhnlp generate`: a tiny random transformers Ernie4_5ForCausalLM saved with
an ERNIE 4.5-layout tokenizer (trained on the sentiment reviews). Greedy output equals transformers' own
text-generation pipeline on the same directory (plain prompts, lists, chats, return_full_text=False), the streamer
gets one call per token, and the command prints exactly the pipeline's new text."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import torch
import transformers

import zhnlp
from tests.tiny_decoder import hf_model
from zhnlp.cli import main
from zhnlp.errors import CheckpointError
from zhnlp.pipelines.streaming import TextStreamer
from zhnlp.tokenizers import train_ernie4_5_tokenizer

PROMPTS = ["这家酒店的服务", "北京是中国的", "我觉得这本书", "价格便宜，但是"]
CHAT = [{"role": "system", "content": "你是一个乐于助人的助手。"}, {"role": "user", "content": "推荐一家酒店"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from zhnlp.data.fetch import fetch

    root = tmp_path_factory.mktemp("textgen")
    reviews = [json.loads(line)["text"] for line in open(fetch("sentiment-reviews") / "train.jsonl",
                                                         encoding="utf-8")]
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(reviews[:4000]), encoding="utf-8")
    out = root / "model"
    tok = train_ernie4_5_tokenizer([corpus], out, vocab_size=2500, character_coverage=0.98, num_threads=1)
    hf = hf_model("tied", vocab_size=len(tok), max_position_embeddings=96, eos_token_id=2, pad_token_id=0,
                  bos_token_id=1)
    hf.generation_config.do_sample = False
    hf.save_pretrained(out)
    zhnlp.distributed.init()
    return out


@pytest.fixture(scope="module")
def ours(model_dir):
    return zhnlp.pipeline("text-generation", model_dir)


@pytest.fixture(scope="module")
def theirs(model_dir):
    return transformers.pipeline("text-generation", model=str(model_dir), tokenizer=str(model_dir))


def test_greedy_text_equals_transformers_pipeline(ours, theirs):
    for prompt in PROMPTS:
        expected = theirs(prompt, max_new_tokens=12)
        assert ours(prompt, max_new_tokens=12) == expected
        assert expected[0]["generated_text"].startswith(prompt) and len(expected[0]["generated_text"]) > len(prompt)
    assert ours(PROMPTS, max_new_tokens=8, return_full_text=False) == [
        theirs(p, max_new_tokens=8, return_full_text=False) for p in PROMPTS]


def test_generated_ids_equal_transformers_generate(ours, model_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = ours.tokenizer
    for prompt in PROMPTS[:2]:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        expected = hf.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:]
        text = tok.decode(expected, skip_special_tokens=True)
        assert ours(prompt, max_new_tokens=10, return_full_text=False) == [{"generated_text": text}]


def test_batched_prompts_equal_one_by_one(model_dir, ours):
    batched = zhnlp.pipeline("text-generation", model_dir, batch_size=4)
    assert batched(PROMPTS, max_new_tokens=8) == [ours(p, max_new_tokens=8) for p in PROMPTS]


def test_chat_appends_the_assistant_reply_as_transformers_does(ours, theirs):
    result = ours(CHAT, max_new_tokens=8)
    assert result == theirs(CHAT, max_new_tokens=8)
    messages = result[0]["generated_text"]
    assert messages[:2] == CHAT and messages[2]["role"] == "assistant" and set(messages[2]) == {"role", "content"}
    # a chat ending in an assistant message is continued (prefill), as in transformers
    prefill = CHAT + [{"role": "assistant", "content": "好的，"}]
    assert ours(prefill, max_new_tokens=6) == theirs(prefill, max_new_tokens=6)
    assert ours([CHAT, CHAT], max_new_tokens=4) == [theirs(CHAT, max_new_tokens=4)] * 2


class Recorder:
    def __init__(self):
        self.calls = []

    def put(self, ids):
        self.calls.append(ids.tolist())

    def end(self):
        self.calls.append("end")


def test_streamer_gets_the_prompt_then_one_call_per_token(ours):
    rec = Recorder()
    out = ours(PROMPTS[0], max_new_tokens=9, streamer=rec, return_full_text=False)[0]["generated_text"]
    prompt_ids = ours.tokenizer(PROMPTS[0])["input_ids"]
    assert rec.calls[0] == [prompt_ids] and rec.calls[-1] == "end"
    tokens = [c[0] for c in rec.calls[1:-1]]
    assert all(len(c) == 1 for c in rec.calls[1:-1]) and 1 <= len(tokens) <= 9
    assert ours.tokenizer.decode(tokens, skip_special_tokens=True) == out
    # zhnlp.TextStreamer writes the same text, piece by piece, as the tokens come
    buffer, pieces = io.StringIO(), []

    class Pieces(TextStreamer):
        def on_text(self, text, stream_end=False):
            pieces.append(text)
            super().on_text(text, stream_end)

    ours(PROMPTS[0], max_new_tokens=9, streamer=Pieces(ours.tokenizer, skip_prompt=True, stream=buffer))
    assert buffer.getvalue() == out + "\n"
    assert len([p for p in pieces if p]) >= min(3, len(out))  # incremental, not one write at the end
    assert zhnlp.TextStreamer is TextStreamer


def test_streamer_holds_a_character_until_its_bytes_are_complete(ours):
    tok = ours.tokenizer
    ids = tok("䶮好")["input_ids"]  # a rare character: byte-fallback pieces
    assert len(ids) >= 3
    buffer = io.StringIO()
    streamer = TextStreamer(tok, stream=buffer, end="")
    for i in ids:
        streamer.put(torch.tensor([i]))
        assert "\ufffd" not in buffer.getvalue()
    streamer.end()
    assert buffer.getvalue() == tok.decode(ids, skip_special_tokens=True)


def test_sampling_is_repeatable_with_a_seed(ours):
    options = dict(max_new_tokens=8, do_sample=True, temperature=0.9, top_k=50, top_p=0.9, repetition_penalty=1.2)
    torch.manual_seed(7)
    first = ours(PROMPTS[1], **options)
    torch.manual_seed(7)
    assert ours(PROMPTS[1], **options) == first


def test_generation_config_sets_the_defaults_as_in_transformers(model_dir, tmp_path, ours, capsys):
    import shutil

    copy = tmp_path / "sampling"
    shutil.copytree(model_dir, copy)
    # what ERNIE-4.5-0.3B-Base ships (frequency/presence penalties are not transformers options: ignored)
    (copy / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "top_p": 0.8, "temperature": 0.8, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}))
    sampling = zhnlp.pipeline("text-generation", copy)
    assert {k: sampling.options[k] for k in ("do_sample", "top_p", "temperature", "top_k")} == {
        "do_sample": True, "top_p": 0.8, "temperature": 0.8, "top_k": 50}
    greedy = zhnlp.pipeline("text-generation", copy, do_sample=False)  # the caller's choice wins
    assert greedy(PROMPTS[0], max_new_tokens=6) == ours(PROMPTS[0], max_new_tokens=6)
    assert main(["generate", "--model", str(copy), "--greedy", PROMPTS[0], "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out == ours(PROMPTS[0], max_new_tokens=6, return_full_text=False)[0][
        "generated_text"] + "\n"
    (copy / "generation_config.json").write_text("[1]")
    with pytest.raises(CheckpointError, match="generation_config.json holds a JSON list, not an object"):
        zhnlp.pipeline("text-generation", copy)


def test_pipeline_errors(ours, model_dir):
    with pytest.raises(ValueError, match="the prompt is empty"):
        ours("   ")
    with pytest.raises(ValueError, match=r"chat message 0 is .*'role' \(one of system, user, assistant\)"):
        ours([{"role": "robot", "content": "hi"}])
    with pytest.raises(ValueError, match=r"the prompt has \d+ tokens and max_new_tokens is 200, more than the "
                                         r"model's 96 positions"):
        ours(PROMPTS[0], max_new_tokens=200)
    with pytest.raises(TypeError, match="streamer must have put"):
        ours(PROMPTS[0], streamer=print)
    with pytest.raises(TypeError, match="unknown option"):
        ours(PROMPTS[0], num_beams=4)


def test_an_encoder_is_refused_by_name(tmp_path):
    from tests.unit.test_pipelines import _build

    _build(tmp_path / "bert", "mlm")
    with pytest.raises(CheckpointError, match=r"model_type 'bert' has no causal_lm head in zhnlp, so "
                                              r"AutoModelForCausalLM cannot load it; it needs a decoder"):
        zhnlp.pipeline("text-generation", tmp_path / "bert")


# ---------------------------------------------------------------------------------------------- command line
def test_generate_command_prints_the_pipelines_new_text(model_dir, ours):
    expected = ours(PROMPTS[1], max_new_tokens=10, return_full_text=False)[0]["generated_text"]
    run = subprocess.run([sys.executable, "-m", "zhnlp", "generate", "--model", str(model_dir), PROMPTS[1],
                          "--max-new-tokens", "10"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected + "\n"


def test_generate_command_streams_chat_and_reads_stdin(model_dir, ours, capsys, monkeypatch):
    pieces = []
    original = TextStreamer.on_text
    monkeypatch.setattr(TextStreamer, "on_text", lambda self, text, stream_end=False: (
        pieces.append(text), original(self, text, stream_end)))
    assert main(["generate", "--model", str(model_dir), "--chat", "--system", CHAT[0]["content"], CHAT[1]["content"],
                 "--max-new-tokens", "8"]) == 0
    reply = ours(CHAT, max_new_tokens=8)[0]["generated_text"][-1]["content"]
    assert capsys.readouterr().out == reply + "\n"
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == reply + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPTS[2]))
    assert main(["generate", "--model", str(model_dir), "-", "--max-new-tokens", "5", "--do-sample",
                 "--seed", "3", "--top-p", "0.8"]) == 0
    torch.manual_seed(3)
    sampled = ours(PROMPTS[2], max_new_tokens=5, do_sample=True, top_p=0.8, return_full_text=False)
    assert capsys.readouterr().out == sampled[0]["generated_text"] + "\n"


def test_generate_command_errors(model_dir, tmp_path, capsys):
    from tests.unit.test_pipelines import _build

    assert main(["generate", "--model", str(model_dir), " "]) == 2
    assert "zhnlp: error: the prompt is empty" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path / "missing"), "你好"]) == 2
    assert f"no such directory: {tmp_path / 'missing'}" in capsys.readouterr().err
    _build(tmp_path / "bert", "mlm")
    assert main(["generate", "--model", str(tmp_path / "bert"), "你好"]) == 2
    assert "has no causal_lm head in zhnlp" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dir), "--system", "x", "你好"]) == 2
    assert "--system is the system message of a chat; add --chat" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dir), "你好", "--top-p", "1.5"]) == 2
