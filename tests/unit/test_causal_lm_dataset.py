"""Causal-LM corpora and windows: `zhnlp preprocess --objective causal-lm` writes whole documents ended by EOD;
CausalLMDataset packs them into full windows in which every token after the first is a target exactly once,
deterministically; reset attention gives per-document ids and positions; the wrong corpus kind is refused."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from zhnlp.data.causal_lm import CausalLMDataset, check_objective
from zhnlp.errors import DataError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EOD = 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """150 documents of 1-40 tokens (ids 3..999), each ended by EOD=2, as the causal-LM preprocessing writes."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path_factory.mktemp("causal") / "c"
    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    docs = []
    for _ in range(150):
        doc = np.concatenate([rng.integers(3, 1000, int(rng.integers(1, 41))), [EOD]]).astype(np.int32)
        builder.add_item(torch.from_numpy(doc))
        builder.end_document()
        docs.append(doc)
    builder.finalize(f"{prefix}.idx")
    Path(f"{prefix}.json").write_text(json.dumps({"tokenizer": "x", "objective": "causal-lm", "eod_token": "</s>",
                                                  "eod_token_id": EOD}))
    return prefix, docs


def stream(ds, docs) -> np.ndarray:
    return np.concatenate([docs[i] for i in ds.order])


@pytest.mark.parametrize("seq", [8, 33])
def test_every_token_is_a_target_exactly_once(corpus, seq):
    prefix, docs = corpus
    ds = CausalLMDataset(prefix, seq, seed=5)
    tokens = stream(ds, docs)
    assert ds.total_tokens == len(tokens) == sum(len(d) for d in docs)
    assert len(ds) == (len(tokens) - seq) // (seq - 1) + 1 and sorted(ds.windows) == list(range(len(ds)))
    by_window = {}
    for i in range(len(ds)):
        s = ds[i]
        assert set(s) == {"input_ids", "labels"} and s["input_ids"].shape == (seq,)  # full: no padding
        assert np.array_equal(s["input_ids"], s["labels"])  # the model shifts the labels itself
        by_window[int(ds.windows[i])] = s["input_ids"]
    # consecutive windows share one token: the last input of one is the first of the next
    for k in range(len(ds) - 1):
        assert by_window[k][-1] == by_window[k + 1][0]
    targets = np.concatenate([by_window[k][1:] for k in range(len(ds))])  # what position t predicts: t+1
    assert np.array_equal(targets, tokens[1:1 + len(targets)])
    assert ds.dropped_tokens == len(tokens) - 1 - len(targets) < seq - 1


def test_samples_depend_only_on_seed_and_index(corpus):
    prefix, _ = corpus
    a, b = CausalLMDataset(prefix, 16, seed=3), CausalLMDataset(prefix, 16, seed=3)
    for i in reversed(range(20)):  # any access order
        assert np.array_equal(a[i]["input_ids"], b[i]["input_ids"])
    c = CausalLMDataset(prefix, 16, seed=4)
    assert not np.array_equal(a.order, c.order)
    assert any(not np.array_equal(a[i]["input_ids"], c[i]["input_ids"]) for i in range(5))


def test_reset_attention_gives_document_ids_and_positions(corpus):
    prefix, _ = corpus
    plain = CausalLMDataset(prefix, 32, seed=1)
    ds = CausalLMDataset(prefix, 32, seed=1, reset_attention=True)
    masked = CausalLMDataset(prefix, 32, seed=1, reset_attention=True, eod_mask_loss=True)
    crossings = 0
    for i in range(len(ds)):
        s, ids = ds[i], ds[i]["input_ids"]
        assert np.array_equal(ids, plain[i]["input_ids"]) and np.array_equal(s["labels"], ids)
        docs, pos = s["document_ids"], s["position_ids"]
        assert docs[0] == 0 and pos[0] == 0
        for t in range(1, 32):
            if ids[t - 1] == EOD:  # a new document starts after every EOD, at position 0
                assert (docs[t], pos[t]) == (docs[t - 1] + 1, 0)
                crossings += 1
            else:  # the EOD itself belongs to the document it ends
                assert (docs[t], pos[t]) == (docs[t - 1], pos[t - 1] + 1)
        labels = masked[i]["labels"]
        after_eod = np.concatenate([[False], ids[:-1] == EOD])
        assert np.array_equal(labels == -100, after_eod) and np.array_equal(labels[~after_eod], ids[~after_eod])
    assert crossings > 50


