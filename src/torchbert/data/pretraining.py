"""From a raw corpus to BERT pretraining instances: documents -> NSP pairs -> masked tokens.

The recipe is the BERT paper's (Devlin et al. 2018, section 3.1 and appendix A.1) as Google's
create_pretraining_data.py runs it, rewritten for speed: sentences are tokenized in one batched
Rust call, instances are (start, length) ranges into one flat token array, and masking is numpy over
all instances at once.  Python loops run per sentence and per instance, never per token.

Notation: T flat corpus tokens, S sentences, D documents, n instances, N instance tokens.

1. Read documents (`read_documents`): lists of sentences, from one of three layouts:
   - `bert`: one sentence per line, a blank line between documents (Google's layout);
   - `text`: each non-empty line a paragraph, cut into sentences here; blank lines separate
     documents, or, in a file without blank lines, each line is a document;
   - `jsonl`: one document per line, its `text` field (newlines in it separate paragraphs).
   `auto` picks `jsonl` for .jsonl/.json files; otherwise `bert` when the file has blank lines and at
   least 90% of its non-empty lines hold one sentence as `split_sentences` sees it; else `text`.
2. Tokenize every sentence (`tokenize_corpus`), and flag the tokens that start a word: a `##` piece
   continues the previous token's word; with whole-word masking, a sentence holding Chinese is cut
   into words by jieba and every character after the first of a jieba word continues it too.
3. Pair (`create_pairs`): per document, fill a target length of max_seq_len - 3 tokens (with
   probability short_seq_prob a random target in [2, max]) with whole sentences; A is the first
   1..k-1 of them; B is the rest (IsNext) or, half the time, a span from another document
   (NotNext; the unused sentences go back into the stream).  The pair is cut to fit by dropping
   tokens from the longer segment, from its front or back at random.
4. Mask (`masking.mask_instances`): 15% of the non-special tokens (at most max_predictions); each chosen
   token becomes [MASK] 80%, a random non-special token 10%, itself 10%.  With whole-word masking
   every piece of a chosen word is chosen.  The random numbers are a hash of (seed, epoch,
   instance, position), so the data loader can mask afresh each epoch with nothing to remember.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.texts import not_a_file, read_utf8
from ..settings import Checked, SettingError, seed_setting, setting
from .masking import Masked
from .sources import FORMATS


# A sentence ends after a run of terminators and any closing quotes or brackets.  English . ! ? end
# a sentence only before whitespace or the end (so 3.14 and e.g.x stay whole); Chinese 。！？；…
# end it anywhere.  Abbreviations such as "Mr." do end a sentence here: BERT is not sensitive to it.
_CLOSE = "”’\"'」』）)\\]】》〉"
_SENTENCE = re.compile(
    rf"\S.*?(?:[。！？；…]+[{_CLOSE}]*|[.!?]+[{_CLOSE}]*(?=\s|$)|$)", re.S
)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")


def split_sentences(text: str) -> list[str]:
    """Cut a paragraph into sentences (see _SENTENCE); whitespace between them is dropped."""
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


# ----------------------------------------------------------------------------------------------
# 1. documents


def read_lines(path: Path) -> list[str]:
    """The file's lines, decoded; a bad byte is an error naming the file and the line."""
    if not path.is_file():
        raise not_a_file(path, "corpus file")
    return read_utf8(path).splitlines()


def read_documents(paths: Sequence[str | os.PathLike], fmt: str = "auto", text_field: str = "text"
                   ) -> list[list[str]]:
    """Documents (lists of sentences) of the corpus files, all in memory (small corpora; `prepare`
    streams them, see data/sources.py); documents never span two files."""
    from .sources import corpus_documents, corpus_files

    return [d for docs in corpus_documents(corpus_files(paths), fmt, 1 << 24, split_sentences, text_field)
            for d in docs]


# ----------------------------------------------------------------------------------------------
# 2. tokens


@dataclass
class Corpus:
    """The tokenized corpus: one flat token array and the sentence and document boundaries in it."""

    tokens: np.ndarray        # [T] int32
    word_starts: np.ndarray   # [T] bool, True where a token starts a word
    sent_starts: np.ndarray   # [S+1] int64, token offsets of the sentences
    doc_sents: np.ndarray     # [D+1] int64, sentence offsets of the documents
    doc_ids: np.ndarray | None = None  # [D] int64: which of the documents given each one is (the
    #                                    others held no token)

    @property
    def num_documents(self) -> int:
        return len(self.doc_sents) - 1


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate arange(s, s + l) for each (s, l), without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    # [total]: each output slot's start minus the number of slots before its range
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(total)


