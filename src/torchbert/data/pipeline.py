"""`torchbert prepare` at the scale of a real corpus: streamed, in blocks, on every core or a cluster.

The corpus is never in memory whole. Two rounds of tasks, each independent of the others, so any
number of worker processes (or a Dask cluster) runs them with the same result:

1. **Pieces** (read + tokenize). Each piece of the input (data/sources.py: ~8 MB of a plain file's
   text or of a compressed file's, decompressed once and staged for the workers; a Parquet row
   group) is read as a stream in parts of ~8 MB; each part's documents are tokenized (with
   whole-word masking, cut into words by rjieba first) and dealt at random into B blocks, B = corpus
   bytes / --block-mb. A document's block is a hash of the seed and the document's tokens: the deal
   is a global shuffle (LDDL's), fixed by the corpus and the seed, whatever the files' cuts or
   compression. A part is written grouped by block (`pieces/P/part-K/*.npy`).
2. **Blocks** (pair + mask + write). Block b gathers its documents from every part, in corpus order,
   and runs the paper's recipe on them (pretraining.py: create_pairs, masking, dupe_factor passes),
   a batch of instances at a time, writing shards `shard-BBBBB-KKKKK` as they fill. A NotNext
   partner is drawn from the other documents of the block: a uniform random sample of the whole
   corpus, so partners are of global quality (not the neighbours of A in file order).

The held-out documents (--heldout-docs) are drawn among all documents by the seed, as before the
corpus was streamed, and prepared into `heldout/`. With one block (a corpus under --block-mb) the
shards are those the in-memory recipe makes.

Work happens in `OUT.partial/` beside OUT: `plan.json` (plan.py: settings, the corpus files with size and
mtime, the pieces), finished pieces and blocks (each renamed into place whole, so a folder there is
complete), then `data/`, which becomes OUT in one rename, manifest last. A run that is killed
keeps OUT.partial; `--resume` redoes only the unfinished tasks and gives the same data.

Memory: a piece task holds one part's text and tokens; a block task one block's tokens
(--block-mb of text) and a batch of instances. Neither grows with the corpus.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ..errors import RunFailed
from ..io.files import mark, writing
from .pretraining import (Corpus, PrepareSettings, ShardWriter, Tokens, create_pairs, pack_sentences, split_sentences,
                          tokenize_corpus)
from .runner import ClusterLost, Runner, check_address, cores, run_round
from .compressed import compression
from .plan import PLAN, differences, load_plan, make_plan, partial_folder
from .sources import Piece, Stager

BATCH_INSTANCES = 4_000   # instances assembled and masked at a time (masking holds ~120 bytes a token)
BLOCK_ID = 1 << 36        # block b's instances are numbered from b * BLOCK_ID (for static masks)
ARRAYS = ("tokens", "word_starts", "sent_lens", "doc_sents", "doc_ids", "blocks")


_TOKENIZERS: dict[str, object] = {}


def _tokenizer(path: str):
    from ..tokenizer import BertTokenizer

    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = BertTokenizer.from_pretrained(path)
    return _TOKENIZERS[path]


@contextlib.contextmanager
def _into(final: Path) -> Iterator[Path]:
    """A temporary sibling folder that becomes `final` whole when the block ends; if another run made
    `final` meanwhile (the same task, the same content), this one's copy is dropped."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_json(path: Path, value) -> None:
    from ..io.files import atomic_write_text

    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------------
# round 1: pieces


NOTES = 10  # a piece's notes printed at most, then their count


def staged(work: Path, index: int) -> Path:
    """Where the Stager writes the text of piece `index` of a compressed file."""
    return work / "stream" / f"{index:06d}.txt"


