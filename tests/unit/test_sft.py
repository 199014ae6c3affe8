"""Supervised fine-tuning on conversations (``zhnlp finetune sft``), on one process: conversations built from the
sentiment reviews, a tiny random transformers ERNIE 4.5 checkpoint with an ERNIE 4.5-layout tokenizer.

* encoding: the ids are transformers' ``apply_chat_template(messages, tokenize=True)``; the targets are exactly
  the tokens of the assistant replies and their end-of-turn token, found independently of the code's method;
* packing: the loss of a packed batch equals transformers' losses of each conversation alone, weighted by their
  target counts;
* training: the loss falls, the dev loss in metrics.json is transformers' loss of the saved model over the dev
  targets; the command line works with --packing; errors for bad data and wrong settings name the problem."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

import zhnlp
from tests.chat_data import SYSTEM, chat_model, conversations, write_jsonl
from zhnlp.data.tasks.sft import (collate_packed, encode_conversation, encode_sft, pack_conversations, read_sft,
                                  sft_from_rows)
from zhnlp.errors import DataError, ZhnlpError

END = "<|end_of_sentence|>"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return chat_model(tmp_path_factory.mktemp("sft") / "model")


@pytest.fixture(scope="module")
def tok(model_dir):
    return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    return {"train": write_jsonl(root / "train.jsonl", conversations(96)),
            "dev": write_jsonl(root / "dev.jsonl", conversations(24, offset=2000))}


def _expected_targets(text: str, messages: list[dict], offsets) -> list[bool]:
    """Target flags from where each reply occurs in the rendered text (searched, in order)."""
    spans, at = [], 0
    for m in messages:
        if m["role"] == "assistant":
            start = text.index("Assistant: " + m["content"] + END, at) + len("Assistant: ")
            at = start + len(m["content"]) + len(END)
            spans.append((start, at))
    return [b > a and any(s <= a < e for s, e in spans) for a, b in offsets]


def test_ids_are_the_chat_template_and_targets_only_the_replies(tok):
    for conv in conversations(40):
        messages = conv["messages"]
        f = encode_conversation(tok, messages)
        expected_ids = tok.apply_chat_template(messages, tokenize=True)
        expected_ids = expected_ids["input_ids"] if hasattr(expected_ids, "keys") else expected_ids
        assert f["input_ids"] == list(expected_ids)
        text = tok.apply_chat_template(messages, tokenize=False)
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        flags = _expected_targets(text, messages, offsets)
        assert [t != -100 for t in f["labels"]] == flags
        assert [t for t, keep in zip(f["labels"], flags) if keep] == [i for i, k in zip(f["input_ids"], flags) if k]
        # every reply ends with the end-of-turn token, which is a target (the model learns to stop)
        end_id = tok.convert_tokens_to_ids(END)
        replies = sum(m["role"] == "assistant" for m in messages)
        assert sum(1 for t in f["labels"] if t == end_id) == replies
        assert f["labels"][0] == -100 and not f["truncated"]
        # the system prompt and the user turns are never targets
        decoded = tok.decode([t for t in f["labels"] if t != -100])
        assert SYSTEM not in decoded and "正面还是负面" not in decoded


def test_truncation_and_conversations_without_a_target_left(tok, caplog):
    long = {"messages": [{"role": "user", "content": "很好" * 300}, {"role": "assistant", "content": "正面。"}]}
    rows = sft_from_rows([long] + conversations(3, max_chars=16), "rows")
    with caplog.at_level("WARNING", logger="zhnlp"):
        features = encode_sft(tok, rows, 64, "rows")
    assert len(features) == 3 and all(len(f["input_ids"]) <= 64 for f in features)
    assert "no assistant token within --max-length 64" in caplog.text and "row 0" in caplog.text
    with pytest.raises(DataError, match="no conversation keeps an assistant token within --max-length 16"):
        encode_sft(tok, rows[:1], 16, "rows")


@pytest.fixture(scope="module")
def world_of_one():
    zhnlp.distributed.init()
    yield
    zhnlp.distributed.shutdown()


def test_packed_loss_equals_each_conversation_alone(tok, model_dir, world_of_one):
    features = encode_sft(tok, sft_from_rows(conversations(12), "rows"), 128, "rows")
    packs = pack_conversations(features, 128, seed=3)
    assert sorted(len(p["input_ids"]) for p in packs) and all(len(p["input_ids"]) <= 128 for p in packs)
    assert sum(len(p["input_ids"]) for p in packs) == sum(len(f["input_ids"]) for f in features)
    assert len(packs) < len(features)  # something was packed together
    batch = collate_packed(packs, 128, tok.pad_token_id)
    chunk = zhnlp.AutoModelForCausalLM.from_pretrained(model_dir).chunks[0]
    with torch.no_grad(), zhnlp.distributed.cpu.scope():
        ours = chunk(batch["input_ids"], labels=batch["labels"], document_ids=batch["document_ids"],
                     position_ids=batch["position_ids"])["loss"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for f in features:
            labels = torch.tensor([f["labels"]])
            n = int((labels[:, 1:] != -100).sum())
            total += float(hf(torch.tensor([f["input_ids"]]), labels=labels).loss) * n
            count += n
    assert float(ours) == pytest.approx(total / count, abs=1e-5)


def _hf_dev_loss(model_dir, tok, dev_path, max_length: int) -> float:
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for f in encode_sft(tok, read_sft(dev_path), max_length, "dev"):
            labels = torch.tensor([f["labels"]])
            n = int((labels[:, 1:] != -100).sum())
            total += float(hf(torch.tensor([f["input_ids"]]), labels=labels).loss) * n
            count += n
    return total / count


@pytest.mark.parametrize("packing", [False, True])
def test_finetune_sft_learns_and_reports_transformers_dev_loss(model_dir, tok, data, tmp_path, packing):
    out = tmp_path / "run"
    result = zhnlp.finetune(task="sft", model=str(model_dir), train=data["train"], dev=data["dev"], output=str(out),
                            epochs=2, batch_size=8, lr=3e-3, max_length=128, log_interval=1, packing=packing)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3, [s["loss"] for s in steps]
    assert result["status"] == "complete" and result["metric_for_best_model"] == "loss"
    assert result["greater_is_better"] is False
    assert result["train_features"] == 96
    assert (result["train_sequences"] < 96) if packing else (result["train_sequences"] == 96)
    first, last = result["epochs"][0]["dev"]["loss"], result["epochs"][-1]["dev"]["loss"]
    assert last < first
    assert result["dev"]["perplexity"] == pytest.approx(math.exp(result["dev"]["loss"]), rel=1e-9)
    # the best model in OUTPUT/model is a transformers checkpoint with the chat template, and its dev loss over
    # every target token is the one reported
    saved_tok = transformers.AutoTokenizer.from_pretrained(out / "model")
    assert saved_tok.chat_template == tok.chat_template
    assert _hf_dev_loss(out / "model", saved_tok, data["dev"], 128) == pytest.approx(result["dev"]["loss"], abs=1e-5)
    assert not (out / "dev_predictions.json").exists()


def test_command_line(model_dir, data, tmp_path, capsys):
    from zhnlp.cli import main

    out = tmp_path / "cli"
    assert main(["finetune", "sft", "--model", str(model_dir), "--train", str(data["train"]), "--dev",
                 str(data["dev"]), "--output", str(out), "--epochs", "1", "--batch-size", "16", "--max-length", "96",
                 "--packing", "--log-interval", "2"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["dev"]["loss"] > 0 and printed["output"] == str(out)
    assert json.loads((out / "metrics.json").read_text())["config"]["packing"] is True


BAD_LINES = [
    ('{"messages": [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}]}', None),
    ('{"messages": [{"role": "user", "content": "你好"}', "invalid JSON"),
    ('{"conversation": []}', "no 'messages' key"),
    ('{"messages": [{"role": "bot", "content": "你好"}]}', "role 'bot'; use one of system, user, assistant"),
    ('{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "好"}]}',
     "content of type int"),
    ('{"messages": [{"role": "user", "content": "你好"}]}', "no assistant message"),
    ('{"messages": []}', "non-empty list"),
]


def test_bad_lines_are_named_together(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(line for line, _ in BAD_LINES) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_sft(path)
    message = str(e.value)
    assert f"{len(BAD_LINES) - 1} problems" in message
    for number, (_, problem) in enumerate(BAD_LINES, start=1):
        if problem:
            assert f"{path}:{number}: " in message and problem in message
    assert f"{path}:1:" not in message


def test_templates_and_settings_that_cannot_work(model_dir, tok, data, tmp_path):
    # a template that rewrites earlier turns once later ones follow (it numbers the turns from the end)
    shifting = transformers.AutoTokenizer.from_pretrained(model_dir)
    shifting.chat_template = ("{% for m in messages %}{{ (messages|length - loop.index)|string + m['role'] + ': ' + "
                              "m['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(DataError, match="renders earlier turns differently"):
        encode_conversation(shifting, conversations(1)[0]["messages"])
    # no chat template at all
    bare = tmp_path / "bare"
    transformers.AutoModelForCausalLM.from_pretrained(model_dir).save_pretrained(bare)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    for name in ("tokenizer.model", "special_tokens_map.json", "added_tokens.json"):
        if (model_dir / name).exists():
            (bare / name).write_bytes((model_dir / name).read_bytes())
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(DataError, match="has no chat template"):
        zhnlp.finetune(task="sft", model=str(bare), train=data["train"], dev=data["dev"], output=str(tmp_path / "a"))
    with pytest.raises(ZhnlpError, match="--packing is for supervised fine-tuning"):
        zhnlp.finetune(task="classification", model=str(model_dir), train=data["train"], dev=data["dev"],
                       output=str(tmp_path / "b"), packing=True)
    with pytest.raises(ZhnlpError, match="ernie4_5 models have no dropout settings"):
        zhnlp.finetune(task="sft", model=str(model_dir), train=data["train"], dev=data["dev"],
                       output=str(tmp_path / "c"), dropout=0.1)
    with pytest.raises(ZhnlpError, match="compute_metrics is not available for sft"):
        zhnlp.finetune(task="sft", model=str(model_dir), train=data["train"], dev=data["dev"],
                       output=str(tmp_path / "d"), compute_metrics=lambda p: {})


def test_an_encoder_cannot_be_fine_tuned_on_conversations(data, tmp_path):
    from tests.finetuning import make_tiny_model

    encoder = make_tiny_model(tmp_path / "encoder")
    with pytest.raises(ZhnlpError, match="has no causal_lm head; zhnlp finetune sft needs a decoder"):
        zhnlp.finetune(task="sft", model=str(encoder), train=data["train"], dev=data["dev"], output=str(tmp_path / "e"))


def test_gradient_accumulation_gives_the_same_losses(model_dir, data, tmp_path):
    """The loss averages over the global batch's assistant tokens, not per micro-batch: 4 micro-batches of 2
    conversations train exactly like one of 8 (conversations have different numbers of targets)."""
    runs = {}
    for micro in (8, 2):
        out = tmp_path / f"micro{micro}"
        zhnlp.finetune(task="sft", model=str(model_dir), train=data["train"], dev=data["dev"], output=str(out),
                       epochs=1, max_steps=4, batch_size=8, micro_batch_size=micro, lr=3e-3, max_length=128,
                       log_interval=1)
        runs[micro] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    for a, b in zip(runs[8], runs[2], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
