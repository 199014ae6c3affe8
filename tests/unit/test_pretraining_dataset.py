"""Masked-LM samples: whole units masked together, the 80/10/10 rule, sentence pairs, and
samples that depend only on (seed, index)."""

import numpy as np
import pytest
import torch

from zhnlp.data.pretraining import MaskedLMDataset, SpecialTokens

SPECIAL = SpecialTokens(cls=101, sep=102, mask=103, pad=0, vocab_size=1000, first_regular=106)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """120 documents of 2-5 sentences; units are 'words' of 1-3 tokens."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path_factory.mktemp("corpus") / "c"
    rng = np.random.default_rng(0)
    ids_b = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    units_b = IndexedDatasetBuilder(f"{prefix}_units.bin", dtype=np.int32)
    for _ in range(120):
        for _ in range(rng.integers(2, 6)):
            n = int(rng.integers(8, 30))
            ids = rng.integers(200, 1000, n)
            sizes, units = [], []
            while sum(sizes) < n:
                sizes.append(min(int(rng.integers(1, 4)), n - sum(sizes)))
            for u, size in enumerate(sizes):
                units += [u] * size
            units = np.asarray(units)
            units[rng.random(n) < 0.05] = -1  # a few tokens without a unit
            ids_b.add_item(torch.from_numpy(ids.astype(np.int32)))
            units_b.add_item(torch.from_numpy(units.astype(np.int32)))
        ids_b.end_document()
        units_b.end_document()
    ids_b.finalize(f"{prefix}.idx")
    units_b.finalize(f"{prefix}_units.idx")
    return prefix


def test_samples_are_a_function_of_seed_and_index(corpus):
    a = MaskedLMDataset(corpus, SPECIAL, seq_length=64, seed=3)
    b = MaskedLMDataset(corpus, SPECIAL, seq_length=64, seed=3)
    order = list(range(len(a)))[::-1]
    for i in order[:10]:  # any access order gives the same sample
        for k in a[i]:
            assert np.array_equal(a[i][k], b[i][k])
    c = MaskedLMDataset(corpus, SPECIAL, seq_length=64, seed=4)
    assert any(not np.array_equal(a[i]["labels"], c[i]["labels"]) for i in range(5))


def test_whole_units_are_masked_together_and_specials_never(corpus):
    ds = MaskedLMDataset(corpus, SPECIAL, seq_length=64, max_ngram=3, seed=1)
    masked = total = 0
    for i in range(len(ds)):
        s = ds[i]
        first, end, _ = ds.samples[i]
        ids, units = ds._segment(int(first), int(end))
        ids, units = ids[:62], units[:62]
        labels = s["labels"][1:1 + len(ids)]
        for u in np.unique(units):
            chosen = labels[units == u] != -100
            assert chosen.all() or not chosen.any(), f"unit {u} split in sample {i}"
        assert np.array_equal(labels[labels != -100], ids[labels != -100])  # labels are the originals
        assert s["labels"][0] == -100 and s["input_ids"][0] == SPECIAL.cls
        masked += (labels != -100).sum()
        total += len(ids)
    assert 0.11 < masked / total < 0.17


def test_replacement_rule_80_10_10(corpus):
    ds = MaskedLMDataset(corpus, SPECIAL, seq_length=64, seed=2)
    mask = rand = keep = 0
    for i in range(len(ds)):
        s = ds[i]
        sel = s["labels"] != -100
        mask += (s["input_ids"][sel] == SPECIAL.mask).sum()
        keep += (s["input_ids"][sel] == s["labels"][sel]).sum()
        rand += ((s["input_ids"][sel] != SPECIAL.mask) & (s["input_ids"][sel] != s["labels"][sel])).sum()
    n = mask + rand + keep
    assert n > 500
    assert abs(mask / n - 0.8) < 0.05 and abs(rand / n - 0.1) < 0.04 and abs(keep / n - 0.1) < 0.04


def test_sentence_pairs(corpus):
    ds = MaskedLMDataset(corpus, SPECIAL, seq_length=96, sentence_pairs=True, seed=5)
    labels = []
    for i in range(len(ds)):
        s = ds[i]
        n = int(s["attention_mask"].sum())
        seps = np.flatnonzero(s["input_ids"][:n] == SPECIAL.sep)
        assert seps[-1] == n - 1 and len(seps) == 2
        assert (s["token_type_ids"][: seps[0] + 1] == 0).all() and (s["token_type_ids"][seps[0] + 1: n] == 1).all()
        assert s["input_ids"].shape == (96,) and (s["input_ids"][n:] == SPECIAL.pad).all()
        labels.append(int(s["sentence_order_label"]))
    assert 0.3 < np.mean(labels) < 0.7


def test_too_short_sequences_are_refused(corpus):
    with pytest.raises(Exception, match="seq_length=4 is too short"):
        MaskedLMDataset(corpus, SPECIAL, seq_length=4)


def test_end_to_end_entities_are_masked_whole(tmp_path):
    """preprocess (real vocab, jieba, entity spans) -> samples: an entity is masked all or nothing."""
    import json
    import shutil
    from pathlib import Path

    from zhnlp.data.preprocess import preprocess
    from zhnlp.tokenizers import AutoTokenizer

    vocab = tmp_path / "vocab"
    vocab.mkdir()
    shutil.copy(Path(__file__).resolve().parent.parent / "assets" / "bert-base-chinese-vocab.txt", vocab / "vocab.txt")
    text = "北京大学的张三丰教授今天访问了上海交通大学。他们讨论了人工智能的发展。" * 2
    spans = [(0, 4), (5, 8), (15, 21)]
    rows = [{"text": text, "entities": [{"start": a + k * 35, "end": b + k * 35} for a, b in spans]}
            for k in range(2)]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows * 30) + "\n", encoding="utf-8")
    preprocess([path], tmp_path / "pd", str(vocab), entities_field="entities", progress=False)
    tok = AutoTokenizer.from_pretrained(str(vocab))
    special = SpecialTokens.from_tokenizer(tok)
    assert special.first_regular == 104
    ds = MaskedLMDataset(tmp_path / "pd", special, seq_length=64, mask_prob=0.3, seed=0)
    whole = found = 0
    for i in range(len(ds)):
        s = ds[i]
        original = np.where(s["labels"] != -100, s["labels"], s["input_ids"]).tolist()
        chosen = (s["labels"] != -100).tolist()
        for name in ("北京大学", "张三丰", "上海交通大学"):
            ids = tok.convert_tokens_to_ids(list(name))
            for start in range(len(original) - len(ids) + 1):
                if original[start:start + len(ids)] == ids:
                    found += 1
                    picked = chosen[start:start + len(ids)]
                    assert all(picked) or not any(picked), f"{name} partly masked in sample {i}"
                    whole += all(picked)
    assert found > 50 and whole > 0