def run_piece(work: str, index: int) -> dict:
    """Read, tokenize and deal piece `index` into blocks; returns its counts. Does nothing if done."""
    from ..data.masking import document_uniforms
    from ..data.shards import token_dtype
    from .sources import piece_documents

    work = Path(work)
    final = work / "pieces" / f"{index:06d}"
    if (final / "piece.json").is_file():
        return json.loads((final / "piece.json").read_text(encoding="utf-8"))
    plan = load_plan(work)
    s = PrepareSettings(**plan["settings"])
    B = plan["blocks"]
    tok = _tokenizer(plan["tokenizer"])
    dtype = token_dtype(tok.vocab_size)
    piece = Piece(**plan["pieces"][index])
    parts, t0 = [], time.perf_counter()
    final.parent.mkdir(exist_ok=True)
    text = staged(work, index) if compression(Path(piece.file)) else None
    notes: list[str] = []  # what the reader cut or skipped (sources.py's bounds), printed by the parent
    with _into(final) as tmp:
        for k, (docs, size) in enumerate(piece_documents(piece, plan["piece_bytes"], split_sentences, s.text_field,
                                                         text, notes.append)):
            corpus = tokenize_corpus(docs, tok, whole_word=s.whole_word)
            D = corpus.num_documents
            u = document_uniforms(s.seed, corpus.tokens, corpus.sent_starts[corpus.doc_sents])
            block = np.minimum((u * B).astype(np.int64), B - 1)
            order = np.argsort(block, kind="stable")  # grouped by block, corpus order within each
            from .pretraining import ranges

            sents = np.diff(corpus.doc_sents)
            s_order = ranges(corpus.doc_sents[:-1][order], sents[order])
            s_len = np.diff(corpus.sent_starts)
            t_order = ranges(corpus.sent_starts[:-1][s_order], s_len[s_order])
            arrays = {
                "tokens": corpus.tokens[t_order].astype(dtype),
                "word_starts": corpus.word_starts[t_order],
                "sent_lens": s_len[s_order].astype(np.int32),
                "doc_sents": sents[order].astype(np.int32),
                "doc_ids": corpus.doc_ids[order].astype(np.int64),
                # [3, B+1]: where each block's documents, sentences and tokens start (a block task
                # reads its own slices, never a whole part)
                "blocks": np.stack([np.r_[0, np.cumsum(np.bincount(block, weights=w, minlength=B))]
                                    for w in (None, sents, np.add.reduceat(s_len, corpus.doc_sents[:-1])
                                              if D else np.zeros(0))]).astype(np.int64),
            }
            (tmp / f"part-{k:05d}").mkdir()
            for name, a in arrays.items():
                np.save(tmp / f"part-{k:05d}" / f"{name}.npy", a)
            parts.append({"documents": len(docs), "tokens": int(len(corpus.tokens)), "bytes": int(size)})
        info = {"parts": parts, "bytes": piece.size, "tokens": sum(p["tokens"] for p in parts),
                "seconds": time.perf_counter() - t0,
                "notes": notes[:NOTES] + ([f"... and {len(notes) - NOTES:,} more in {piece.file}"]
                                          if len(notes) > NOTES else [])}
        _write_json(tmp / "piece.json", info)
    if text is not None:
        text.unlink(missing_ok=True)
    return info


# ----------------------------------------------------------------------------------------------
# the index: where each part's documents start in corpus order, and the held-out ones


def make_index(work: Path, plan: dict, names: str) -> dict:
    """Global document numbers of every part, and the held-out documents drawn among them."""
    bases, total = [], 0
    for p in range(len(plan["pieces"])):
        info = json.loads((work / "pieces" / f"{p:06d}" / "piece.json").read_text(encoding="utf-8"))
        row = []
        for part in info["parts"]:
            row.append(total)
            total += part["documents"]
        bases.append(row)
    if total == 0:
        raise ValueError(f"{names}: the corpus is empty (no sentences)")
    k = plan["settings"]["heldout_docs"]
    heldout: list[int] = []
    if k:
        if k < 2 or total - k < 2:
            raise ValueError(f"{names}: {total} documents cannot spare {k} for evaluation (each side needs "
                             "at least 2, for NotNext partners)")
        heldout = sorted(random.Random(f"{plan['settings']['seed']}/heldout").sample(range(total), k))
    return {"bases": bases, "documents": total, "heldout": heldout}