def _flatten(lists, total: int, dtype) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(lists), dtype=dtype, count=total)


def _continuation_table(tokenizer) -> np.ndarray:
    """[V] bool: True for `##` pieces, which continue the previous token's word."""
    table = np.zeros(tokenizer.vocab_size, dtype=bool)
    for token, i in tokenizer.vocab.items():
        if token.startswith("##"):
            table[i] = True
    return table


def _encode(tokenizer, items: list, pretokenized: bool, progress: Callable[[int], None] | None,
            chunk: int = 2000):
    """(flat ids [T], lengths [S], word ids [T] or None) of a list of sentences (or word lists).

    A chunk of sentences at a time: the tokenizer's Encoding objects cost far more than the ids (at
    20,000 sentences a chunk they were most of a worker's memory). Without word ids, the tokenizer's
    encode_batch_fast (no character offsets; the same ids, about 1.5x faster)."""
    backend = tokenizer.backend
    encode = backend.encode_batch if pretokenized else getattr(backend, "encode_batch_fast", backend.encode_batch)
    ids_parts, lens_parts, wid_parts = [], [], []
    for i in range(0, len(items), chunk):
        encs = encode(items[i:i + chunk], is_pretokenized=pretokenized, add_special_tokens=False)
        lens = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
        total = int(lens.sum())
        ids_parts.append(_flatten((e.ids for e in encs), total, np.int32))
        lens_parts.append(lens)
        if pretokenized:
            wid_parts.append(_flatten((e.word_ids for e in encs), total, np.int64))
        if progress:
            progress(len(encs))
    empty = np.zeros(0, dtype=np.int64)
    ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=np.int32)
    lens = np.concatenate(lens_parts) if lens_parts else empty
    wids = (np.concatenate(wid_parts) if wid_parts else empty) if pretokenized else None
    return ids, lens, wids


def _cut(sentences: list[str]) -> list[list[str]]:
    import jieba

    return [jieba.lcut(s) for s in sentences]


def jieba_words(sentences: list[str], *, workers: int | None = None, chunk: int = 5000,
                rust: bool | None = None) -> list[list[str]]:
    """Each sentence cut into words by jieba's algorithm and dictionary (default mode, HMM on).

    rust (default: when installed): rjieba, jieba-rs's binding, which cuts the same words about 25x
    faster. Otherwise jieba, pure Python (~150k characters/s per core) and the slowest stage of
    whole-word `prepare` by far: a large corpus is then cut by one forked process per core, each
    inheriting the loaded dictionary."""
    if rust is None:
        rust = importlib.util.find_spec("rjieba") is not None
    if rust:
        import rjieba

        return [rjieba.cut(s) for s in sentences]
    import jieba

    jieba.setLogLevel(60)
    jieba.initialize()
    workers = workers or len(os.sched_getaffinity(0))
    chunks = [sentences[i:i + chunk] for i in range(0, len(sentences), chunk)]
    if workers < 2 or len(chunks) < 2:
        return _cut(sentences)
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(min(workers, len(chunks))) as pool:
        return [w for part in pool.map(_cut, chunks) for w in part]


