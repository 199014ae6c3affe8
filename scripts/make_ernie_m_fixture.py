"""Make the ERNIE-M golden fixture (``tests/assets/ernie_m/``) with transformers 4.x, which still has ErnieM.

transformers 5 dropped ERNIE-M, so zhnlp's ERNIE-M family is tested against outputs that transformers 4.x wrote
once, here: a tiny SentencePiece tokenizer in the ErnieM layout with the ids ``ErnieMTokenizer`` gives on a set of
texts, and tiny random ErnieM models of every head (``ErnieMModel`` with its pooler, ``...ForSequenceClassification``,
``...ForTokenClassification``, ``...ForQuestionAnswering``) with a right-padded batch and their outputs.

Needs (outside the project's virtual environment, which keeps transformers 5):

* transformers 4.x with ErnieM (4.40-4.46) and its ``tokenizers``/``huggingface_hub``, installed into a throwaway
  folder and put first on ``PYTHONPATH``, so that the project's torch, sentencepiece and safetensors are reused::

      .venv/bin/python -m pip install --target /tmp/tf4 --no-deps transformers==4.46.3 tokenizers==0.20.3 \\
          huggingface_hub==0.26.5 requests urllib3 idna charset_normalizer certifi

* the Chinese text it trains the tokenizer on: ``zhnlp data fetch peoples-daily-1998 sentiment-reviews`` (read
  from ``$ZHNLP_HOME/data`` or ``~/.cache/zhnlp/data``; ``--data`` points elsewhere).

Run from the repository root::

    PYTHONPATH=/tmp/tf4 .venv/bin/python scripts/make_ernie_m_fixture.py            # writes tests/assets/ernie_m
    PYTHONPATH=/tmp/tf4 .venv/bin/python scripts/make_ernie_m_fixture.py --check    # and checks zhnlp's saves

``--check`` then runs zhnlp (the same interpreter without ``PYTHONPATH``, so with transformers 5) on every case:
load, compare with the reference, ``save_pretrained`` the model and the tokenizer; and loads those saved
directories back here with transformers 4.x, which must give the same weights, outputs and ids. (The test suite
cannot do this last step: it has no transformers 4.x.)

What is written (a few hundred KB):

* ``tokenizer/``: ``sentencepiece.bpe.model``, ``vocab.txt``, ``tokenizer_config.json``, ``special_tokens_map.json``
  exactly as ``ErnieMTokenizer.save_pretrained`` writes them; ``tokenizer_cases.json``: calls and their results.
* ``<case>/``: ``hf/`` (``config.json`` + ``model.safetensors``), ``inputs.safetensors``, ``reference.safetensors``
  (outputs, losses and ``hidden_states.<i>`` of every layer), ``meta.json`` (the layout
  ``tests/distributed/parity_worker.py`` reads); the base case adds ``extra.safetensors`` (outputs without an
  attention mask and with explicit position ids), the sequence-classification case ``grads.safetensors`` (every
  weight's gradient of the loss).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 20240607

# Texts the tokenizer cases run on: Chinese with full-width digits and punctuation, mixed Chinese/English,
# digits next to letters, characters the tiny vocabulary lacks, special tokens written in the text, odd spacing.
TEXTS = [
    "ERNIE-M是百度2020年提出的多语言模型，支持96种语言。",
    "Hello world! 你好，世界。",
    "１９９８年１月１日，新华社北京电。",
    "价格是3.5元，一共12345件，比去年多了20%。",
    "我们在北京开会[MASK]讨论经济发展",
    "这本书很好看[SEP]下次还会再买",
    "  前后有空格  ，中间\t有制表符\n和换行  ",
    "GPT4和BERT-base都是model，abc123def456。",
    "😀表情符号和ｆｕｌｌ　ｗｉｄｔｈ全角字母",
    "日本語のテキストと한국어 텍스트",
    "ＣＨＩＮＡ　ＤＡＩＬＹ：中国日报",
    "",
]
PAIRS = [
    ("这家酒店的服务怎么样？", "服务很周到，房间也干净，下次还会入住。"),
    ("What is ERNIE-M?", "ERNIE-M是一个多语言预训练模型，由百度在2020年提出。"),
    ("问题", "一九九七年，中国经济保持了快速增长，国内生产总值增长百分之八点八。"),
]

# The model cases: (name, head, transformers class suffix, config changes). Sizes split two ways (heads, FFN,
# the vocabulary padded to 384) and the layers into two pipeline stages; each case differs in activation,
# LayerNorm epsilon, widths and dropout so that a wrong mapping or a shared default cannot hide.
CASES = [
    ("base", "base", "Model",
     dict(hidden_size=12, num_attention_heads=4, intermediate_size=26, num_hidden_layers=2, hidden_act="gelu",
          layer_norm_eps=1e-5)),
    ("sequence_classification", "sequence_classification", "ForSequenceClassification",
     dict(hidden_size=12, num_attention_heads=2, intermediate_size=22, num_hidden_layers=4, hidden_act="relu",
          layer_norm_eps=1e-6, classifier_dropout=0.2, act_dropout=0.1,
          id2label={0: "negative", 1: "neutral", 2: "positive"}, label2id={"negative": 0, "neutral": 1, "positive": 2},
          extra_vocab=5)),
    ("token_classification", "token_classification", "ForTokenClassification",
     dict(hidden_size=10, num_attention_heads=2, intermediate_size=18, num_hidden_layers=2, hidden_act="gelu_new",
          layer_norm_eps=1e-7, num_labels=5, max_position_embeddings=40)),
    ("question_answering", "question_answering", "ForQuestionAnswering",
     dict(hidden_size=12, num_attention_heads=2, intermediate_size=24, num_hidden_layers=2, hidden_act="quick_gelu",
          layer_norm_eps=1e-5)),
    ("regression", "sequence_classification", "ForSequenceClassification",
     dict(hidden_size=8, num_attention_heads=2, intermediate_size=12, num_hidden_layers=2, hidden_act="silu",
          layer_norm_eps=1e-5, num_labels=1)),
]
BATCH_TEXTS = ["百度提出了多语言模型ERNIE-M。", "１９９８年，中国经济保持了快速增长，总值增长８．８％。",
               "服务很好，下次还来。"]


def data_home(given: Path | None) -> Path:
    if given is not None:
        return given
    home = os.environ.get("ZHNLP_HOME")
    return Path(home) / "data" if home else Path.home() / ".cache" / "zhnlp" / "data"


# ---------------------------------------------------------------------------------------------- tokenizer
# A little English (written for this fixture), so that the vocabulary has Latin word pieces as well.
ENGLISH = ["the model reads Chinese and English text", "machine translation between many languages",
           "a multilingual model learns shared representations", "hello world, this is a test sentence",
           "pretraining on large corpora with masked language modeling", "version 2 of the base model",
           "the service was good and the room was clean", "we will come back next year"]


def training_text(data: Path) -> list[str]:
    """Clauses of People's Daily 1998 and the sentiment reviews written with their 180 most frequent characters
    (so that a vocabulary of a few hundred pieces covers them), and the English lines above."""
    corpus = data / "peoples-daily-1998" / "corpus.txt"
    reviews = data / "sentiment-reviews" / "train.jsonl"
    for path in (corpus, reviews):
        if not path.is_file():
            sys.exit(f"{path} is missing: run `zhnlp data fetch peoples-daily-1998 sentiment-reviews` (or pass --data)")
    texts = corpus.read_text(encoding="utf-8").split("\n")[:4000]
    with open(reviews, encoding="utf-8") as f:
        texts += [json.loads(line)["text"] for line in f][:6000]
    counts = collections.Counter(c for t in texts for c in t if not c.isascii())
    common = {c for c, _ in counts.most_common(180)}
    clauses = [c.strip() for t in texts for c in re.split("(?<=[，。！？；：])", t)]
    return [c for c in clauses if len(c) > 3 and all(ch.isascii() or ch in common for ch in c)] + ENGLISH * 20


def make_tokenizer(data: Path, out: Path):
    """Train a unigram SentencePiece model and save it with an ERNIE-M vocab.txt through ErnieMTokenizer."""
    import sentencepiece as spm
    from transformers import ErnieMTokenizer

    work = Path(tempfile.mkdtemp(prefix="ernie-m-spm-"))
    (work / "corpus.txt").write_text("\n".join(training_text(data)), encoding="utf-8")
    # A small normalisation table (full-width ASCII and the ideographic space to ASCII) instead of nmt_nfkc,
    # whose compiled table alone would be about 240 KB.
    rules = "".join(f"{0xFF01 + i:X}\t{0x21 + i:X}\n" for i in range(0x5E)) + "3000\t20\n"
    (work / "rules.tsv").write_text(rules, encoding="utf-8")
    spm.set_random_generator_seed(SEED)
    spm.SentencePieceTrainer.train(
        input=str(work / "corpus.txt"), model_prefix=str(work / "sp"), vocab_size=340, model_type="unigram",
        character_coverage=0.9995, normalization_rule_tsv=str(work / "rules.tsv"), num_threads=1, minloglevel=2)
    # The trainer records its temporary paths in the model: clear them, so that the file is the same on every run.
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((work / "sp.model").read_bytes())
    del proto.trainer_spec.input[:]
    proto.trainer_spec.model_prefix = ""
    proto.normalizer_spec.normalization_rule_tsv = ""
    (work / "sp.model").write_bytes(proto.SerializeToString())
    sp = spm.SentencePieceProcessor(model_file=str(work / "sp.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    # ERNIE-M's layout: [CLS] [PAD] [SEP] [UNK] (pad id 1, as ErnieMConfig's default), the pieces, [MASK] last.
    # Its ids are not the SentencePiece model's, so a tokenizer that used those would fail the cases.
    vocab = ["[CLS]", "[PAD]", "[SEP]", "[UNK]"] + pieces + ["[MASK]"]
    (work / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = ErnieMTokenizer(sentencepiece_model_ckpt=str(work / "sp.model"), vocab_file=str(work / "vocab.txt"))
    tok.save_pretrained(str(out))
    shutil.rmtree(work)
    return ErnieMTokenizer.from_pretrained(str(out))


def tokenizer_cases(tok_dir: Path, data: Path) -> list[dict]:
    """Calls of transformers 4.x's ErnieMTokenizer and what they returned."""
    from transformers import ErnieMTokenizer

    cases = []

    def record(name, init, method, args, kwargs=None):
        tok = ErnieMTokenizer.from_pretrained(str(tok_dir), **init)
        result = getattr(tok, method)(*args, **(kwargs or {}))
        if hasattr(result, "data"):  # BatchEncoding
            result = dict(result.data)
        cases.append({"name": name, "init": init, "method": method, "args": args, "kwargs": kwargs or {},
                      "expected": result})

    first, second = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    record("single", {}, "__call__", [TEXTS])
    record("single_no_special", {}, "__call__", [TEXTS], {"add_special_tokens": False})
    record("pairs", {}, "__call__", [first, second])
    record("pairs_all_outputs", {}, "__call__", [first, second],
           {"return_token_type_ids": True, "return_attention_mask": True, "return_special_tokens_mask": True,
            "padding": True})
    record("truncate_longest_first", {}, "__call__", [first, second], {"truncation": True, "max_length": 16})
    record("truncate_only_second", {}, "__call__", [first, second], {"truncation": "only_second", "max_length": 26})
    record("truncate_single", {}, "__call__", [TEXTS], {"truncation": True, "max_length": 9})
    record("pad_to_max_length", {}, "__call__", [TEXTS[:4]],
           {"padding": "max_length", "max_length": 40, "truncation": True, "return_attention_mask": True})
    record("overflow_with_stride", {}, "__call__", [TEXTS[3]],
           {"truncation": True, "max_length": 10, "stride": 3, "return_overflowing_tokens": True})
    for i, text in enumerate(TEXTS + [a for pair in PAIRS for a in pair]):
        record(f"tokenize_{i}", {}, "tokenize", [text])
    record("lower_case", {"do_lower_case": True}, "__call__", [TEXTS])
    record("lower_case_tokens", {"do_lower_case": True}, "tokenize", [TEXTS[7]])
    record("encode_pair", {}, "encode", [PAIRS[0][0], PAIRS[0][1]])
    ids = ErnieMTokenizer.from_pretrained(str(tok_dir))(TEXTS)["input_ids"]
    record("ids_to_tokens", {}, "convert_ids_to_tokens", [ids[0]])
    record("decode", {}, "batch_decode", [ids])
    record("decode_skip_special", {}, "batch_decode", [ids], {"skip_special_tokens": True})
    record("special_tokens_mask", {}, "get_special_tokens_mask", [ids[1]], {"already_has_special_tokens": True})
    record("vocab", {}, "get_vocab", [])
    record("corpus", {}, "__call__", [corpus_sample(data)])
    return cases


