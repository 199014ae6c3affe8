"""ERNIE 4.5's tokenizer: a SentencePiece model with ERNIE 4.5's special tokens, added tokens and chat template.

The ERNIE 4.5 repos (``baidu/ERNIE-4.5-0.3B-PT``, ``-21B-A3B-PT``, ...) ship::

    tokenizer.model            the SentencePiece model (<unk> 0, <s> 1, </s> 2, then ERNIE's own pieces)
    tokenizer_config.json      special tokens by role, chat_template, and an auto_map naming the repo's
                               own tokenization_ernie4_5.py
    special_tokens_map.json    the special tokens again (legacy file)
    added_tokens.json          tokens beyond the SentencePiece vocabulary (<|IMAGE_PLACEHOLDER|>, ...), by id

transformers (5.x) never runs that remote code for ``model_type`` ``ernie4_5``/``ernie4_5_moe``: its
``AutoTokenizer`` builds a fast (Rust ``tokenizers``) pipeline from ``tokenizer.model`` and registers the special
and added tokens on it. :func:`load_ernie4_5_tokenizer` builds the same pipeline (the same SentencePiece
converter, no bos/eos around the text, the same special and added tokens with the same flags, the same chat
template), so the ids equal transformers' on every text; neither executes the repo's Python file.

The roles: ``bos`` ``<s>``, ``eos`` ``</s>``, ``unk`` and ``pad`` ``<unk>`` (id 0, which is also the model's
``pad_token_id``), ``cls`` ``<|begin_of_sentence|>`` and ``sep`` ``<|end_of_sentence|>`` (the chat template's
turn markers), ``mask`` ``<mask:1>``; ``sys_start``/``sys_end``/``header_start``/``header_end`` are
``<mask:4>``..``<mask:7>``. Encoding adds no special tokens around the text (``add_special_tokens`` changes
nothing), as ERNIE 4.5's own tokenizer does; the chat template writes ``<|begin_of_sentence|>`` itself::

    <|begin_of_sentence|>{system}\\nUser: {user}\\nAssistant: {reply}<|end_of_sentence|>User: ...\\nAssistant:

:func:`train_ernie4_5_tokenizer` trains such a model on a corpus and writes the four files, so that tests and
small pretraining runs have a tokenizer in the real layout (the real ``tokenizer.model`` is not reachable here).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import AddedToken, PreTrainedTokenizerFast

from zhnlp.errors import TokenizerError

MODEL_FILE = "tokenizer.model"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_MAP_FILE = "special_tokens_map.json"
ADDED_FILE = "added_tokens.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # transformers 5's file; wins over tokenizer_config's chat_template

# tokenizer_config.json "tokenizer_class" values of ERNIE 4.5 repos (the remote-code class, and what transformers
# itself would write)
TOKENIZER_CLASSES = {"Ernie4_5_Tokenizer", "Ernie4_5Tokenizer", "Ernie4_5_VLTokenizer"}
MODEL_TYPES = {"ernie4_5", "ernie4_5_moe"}

# The roles transformers knows by name, and ERNIE 4.5's own named special tokens.
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
                  "cls_token": "<|begin_of_sentence|>", "sep_token": "<|end_of_sentence|>", "mask_token": "<mask:1>"}
NAMED_SPECIAL_TOKENS = {"sys_start_token": "<mask:4>", "sys_end_token": "<mask:5>",
                        "header_start_token": "<mask:6>", "header_end_token": "<mask:7>"}
_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Pieces inside the SentencePiece model after <unk> <s> </s> (user-defined: matched whole in raw text).
MODEL_PIECES = ["<|begin_of_sentence|>", "<|end_of_sentence|>"] + [f"<mask:{i}>" for i in range(8)]
# Tokens after the SentencePiece vocabulary (added_tokens.json), as in the multimodal-ready ERNIE 4.5 vocabulary.
ADDED_TOKENS = ["<|IMAGE_PLACEHOLDER|>", "<|AUDIO_PLACEHOLDER|>", "<|IMAGE_START|>", "<|IMAGE_END|>",
                "<|VIDEO_START|>", "<|VIDEO_END|>"]

# ERNIE 4.5's conversation format: the system text and each user turn end with a newline, each assistant reply
# with <|end_of_sentence|>; the prompt for a reply is "Assistant: ".
CHAT_TEMPLATE = (
    "{{- cls_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{- message['content'] + '\\n' -}}"
    "{%- elif message['role'] == 'user' -%}{{- 'User: ' + message['content'] + '\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' + message['content'] + sep_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant: ' -}}{%- endif -%}")

_FIX = ("use the tokenizer files that came with the model, or write them with "
        "zhnlp.tokenizers.train_ernie4_5_tokenizer (`zhnlp tokenizer train-ernie4_5`)")


def is_ernie4_5_layout(directory: Path, tokenizer_config: dict) -> bool:
    """True for a directory in the ERNIE 4.5 layout: its tokenizer_config names the ERNIE 4.5 tokenizer class,
    or its config.json is an ``ernie4_5``/``ernie4_5_moe`` model and it holds ``tokenizer.model``."""
    if tokenizer_config.get("tokenizer_class") in TOKENIZER_CLASSES:
        return True
    config = directory / "config.json"
    if not (directory / MODEL_FILE).is_file() or not config.is_file():
        return False
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False  # not this loader's file to judge; loading the model names the problem
    return model_type in MODEL_TYPES


def _json_object(file: Path) -> dict:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file} is not valid JSON ({e}); {_FIX}.") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{file} holds a JSON {type(value).__name__}, not an object; {_FIX}.")
    return value


def _token_text(value, file: Path, key: str) -> str | None:
    """A special token as written in tokenizer_config/special_tokens_map: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{file}: {key} is {value!r}, neither a token string nor an object with 'content'; {_FIX}.")