def tokenize_corpus(docs: list[list[str]], tokenizer, *, whole_word: bool = False,
                    progress: Callable[[int], None] | None = None) -> Corpus:
    """Tokenize every sentence (batched, in Rust) into one flat array with word-start flags.

    Sentences that tokenize to nothing are dropped; so are documents left without sentences."""
    sentences = [s for d in docs for s in d]
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    continuation = _continuation_table(tokenizer)
    if whole_word:
        # Chinese has no ## pieces: its words come from jieba, fed to the tokenizer as pre-split
        # words so that each token knows its word (Encoding.word_ids).
        chinese = np.fromiter((bool(_CJK.search(s)) for s in sentences), dtype=bool, count=len(sentences))
    else:
        chinese = np.zeros(len(sentences), dtype=bool)
    plain_idx, zh_idx = np.flatnonzero(~chinese), np.flatnonzero(chinese)

    ids_a, lens_a, _ = _encode(tokenizer, [sentences[i] for i in plain_idx], False, progress)
    ws_a = ~continuation[ids_a]
    if len(zh_idx):
        words = jieba_words([sentences[i] for i in zh_idx])
        ids_b, lens_b, wids = _encode(tokenizer, words, True, progress)
        first = np.zeros(len(ids_b), dtype=bool)
        first[(np.cumsum(lens_b) - lens_b)[lens_b > 0]] = True
        # [T_b]: a token starts a word when its jieba word differs from the previous token's
        ws_b = first | np.r_[True, wids[1:] != wids[:-1]]
    else:
        ids_b, lens_b, ws_b = np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, bool)

    # Put the two groups back in sentence order: gather each sentence's range from [a | b].
    lens = np.empty(len(sentences), dtype=np.int64)
    starts = np.empty(len(sentences), dtype=np.int64)
    lens[plain_idx], lens[zh_idx] = lens_a, lens_b
    starts[plain_idx] = np.cumsum(lens_a) - lens_a
    starts[zh_idx] = len(ids_a) + np.cumsum(lens_b) - lens_b
    keep = lens > 0
    gather = ranges(starts[keep], lens[keep])
    tokens = np.concatenate([ids_a, ids_b])[gather]
    word_starts = np.concatenate([ws_a, ws_b])[gather]
    lens = lens[keep]
    doc_of = doc_of[keep]
    sent_starts = np.r_[0, np.cumsum(lens)]
    sents_per_doc = np.bincount(doc_of, minlength=len(docs))
    kept = np.flatnonzero(sents_per_doc > 0)
    doc_sents = np.r_[0, np.cumsum(sents_per_doc[kept])]
    return Corpus(tokens.astype(np.int32), word_starts, sent_starts.astype(np.int64), doc_sents.astype(np.int64),
                  kept.astype(np.int64))


# ----------------------------------------------------------------------------------------------
# 3. sentence pairs


@dataclass
class Pairs:
    """n instances as ranges into Corpus.tokens: [CLS] tokens[a:a+la] [SEP] tokens[b:b+lb] [SEP]."""

    a_start: np.ndarray   # [n] int64
    a_len: np.ndarray     # [n] int64
    b_start: np.ndarray   # [n] int64
    b_len: np.ndarray     # [n] int64
    random_next: np.ndarray  # [n] bool: B is from another document (NotNext)

    def __len__(self) -> int:
        return len(self.a_start)


def _popcount(rng: random.Random, k: int) -> int:
    """Binomial(k, 1/2): the number of fronts among k fair front-or-back coin flips."""
    return bin(rng.getrandbits(k)).count("1") if k > 0 else 0


def create_pairs(corpus: Corpus, max_seq_len: int, rng: random.Random, *, short_seq_prob: float = 0.1) -> Pairs:
    """One pass over the documents: NSP pairs of whole sentences, cut to max_seq_len - 3 tokens.

    A chunk of one sentence (a one-sentence document, or the last sentence of one) always gets a
    NotNext partner, as in Google's code; so short documents still yield pairs, all NotNext, and
    a corpus of short documents has more than half NotNext.  Partners come from any other document."""
    max_tokens = max_seq_len - 3
    D = corpus.num_documents
    if D < 2:
        raise ValueError(f"the corpus holds {D} document(s); next sentence prediction needs at least 2 "
                         "(a NotNext pair takes its second segment from another document)")
    s_start = corpus.sent_starts
    s_len = np.diff(s_start).tolist()
    s_start = s_start.tolist()
    doc_sents = corpus.doc_sents.tolist()
    out: list[tuple[int, int, int, int, bool]] = []
    for d in range(D):
        first, last = doc_sents[d], doc_sents[d + 1]
        target = max_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_tokens)
        chunk_first, chunk_len = first, 0  # the chunk is sentences [chunk_first, i]
        i = first
        while i < last:
            chunk_len += s_len[i]
            if i == last - 1 or chunk_len >= target:
                k = i - chunk_first + 1
                a_end = chunk_first + (rng.randint(1, k - 1) if k >= 2 else 1)  # A: [chunk_first, a_end)
                a0, la = s_start[chunk_first], s_start[a_end - 1] + s_len[a_end - 1] - s_start[chunk_first]
                if k == 1 or rng.random() < 0.5:
                    is_random = True
                    want = max(1, target - la)
                    other = rng.randrange(D - 1)
                    other += other >= d  # any document but this one
                    o_first, o_last = doc_sents[other], doc_sents[other + 1]
                    j = rng.randrange(o_first, o_last)
                    b0, lb = s_start[j], 0
                    while j < o_last and lb < want:
                        lb += s_len[j]
                        j += 1
                    next_i = a_end  # the unused sentences of the chunk go back into the stream
                else:
                    is_random = False
                    b0, lb = s_start[a_end], s_start[i] + s_len[i] - s_start[a_end]
                    next_i = i + 1
                # Truncate: drop one token at a time from the longer segment (B on a tie), front or
                # back at random.  Closed form: cut the longer one down to the other, then split the
                # rest between them, B taking the odd one; the fronts dropped are Binomial(cut, 1/2).
                excess = la + lb - max_tokens
                if excess > 0:
                    cut_a = cut_b = 0
                    if la > lb:
                        cut_a = min(excess, la - lb)
                    elif lb > la:
                        cut_b = min(excess, lb - la)
                    rest = excess - cut_a - cut_b
                    cut_a += rest // 2
                    cut_b += rest - rest // 2
                    a0 += _popcount(rng, cut_a)
                    b0 += _popcount(rng, cut_b)
                    la -= cut_a
                    lb -= cut_b
                if la >= 1 and lb >= 1:
                    out.append((a0, la, b0, lb, is_random))
                chunk_first, chunk_len = next_i, 0
                i = next_i
                continue
            i += 1
    arr = np.array(out, dtype=np.int64).reshape(-1, 5)
    return Pairs(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4].astype(bool))