def corpus_sample(data: Path) -> list[str]:
    """People's Daily lines and reviews the tokenizer was not trained on, and random strings of CJK, Latin, digits,
    the punctuation ERNIE-M cuts at, full-width forms and odd spaces (a fixed seed)."""
    import random

    lines = (data / "peoples-daily-1998" / "corpus.txt").read_text(encoding="utf-8").split("\n")[6000:6100]
    with open(data / "sentiment-reviews" / "dev.jsonl", encoding="utf-8") as f:
        lines += [json.loads(line)["text"] for line in f][:100]
    lines = [t[:60] for t in lines]  # the first 60 characters: enough of each, and a small file
    rng = random.Random(SEED)
    alphabet = "abcXYZ 0123 ，。！？《》【】,.;:~ 中国人民的 \u2581 \t\u3000ｆｕ１２é"
    return [t for t in lines if t] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
                                      for _ in range(150)]


# ---------------------------------------------------------------------------------------------- models
def build_model(name: str, suffix: str, changes: dict, vocab_size: int):
    import torch
    import transformers

    changes = dict(changes)
    config = transformers.ErnieMConfig(vocab_size=vocab_size + changes.pop("extra_vocab", 0),
                                       max_position_embeddings=changes.pop("max_position_embeddings", 34),
                                       **changes)
    torch.manual_seed(SEED + sum(map(ord, name)))
    model = getattr(transformers, "ErnieM" + suffix)(config).eval()
    # Non-trivial LayerNorm and bias values, so that a mis-mapped weight cannot hide behind ones and zeros.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def batch_for(tok, head: str, model) -> dict:
    """The right-padded batch of BATCH_TEXTS with the labels of ``head``."""
    import torch

    enc = tok(BATCH_TEXTS, padding=True, return_attention_mask=True, return_tensors="pt")
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    b, s = batch["input_ids"].shape
    g = torch.Generator().manual_seed(SEED)
    if head == "sequence_classification":
        n = model.config.num_labels
        batch["labels"] = (torch.tensor([0.5, -1.25, 2.0]) if n == 1 else torch.tensor([2, 0, 1]))
    elif head == "token_classification":
        labels = torch.randint(0, model.config.num_labels, (b, s), generator=g)
        labels[batch["attention_mask"] == 0] = -100
        labels[:, 0] = -100
        batch["labels"] = labels
    elif head == "question_answering":
        batch["start_positions"] = torch.tensor([1, 4, s + 5])  # the last is outside the sequence: ignored
        batch["end_positions"] = torch.tensor([3, 9, 2])
    return batch