def _gather(work: Path, plan: dict, index: dict, block: int | None) -> Corpus:
    """The documents of one block (None: the held-out ones), in corpus order, as one Corpus."""
    from .pretraining import ranges

    heldout = np.asarray(index["heldout"], dtype=np.int64)
    toks, wss, lens, per_doc = [], [], [], []
    for p, row in enumerate(index["bases"]):
        for k, base in enumerate(row):
            d = work / "pieces" / f"{p:06d}" / f"part-{k:05d}"
            a = {n: np.load(d / f"{n}.npy", mmap_mode="r") for n in ARRAYS}
            # this block's slices of the part (sorted by block): documents, sentences, tokens
            (d0, s0, t0), (d1, s1, t1) = a["blocks"][:, [0, -1] if block is None else [block, block + 1]].T
            d0, d1, s0, s1, t0, t1 = (int(x) for x in (d0, d1, s0, s1, t0, t1))
            if d0 == d1:
                continue
            ids = base + np.asarray(a["doc_ids"][d0:d1])
            keep = np.isin(ids, heldout)
            if block is not None:
                keep = ~keep
            if not keep.any():
                continue
            docs = np.asarray(a["doc_sents"][d0:d1], dtype=np.int64)    # sentences of each document
            sent_lens = np.asarray(a["sent_lens"][s0:s1], dtype=np.int64)
            tokens = np.asarray(a["tokens"][t0:t1], dtype=np.int32)
            word_starts = np.asarray(a["word_starts"][t0:t1])
            if not keep.all():  # some documents are held out: gather the others' sentences and tokens
                s_pick = ranges(np.r_[0, np.cumsum(docs)][:-1][keep], docs[keep])
                t_pick = ranges(np.r_[0, np.cumsum(sent_lens)][:-1][s_pick], sent_lens[s_pick])
                docs, sent_lens = docs[keep], sent_lens[s_pick]
                tokens, word_starts = tokens[t_pick], word_starts[t_pick]
            toks.append(tokens)
            wss.append(word_starts)
            lens.append(sent_lens)
            per_doc.append(docs)
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    sent_lens, docs = cat(lens, np.int64), cat(per_doc, np.int64)
    return Corpus(cat(toks, np.int32), cat(wss, bool), np.r_[0, np.cumsum(sent_lens)].astype(np.int64),
                  np.r_[0, np.cumsum(docs)].astype(np.int64))


# ----------------------------------------------------------------------------------------------
# round 2: blocks


def run_block(work: str, block: int | None) -> dict:
    """Pair, mask and write the shards of one block (None: the held-out documents). Does nothing if done."""
    work = Path(work)
    name = "heldout" if block is None else f"{block:05d}"
    final = work / "blocks" / name
    if (final / "block.json").is_file():
        return json.loads((final / "block.json").read_text(encoding="utf-8"))
    plan = load_plan(work)
    index = json.loads((work / "index.json").read_text(encoding="utf-8"))
    s = PrepareSettings(**plan["settings"])
    if block is None:
        s = replace(s, masking="static", dupe_factor=1, heldout_docs=0)
    t0 = time.perf_counter()
    corpus = _gather(work, plan, index, block)
    final.parent.mkdir(exist_ok=True)
    with _into(final) as tmp:
        info = build_instances(corpus, _tokenizer(plan["tokenizer"]), s, tmp, block or 0,
                               prefix="shard-" if block is None else f"shard-{block:05d}-")
        info["seconds"] = time.perf_counter() - t0
        _write_json(tmp / "block.json", info)
    return info


