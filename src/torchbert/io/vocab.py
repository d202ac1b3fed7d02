"""vocab.txt and tokenizer_config.json, read with errors that name the file and line: the files of a
BERT tokenizer (tokenizer.py builds the tokenizer from them); or a tokenizer.json alone, which is all
that transformers 5 (and so sentence-transformers) writes for a BERT."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from .texts import CONFIG_BYTES, read_json

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
REQUIRED_SPECIAL_TOKENS = (PAD, UNK, CLS, SEP)  # [MASK] is only needed for pretraining
# transformers writes int(1e30) as "no limit known"; anything above this is treated as that.
ABSURD_MODEL_MAX_LENGTH = 1_000_000


class VocabError(ValueError):
    """A vocabulary (file or dict) that BERT's tokenizer cannot use."""


def check_vocab_size(vocab: Path, vocab_size: int, config: Path) -> None:
    """ValueError when `vocab` holds more tokens than the model's embedding table (`vocab_size`, from
    `config`): ids past it would index nothing. Counted without reading the file whole, and stopped
    as soon as it is too long (a 10^7-line vocab.txt took 36 s and 3.5 GB to load unchecked)."""
    lines = 0
    with open(vocab, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            lines += block.count(b"\n")
            if lines > vocab_size:
                raise ValueError(f"{vocab}: more tokens than the {vocab_size:,} of {config}'s vocab_size; the "
                                 "vocabulary does not belong to this model")


def check_against_model(vocab: Path) -> None:
    """A vocab.txt beside a model's config.json: no longer than the model's vocab_size."""
    config = vocab.parent / "config.json"
    if not config.is_file():
        return
    try:
        size = read_json(config, dict, "config.json", CONFIG_BYTES).get("vocab_size")
    except (OSError, ValueError):
        return  # the model's loading says what is wrong with it
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        check_vocab_size(vocab, size, config)


def read_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read a vocab.txt: one token per line, the line number (from 0) is its id."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no vocab.txt (file not found)")
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark is not part of the first token
        data = data[3:]
    if not data.strip():
        raise VocabError(f"{path}: vocab.txt is empty")
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the file's final newline
        lines.pop()
    vocab: dict[str, int] = {}
    for index, raw in enumerate(lines):
        lineno = index + 1
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            token = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VocabError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
        if token == "":
            raise VocabError(f"{path}:{lineno}: empty line (every line must hold one token)")
        if token in vocab:
            raise VocabError(f"{path}:{lineno}: duplicate token {token!r} (first on line {vocab[token] + 1})")
        vocab[token] = index
    check_vocab(vocab, where=str(path))
    return vocab


def check_vocab(vocab: dict[str, int], where: str) -> None:
    missing = [t for t in REQUIRED_SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise VocabError(
            f"{where}: vocab lacks special token(s) {' '.join(missing)} "
            f"(BERT needs {' '.join(REQUIRED_SPECIAL_TOKENS)})"
        )
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise VocabError(f"{where}: token ids must be 0..{len(ids) - 1}, each used once")


def read_tokenizer_config(path: Path) -> dict[str, Any]:
    """The settings we honour from a tokenizer_config.json (missing keys keep BERT's defaults)."""
    cfg = read_json(path, dict, "tokenizer_config.json", 64 << 20)
    out: dict[str, Any] = {}
    for key, arg, allowed in (
        ("do_lower_case", "lowercase", (bool,)),
        ("strip_accents", "strip_accents", (bool, type(None))),
        ("tokenize_chinese_chars", "tokenize_chinese_chars", (bool,)),
    ):
        if key in cfg:
            if not isinstance(cfg[key], allowed):
                raise ValueError(f"{path}: {key} must be {' or '.join(a.__name__ for a in allowed)}, got {cfg[key]!r}")
            out[arg] = cfg[key]
    limit = cfg.get("model_max_length")
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and 0 < limit <= ABSURD_MODEL_MAX_LENGTH:
        out["model_max_length"] = int(limit)
    # None, int(1e30) ("unknown") or nonsense: keep BERT's 512.
    return out


SPECIAL_ROLES = {"pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP, "mask_token": MASK}


def check_special_tokens(folder: Path) -> None:
    """The special tokens a tokenizer folder names (special_tokens_map.json, tokenizer_config.json) are
    BERT's, the ones torchbert's tokenizer uses; one that is another token is a ValueError naming the file
    and the role (its ids would differ from transformers'). A special_tokens_map.json that cannot be read
    is a warning naming it: BERT's tokens are used (transformers reads such a file only for these roles)."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            saved = read_json(path, dict, name, 64 << 20)
        except ValueError as e:
            if name == "tokenizer_config.json":
                raise  # read_tokenizer_config says so as well; its casing changes every token
            warnings.warn(f"{e}; BERT's special tokens ({', '.join(SPECIAL_TOKENS)}) are used", stacklevel=3)
            continue
        for role, ours in SPECIAL_ROLES.items():
            value = saved.get(role)
            token = value.get("content") if isinstance(value, dict) else value
            if token is not None and token != ours:
                shown = token if isinstance(token, str) and len(token) <= 40 else f"{str(token)[:40]}..."
                raise ValueError(f"{path}: {role} is {shown!r}; torchbert's BERT tokenizer uses {ours} (the ids of "
                                 "another special token would differ from transformers')")


def tokenizer_json_bytes(vocab_size: int | None) -> int:
    """The most a BERT tokenizer.json of `vocab_size` tokens takes (a token of 100 characters of 4 bytes,
    its id and JSON around it, twice over), so that a larger file is refused before it is parsed."""
    return (1 << 20) + 1024 * vocab_size if vocab_size else 1 << 30


def read_tokenizer_json(path: Path, max_bytes: int = 1 << 30) -> tuple[dict[str, int], dict[str, Any]]:
    """The vocabulary and the normalizer's settings of a BERT tokenizer.json (model WordPiece with
    `##` pieces, BertNormalizer, BertPreTokenizer); anything else is a VocabError naming what it is,
    never a tokenizer that splits text differently. A file over max_bytes is refused unread."""
    try:
        cfg = read_json(path, dict, "tokenizer.json", max_bytes)
    except ValueError as e:
        raise VocabError(str(e)) from None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    norm = (cfg.get("normalizer") if isinstance(cfg, dict) else None) or {}
    pre = (cfg.get("pre_tokenizer") if isinstance(cfg, dict) else None) or {}
    if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        kind = model.get("type") if isinstance(model, dict) else None
        raise VocabError(f"{path}: a {kind or 'unknown'} tokenizer; BERT's tokenizer is WordPiece")
    if model.get("continuing_subword_prefix", "##") != "##" or norm.get("type") != "BertNormalizer" \
            or pre.get("type") != "BertPreTokenizer":
        raise VocabError(f"{path}: normalizer {norm.get('type')}, pre-tokenizer {pre.get('type')}, pieces "
                         f"{model.get('continuing_subword_prefix')!r}; torchbert reproduces BERT's (BertNormalizer, "
                         "BertPreTokenizer, ##) only")
    vocab = model["vocab"]
    check_vocab(vocab, where=str(path))
    return vocab, {"lowercase": bool(norm.get("lowercase", True)), "strip_accents": norm.get("strip_accents"),
                   "tokenize_chinese_chars": bool(norm.get("handle_chinese_chars", True))}
