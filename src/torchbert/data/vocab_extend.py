"""A checkpoint's vocabulary grown with the words of a corpus: what `torchbert vocab --extend` runs.

A public BERT reads a domain's frequent words in many pieces ("pembrolizumab" in seven) and the
characters its vocabulary lacks as [UNK]. `extend_vocabulary` counts the corpus's words as the
checkpoint's own tokenizer splits text into words (its normalizer and pre-tokenizer: lowercasing,
punctuation, one Chinese character a word), and adds, most frequent first, up to `add` of them:
words that its WordPiece splits into `min_pieces` pieces or more, and characters it reads as
[UNK]. A new token takes an [unusedN] slot first, in id order, and is appended after the last id when
none is left, so every old token keeps its id and its row. Every weight with a row per token (the
word embeddings, an untied MLM decoder, the decoder's bias) gives a new token the mean of the rows
of the pieces that the old vocabulary made of it (a character that was [UNK]: [UNK]'s row), as
bert4keras initialises new words. The folder is the checkpoint's with vocab.txt, tokenizer.json,
config.json's vocab_size and the weights changed, so it loads in torchbert and transformers alike.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..settings import Checked, setting

UNUSED = re.compile(r"\[unused\d+\]")
CONTINUED = "##"


@dataclass(kw_only=True)
class ExtendSettings(Checked):
    extend: str | None = setting(None, "a model folder (or `minilm`, a hub id) whose vocabulary to grow with "
                                       "--corpus's frequent words instead of training one: --out gets the model with "
                                       "the new tokens' rows started as the mean of their old pieces' rows",
                                 metavar="CHECKPOINT")
    add: int = setting(1000, "with --extend: at most this many new tokens, the most frequent first", low=1)
    min_pieces: int = setting(3, "with --extend: a word is added when the checkpoint splits it into this many pieces "
                                 "or more (a character it reads as [UNK] always is)", low=2)


@dataclass
class Extension:
    """What was added: each new token with its id and the old ids its row was made from; and the
    corpus's word pieces before and after, per word."""

    added: list[tuple[str, int, list[int]]]
    old_size: int
    new_size: int
    pieces_before: float
    pieces_after: float
    unknown_before: float  # the share of the corpus's words read as [UNK]
    unknown_after: float


MAX_WORDS = 4_000_000  # distinct words held while counting (a few hundred MB); the rarest go past it