def build_instances(corpus: Corpus, tokenizer, s: PrepareSettings, folder: Path, block: int, prefix: str) -> dict:
    """The paper's recipe on one block's documents: dupe_factor passes of pairs (or packed sentences),
    masked a batch at a time, written as shards into `folder`; returns the counts and shard entries."""
    from .masking import mask_instances
    from .shards import token_dtype

    counts = {"documents": corpus.num_documents, "sentences": len(corpus.sent_starts) - 1,
              "corpus_tokens": int(len(corpus.tokens)), "instances": 0, "tokens": 0,
              "masked_tokens": 0 if s.masking == "static" else None, "is_random_next": 0}
    if corpus.num_documents < (2 if s.pairs == "nsp" else 1):
        return {"counts": counts, "shards": []}  # no NotNext partner in a block of one document
    special_ids = tokenizer.all_special_ids
    never_mask = [tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]
    shards = ShardWriter(folder, s.shard_size, token_dtype(tokenizer.vocab_size), prefix=prefix)
    tokens = Tokens(corpus, tokenizer.cls_token_id, tokenizer.sep_token_id)
    packed = pack_sentences(corpus, s.max_seq_len) if s.pairs == "none" else None
    n_done = 0
    for p in range(s.dupe_factor):
        if packed is None:
            rng = random.Random(f"{s.seed}/{p}" if block == 0 else f"{s.seed}/{p}/{block}")
            pairs = create_pairs(corpus, s.max_seq_len, rng, short_seq_prob=s.short_seq_prob)
            n = len(pairs)
        else:
            n = len(packed.first) - 1
        for i in range(0, n, BATCH_INSTANCES):
            j = min(n, i + BATCH_INSTANCES)
            if packed is None:
                from .pretraining import Pairs

                inst = tokens.pairs(Pairs(pairs.a_start[i:j], pairs.a_len[i:j], pairs.b_start[i:j],
                                          pairs.b_len[i:j], pairs.random_next[i:j]))
            else:
                from .pretraining import Spans

                f = packed.first[i:j + 1]
                inst = tokens.packed(Spans(packed.start[f[0]:f[-1]], packed.length[f[0]:f[-1]], f - f[0]))
            masked = None
            if s.masking == "static":
                ids = block * BLOCK_ID + np.arange(n_done + i, n_done + j)
                masked = mask_instances(
                    inst.tokens, inst.word_starts, inst.offsets, ids, special_ids=special_ids,
                    never_mask=never_mask, mask_id=tokenizer.mask_token_id, vocab_size=tokenizer.vocab_size,
                    seed=s.seed, epoch=p, masked_lm_prob=s.masked_lm_prob, max_predictions=s.max_predictions,
                    whole_word=s.whole_word, replace=s.mask_replace)
            shards.add(inst, masked)
        n_done += n
    entries = shards.close()
    counts.update(instances=n_done, tokens=sum(e["tokens"] for e in entries),
                  masked_tokens=shards.masked_tokens if s.masking == "static" else None,
                  is_random_next=shards.random_next)
    return {"counts": counts, "shards": entries}


# ----------------------------------------------------------------------------------------------
# the whole job


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out}: folder exists and is not empty (pass --overwrite to replace it)")
        from ..io.files import check_replaceable

        check_replaceable(out)


def _remove(work: Path) -> None:
    """Remove OUT.partial as one step: renamed aside first (a kill while deleting leaves a hidden,
    marked folder that the next run clears, never a half-deleted OUT.partial that --resume reads)."""
    aside = Path(tempfile.mkdtemp(prefix=f".{work.name}.", suffix=".tmp", dir=work.parent))
    mark(aside)
    os.rename(work, aside / "old")
    shutil.rmtree(aside, ignore_errors=True)


