"""zhnlp vs reference implementations: tokenizer and preprocessing speed on real Chinese text.

Sections (each a function returning a dict of figures, printed as one line):

1. ``wordpiece``: batch encoding with offsets (``return_offsets_mapping=True``, truncation to
   128, padding to the longest), zhnlp's ``AutoTokenizer`` vs ``transformers.BertTokenizerFast``,
   both from the bert-base-chinese vocab in tests/assets, on the CMRC2018 trial contexts split
   into sentences (a few thousand) plus its questions. The outputs are checked identical first.
2. ``segmentation``: zhnlp's ``Segmenter`` with the rjieba backend (jieba-exact) vs jieba's
   precise mode, on the same CMRC sentences, with the agreement of their outputs.
3. ``preprocessing``: ``zhnlp.data.preprocess`` (WordPiece + jieba whole-word units into a
   megatron indexed dataset) in one worker, MB of input per second, on the CMRC contexts (one
   paragraph per document) repeated to a few MB (``--corpus FILE`` to use another corpus, e.g. People's Daily from
   ``zhnlp data fetch peoples-daily-1998``).

The two sides alternate run by run (ABBA order) so machine noise hits both alike; each side's
figure is the median. ratio = reference_time / zhnlp_time (>1: zhnlp faster).

Run:  .venv/bin/python benchmarks/bench_tokenizers.py [--repeats 20] [--batch 256] [--json]
                                                     [--sections wordpiece]

The CMRC2018 trial set (CC-BY-SA-4.0) is read from ../shared/data/cmrc2018 beside the repo.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

ROOT = Path(__file__).resolve().parent.parent
VOCAB = ROOT / "tests" / "assets" / "bert-base-chinese-vocab.txt"
CMRC = ROOT.parent / "shared" / "data" / "cmrc2018" / "cmrc2018_trial.json"


def cmrc_sentences() -> list[str]:
    """CMRC2018 trial contexts cut after 。！？ (closing quotes kept), plus the questions."""
    if not CMRC.is_file():
        sys.exit(f"bench_tokenizers: CMRC2018 trial set not found at {CMRC}; put the shared data beside the repo.")
    data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
    texts = []
    for article in data:
        for para in article["paragraphs"]:
            texts += [s for s in re.findall(r"[^。！？]+[。！？]*[”」』]?", para["context"]) if s.strip()]
            texts += [q["question"] for q in para["qas"]]
    return texts


def _alternate(runs: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each callable in ``runs``, run in ABBA order ``repeats`` times."""
    times = {name: [] for name in runs}
    names = list(runs)
    for i in range(repeats):
        for name in (names if i % 2 == 0 else names[::-1]):
            # The cyclic collector would otherwise fire at allocation counts that land in one
            # side's run or the other's by chance.
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
            gc.enable()
    return {name: statistics.median(t) for name, t in times.items()}


def bench_wordpiece(repeats: int, batch: int) -> dict:
    """Section 1: batch encoding with offsets, zhnlp vs transformers' BertTokenizerFast."""
    import transformers

    from zhnlp.tokenizers import AutoTokenizer

    texts = cmrc_sentences()
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(VOCAB, Path(d) / "vocab.txt")
        ours = AutoTokenizer.from_pretrained(d)
        ref = transformers.BertTokenizerFast.from_pretrained(d)
    kw = dict(return_offsets_mapping=True, truncation=True, max_length=128, padding="longest")
    batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    for b in batches:
        if ours(b, **kw) != ref(b, **kw):
            sys.exit("bench_tokenizers: zhnlp and transformers disagree; run tests/unit/test_tokenizers.py.")

    def run(tok):
        return lambda: [tok(b, **kw) for b in batches]

    med = _alternate({"zhnlp": run(ours), "transformers": run(ref)}, repeats)
    chars = sum(map(len, texts))
    return {"section": "wordpiece", "texts": len(texts), "chars": chars, "batch": batch,
            "zhnlp_ms": med["zhnlp"] * 1e3, "transformers_ms": med["transformers"] * 1e3,
            "zhnlp_mchars_s": chars / med["zhnlp"] / 1e6, "ratio": med["transformers"] / med["zhnlp"]}


