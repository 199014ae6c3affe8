"""Corpus preprocessing: raw Chinese text -> megatron-core ``IndexedDataset`` of token ids.

Input: jsonl (one document per line, text in a field, ``text`` by default) or plain text
(one document per line). Each document is split into sentences; each sentence becomes one
sequence of the indexed dataset and the document boundary is recorded, as megatron's BERT
data expects (sentence pairs come from within a document).

Output, for ``--output PREFIX``:

* ``PREFIX.bin`` / ``PREFIX.idx``: token ids (no [CLS]/[SEP]; the datasets add them);
* ``PREFIX_units.bin`` / ``PREFIX_units.idx``: side data aligned token for token: the
  masking unit of every token (whole-word units from jieba segmentation; -1 = none), so
  that Chinese whole-word masking knows which characters form one word;
* ``PREFIX.json``: what was done (inputs, tokenizer, objective, counts, bad lines, checksums).

With ``objective="causal-lm"`` (``--objective causal-lm``, for decoder pretraining) documents are not
split: each becomes one sequence, its token ids followed by the tokenizer's end-of-document id (EOD: the
eos token, e.g. ``</s>``; ``[SEP]`` for a WordPiece vocabulary without one), recorded in ``PREFIX.json``
as ``eod_token`` / ``eod_token_id``. There is no unit side data. :class:`zhnlp.data.causal_lm.CausalLMDataset`
packs the token stream into full windows.

Bad input lines (invalid UTF-8, invalid JSON, a missing or non-string field, empty text) are
counted and reported with their line numbers; ``on_error="skip"`` leaves them out, ``"fail"``
stops before anything is written. Work is spread over worker processes in fixed-size chunks
whose results are written in input order, so a re-run on the same input gives identical files.
Files are written under temporary names and moved into place at the end.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from zhnlp.errors import ZhnlpError

# Sentence ends: Chinese and Western terminal punctuation, optionally followed by closing quotes.
_SENTENCE_END = re.compile(r"[^。！？!?；;…\n]*(?:[。！？!?；;…]+[”’」』）)]*|\n|$)")
_CHUNK_LINES = 256
OBJECTIVES = ("mlm", "causal-lm")  # masked LM (sentences + masking units) / causal LM (documents + EOD)


class PreprocessError(ZhnlpError, ValueError):
    """Input that cannot be preprocessed as asked."""


@dataclass
class PreprocessReport:
    """Counts of one run; written to ``PREFIX.json``."""

    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    input_bytes: int = 0
    bad_lines: dict = field(default_factory=dict)  # reason -> [line numbers]
    seconds: float = 0.0
    workers: int = 1
    objective: str = "mlm"

    @property
    def bad_count(self) -> int:
        return sum(len(v) for v in self.bad_lines.values())

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / max(self.seconds, 1e-9)

    def summary(self) -> str:
        what = "" if self.objective == "causal-lm" else f"{self.sentences:,} sentences, "
        eod = " (EOD included)" if self.objective == "causal-lm" else ""
        lines = [f"{self.documents:,} documents, {what}{self.tokens:,} tokens{eod} from "
                 f"{self.input_bytes / 1e6:.1f} MB in {self.seconds:.1f}s: {self.mb_per_s:.2f} MB/s "
                 f"({self.mb_per_s / self.workers:.2f} MB/s per worker, {self.workers} workers)"]
        for reason, numbers in sorted(self.bad_lines.items()):
            shown = ", ".join(map(str, numbers[:10])) + (" ..." if len(numbers) > 10 else "")
            lines.append(f"  {len(numbers)} line(s) {reason}: line {shown}")
        return "\n".join(lines)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence: split after sentence-final punctuation and at newlines,
    surrounding whitespace left out, blank pieces dropped."""
    spans = []
    for m in _SENTENCE_END.finditer(text):
        piece = m.group(0)
        if piece.strip():
            start = m.start() + len(piece) - len(piece.lstrip())
            spans.append((start, start + len(piece.strip())))
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences of :func:`sentence_spans` as strings."""
    return [text[a:b] for a, b in sentence_spans(text)]


def parse_line(raw: bytes, fmt: str, field_name: str, entities_field: str | None = None):
    """``((text, entity spans), None)`` or ``(None, reason)`` for one input line. Entity spans come
    from ``entities_field`` of a jsonl line: a list of ``{"start": i, "end": j}`` character spans."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"are not valid UTF-8 (byte {e.start})"
    line = line.rstrip("\r\n")
    if fmt == "jsonl":
        if not line.strip():
            return None, "are empty"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            return None, "are not valid JSON"
        if not isinstance(obj, dict) or field_name not in obj:
            return None, f"have no {field_name!r} field"
        text = obj[field_name]
        if not isinstance(text, str):
            return None, f"have a {field_name!r} field that is not a string"
    else:
        text, obj = line, {}
    if not text.strip():
        return None, "are empty"
    spans = []
    if entities_field:
        entities = obj.get(entities_field, [])
        try:
            spans = [(int(e["start"]), int(e["end"])) for e in entities]
        except (TypeError, KeyError, ValueError):
            return None, f"have a {entities_field!r} field that is not a list of {{start, end}} spans"
        if any(not 0 <= a < b <= len(text) for a, b in spans):
            return None, f"have {entities_field!r} spans outside the text"
    return (text, spans), None