def outputs(model, batch: dict) -> dict:
    import torch

    with torch.no_grad():
        ref = model(**batch, output_hidden_states=True)
    names = ("loss", "logits", "last_hidden_state", "pooler_output", "start_logits", "end_logits")
    out = {k: ref[k].clone() for k in names if getattr(ref, k, None) is not None}
    out.update({f"hidden_states.{i}": h.clone() for i, h in enumerate(ref.hidden_states)})
    return out


def make_case(out: Path, tok, name: str, head: str, suffix: str, changes: dict) -> None:
    import torch
    from safetensors.torch import save_file

    case = out / name
    model = build_model(name, suffix, changes, len(tok))
    model.save_pretrained(str(case / "hf"), safe_serialization=True)
    batch = batch_for(tok, head, model)
    save_file({k: v.contiguous() for k, v in batch.items()}, str(case / "inputs.safetensors"))
    save_file(outputs(model, batch), str(case / "reference.safetensors"))
    (case / "meta.json").write_text(json.dumps({"name": name, "head": head, "hf_class": "ErnieM" + suffix,
                                                "num_parameters": model.num_parameters()}, indent=1) + "\n")
    if name == "base":
        # Without an attention mask ErnieM masks the pad id itself; explicit position ids are offset by 2 too.
        extra = {}
        with torch.no_grad():
            extra["no_mask.last_hidden_state"] = model(batch["input_ids"]).last_hidden_state
            pos = torch.arange(3, 3 + batch["input_ids"].shape[1]).expand_as(batch["input_ids"]).contiguous()
            extra["position_ids"] = pos
            extra["positions.last_hidden_state"] = model(**batch, position_ids=pos.clone()).last_hidden_state
        save_file(extra, str(case / "extra.safetensors"))
    if head == "sequence_classification" and name == "sequence_classification":
        # Gradients in eval mode: those of training with dropout off.
        model.zero_grad()
        model(**batch).loss.backward()
        save_file({n: p.grad.contiguous() for n, p in model.named_parameters()}, str(case / "grads.safetensors"))