@dataclass
class Instances:
    """n unmasked instances, packed end to end."""

    tokens: np.ndarray       # [N] int32: [CLS] A [SEP] B [SEP] for each instance
    word_starts: np.ndarray  # [N] bool
    offsets: np.ndarray      # [n+1] int64
    a_len: np.ndarray        # [n] int32: tokens of [CLS] A [SEP] (token type 0); the rest are type 1
    random_next: np.ndarray  # [n] bool


def assemble(corpus: Corpus, pairs: Pairs, cls_id: int, sep_id: int) -> Instances:
    """Gather the pairs into [CLS] A [SEP] B [SEP] token arrays."""
    return Tokens(corpus, cls_id, sep_id).pairs(pairs)


class Tokens:
    """The corpus tokens with [CLS] and [SEP] after them (at T and T+1), built once: instances are
    gathered from it by index ranges, a batch of instances at a time."""

    def __init__(self, corpus: Corpus, cls_id: int, sep_id: int):
        self.T = T = len(corpus.tokens)
        self.tokens = np.r_[corpus.tokens, np.int32(cls_id), np.int32(sep_id)]  # [T+2]
        self.word_starts = np.r_[corpus.word_starts, True, True]
        self.cls, self.sep = T, T + 1

    def pairs(self, pairs: Pairs) -> Instances:
        """[CLS] A [SEP] B [SEP] of each pair."""
        n = len(pairs)
        one = np.ones(n, dtype=np.int64)
        # [n, 5] pieces per instance: CLS, A, SEP, B, SEP
        starts = np.stack([one * self.cls, pairs.a_start, one * self.sep, pairs.b_start, one * self.sep], axis=1)
        lengths = np.stack([one, pairs.a_len, one, pairs.b_len, one], axis=1)
        idx = ranges(starts.ravel(), lengths.ravel())
        seq_len = lengths.sum(axis=1)
        offsets = np.r_[0, np.cumsum(seq_len)].astype(np.int64)
        word_starts = self.word_starts[idx]
        # A segment starts a word even when truncation cut into one: words never cross [CLS] or [SEP].
        word_starts[offsets[:-1] + 1] = True
        word_starts[offsets[:-1] + pairs.a_len + 2] = True
        return Instances(
            tokens=self.tokens[idx],
            word_starts=word_starts,
            offsets=offsets,
            a_len=(pairs.a_len + 2).astype(np.int32),
            random_next=pairs.random_next.copy(),
        )

    def packed(self, spans: "Spans") -> Instances:
        """[CLS] spans... [SEP] of each packed instance (one segment: a_len is the whole length)."""
        n = len(spans.first) - 1
        idx = ranges(spans.start, spans.length)
        lengths = np.add.reduceat(spans.length, spans.first[:-1]) if n else np.zeros(0, np.int64)
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        tokens = self.tokens[idx]
        word_starts = self.word_starts[idx]
        # a span cut from the middle of a sentence starts a word
        word_starts[np.r_[0, np.cumsum(spans.length)[:-1]].astype(np.int64)] = True
        return Instances(tokens=tokens, word_starts=word_starts, offsets=offsets,
                         a_len=lengths.astype(np.int32), random_next=np.zeros(n, dtype=bool))