# ------------------------------------------------------------------------------ workers
_STATE: dict = {}


def _init_worker(tokenizer: str, masking: bool, phrases: list[str] | None = None, eod: int | None = None) -> None:
    from zhnlp.tokenizers import AutoTokenizer

    _STATE["tokenizer"] = AutoTokenizer.from_pretrained(tokenizer)
    _STATE["eod"] = eod  # causal LM: documents whole, each followed by this id
    if masking:
        from zhnlp.tokenizers.segment import Segmenter

        _STATE["segmenter"] = Segmenter()
    _STATE["masking"] = masking
    _STATE["phrases"] = set(phrases) if phrases else None


def _unit_ids(sentence: str, offsets, entities: list[tuple[int, int]]) -> np.ndarray:
    """Whole-word units; phrases of the phrase dictionary and entity spans as single units."""
    from zhnlp.tokenizers import masking as M

    seg = _STATE["segmenter"]
    if not entities and not _STATE["phrases"]:
        return M.whole_word_unit_ids(sentence, offsets, seg)
    units = M.phrase_units(sentence, offsets, seg, _STATE["phrases"])
    if entities:
        units = M.combine_units(M.entity_units(sentence, offsets, entities), units)
    return M.units_to_ids(units, len(offsets))


def _encode_documents(docs: list[tuple[str, list]]) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """Token ids and unit ids of every sentence of every ``(text, entity spans)`` document,
    tokenised in one batch (the Rust tokenizer's batch call avoids per-sentence Python overhead).
    Causal LM: one sequence per document, EOD appended, no units."""
    if _STATE["eod"] is not None:
        encodings = _STATE["tokenizer"].backend_tokenizer.encode_batch([t for t, _ in docs], add_special_tokens=False)
        return [([np.asarray([*enc.ids, _STATE["eod"]], dtype=np.int32)], None) if enc.ids else ([], None)
                for enc in encodings]
    spans = [sentence_spans(text) for text, _ in docs]
    flat = [text[a:b] for (text, _), doc in zip(docs, spans) for a, b in doc]
    encodings = _STATE["tokenizer"].backend_tokenizer.encode_batch(flat, add_special_tokens=False)
    out, i = [], 0
    for (text, entities), doc in zip(docs, spans):
        encs = [e for e in encodings[i:i + len(doc)]]
        i += len(doc)
        kept = [(span, enc) for span, enc in zip(doc, encs) if enc.ids]
        ids = [np.asarray(enc.ids, dtype=np.int32) for _, enc in kept]
        if not _STATE["masking"]:
            units = [np.full(len(x), -1, dtype=np.int32) for x in ids]
        elif not entities and not _STATE["phrases"]:
            units = _document_word_units(text, kept)
        else:
            units = [_unit_ids(text[a:b], enc.offsets, [(s - a, e - a) for s, e in entities if a <= s and e <= b])
                     for (a, b), enc in kept]
        out.append((ids, units))
    return out


