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
import json
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..io.texts import json_loads, not_a_file, read_utf8
from ..settings import Checked, SettingError, setting
from .masking import Masked, mask_instances

FORMATS = ("auto", "bert", "text", "jsonl")

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


def detect_format(path: Path, lines: Sequence[str]) -> str:
    """`auto`: jsonl by extension; bert if blank lines and >= 90% one-sentence lines; else text."""
    if path.suffix.lower() in (".jsonl", ".json"):
        return "jsonl"
    sample = lines[:20000]
    if not any(not line.strip() for line in sample):
        return "text"
    filled = [line for line in sample if line.strip()]
    single = sum(1 for line in filled if len(split_sentences(line)) <= 1)
    return "bert" if filled and single >= 0.9 * len(filled) else "text"


def read_documents(paths: Sequence[str | os.PathLike], fmt: str = "auto") -> list[list[str]]:
    """Documents (lists of sentences) from the corpus files; documents never span two files."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    docs: list[list[str]] = []
    for p in map(Path, paths):
        lines = read_lines(p)
        kind = detect_format(p, lines) if fmt == "auto" else fmt
        if kind == "jsonl":
            for n, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = json_loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{n}: not valid JSON ({e.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise ValueError(f"{p}:{n}: expected an object with a string 'text' field")
                docs.append([s for para in record["text"].splitlines() for s in split_sentences(para)])
        elif kind == "bert":
            doc: list[str] = []
            for line in lines:
                line = line.strip()
                if line:
                    doc.append(line)
                elif doc:
                    docs.append(doc)
                    doc = []
            docs.append(doc)
        else:  # text
            if any(not line.strip() for line in lines):
                doc = []
                for line in lines:
                    if line.strip():
                        doc += split_sentences(line)
                    elif doc:
                        docs.append(doc)
                        doc = []
                docs.append(doc)
            else:
                docs += [split_sentences(line) for line in lines]
    return [d for d in docs if d]


# ----------------------------------------------------------------------------------------------
# 2. tokens


@dataclass
class Corpus:
    """The tokenized corpus: one flat token array and the sentence and document boundaries in it."""

    tokens: np.ndarray        # [T] int32
    word_starts: np.ndarray   # [T] bool, True where a token starts a word
    sent_starts: np.ndarray   # [S+1] int64, token offsets of the sentences
    doc_sents: np.ndarray     # [D+1] int64, sentence offsets of the documents

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
            chunk: int = 20000):
    """(flat ids [T], lengths [S], word ids [T] or None) of a list of sentences (or word lists)."""
    ids_parts, lens_parts, wid_parts = [], [], []
    for i in range(0, len(items), chunk):
        encs = tokenizer.backend.encode_batch(items[i:i + chunk], is_pretokenized=pretokenized,
                                              add_special_tokens=False)
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
    sents_per_doc = sents_per_doc[sents_per_doc > 0]
    doc_sents = np.r_[0, np.cumsum(sents_per_doc)]
    return Corpus(tokens.astype(np.int32), word_starts, sent_starts.astype(np.int64), doc_sents.astype(np.int64))


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
    T = len(corpus.tokens)
    ext_tokens = np.r_[corpus.tokens, np.int32(cls_id), np.int32(sep_id)]  # T is [CLS], T+1 is [SEP]
    ext_ws = np.r_[corpus.word_starts, True, True]
    n = len(pairs)
    one = np.ones(n, dtype=np.int64)
    # [n, 5] pieces per instance: CLS, A, SEP, B, SEP
    starts = np.stack([one * T, pairs.a_start, one * (T + 1), pairs.b_start, one * (T + 1)], axis=1)
    lengths = np.stack([one, pairs.a_len, one, pairs.b_len, one], axis=1)
    idx = ranges(starts.ravel(), lengths.ravel())
    seq_len = lengths.sum(axis=1)
    offsets = np.r_[0, np.cumsum(seq_len)].astype(np.int64)
    word_starts = ext_ws[idx]
    # A segment starts a word even when truncation cut into one: words never cross [CLS] or [SEP].
    word_starts[offsets[:-1] + 1] = True
    word_starts[offsets[:-1] + pairs.a_len + 2] = True
    return Instances(
        tokens=ext_tokens[idx],
        word_starts=word_starts,
        offsets=offsets,
        a_len=(pairs.a_len + 2).astype(np.int32),
        random_next=pairs.random_next.copy(),
    )


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
    seed: int = setting(12345, "random seed")
    format: str = setting("auto", "input layout, see below", choices=FORMATS)
    shard_size: int = setting(100_000, "instances per shard", low=1)
    heldout_docs: int = setting(0, "keep N documents (drawn by --seed) out of training and prepare them into "
                                   "OUT/heldout for held-out evaluation", low=0, metavar="N")

    def check(self) -> None:
        super().check()
        to_mask, to_random = self.mask_replace
        if not (0 <= to_mask and 0 <= to_random and to_mask + to_random <= 1):
            raise SettingError("mask_replace", f"([MASK] share, random share) must be >= 0 and add up to at most 1, "
                                               f"got {to_mask}, {to_random}")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out}: folder exists and is not empty (pass --overwrite to replace it)")
        from ..io.files import check_replaceable

        check_replaceable(out)


def prepare(
    corpus_paths: Sequence[str | os.PathLike],
    tokenizer_dir: str | os.PathLike,
    out: str | os.PathLike,
    settings: PrepareSettings | None = None,
    *,
    overwrite: bool = False,
    progress: bool = False,
) -> dict:
    """Corpus files -> a data folder of sharded instances (see data/shards.py); returns the manifest.

    With settings.heldout_docs = k, k documents drawn by the seed are kept out of training and
    prepared (static masking, one pass) in `out/heldout`, a data folder of its own for evaluation.
    The folder is built next to `out` and renamed into place at the end, so `out` never holds a
    half-written dataset.  manifest["timings"] gives the seconds of each stage."""
    import time

    from ..io.files import atomic_folder
    from ..tokenizer import MASK, BertTokenizer

    s = settings or PrepareSettings()
    s.check()
    out = Path(out)
    _check_out(out, overwrite)
    if not corpus_paths:
        raise ValueError("no corpus files given")
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.mask_token_id is None:
        raise ValueError(f"{tokenizer_dir}: the vocab has no {MASK} token, which masked LM needs")

    t0 = time.perf_counter()
    docs = read_documents(corpus_paths, s.format)
    names = ", ".join(str(p) for p in corpus_paths)
    if not docs:
        raise ValueError(f"{names}: the corpus is empty (no sentences)")
    read_seconds = time.perf_counter() - t0
    heldout, docs = split_heldout(docs, s.heldout_docs, s.seed, names)

    with atomic_folder(out, marked=True) as tmp:  # the whole data folder or none; an older one is replaced whole
        manifest = _build(docs, tokenizer, tokenizer_dir, s, tmp, corpus_paths, progress)
        manifest["timings"] = {"read": read_seconds, **manifest["timings"]}
        if heldout:
            evaluation = replace(s, masking="static", dupe_factor=1, heldout_docs=0)
            held = _build(heldout, tokenizer, tokenizer_dir, evaluation, tmp / "heldout", corpus_paths, progress)
            _write_manifest(tmp / "heldout", held)
            manifest["heldout"] = {"folder": "heldout", **held["counts"]}
        _write_manifest(tmp, manifest)
        _check_out(out, overwrite)  # nothing appeared meanwhile
    return manifest


def split_heldout(docs: list[list[str]], k: int, seed: int, names: str) -> tuple[list, list]:
    """(held-out documents, training documents): k documents drawn by the seed, order kept."""
    if k == 0:
        return [], docs
    if k < 2 or len(docs) - k < 2:
        raise ValueError(f"{names}: {len(docs)} documents cannot spare {k} for evaluation (each side needs "
                         "at least 2, for NotNext partners)")
    chosen = set(random.Random(f"{seed}/heldout").sample(range(len(docs)), k))
    return ([d for i, d in enumerate(docs) if i in chosen], [d for i, d in enumerate(docs) if i not in chosen])


def _build(docs: list[list[str]], tokenizer, tokenizer_dir, s: PrepareSettings, folder: Path,
           corpus_paths: Sequence, progress: bool) -> dict:
    """Tokenize, pair, mask and write one data folder (shards, tokenizer files); returns its manifest.
    The caller writes manifest.json (the training folder's also names its held-out part)."""
    import shutil
    import time

    from tqdm.auto import tqdm

    from ..tokenizer import TOKENIZER_FILES
    from .shards import FORMAT_NAME, FORMAT_VERSION, token_dtype, vocab_sha256, write_shard

    names = ", ".join(str(p) for p in corpus_paths)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    n_sent = sum(len(d) for d in docs)
    with tqdm(total=n_sent, unit="sent", desc="tokenize", disable=not progress) as bar:
        corpus = tokenize_corpus(docs, tokenizer, whole_word=s.whole_word, progress=bar.update)
    timings["tokenize"] = time.perf_counter() - t0
    if len(corpus.tokens) == 0:
        raise ValueError(f"{names}: the corpus is empty (no tokens)")
    if corpus.num_documents < 2:
        raise ValueError(f"{names}: the corpus holds one document; next sentence prediction needs at "
                         "least 2 (NotNext pairs take their B from another document; "
                         "separate documents with a blank line)")

    special_ids = tokenizer.all_special_ids
    never_mask = [tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]
    folder.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    shards = _ShardWriter(folder, s.shard_size, dtype, write_shard)
    timings["pairs"] = timings["mask"] = timings["write"] = 0.0
    n_done = 0
    for p in tqdm(range(s.dupe_factor), unit="pass", desc="instances", disable=not progress):
        t0 = time.perf_counter()
        rng = random.Random(f"{s.seed}/{p}")
        inst = assemble(corpus, create_pairs(corpus, s.max_seq_len, rng, short_seq_prob=s.short_seq_prob),
                        tokenizer.cls_token_id, tokenizer.sep_token_id)
        timings["pairs"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        n_inst = len(inst.a_len)
        masked = None
        if s.masking == "static":
            masked = mask_instances(
                inst.tokens, inst.word_starts, inst.offsets, np.arange(n_done, n_done + n_inst),
                special_ids=special_ids, never_mask=never_mask, mask_id=tokenizer.mask_token_id,
                vocab_size=tokenizer.vocab_size, seed=s.seed, epoch=p, masked_lm_prob=s.masked_lm_prob,
                max_predictions=s.max_predictions, whole_word=s.whole_word, replace=s.mask_replace)
        timings["mask"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        shards.add(inst, masked)  # this pass's full shards go to disk now; only the rest is kept
        timings["write"] += time.perf_counter() - t0
        n_done += n_inst
    if n_done == 0:
        raise ValueError(f"{names}: no instance could be built (every document is too short for a "
                         "sentence pair)")

    t0 = time.perf_counter()
    shard_entries = shards.close()
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copy2(src, folder / name)
    if not (folder / "vocab.txt").is_file():  # tokenizer_dir was a vocab.txt itself
        tokenizer.save_pretrained(folder)
    n_tokens = sum(e["tokens"] for e in shard_entries)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "counts": {
            "documents": corpus.num_documents,
            "sentences": len(corpus.sent_starts) - 1,
            "corpus_tokens": int(len(corpus.tokens)),
            "instances": n_done,
            "tokens": n_tokens,
            "masked_tokens": shards.masked_tokens if s.masking == "static" else None,
            "is_random_next": shards.random_next,
            "shards": len(shard_entries),
        },
        "vocab_size": tokenizer.vocab_size,
        "vocab_sha256": vocab_sha256(tokenizer),
        "token_dtype": dtype.name,
        "special_ids": {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
                        "pad": tokenizer.pad_token_id, "mask": tokenizer.mask_token_id, "all": special_ids},
        "seed": s.seed,
        "settings": {**s.__dict__, "corpus": [str(p) for p in corpus_paths], "tokenizer": str(tokenizer_dir)},
        "shards": shard_entries,
    }
    timings["write"] += time.perf_counter() - t0
    manifest["timings"] = timings
    return manifest


def _write_manifest(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


class _ShardWriter:
    """Cuts the instances of successive passes into shards of shard_size instances as they come: the
    full shards of a pass are written at once and only the rest (under one shard) waits for the next
    pass, so a corpus's dupe_factor passes are never all in memory. The shards are those of the
    passes concatenated and then cut."""

    def __init__(self, folder: Path, shard_size: int, dtype, write_shard):
        self.folder, self.shard_size, self.dtype, self.write_shard = folder, shard_size, dtype, write_shard
        self.rest: dict[str, np.ndarray] | None = None  # the instances not yet written, as below
        self.entries: list[dict] = []
        self.masked_tokens = self.random_next = 0

    def add(self, inst: Instances, masked: Masked | None) -> None:
        part = {"tokens": inst.tokens, "word_starts": inst.word_starts, "lengths": np.diff(inst.offsets),
                "a_len": inst.a_len, "random_next": inst.random_next}
        if masked is not None:
            part.update(m_counts=np.diff(masked.offsets), m_pos=masked.positions, m_ids=masked.input_ids)
            self.masked_tokens += len(masked.positions)
        self.random_next += int(inst.random_next.sum())
        if self.rest is not None:
            part = {k: np.concatenate([self.rest[k], v]) for k, v in part.items()}
        self.rest = self._write(part, final=False)

    def close(self) -> list[dict]:
        if self.rest is not None:
            self._write(self.rest, final=True)
        return self.entries

    def _write(self, part: dict[str, np.ndarray], final: bool) -> dict[str, np.ndarray]:
        """Write the whole shards of `part` (and with `final` its last, smaller one); return the rest."""
        offsets = np.r_[0, np.cumsum(part["lengths"])]
        m_off = np.r_[0, np.cumsum(part["m_counts"])] if "m_counts" in part else None
        n = len(part["a_len"])
        first = 0
        while n - first >= self.shard_size or (final and first < n):
            last = min(n, first + self.shard_size)
            o0, o1 = offsets[first], offsets[last]
            arrays = {
                "tokens": part["tokens"][o0:o1].astype(self.dtype),
                "word_starts": part["word_starts"][o0:o1],
                "offsets": (offsets[first:last + 1] - o0).astype(np.int64),
                "a_len": part["a_len"][first:last].astype(np.int32),
                "random_next": part["random_next"][first:last],
            }
            if m_off is not None:
                q0, q1 = m_off[first], m_off[last]
                arrays["mlm_offsets"] = (m_off[first:last + 1] - q0).astype(np.int64)
                arrays["mlm_positions"] = part["m_pos"][q0:q1].astype(np.int16)
                arrays["mlm_input_ids"] = part["m_ids"][q0:q1].astype(self.dtype)
            name = f"shard-{len(self.entries):05d}"
            self.write_shard(self.folder / name, arrays)
            self.entries.append({"name": name, "instances": int(last - first), "tokens": int(o1 - o0)})
            first = last
        o0 = offsets[first]
        rest = {"tokens": part["tokens"][o0:], "word_starts": part["word_starts"][o0:],
                "lengths": part["lengths"][first:], "a_len": part["a_len"][first:],
                "random_next": part["random_next"][first:]}
        if m_off is not None:
            q0 = m_off[first]
            rest.update(m_counts=part["m_counts"][first:], m_pos=part["m_pos"][q0:], m_ids=part["m_ids"][q0:])
        return {k: v.copy() for k, v in rest.items()}  # not views: the pass they came from can go