@dataclass
class Spans:
    """Packed instances as token ranges of Tokens: instance i is spans first[i]..first[i+1]-1."""

    start: np.ndarray   # [P] int64 into Tokens.tokens
    length: np.ndarray  # [P] int64
    first: np.ndarray   # [n+1] int64


def pack_sentences(corpus: Corpus, max_seq_len: int) -> Spans:
    """RoBERTa's FULL-SENTENCES layout, for objectives without NSP: whole sentences end to end in
    [CLS] ... [SEP] of up to max_seq_len tokens, running on across documents with a [SEP] between
    them; a sentence longer than an instance is cut. No randomness: every pass packs alike."""
    budget = max_seq_len - 2
    T = len(corpus.tokens)
    cls, sep = T, T + 1
    s_start = corpus.sent_starts[:-1].tolist()
    s_len = np.diff(corpus.sent_starts).tolist()
    doc_sents = corpus.doc_sents.tolist()
    starts: list[int] = []
    lens: list[int] = []
    first: list[int] = []
    used = 0  # tokens in the open instance, [CLS] and the last [SEP] not counted

    def close() -> None:
        nonlocal used
        starts.append(sep)
        lens.append(1)
        used = 0

    for d in range(len(doc_sents) - 1):
        if used and used + 2 <= budget:  # room for the documents' [SEP] and a token after it
            starts.append(sep)
            lens.append(1)
            used += 1
        elif used:
            close()
        for j in range(doc_sents[d], doc_sents[d + 1]):
            start, left = s_start[j], s_len[j]
            while left:
                if used == budget:
                    close()
                if used == 0:
                    first.append(len(starts))
                    starts.append(cls)
                    lens.append(1)
                room = budget - used
                if left <= room:
                    starts.append(start)
                    lens.append(left)
                    used += left
                    left = 0
                elif used == 0 or left > budget:  # too long for any instance: fill this one with its head
                    starts.append(start)
                    lens.append(room)
                    start += room
                    left -= room
                    close()
                else:  # the whole sentence goes into the next instance
                    close()
    if used:
        close()
    first.append(len(starts))
    return Spans(np.array(starts, dtype=np.int64), np.array(lens, dtype=np.int64), np.array(first, dtype=np.int64))


# ----------------------------------------------------------------------------------------------
# 4. masking

@dataclass
class PrepareSettings(Checked):
    """What `prepare` builds, declared once: its flags are made from these fields."""

    max_seq_len: int = setting(128, "tokens per instance, specials included ([CLS] A [SEP] B [SEP]: at least 5)",
                               low=5)
    masking: str = setting("static", "static: masked here, --dupe-factor times; dynamic: masked by the loader each "
                                     "epoch", choices=("static", "dynamic"))
    whole_word: bool = setting(False, "mask whole words (Chinese words from jieba's segmenter, run by rjieba)")
    dupe_factor: int = setting(5, "passes over the corpus", low=1)
    masked_lm_prob: float = setting(0.15, "share of tokens masked", above=0, below=1)
    max_predictions: int = setting(20, "masked tokens per instance at most", low=1)
    mask_replace: tuple[float, float] = setting(
        (0.8, 0.1), "shares of the masked tokens shown as [MASK] and as a random token, the rest left unchanged "
                    "(default: 0.8 0.1, the paper's; 1 0: [MASK] only)", metavar=("MASK", "RANDOM"))
    short_seq_prob: float = setting(0.1, "probability of a shorter random target length", low=0, high=1)
    seed: int = seed_setting(12345, "random seed")
    pairs: str = setting("nsp", "nsp: sentence pairs, half of them NotNext (the paper's, for MLM + NSP); none: "
                                "whole sentences packed end to end across documents, a [SEP] between documents "
                                "(RoBERTa's FULL-SENTENCES, for objectives without NSP; one segment, so a model "
                                "trained on it reads sentence pairs worse, bench/README.md)", choices=("nsp", "none"))
    format: str = setting("auto", "input layout, see below", choices=FORMATS)
    text_field: str = setting("text", "the JSON field or Parquet column that holds the text")
    shard_size: int = setting(100_000, "instances per shard", low=1)
    block_mb: float = setting(32.0, "megabytes of corpus per block: the documents are dealt at random into blocks "
                                    "of about this size, each made into instances by one worker, with NotNext "
                                    "partners from its block (a random sample of the whole corpus); a worker's "
                                    "memory grows with it", low=0.001, high=1 << 20, metavar="MB")
    heldout_docs: int = setting(0, "keep N documents (drawn by --seed) out of training and prepare them into "
                                   "OUT/heldout for held-out evaluation", low=0, metavar="N")
    workers: int = setting(0, "worker processes (default 0: one per core); the data is the same for any number",
                           low=0, high=4096, metavar="N")
    cluster: str | None = setting(None, "run the blocks as tasks on this Dask cluster (its scheduler's address, "
                                        "tcp://HOST:8786); OUT must be a folder every worker can reach",
                                  metavar="ADDRESS")

    RUN_ONLY = ("workers", "cluster")  # how the data is made, not what it is: not in the manifest

    def check(self) -> None:
        super().check()
        to_mask, to_random = self.mask_replace
        if not (0 <= to_mask and 0 <= to_random and to_mask + to_random <= 1):
            raise SettingError("mask_replace", f"([MASK] share, random share) must be >= 0 and add up to at most 1, "
                                               f"got {to_mask}, {to_random}")