def _document_word_units(text: str, sentences) -> list[np.ndarray]:
    """Whole-word unit ids for every ``((start, end), encoding)`` sentence of one document,
    segmenting the document once. Equal to segmenting sentence by sentence: sentences end at
    punctuation or newlines, where jieba starts a new block anyway."""
    words_end = np.cumsum([len(w) for w in _STATE["segmenter"].cut(text)])  # word k covers [end[k-1], end[k])
    out = []
    for (a, _), enc in sentences:
        bounds = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        word = np.searchsorted(words_end, bounds[:, 0] + a, side="right")  # the word each token starts in
        out.append(np.unique(word, return_inverse=True)[1].astype(np.int32).reshape(-1))
    return out


def _process_chunk(args):
    """(first line number, raw lines, format, field) -> documents and bad lines, in order."""
    first, lines, fmt, field_name, entities_field = args
    texts, numbers, bad = [], [], []
    for offset, raw in enumerate(lines):
        text, reason = parse_line(raw, fmt, field_name, entities_field)
        if reason is None:
            texts.append(text)
            numbers.append(first + offset)
        else:
            bad.append((first + offset, reason))
    docs = []
    for number, (ids, units) in zip(numbers, _encode_documents(texts)):
        if ids:
            docs.append((ids, units))
        else:
            bad.append((number, "have no tokens after normalisation"))
    bad.sort()
    return docs, bad, sum(len(x) for x in lines)


def _chunks(paths: list[Path], fmt: str, field_name: str, entities_field: str | None):
    for path in paths:
        line_fmt = fmt if fmt != "auto" else ("jsonl" if path.suffix in (".jsonl", ".json") else "text")
        with open(path, "rb") as f:
            buf, first = [], 1
            for number, raw in enumerate(f, start=1):
                buf.append(raw)
                if len(buf) == _CHUNK_LINES:
                    yield first, buf, line_fmt, field_name, entities_field
                    buf, first = [], number + 1
            if buf:
                yield first, buf, line_fmt, field_name, entities_field