def load_ernie4_5_tokenizer(directory: str | os.PathLike, **kwargs) -> PreTrainedTokenizerFast:
    """The fast tokenizer of an ERNIE 4.5 directory (the layout above), with transformers' ids.

    ``kwargs`` override the files' settings (special tokens, ``model_max_length``, ``padding_side``, ...).
    Raises :class:`~zhnlp.errors.TokenizerError` naming the file for a missing or corrupt ``tokenizer.model``, a
    malformed JSON file or an ``added_tokens.json`` whose ids do not follow the SentencePiece vocabulary.
    """
    from zhnlp.tokenizers.sentencepiece import _processor, build_backend, read_model_proto

    directory = Path(directory)
    model_file = directory / MODEL_FILE
    if not model_file.is_file():
        raise TokenizerError(f"{directory} has no {MODEL_FILE}: an ERNIE 4.5 tokenizer is a SentencePiece model "
                             f"({MODEL_FILE}) with {CONFIG_FILE}; {_FIX}.")
    _processor(model_file)  # sentencepiece's own checks (a truncated or foreign file is one clear error)
    proto = read_model_proto(model_file)
    config_file, map_file, added_file = directory / CONFIG_FILE, directory / SPECIAL_MAP_FILE, directory / ADDED_FILE
    config = _json_object(config_file) if config_file.is_file() else {}
    special_map = _json_object(map_file) if map_file.is_file() else {}

    # Roles: tokenizer_config, then special_tokens_map on top (transformers reads them in this order).
    roles, named = {}, {}
    for source, file in ((config, config_file), (special_map, map_file)):
        for key, value in source.items():
            if key in _ROLES:
                roles[key] = _token_text(value, file, key)
            elif key.endswith("_token") and isinstance(value, (str, dict)):
                named[key] = _token_text(value, file, key)
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if isinstance(extra, dict):  # transformers 5 writes named extra tokens as a dict
        named.update(extra)
        extra = []
    extra = [_token_text(t, config_file, "additional_special_tokens") for t in extra]

    backend = build_backend(model_file, proto, template=False)
    vocab_size = backend.get_vocab_size()
    options = {key: config[key] for key in ("model_max_length", "padding_side", "truncation_side",
                                            "clean_up_tokenization_spaces") if key in config}
    template = config.get("chat_template")
    if (directory / CHAT_TEMPLATE_FILE).is_file():
        template = (directory / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    roles = {key: value for key, value in roles.items() if value is not None}
    # named extra roles (sys_start_token, ...) become attributes, as in transformers
    named = {key: value for key, value in named.items() if value is not None and key not in kwargs}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_input_names=["input_ids", "attention_mask"],
                                        chat_template=template, model_specific_special_tokens=named,
                                        extra_special_tokens=extra, **{**options, **roles, **kwargs})
    specials = set(roles.values()) | set(named.values()) | set(extra)
    if added_file.is_file():
        _add_tokens(tokenizer, _json_object(added_file), added_file, vocab_size, specials)
    return tokenizer