def bench_segmentation(repeats: int) -> dict:
    """Section 2: segmentation speed of the fast backend relative to jieba (goal >= 3x)."""
    from zhnlp.tokenizers.segment import bench_segmentation as measure

    r = measure(cmrc_sentences(), hmm=True, repeat=max(1, repeats // 5))
    return {"section": "segmentation", "texts": r["texts"], "chars": r["chars"],
            "jieba_mchars_s": r["jieba_chars_per_s"] / 1e6, "zhnlp_mchars_s": r["rjieba_chars_per_s"] / 1e6,
            "ratio": r["speedup"], "texts_identical": r["rjieba_agreement"]["texts"]}


def bench_preprocessing(repeats: int, corpus: Path | None = None) -> dict:
    """Section 3: preprocessing throughput of one worker in MB/s (goal >= 1 MB/s per worker)."""
    from zhnlp.data.preprocess import preprocess

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copy(VOCAB, tmp / "vocab.txt")
        if corpus is None:  # documents = CMRC contexts (paragraphs of several sentences)
            corpus = tmp / "corpus.txt"
            data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
            text = "\n".join(p["context"].replace("\n", " ") for a in data for p in a["paragraphs"])
            corpus.write_text("\n".join([text] * max(1, 4_000_000 // len(text.encode()))) + "\n", encoding="utf-8")
        runs = []
        # one worker means one core: keep the Rust tokenizer from using a second thread
        previous = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            for _ in range(max(1, repeats // 10)):
                report = preprocess([corpus], tmp / "out", str(tmp), workers=1, progress=False)
                runs.append(report.mb_per_s)
        finally:
            os.environ["TOKENIZERS_PARALLELISM"] = previous or "true"
        return {"section": "preprocessing", "mb": report.input_bytes / 1e6, "tokens": report.tokens,
                "mb_per_s_per_worker": statistics.median(runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--sections", nargs="+", default=["wordpiece", "segmentation", "preprocessing"],
                        choices=["wordpiece", "segmentation", "preprocessing"])
    parser.add_argument("--corpus", type=Path, help="plain-text corpus for the preprocessing section")
    parser.add_argument("--json", action="store_true", help="one JSON object per section")
    args = parser.parse_args(argv)
    sections = {"wordpiece": lambda: bench_wordpiece(args.repeats, args.batch),
                "segmentation": lambda: bench_segmentation(args.repeats),
                "preprocessing": lambda: bench_preprocessing(args.repeats, args.corpus)}
    for name in args.sections:
        result = sections[name]()
        if args.json:
            print(json.dumps(result))
        elif name == "wordpiece":
            print(f"{name}: {result['texts']} texts, {result['chars']} chars, batch {result['batch']}: "
                  f"zhnlp {result['zhnlp_ms']:.1f} ms, transformers {result['transformers_ms']:.1f} ms, "
                  f"ratio {result['ratio']:.2f}x ({result['zhnlp_mchars_s']:.2f} M chars/s)  goal >= 1.0x")
        elif name == "segmentation":
            print(f"{name}: {result['texts']} texts, {result['chars']} chars: zhnlp (rjieba) "
                  f"{result['zhnlp_mchars_s']:.2f} M chars/s, jieba {result['jieba_mchars_s']:.2f} M chars/s, "
                  f"ratio {result['ratio']:.1f}x, identical segmentation {result['texts_identical']:.1%}  goal >= 3x")
        else:
            print(f"{name}: {result['mb']:.1f} MB, {result['tokens']:,} tokens: "
                  f"{result['mb_per_s_per_worker']:.2f} MB/s per worker  goal >= 1 MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