# ---------------------------------------------------------------------------------------------- --check
ZHNLP_SIDE = r"""
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
import zhnlp

fixture, out = Path(sys.argv[1]), Path(sys.argv[2])
heads = {"base": zhnlp.AutoModel, "sequence_classification": zhnlp.AutoModelForSequenceClassification,
         "token_classification": zhnlp.AutoModelForTokenClassification,
         "question_answering": zhnlp.AutoModelForQuestionAnswering}
report = {}
for case in sorted(p for p in fixture.iterdir() if (p / "hf").is_dir()):
    meta = json.loads((case / "meta.json").read_text())
    model = heads[meta["head"]].from_pretrained(case / "hf")
    batch = load_file(str(case / "inputs.safetensors"))
    ref = load_file(str(case / "reference.safetensors"))
    with torch.no_grad():
        got = dict(model(**batch))
        states = model(**batch, output_hidden_states=True).hidden_states
        got.update({f"hidden_states.{i}": h for i, h in enumerate(states)})
    report[case.name] = max((got[k] - v).abs().max().item() for k, v in ref.items())
    model.save_pretrained(out / case.name)
tok = zhnlp.AutoTokenizer.from_pretrained(fixture / "tokenizer")
tok.save_pretrained(out / "tokenizer")
print(json.dumps(report))
"""