# ------------------------------------------------------------------------------ driver
def preprocess(inputs: list[str | Path], output_prefix: str | Path, tokenizer: str, *, fmt: str = "auto",
               field_name: str = "text", workers: int = 1, on_error: str = "skip", masking: bool = True,
               entities_field: str | None = None, phrases: list[str] | None = None,
               progress: bool = True, overwrite: bool = False, objective: str = "mlm") -> PreprocessReport:
    """Tokenise ``inputs`` into ``output_prefix``.{bin,idx} (+ ``_units`` side data and ``.json``).

    Args:
        inputs: jsonl or plain-text files.
        output_prefix: path prefix of the outputs.
        tokenizer: name or directory for :func:`zhnlp.AutoTokenizer.from_pretrained`.
        fmt: ``jsonl``, ``text`` or ``auto`` (by file suffix).
        field_name: the jsonl field holding the text.
        workers: worker processes.
        on_error: ``skip`` bad lines (reported) or ``fail`` on the first run that has any.
        masking: compute masking units as side data: jieba words (Chinese whole-word masking),
            and, for ERNIE's knowledge masking, phrases and entities as single units.
        entities_field: jsonl field with entity spans ``[{"start", "end"}, ...]`` per document
            (e.g. ``zhnlp data fetch peoples-daily-1998``'s ``entities.jsonl``).
        phrases: multi-word phrases to mask as one unit where jieba's words form them.
        overwrite: replace a corpus already at ``output_prefix`` (else refused; the old files stay
            intact until the new ones are complete either way).
        objective: ``mlm`` (sentences with masking units, for the encoders) or ``causal-lm`` (whole
            documents each followed by the tokenizer's EOD id, no side data, for the decoders).

    Raises:
        PreprocessError: missing or unreadable inputs, bad settings, or a corpus with no usable
            line (nothing is written then).
        OutputExistsError: files at ``output_prefix`` exist and ``overwrite`` is False.
    """
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from zhnlp.data.pretraining import CORPUS_FILES
    from zhnlp.fileio import refuse_existing

    paths = [Path(p) for p in inputs]
    if not paths:
        raise PreprocessError("no input files given; pass --input FILE [FILE ...].")
    folders = [str(p) for p in paths if p.is_dir()]
    if folders:
        raise PreprocessError(f"--input {', '.join(folders)}: a directory, not a file; pass the jsonl or text files "
                              "inside it (e.g. DIR/*.jsonl).")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise PreprocessError(f"input files not found: {missing}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PreprocessError(f"workers must be an integer >= 1, got {workers!r}")
    prefix = Path(output_prefix)
    if prefix.is_dir():
        raise PreprocessError(f"--output {prefix} is a directory; pass a prefix for the files, e.g. {prefix}/corpus "
                              f"for {prefix}/corpus.bin and .idx.")
    refuse_existing([Path(f"{prefix}{suffix}") for suffix in (*CORPUS_FILES, ".json")], overwrite=overwrite,
                    flag="--output", what="a preprocessed corpus")
    if on_error not in ("skip", "fail"):
        raise PreprocessError(f"on_error must be 'skip' or 'fail', not {on_error!r}")
    if fmt not in ("auto", "jsonl", "text"):
        raise PreprocessError(f"fmt must be 'auto', 'jsonl' or 'text', not {fmt!r}")
    if objective not in OBJECTIVES:
        raise PreprocessError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    causal = objective == "causal-lm"
    if causal and (entities_field or phrases):
        raise PreprocessError("--entities-field and --phrases are masking units for masked-LM pretraining; drop "
                              "them with --objective causal-lm.")
    from zhnlp.tokenizers import AutoTokenizer

    # load it here first: a tokenizer that fails inside the pool's initializer would be retried forever
    eod_token, eod = _eod(AutoTokenizer.from_pretrained(tokenizer), tokenizer) if causal else (None, None)
    masking = masking and not causal
    prefix.parent.mkdir(parents=True, exist_ok=True)
    total_bytes = sum(p.stat().st_size for p in paths)
    report = PreprocessReport(workers=workers, objective=objective)
    tmp = {k: prefix.with_name(f"{prefix.name}{k}.tmp{os.getpid()}") for k in (("",) if causal else ("", "_units"))}
    builders = {k: IndexedDatasetBuilder(str(v) + ".bin", dtype=np.int32) for k, v in tmp.items()}
    start = time.perf_counter()
    bar = _progress(total_bytes, progress)
    try:
        if workers > 1:
            # spawn: the workers must not inherit torch/megatron state (threads, process groups)
            pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker,
                                                initargs=(tokenizer, masking, phrases, eod))
            results = pool.imap(_process_chunk, _chunks(paths, fmt, field_name, entities_field))
        else:
            pool = None
            _init_worker(tokenizer, masking, phrases, eod)
            results = map(_process_chunk, _chunks(paths, fmt, field_name, entities_field))
        for docs, bad, nbytes in results:
            for line, reason in bad:
                report.bad_lines.setdefault(reason, []).append(line)
            if bad and on_error == "fail":
                raise PreprocessError("bad input lines (on_error='fail'): "
                                      + report.summary().split("\n", 1)[1].strip())
            for ids, units in docs:
                for i, seq_ids in enumerate(ids):
                    builders[""].add_item(_tensor(seq_ids))
                    if units is not None:
                        builders["_units"].add_item(_tensor(units[i]))
                    report.tokens += len(seq_ids)
                report.sentences += len(ids)
                report.documents += 1
                for builder in builders.values():
                    builder.end_document()
            report.input_bytes += nbytes
            bar.update(nbytes)
        if pool is not None:
            pool.close()
            pool.join()
    except BaseException:
        for k, v in tmp.items():
            builders[k].data_file.close()
            for suffix in (".bin", ".idx"):
                Path(str(v) + suffix).unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    if report.sentences == 0:  # an empty dataset would only fail later, inside pretraining
        for k, v in tmp.items():
            builders[k].data_file.close()
            Path(str(v) + ".bin").unlink(missing_ok=True)
        reasons = "; ".join(x.strip() for x in report.summary().split("\n")[1:])
        bad = f" ({report.bad_count} bad line(s): {reasons})" if report.bad_count else ""
        raise PreprocessError(f"{', '.join(map(str, paths))}: no usable text{bad}; nothing was written. Check the "
                              f"format (--format, --field) or pass a corpus with text in it.")
    for k, v in tmp.items():
        builders[k].finalize(str(v) + ".idx")
    if causal:  # a masked-LM corpus replaced by --overwrite must not leave its side data behind
        for suffix in (".bin", ".idx"):
            Path(f"{prefix}_units{suffix}").unlink(missing_ok=True)
    report.seconds = time.perf_counter() - start
    checksums = {}
    for k, v in tmp.items():
        for suffix in (".bin", ".idx"):
            final = Path(f"{prefix}{k}{suffix}")
            os.replace(str(v) + suffix, final)
            checksums[f"{k}{suffix}"] = hashlib.sha256(final.read_bytes()).hexdigest()
    counts = {k: v for k, v in asdict(report).items() if k not in ("seconds", "workers", "objective")}  # reproducible
    meta = {"inputs": [str(p) for p in paths], "tokenizer": tokenizer, "objective": objective, "format": fmt,
            "field": field_name, "masking": (("entity+" if entities_field else "") + ("phrase+" if phrases else "")
                                             + "word") if masking else None}
    if causal:
        meta.update(eod_token=eod_token, eod_token_id=eod)
    meta.update(counts=counts, sha256=checksums)
    Path(f"{prefix}.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return report


def _eod(tok, name: str) -> tuple[str, int]:
    """The end-of-document token of a causal-LM corpus: the tokenizer's eos token, else its [SEP]."""
    for attr in ("eos_token", "sep_token"):
        token = getattr(tok, attr, None)
        if token is not None:
            return token, int(tok.convert_tokens_to_ids(token))
    raise PreprocessError(f"tokenizer {name} has neither an eos nor a sep token to end documents with "
                          "(--objective causal-lm); use a tokenizer that defines one.")


def _tensor(array: np.ndarray):
    import torch

    return torch.from_numpy(array)


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="preprocess")