def _add_tokens(tokenizer, added: dict, file: Path, vocab_size: int, specials: set) -> None:
    """Register ``added_tokens.json``'s tokens at their ids (they must continue the vocabulary without gaps)."""
    vocab = tokenizer.get_vocab()
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in added.values()):
        raise TokenizerError(f"{file}: every value must be an integer token id; {_FIX}.")
    for token, index in sorted(added.items(), key=lambda item: item[1]):
        if token in vocab:
            if vocab[token] != index:
                raise TokenizerError(f"{file}: {token!r} has id {index} there but {vocab[token]} in the tokenizer; "
                                     f"{_FIX}.")
            continue
        if index != len(tokenizer):
            raise TokenizerError(f"{file}: {token!r} has id {index}, but the next free id after the "
                                 f"{vocab_size}-piece {MODEL_FILE} and the tokens before it is {len(tokenizer)}; "
                                 f"added tokens must continue the vocabulary without gaps; {_FIX}.")
        special = token in specials
        # matched on the raw text (not normalised), like the special tokens
        tokenizer.add_tokens([AddedToken(token, normalized=False, special=special)], special_tokens=special)


# ---------------------------------------------------------------- training
def train_ernie4_5_tokenizer(corpus_files: list[str | os.PathLike], output_dir: str | os.PathLike, *,
                             vocab_size: int = 32000, model_type: str = "bpe", character_coverage: float = 0.9995,
                             byte_fallback: bool = True, input_sentence_size: int = 2_000_000,
                             max_sentence_length: int = 8192, num_threads: int | None = None,
                             seed: int = 1998) -> PreTrainedTokenizerFast:
    """Train a SentencePiece model on ``corpus_files`` (plain text, one sentence or paragraph a line) and write it
    in the ERNIE 4.5 layout: ``tokenizer.model``, ``tokenizer_config.json`` (special tokens, chat template),
    ``special_tokens_map.json`` and ``added_tokens.json``. Returns the loaded tokenizer.

    ``vocab_size`` counts the SentencePiece pieces (``<unk> <s> </s>``, ERNIE's ``<|begin_of_sentence|>``,
    ``<|end_of_sentence|>`` and ``<mask:0>``..``<mask:7>`` included); the added tokens come after it, so a model
    for this tokenizer needs ``vocab_size`` of at least ``len(tokenizer)``. BPE with byte fallback (the
    default) never produces ``<unk>`` for a character it did not see. ``input_sentence_size`` caps the lines
    sampled (with ``seed``, so a run is repeatable), bounding memory on large corpora.
    """
    import sentencepiece as spm

    from zhnlp.tokenizers.train import check_corpus

    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type={model_type!r}: choose 'bpe' (the default) or 'unigram'.")
    files = check_corpus(corpus_files)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / Path(MODEL_FILE).stem
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            input=files, model_prefix=os.fspath(prefix), vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, byte_fallback=byte_fallback,
            input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
            max_sentence_length=max_sentence_length, num_threads=num_threads or os.cpu_count() or 1,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            user_defined_symbols=MODEL_PIECES, minloglevel=2)
    except RuntimeError as e:  # sentencepiece reports bad settings (vocabulary too small, ...) this way
        raise TokenizerError(f"SentencePiece training failed: {e}") from None
    (out / (prefix.name + ".vocab")).unlink(missing_ok=True)  # the real layout has no .vocab file
    pieces = spm.SentencePieceProcessor(model_file=os.fspath(out / MODEL_FILE)).get_piece_size()
    config = {**SPECIAL_TOKENS, **NAMED_SPECIAL_TOKENS, "additional_special_tokens": None,
              "tokenizer_class": "Ernie4_5_Tokenizer", "model_max_length": 131072, "padding_side": "right",
              "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    _write_json(out / CONFIG_FILE, config)
    _write_json(out / SPECIAL_MAP_FILE, {**SPECIAL_TOKENS, **NAMED_SPECIAL_TOKENS})
    _write_json(out / ADDED_FILE, {token: pieces + i for i, token in enumerate(ADDED_TOKENS)})
    return load_ernie4_5_tokenizer(out)


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