def test_preprocess_causal_lm_writes_whole_documents_ended_by_eod(tmp_path):
    from zhnlp.data.preprocess import preprocess
    from zhnlp.tokenizers import AutoTokenizer

    shutil.copy(ASSETS / "bert-base-chinese-vocab.txt", tmp_path / "vocab.txt")
    texts = ["北京是中华人民共和国的首都。长江是中国最长的河流！", "我喜欢读书。", "", "今天天气很好"]
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    report = preprocess([tmp_path / "c.txt"], tmp_path / "d", str(tmp_path), objective="causal-lm", progress=False)
    meta = json.loads((tmp_path / "d.json").read_text())
    assert (meta["objective"], meta["eod_token"], meta["eod_token_id"], meta["masking"]) == \
        ("causal-lm", "[SEP]", 102, None)  # a WordPiece vocabulary without eos: [SEP] ends documents
    assert not Path(f"{tmp_path}/d_units.bin").exists() and report.documents == 3 == report.sentences
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data, tok = IndexedDataset(str(tmp_path / "d")), AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(data) == 3 and list(data.document_indices) == [0, 1, 2, 3]  # one sequence per document
    for i, text in enumerate(t for t in texts if t):
        ids = list(data[i])
        assert ids[-1] == 102 and 102 not in ids[:-1]
        assert tok.decode(ids[:-1]).replace(" ", "") == text
    assert "3 documents, " in report.summary() and "(EOD included)" in report.summary()
    with pytest.raises(ValueError, match="--entities-field and --phrases are masking units for masked-LM"):
        preprocess([tmp_path / "c.txt"], tmp_path / "e", str(tmp_path), objective="causal-lm", phrases=["北京"],
                   progress=False)
    with pytest.raises(ValueError, match="objective must be one of mlm, causal-lm, not 'clm'"):
        preprocess([tmp_path / "c.txt"], tmp_path / "e", str(tmp_path), objective="clm", progress=False)
    # the masked-LM corpus of the same text records its objective; each kind is refused where the other is needed
    preprocess([tmp_path / "c.txt"], tmp_path / "m", str(tmp_path), masking=False, progress=False)
    assert json.loads((tmp_path / "m.json").read_text())["objective"] == "mlm"
    with pytest.raises(DataError) as e:
        CausalLMDataset(tmp_path / "m", 8)
    assert str(e.value) == (f"--data {tmp_path / 'm'} was preprocessed for masked-LM pretraining (sentences with "
                            "masking units), but recipe 'a causal-LM recipe' needs a corpus for causal-LM pretraining "
                            "(whole documents with EOD); preprocess the text again with `zhnlp preprocess "
                            "--objective causal-lm --input FILE --output PREFIX --tokenizer DIR`.")
    with pytest.raises(DataError, match=r"was preprocessed for causal-LM pretraining \(whole documents with EOD\), "
                                        r"but recipe 'ernie-debug' needs a corpus for masked-LM pretraining .*"
                                        r"`zhnlp preprocess --objective mlm "):
        check_objective(tmp_path / "d", "mlm", "ernie-debug")


def test_corpora_too_small_or_missing_are_named(corpus, tmp_path):
    prefix, docs = corpus
    total = sum(len(d) for d in docs)
    with pytest.raises(DataError, match=f"holds {total} tokens, fewer than one window of seq_length={total + 1}"):
        CausalLMDataset(prefix, total + 1)
    assert len(CausalLMDataset(prefix, total)) == 1
    with pytest.raises(DataError, match=r"no preprocessed corpus there \(missing .*nope\.bin, .*nope\.idx, "
                                        r".*nope\.json\); write one with `zhnlp preprocess --objective causal-lm "):
        CausalLMDataset(tmp_path / "nope", 16)