def check(out: Path) -> None:
    """zhnlp loads every case and saves it; transformers 4.x must read the saves back unchanged."""
    import torch
    import transformers
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(prefix="ernie-m-check-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.run([sys.executable, "-c", ZHNLP_SIDE, str(out), tmp], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"zhnlp failed on the fixture:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        diffs = json.loads(proc.stdout.strip().splitlines()[-1])
        for name, diff in diffs.items():
            print(f"zhnlp {name}: largest difference from the reference {diff:.2e}")
            assert diff <= 1e-5, name
        for case in sorted(p for p in out.iterdir() if (p / "hf").is_dir()):
            meta = json.loads((case / "meta.json").read_text())
            cls = getattr(transformers, meta["hf_class"])
            theirs, ours = cls.from_pretrained(str(case / "hf")).eval(), cls.from_pretrained(str(Path(tmp) / case.name))
            a, b = theirs.state_dict(), ours.eval().state_dict()
            assert set(a) == set(b), case.name
            assert all(torch.equal(a[k], b[k]) for k in a), case.name
            assert json.loads((Path(tmp) / case.name / "config.json").read_text())["architectures"] == [
                meta["hf_class"]], case.name
            batch = load_file(str(case / "inputs.safetensors"))
            ref = load_file(str(case / "reference.safetensors"))
            got = outputs(ours, batch)
            assert all(torch.equal(got[k], ref[k]) for k in ref), case.name
            print(f"transformers {transformers.__version__} loads zhnlp's save of {case.name}: same weights, outputs")
        theirs = transformers.ErnieMTokenizer.from_pretrained(str(out / "tokenizer"))
        ours = transformers.ErnieMTokenizer.from_pretrained(str(Path(tmp) / "tokenizer"))
        texts = TEXTS + [a for pair in PAIRS for a in pair]
        assert ours(texts)["input_ids"] == theirs(texts)["input_ids"]
        assert ours.get_vocab() == theirs.get_vocab()
        print("transformers loads zhnlp's saved tokenizer: same vocabulary and ids")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "assets" / "ernie_m")
    ap.add_argument("--data", type=Path, help="zhnlp's data cache (default $ZHNLP_HOME/data or ~/.cache/zhnlp/data)")
    ap.add_argument("--check", action="store_true", help="also check zhnlp's loads and saves (see above)")
    args = ap.parse_args()
    import torch
    import transformers

    if not hasattr(transformers, "ErnieMModel"):
        sys.exit(f"transformers {transformers.__version__} has no ErnieM: put a 4.40-4.46 install first on "
                 "PYTHONPATH (see this script's docstring).")
    torch.set_num_threads(1)
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    tok = make_tokenizer(data_home(args.data), args.out / "tokenizer")
    cases = tokenizer_cases(args.out / "tokenizer", data_home(args.data))
    lines = [json.dumps(case, ensure_ascii=False, separators=(",", ":")) for case in cases]  # one case a line
    (args.out / "tokenizer_cases.json").write_text(
        f'{{"transformers": "{transformers.__version__}", "cases": [\n' + ",\n".join(lines) + "\n]}\n",
        encoding="utf-8")
    for name, head, suffix, changes in CASES:
        make_case(args.out, tok, name, head, suffix, changes)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({total / 1024:.0f} KB) with transformers {transformers.__version__}")
    if args.check:
        check(args.out)


if __name__ == "__main__":
    main()