def count_words(tok, texts, max_words: int = MAX_WORDS) -> Counter:
    """The words of `texts` as `tok` cuts them before WordPiece. Memory stays bounded on a corpus of
    any size: when more than `max_words` distinct words are held, the rarest are dropped (those seen
    once, then twice, ..., until at most half are left), as a vocabulary trainer prunes its counts; a
    word dropped early is one that could not have been among the most frequent anyway."""
    normalize, split = tok.backend.normalizer.normalize_str, tok.backend.pre_tokenizer.pre_tokenize_str
    counts: Counter = Counter()
    for text in texts:
        counts.update(w for w, _ in split(normalize(text)))
        if len(counts) > max_words:
            prune(counts, max_words // 2)
    return counts


def prune(counts: Counter, keep: int) -> None:
    """Drop `counts`' rarest words, the least frequent first, until at most `keep` are left."""
    floor = 1
    while len(counts) > keep:
        for word in [w for w, n in counts.items() if n <= floor]:
            del counts[word]
        floor += 1


def candidates(tok, counts: Counter, add: int, min_pieces: int, min_frequency: int) -> list[tuple[str, list[int]]]:
    """The tokens to add, most frequent first (ties by the token), each with the old ids that make its row."""
    model, unk = tok.backend.model, tok.unk_token_id
    found: Counter = Counter()
    pieces: dict[str, list[int]] = {}
    for word, n in counts.items():
        if word in tok.vocab:
            continue
        ids = [t.id for t in model.tokenize(word)]
        if unk in ids:  # a character the vocabulary lacks makes the whole word [UNK]: add the character
            for ch in word:
                if ch not in tok.vocab and CONTINUED + ch not in tok.vocab:
                    found[ch] += n
                    pieces[ch] = [unk]
        elif len(ids) >= min_pieces:
            found[word] += n
            pieces[word] = ids
    ranked = sorted((t for t in found if found[t] >= min_frequency), key=lambda t: (-found[t], t))
    return [(t, pieces[t]) for t in ranked[:add]]


def grown_vocab(vocab: dict[str, int], new: list[str]) -> dict[str, int]:
    """`vocab` with `new` tokens in its [unusedN] slots, in id order, then after its last id."""
    slots = sorted((i for t, i in vocab.items() if UNUSED.fullmatch(t)))
    grown = dict(vocab)
    by_id = {i: t for t, i in vocab.items()}
    end = max(vocab.values()) + 1
    for k, token in enumerate(new):
        if k < len(slots):
            del grown[by_id[slots[k]]]
            grown[token] = slots[k]
        else:
            grown[token] = end
            end += 1
    return grown


def grown_weights(state: dict, old_size: int, new_size: int, rows: dict[int, list[int]]) -> list[str]:
    """Every tensor of `state` with a row per token, grown to `new_size` rows in place: row i of
    `rows` the mean of the old rows it names. Returns the names of the tensors grown."""
    import torch

    grown = []
    for name, t in state.items():
        if t.dim() not in (1, 2) or t.shape[0] != old_size or not t.is_floating_point():
            continue
        out = torch.cat([t, t.new_zeros((new_size - old_size, *t.shape[1:]))]) if new_size > old_size else t.clone()
        for i, old in rows.items():
            out[i] = t[old].float().mean(0).to(t.dtype)
        state[name] = out
        grown.append(name)
    return grown


def extend_vocabulary(model_dir: Path, texts, out: Path, add: int, min_pieces: int, min_frequency: int) -> Extension:
    """`model_dir` with its vocabulary grown by `texts`' words, written whole to `out` (or nothing)."""
    from safetensors.torch import save_file

    from ..io.files import atomic_folder, atomic_write, atomic_write_text
    from ..io.hf import find_weights, read_weights
    from ..io.texts import CONFIG_BYTES, read_json
    from ..tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(model_dir)
    config = read_json(model_dir / "config.json", what="config.json", max_bytes=CONFIG_BYTES)
    old_size = int(config.get("vocab_size", tok.vocab_size))
    if tok.vocab_size != old_size:
        raise ValueError(f"{model_dir}: vocab.txt holds {tok.vocab_size:,} tokens and config.json's vocab_size is "
                         f"{old_size:,}; the vocabulary does not belong to this model")
    counts = count_words(tok, texts)
    if not counts:
        raise ValueError("--corpus: no words in it")
    new = candidates(tok, counts, add, min_pieces, min_frequency)
    vocab = grown_vocab(tok.vocab, [t for t, _ in new])
    new_size = max(vocab.values()) + 1
    state = read_weights(find_weights(model_dir))
    rows = {vocab[t]: ids for t, ids in new}
    if new and not grown_weights(state, old_size, new_size, rows):
        raise ValueError(f"{model_dir}: no weight has a row per token ({old_size:,} rows): not a BERT checkpoint")
    grown = BertTokenizer(vocab, lowercase=tok.lowercase, strip_accents=tok.strip_accents,
                          tokenize_chinese_chars=tok.tokenize_chinese_chars, model_max_length=tok.model_max_length)
    before, unknown_before = reading(tok, counts)
    after, unknown_after = reading(grown, counts)
    weights = find_weights(model_dir).name
    with atomic_folder(out, marked=True) as folder:
        for item in model_dir.iterdir():  # what else the checkpoint holds (sentence-transformers' modules ...)
            if item.name in (weights, "vocab.txt", "tokenizer.json", "config.json") or item.name.startswith("."):
                continue
            if item.name.endswith((".safetensors", ".bin", ".index.json", ".h5", ".msgpack", ".onnx")):
                continue  # weights in other formats: the old vocabulary's
            (shutil.copytree if item.is_dir() else shutil.copyfile)(item, folder / item.name)
        grown.save_pretrained(folder)
        atomic_write_text(folder / "config.json", json.dumps({**config, "vocab_size": new_size}, indent=2) + "\n")
        atomic_write(folder / "model.safetensors",
                     lambda tmp: save_file({k: v.contiguous() for k, v in state.items()}, tmp, metadata={"format": "pt"}))
    return Extension([(t, vocab[t], ids) for t, ids in new], old_size, new_size, before, after, unknown_before,
                     unknown_after)


def extend_from_corpus(model_dir: Path, s, e: ExtendSettings, out: Path) -> Extension:
    """`vocab --extend`: `model_dir` grown with the words of VocabSettings `s`'s corpus (its files read
    as streams, a sentence at a time) by ExtendSettings `e`, written whole to `out`."""
    from .pretraining import split_sentences
    from .sources import corpus_documents, corpus_files
    from .vocabulary import check_corpus

    check_corpus(s.corpus)
    texts = (sent for docs in corpus_documents(corpus_files(s.corpus), "auto", 8 << 20, split_sentences, s.text_field)
             for d in docs for sent in d)
    return extend_vocabulary(model_dir, texts, out, e.add, e.min_pieces, s.min_frequency)


def reading(tok, counts: Counter) -> tuple[float, float]:
    """How `tok` reads the counted words: pieces a word, and the share of words that are [UNK]."""
    pieces = unknown = 0
    for word, n in counts.items():
        ids = [t.id for t in tok.backend.model.tokenize(word)]
        pieces += n * len(ids)
        unknown += n * (tok.unk_token_id in ids)
    total = sum(counts.values())
    return pieces / total, unknown / total