def add_cli(subparsers) -> None:
    """``zhnlp preprocess``: see this module's docstring."""
    from zhnlp.argtypes import input_file, positive

    p = subparsers.add_parser("preprocess", help="tokenise a corpus into a megatron indexed dataset",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs="+", required=True, type=input_file, help="jsonl or plain-text files")
    p.add_argument("--output", required=True, help="output prefix (PREFIX.bin/.idx, PREFIX_units.*, PREFIX.json)")
    p.add_argument("--objective", choices=OBJECTIVES, default="mlm",
                   help="mlm: sentences with masking units (encoders); causal-lm: whole documents each followed "
                        "by the tokenizer's EOD token, no side data (decoders, zhnlp pretrain --recipe ernie4.5-*)")
    p.add_argument("--tokenizer", required=True, help="tokenizer name or directory holding vocab.txt")
    p.add_argument("--format", choices=["auto", "jsonl", "text"], default="auto")
    p.add_argument("--field", default="text", help="jsonl field holding the text")
    p.add_argument("--workers", type=positive, default=max(1, (os.cpu_count() or 1)))
    p.add_argument("--on-error", choices=["skip", "fail"], default="skip",
                   help="bad lines: leave them out (reported) or stop")
    p.add_argument("--no-masking", action="store_true", help="skip whole-word units (no jieba)")
    p.add_argument("--entities-field", help="jsonl field of entity spans to mask as units (ERNIE entity masking)")
    p.add_argument("--phrases", type=input_file, help="file of phrases, one per line, to mask as units (ERNIE phrase masking)")
    p.add_argument("--overwrite", action="store_true", help="replace a corpus already at --output")
    p.set_defaults(func=_run_cli)


def _run_cli(args) -> int:
    phrases = None
    if args.phrases:
        try:
            text = Path(args.phrases).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise PreprocessError(f"--phrases {args.phrases} is not UTF-8 (byte {e.start}); convert it, e.g. with "
                                  "iconv -t UTF-8.") from None
        phrases = [p.strip() for p in text.splitlines() if p.strip()]
    report = preprocess(args.input, args.output, args.tokenizer, fmt=args.format, field_name=args.field,
                        workers=args.workers, on_error=args.on_error, masking=not args.no_masking,
                        entities_field=args.entities_field, phrases=phrases,
                        progress=logging.getLogger("zhnlp").isEnabledFor(logging.INFO),  # -q: no bar
                        overwrite=args.overwrite, objective=args.objective)
    print(report.summary())
    units = "" if args.objective == "causal-lm" else f"{args.output}_units.bin/.idx, "
    print(f"wrote {args.output}.bin/.idx, {units}{args.output}.json")
    return 0