class ShardWriter:
    """Writes instances into shards of shard_size instances as they come, each array appended to its
    .npy file on disk (data/shards.py's NpyAppender): memory holds one batch of instances, never a
    shard. The shards are those of all the batches end to end, cut every shard_size instances."""

    def __init__(self, folder: Path, shard_size: int, dtype, prefix: str = "shard-"):
        self.folder, self.shard_size, self.dtype, self.prefix = folder, shard_size, dtype, prefix
        self.entries: list[dict] = []
        self.masked_tokens = self.random_next = 0
        self._static = False  # static masking: the shards hold the masks too
        self._files: dict | None = None  # the open shard's appenders
        self._n = self._tokens = self._masked = 0  # what the open shard holds

    def _open(self) -> None:
        from .shards import NpyAppender

        folder = self.folder / f"{self.prefix}{len(self.entries):05d}"
        folder.mkdir(parents=True)
        types = {"tokens": self.dtype, "word_starts": bool, "offsets": np.int64, "a_len": np.int32,
                 "random_next": bool, "mlm_offsets": np.int64, "mlm_positions": np.int16,
                 "mlm_input_ids": self.dtype}
        if not self._static:
            types = {k: v for k, v in types.items() if not k.startswith("mlm_")}
        self._files = {name: NpyAppender(folder / f"{name}.npy", dtype) for name, dtype in types.items()}
        self._files["offsets"].append(np.zeros(1, np.int64))
        if self._static:
            self._files["mlm_offsets"].append(np.zeros(1, np.int64))
        self._n = self._tokens = self._masked = 0

    def _close(self) -> None:
        for f in self._files.values():
            f.close()
        self.entries.append({"name": f"{self.prefix}{len(self.entries):05d}", "instances": self._n,
                             "tokens": self._tokens})
        self._files = None

    def add(self, inst: Instances, masked: Masked | None) -> None:
        self._static = masked is not None
        if masked is not None:
            self.masked_tokens += len(masked.positions)
        self.random_next += int(inst.random_next.sum())
        o, n, i = inst.offsets, len(inst.a_len), 0
        while i < n:
            if self._files is None:
                self._open()
            j = min(n, i + self.shard_size - self._n)
            f = self._files
            f["tokens"].append(inst.tokens[o[i]:o[j]])
            f["word_starts"].append(inst.word_starts[o[i]:o[j]])
            f["offsets"].append(o[i + 1:j + 1] - o[i] + self._tokens)
            f["a_len"].append(inst.a_len[i:j])
            f["random_next"].append(inst.random_next[i:j])
            if masked is not None:
                q = masked.offsets
                f["mlm_offsets"].append(q[i + 1:j + 1] - q[i] + self._masked)
                f["mlm_positions"].append(masked.positions[q[i]:q[j]])
                f["mlm_input_ids"].append(masked.input_ids[q[i]:q[j]])
                self._masked += int(q[j] - q[i])
            self._n += j - i
            self._tokens += int(o[j] - o[i])
            if self._n == self.shard_size:
                self._close()
            i = j

    def close(self) -> list[dict]:
        if self._files is not None:
            self._close()
        return self.entries