def _start(work: Path, plan: dict, out: Path, overwrite: bool, resume: bool) -> None:
    """Make OUT.partial with the plan, or check the one there against it (--resume)."""
    from ..io.files import MARK, check_replaceable

    if work.exists():
        old = None
        with contextlib.suppress(OSError, ValueError):
            old = json.loads((work / PLAN).read_text(encoding="utf-8"))
        if resume:
            if old is None:
                raise ValueError(f"{work}: no readable {PLAN}; start again with --overwrite")
            diff = differences(old, plan)
            if diff:
                raise ValueError(f"--resume: {work} was begun with other settings or files ({'; '.join(diff)}); "
                                 "give the same ones, or start again with --overwrite")
            return
        if not overwrite:
            raise FileExistsError(f"{work}: an unfinished prepare is there; continue it with --resume, or pass "
                                  "--overwrite to start again")
        check_replaceable(work)
        _remove(work)
    elif resume:
        raise ValueError(f"--resume: nothing to resume ({work} does not exist)")
    _check_out(out, overwrite)
    work.parent.mkdir(parents=True, exist_ok=True)
    for left in work.parent.glob(f".{work.name}.*.tmp"):  # a run killed while it made OUT.partial
        if (left / MARK).is_file():
            shutil.rmtree(left, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{work.name}.", suffix=".tmp", dir=work.parent))
    mark(tmp)
    _write_json(tmp / PLAN, plan)
    os.rename(tmp, work)  # OUT.partial exists only with its plan in it


def prepare(corpus_paths: Sequence[str | os.PathLike], tokenizer_dir: str | os.PathLike, out: str | os.PathLike,
            settings: PrepareSettings | None = None, *, overwrite: bool = False, resume: bool = False,
            progress: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """Corpus files -> a data folder of sharded instances (see data/shards.py); returns the manifest.

    With settings.heldout_docs = k, k documents drawn by the seed are kept out of training and
    prepared (static masking, one pass) in `out/heldout`. Work happens in OUT.partial (see the
    module's docstring); `resume` continues a run that was stopped. manifest["timings"] gives the
    seconds of each round."""
    from ..tokenizer import MASK, BertTokenizer
    from .shards import vocab_sha256

    s = settings or PrepareSettings()
    s.check()
    if s.cluster is not None:
        check_address(s.cluster)
    out = Path(out)
    if not resume:
        _check_out(out, overwrite)
    if not corpus_paths:
        raise ValueError("no corpus files given")
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.mask_token_id is None:
        raise ValueError(f"{tokenizer_dir}: the vocab has no {MASK} token, which masked LM needs")
    names = ", ".join(str(p) for p in corpus_paths)
    plan = make_plan(corpus_paths, tokenizer_dir, s, vocab_sha256(tokenizer), note if progress else None)
    work = partial_folder(out)
    _start(work, plan, out, overwrite, resume)
    plan = load_plan(work)
    if progress:
        heldout = f", and one of the {s.heldout_docs:,} held-out documents" if s.heldout_docs else ""
        note(f"{len(plan['pieces']):,} piece(s) of the corpus to read and tokenize, then {plan['blocks']:,} "
             f"block(s) of about {s.block_mb:g} MB to pair and mask{heldout}")
    if resume and _swapped_in(work, out):  # killed after OUT was put in place, before OUT.partial went
        _remove(work)
        return {**json.loads((out / "manifest.json").read_text(encoding="utf-8")), "timings": {}}
    workers = s.workers or cores()
    timings: dict[str, float] = {}
    try:
        with writing(work), Runner(workers, s.cluster) as runner:  # a full disk, in a worker or here, named
            t0 = time.perf_counter()
            pieces = [Piece(**p) for p in plan["pieces"]]
            with Stager() as stager:  # a compressed file's pieces: its text, decompressed once, for the workers
                def before(i: int) -> None:
                    if compression(Path(pieces[i].file)):
                        stager.stage(pieces[i], staged(work, i))

                read = run_round(runner, [(run_piece, (str(work), i)) for i in range(len(pieces))],
                                 [work / "pieces" / f"{i:06d}" / "piece.json" for i in range(len(pieces))],
                                 [p.size for p in pieces], progress, before)
            timings["read_tokenize"] = time.perf_counter() - t0
            timings["read_tokens"] = sum(info["tokens"] for info in read)  # this run's (--resume: the rest)
            index_path = work / "index.json"
            if not index_path.is_file():
                _write_json(index_path, make_index(work, plan, names))
            index = json.loads(index_path.read_text(encoding="utf-8"))
            t0 = time.perf_counter()
            blocks = list(range(plan["blocks"])) + ([None] if index["heldout"] else [])
            run_round(runner, [(run_block, (str(work), b)) for b in blocks],
                      [work / "blocks" / ("heldout" if b is None else f"{b:05d}") / "block.json" for b in blocks],
                      None, progress)
            timings["instances"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with writing(out.parent):
            manifest = _finish(work, out, plan, index, tokenizer, tokenizer_dir, s, overwrite, names)
        timings["write"] = time.perf_counter() - t0
    except ValueError:
        _remove(work)  # a bad input: nothing is kept (it must be fixed first)
        raise
    except ClusterLost as e:
        raise RunFailed(f"{e}; {work} keeps the pieces and blocks that finished: run the same command with --resume "
                        "once the cluster is back (or without --cluster, on this machine)") from None
    manifest["timings"] = timings
    return manifest


def _swapped_in(work: Path, out: Path) -> bool:
    """Whether a run finished all but removing `work`: its shards left the blocks for data/, and data/
    became OUT (before _finish, no shard has moved; during it, data/ exists)."""
    if (work / "data").exists() or not (out / "manifest.json").is_file():
        return False
    for info in sorted((work / "blocks").glob("*/block.json")):
        shards = json.loads(info.read_text(encoding="utf-8"))["shards"]
        if shards:
            return not (info.parent / shards[0]["name"]).exists()
    return False


def _finish(work: Path, out: Path, plan: dict, index: dict, tokenizer, tokenizer_dir, s: PrepareSettings,
            overwrite: bool, names: str) -> dict:
    """Move the blocks' shards into data/, write the tokenizer and the manifest, and swap data/ in as OUT."""
    from ..io.files import _fsync, mark, swap_in
    from ..tokenizer import TOKENIZER_FILES
    from .shards import FORMAT_NAME, FORMAT_VERSION, token_dtype, vocab_sha256

    data = work / "data"
    data.mkdir(exist_ok=True)
    mark(data)

    def gather(names_: list[str], target: Path) -> dict:
        counts: dict[str, int | None] = {}
        entries: list[dict] = []
        for name in names_:
            folder = work / "blocks" / name
            info = json.loads((folder / "block.json").read_text(encoding="utf-8"))
            for key, value in info["counts"].items():
                counts[key] = None if value is None else (counts.get(key) or 0) + value
            for e in info["shards"]:  # numbered across the blocks, in block order
                name = f"shard-{len(entries):05d}"
                if not (target / name).exists():  # (a resumed run may have moved it already)
                    os.rename(folder / e["name"], target / name)
                entries.append({**e, "name": name})
        return {"counts": counts, "shards": entries}

    train = gather([f"{b:05d}" for b in range(plan["blocks"])], data)
    c = train["counts"]
    if c["documents"] < 2 and s.pairs == "nsp":
        held = "one document" if c["documents"] == 1 else f"{c['documents']} documents"
        raise ValueError(f"{names}: the corpus holds {held}; next sentence prediction needs "
                         "at least 2 (NotNext pairs take their B from another document; separate documents with "
                         "a blank line)")
    if c["instances"] == 0:
        raise ValueError(f"{names}: no instance could be built (every document is too short for a sentence pair)")
    def copy_tokenizer(folder: Path) -> None:  # every data folder carries the tokenizer its ids are of
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file():
                shutil.copy2(src, folder / name)
        if not (folder / "vocab.txt").is_file():  # tokenizer_dir was a vocab.txt itself
            tokenizer.save_pretrained(folder)

    copy_tokenizer(data)
    dtype = token_dtype(tokenizer.vocab_size)

    def manifest_of(part: dict, settings: PrepareSettings) -> dict:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "counts": {**part["counts"], "shards": len(part["shards"])},
            "vocab_size": tokenizer.vocab_size,
            "vocab_sha256": vocab_sha256(tokenizer),
            "token_dtype": dtype.name,
            "special_ids": {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
                            "pad": tokenizer.pad_token_id, "mask": tokenizer.mask_token_id,
                            "all": tokenizer.all_special_ids},
            "seed": settings.seed,
            "settings": {**{k: v for k, v in asdict(settings).items() if k not in PrepareSettings.RUN_ONLY},
                         "corpus": plan["corpus"], "tokenizer": str(tokenizer_dir)},
            "shards": part["shards"],
        }

    manifest = manifest_of(train, s)
    if index["heldout"]:
        (data / "heldout").mkdir(exist_ok=True)
        held = gather(["heldout"], data / "heldout")
        copy_tokenizer(data / "heldout")
        evaluation = replace(s, masking="static", dupe_factor=1, heldout_docs=0)
        _write_json(data / "heldout" / "manifest.json", manifest_of(held, evaluation))
        manifest["heldout"] = {"folder": "heldout", **held["counts"], "shards": len(held["shards"])}
    _write_json(data / "manifest.json", manifest)
    for root, _, files in os.walk(data):
        for name in files:
            _fsync(os.path.join(root, name))
        _fsync(root)
    _check_out(out, overwrite)  # nothing appeared meanwhile
    swap_in(data, out)
    _remove(work)
    return manifest


def note(message: str) -> None:
    print(f"torchbert: {message}", file=sys.stderr)
