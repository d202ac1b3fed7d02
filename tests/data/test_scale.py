"""`prepare` at the scale of a real corpus (data/sources.py, data/pipeline.py), on small inputs: the
same data for any number of workers and on a Dask cluster, NotNext partners from the whole corpus,
every input layout, resume after SIGKILL, bad inputs, the packed (--pairs none) layout.

Blocks are made tiny here (--block-mb 0.02: 20 KB) so that a corpus of a few hundred KB is dealt
into many blocks and read in many pieces."""

from __future__ import annotations

import filecmp
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import realdata

from torchbert.cli import main
from torchbert.data import PrepareSettings, PretrainingData, prepare
from torchbert.tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("scale")


@pytest.fixture(scope="module")
def docs():
    """People's Daily paragraphs, 10 to a document: 300 documents, ~700 KB."""
    lines = realdata.peoples_daily_lines()[:3000]
    return ["\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)]


@pytest.fixture(scope="module")
def corpus(work, docs):
    path = work / "zh.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(work, corpus):
    out = work / "tok"
    assert main(["vocab", "--corpus", str(corpus), "--vocab-size", "3000", "--out", str(out), "--quiet"]) == 0
    return out


def same_folders(a: Path, b: Path, other_corpus: bool = False) -> None:
    """Every file of data folder a is in b with the same bytes, and b holds no other; other_corpus:
    the manifests may name other corpus files (the same text in another file), and nothing else."""
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for f in files_a:
        if other_corpus and f.name == "manifest.json":
            ma, mb = (json.loads((x / f).read_text()) for x in (a, b))
            for m in (ma, mb):
                m["settings"].pop("corpus")
            assert ma == mb, f
            continue
        assert filecmp.cmp(a / f, b / f, shallow=False), f


# ----------------------------------------------------------------------------------------------
# the same data whatever the parallelism


@pytest.mark.e2e  # prepare on a pool of worker processes
def test_same_shards_for_any_number_of_workers(work, corpus, tok):
    settings = dict(block_mb=0.02, dupe_factor=2, heldout_docs=20, shard_size=500, seed=3)
    outs = []
    for workers in (1, 3):
        out = work / f"workers-{workers}"
        m = prepare([corpus], tok, out, PrepareSettings(workers=workers, **settings))
        outs.append(out)
    plan_blocks = m["counts"]["shards"]
    assert plan_blocks > 10  # many blocks, each ending in a shard of its own
    assert m["heldout"]["documents"] == 20 and m["counts"]["documents"] == 280
    same_folders(outs[0], outs[1])
    assert not list(work.glob("*.partial"))


def test_the_plan_it_announces_counts_the_held_out_block(work, corpus, tok, capsys):
    """The progress notes name the rounds' work: the pieces, the blocks and, with --heldout-docs, the
    held-out documents' block, which the second bar counts as one more."""
    m = prepare([corpus], tok, work / "announced", PrepareSettings(workers=1, block_mb=0.2, heldout_docs=7),
                progress=True)
    err = capsys.readouterr().err
    assert m["heldout"]["documents"] == 7
    assert ("torchbert: 4 piece(s) of the corpus to read and tokenize, then 4 block(s) of about 0.2 MB to pair and "
            "mask, and one of the 7 held-out documents\n") in err
    assert "/5 [" in err and "pairs + masks: 100%" in err  # the bar's total: the 4 blocks and the held-out one


@pytest.mark.e2e
def test_a_dask_cluster_makes_the_same_shards(work, corpus, tok):
    distributed = pytest.importorskip("distributed")
    settings = dict(block_mb=0.02, dupe_factor=1, masking="dynamic", whole_word=True, seed=4)
    local = work / "local"
    prepare([corpus], tok, local, PrepareSettings(workers=1, **settings))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  env={"TOKENIZERS_PARALLELISM": "false"}) as cluster:
        on_cluster = work / "cluster"
        prepare([corpus], tok, on_cluster, PrepareSettings(cluster=cluster.scheduler_address, **settings))
    same_folders(local, on_cluster)


@pytest.mark.e2e
def test_a_cluster_lost_mid_prepare_is_one_line_and_resumes_here(work, corpus, tok, capsys):
    """Issue 59: a killed scheduler printed two Dask tracebacks and "unexpected FutureCancelledError".
    Now: one line naming the address, that OUT.partial keeps what finished, and --resume; resumed here
    (without the cluster), the shards of a run that was never interrupted. Dask's client logs the lost
    connection itself, with a logger whose level Dask sets when it is imported: the command quiets it."""
    import threading

    distributed = pytest.importorskip("distributed")
    args = ["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--block-mb", "0.02", "--dupe-factor", "1",
            "--masking", "dynamic", "--seed", "4", "--quiet"]
    local, out = work / "lost-local", work / "lost"
    assert main([*args, "--out", str(local), "--workers", "1"]) == 0
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                       env={"TOKENIZERS_PARALLELISM": "false"})
    address, partial = cluster.scheduler_address, work / "lost.partial"

    def kill_once_a_piece_is_done():
        deadline = time.time() + 300
        while not list((partial / "pieces").glob("*/piece.json")) and time.time() < deadline:
            time.sleep(0.005)
        cluster.close()

    killer = threading.Thread(target=kill_once_a_piece_is_done)
    killer.start()
    # a process of its own, as a user runs it: what Dask's loggers write reaches its stderr, past capsys
    done = subprocess.run([sys.executable, "-m", "torchbert", *args, "--out", str(out), "--cluster", address],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    killer.join()
    code, err = done.returncode, done.stderr
    assert code == 1, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err and "unexpected" not in err, err
    assert f"--cluster {address}: lost the Dask scheduler mid-run" in err and f"{partial} keeps the pieces" in err
    assert "--resume" in err and partial.is_dir() and not out.exists()
    assert main([*args, "--out", str(out), "--resume"]) == 0
    same_folders(local, out)


def test_a_cluster_address_that_is_none_is_refused(work, corpus, tok, capsys):
    for bad in ("", "garbage!!"):
        code = main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out", str(work / "bad"),
                     "--cluster", bad, "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and f"--cluster {bad!r}: not a Dask scheduler address" in err, err
        assert not (work / "bad").exists() and not (work / "bad.partial").exists()


ALLOCATES = """
import sys
import numpy as np
from torchbert.data import runner
if sys.argv[1] == "worker":
    runner._worker_init(1)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def task():
    a = np.ones(1 << 20); del a   # 8 MB: mapped; glibc's threshold then rises past it
    b = np.ones(1 << 20); del b   # from the heap now, and kept there when freed
base = rss()
runner._call((task, ()))
print(rss() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_worker_gives_its_tasks_memory_back():
    """What keeps a worker's memory flat from task to task (runner._malloc_trim after each task)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    kept = {mode: int(subprocess.run([sys.executable, "-c", ALLOCATES, mode], env=env, check=True,
                                     capture_output=True, text=True).stdout) for mode in ("plain", "worker")}
    assert kept["plain"] > 6e6 and kept["worker"] < 1e6, kept


# ----------------------------------------------------------------------------------------------
# NotNext partners of global quality


def test_notnext_partners_come_from_the_whole_corpus(work):
    """Documents d0..d199 use words a*, d200..d399 words b*; the corpus is cut into ~15 blocks of
    ~27 documents, each a random sample of all 400. The NotNext partner of a first-half A is from
    the second half with probability (second-half documents in its block) / (block size - 1):
    0.5 on average. Bound: within 0.5 +- 0.1 over ~900 NotNext pairs (the block sizes and the draw
    give a standard deviation of about 0.03). Partners from neighbours in file order (a buffer of
    nearby documents, UER-py's way) would give about 0."""
    n_docs, half = 400, 200
    rng = np.random.default_rng(0)
    words = {"a": [f"a{i}" for i in range(20)], "b": [f"b{i}" for i in range(20)]}
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words["a"] + words["b"]
    vocab += [f"d{d}" for d in range(n_docs)]
    tok_dir = work / "halves-tok"
    tok_dir.mkdir()
    (tok_dir / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    texts = []
    for d in range(n_docs):
        pool = words["a" if d < half else "b"]
        texts.append("\n".join(f"d{d} " + " ".join(rng.choice(pool, rng.integers(3, 12))) + " ." for _ in range(6)))
    path = work / "halves.txt"
    path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    out = work / "halves"
    m = prepare([path], tok_dir, out, PrepareSettings(format="bert", block_mb=0.005, max_seq_len=48,
                                                       masking="dynamic", dupe_factor=2, workers=1))
    assert m["counts"]["shards"] >= 10
    blocks = -(-path.stat().st_size // int(0.005 * (1 << 20)))  # the plan's count: the text over --block-mb
    assert {e["name"].split("-")[1] for e in m["shards"]} == {f"{b:05d}" for b in range(blocks)}  # each dealt some
    data = PretrainingData(out)
    tok = BertTokenizer.from_pretrained(tok_dir)
    from_second = total = 0
    for i in range(len(data)):
        inst = data.instance(i)
        if not inst["random_next"]:
            continue
        pieces = tok.convert_ids_to_tokens(inst["tokens"].tolist())
        a_docs = {int(t[1:]) for t in pieces[:inst["a_len"]] if t.startswith("d")}
        b_words = [t for t in pieces[inst["a_len"]:] if t[0] in "ab" and t[1:].isdigit()]
        if a_docs and max(a_docs) < half and b_words:
            total += 1
            from_second += b_words[0][0] == "b"
    assert total > 500
    assert abs(from_second / total - 0.5) < 0.1, (from_second, total)


def test_each_block_draws_its_own_pairs_and_masks(work, docs, tok):
    """Two blocks of the same documents (a corpus that repeats itself) pair and mask them apart: a block's
    draws come from (seed, pass, block), not from (seed, pass) alone, and its instances are numbered for
    static masks apart from another block's (packed sentences, drawn without pairs, show the masks alone)."""
    from torchbert.data.pipeline import build_instances
    from torchbert.data.pretraining import tokenize_corpus

    tokenizer = BertTokenizer.from_pretrained(tok)
    corpus = tokenize_corpus([d.split("\n") for d in docs[:30]], tokenizer)

    def draw(block, pairs, name):
        folder = work / f"own-draws-{name}"
        info = build_instances(corpus, tokenizer, PrepareSettings(max_seq_len=64, pairs=pairs), folder, block,
                               prefix=f"shard-{block:05d}-")
        shard = folder / info["shards"][0]["name"]
        return {n: np.load(shard / f"{n}.npy") for n in ("tokens", "a_len", "random_next", "mlm_positions")}

    one, two = draw(1, "nsp", "1"), draw(2, "nsp", "2")
    assert len(one["a_len"]) > 100
    assert not np.array_equal(one["a_len"], two["a_len"]) and not np.array_equal(one["random_next"], two["random_next"])
    one, two = draw(1, "none", "1-packed"), draw(2, "none", "2-packed")
    assert np.array_equal(one["tokens"], two["tokens"]) and not np.array_equal(one["mlm_positions"], two["mlm_positions"])
    assert np.array_equal(draw(2, "none", "2-again")["mlm_positions"], two["mlm_positions"])  # and again the same


# ----------------------------------------------------------------------------------------------
# inputs as users hold them


def test_every_input_layout_gives_the_same_data(work, docs, corpus, tok):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    import zstandard

    want = work / "layouts-txt"
    prepare([corpus], tok, want, PrepareSettings(seed=5, dupe_factor=1))
    as_jsonl = "".join(json.dumps({"id": k, "text": d}, ensure_ascii=False) + "\n" for k, d in enumerate(docs))
    inputs = work / "inputs"
    inputs.mkdir()
    (inputs / "zh.txt.gz").write_bytes(gzip.compress(corpus.read_bytes()))
    (inputs / "zh.jsonl").write_text(as_jsonl, encoding="utf-8")
    (inputs / "zh.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(as_jsonl.encode()))
    pq.write_table(pa.table({"id": list(range(len(docs))), "content": docs}), inputs / "zh.parquet",
                   row_group_size=70)  # 5 row groups: 5 pieces
    split = inputs / "split"
    split.mkdir()
    half = len(docs) // 2
    (split / "1.txt").write_text("\n\n".join(docs[:half]) + "\n", encoding="utf-8")
    (split / "2.txt.gz").write_bytes(gzip.compress(("\n\n".join(docs[half:]) + "\n").encode()))
    cases = {
        "gz": [inputs / "zh.txt.gz"],
        "jsonl": [inputs / "zh.jsonl"],
        "zst": [inputs / "zh.jsonl.zst"],
        "folder": [split],
        "glob": [str(split / "*")],
    }
    for name, paths in cases.items():
        out = work / f"layouts-{name}"
        prepare(paths, tok, out, PrepareSettings(seed=5, dupe_factor=1))
        same_folders(want / "shard-00000", out / "shard-00000")
    out = work / "layouts-parquet"
    prepare([inputs / "zh.parquet"], tok, out, PrepareSettings(seed=5, dupe_factor=1, text_field="content"))
    same_folders(want / "shard-00000", out / "shard-00000")


@pytest.mark.parametrize("layout", ["text", "lines", "jsonl"])
def test_a_compressed_file_is_cut_where_its_text_is(work, docs, layout):
    """A .gz or .zst file's pieces are the plain file's: the same offsets into the same text (found in
    one pass over the stream), with their first lines counted."""
    import zstandard

    from torchbert.data.pretraining import split_sentences
    from torchbert.data.sources import plan_pieces

    folder = work / f"cuts-{layout}"
    folder.mkdir()
    if layout == "jsonl":
        text = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs)
    else:
        text = ("\n\n" if layout == "text" else "\n").join(d.replace("\n", "") if layout == "lines" else d
                                                          for d in docs) + "\n"
    name = "c.jsonl" if layout == "jsonl" else "c.txt"
    plain = folder / name
    plain.write_text(text, encoding="utf-8")
    (folder / (name + ".gz")).write_bytes(gzip.compress(text.encode()))
    (folder / (name + ".zst")).write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    for piece_bytes in (10_000, 50_000):
        want = plan_pieces([plain], "auto", piece_bytes, split_sentences)
        assert len(want) > 5
        for suffix in (".gz", ".zst"):
            got = plan_pieces([folder / (name + suffix)], "auto", piece_bytes, split_sentences)
            assert [(p.layout, p.start, p.stop, p.size) for p in got] == \
                   [(p.layout, p.start, p.stop, p.size) for p in want]
            assert [p.line for p in got] == [text.encode()[:p.start].count(b"\n") + 1 for p in want]


@pytest.mark.e2e  # prepare on a pool of worker processes
def test_one_compressed_file_is_read_on_every_core_into_the_plain_files_shards(work, corpus, tok, monkeypatch):
    """One .gz / .zst file in many pieces and blocks: its text staged piece by piece for the workers,
    the same shards as the plain file with 1 or 2 workers, and no staged text left behind."""
    import zstandard

    import torchbert.data.pipeline as pipeline
    from torchbert.data.pretraining import split_sentences
    from torchbert.data.sources import plan_pieces

    gz, zst = work / "one.txt.gz", work / "one.txt.zst"
    gz.write_bytes(gzip.compress(corpus.read_bytes()))
    zst.write_bytes(zstandard.ZstdCompressor().compress(corpus.read_bytes()))
    settings = dict(block_mb=0.05, dupe_factor=1, heldout_docs=10, shard_size=400, seed=6)
    want = work / "one-plain"
    m = prepare([corpus], tok, want, PrepareSettings(workers=1, **settings))
    assert m["counts"]["shards"] > 5
    staged = []
    original = pipeline.Stager.stage
    monkeypatch.setattr(pipeline.Stager, "stage", lambda self, piece, target: (staged.append(target),
                                                                                original(self, piece, target))[1])
    for path in (gz, zst):
        for workers in (1, 2):
            out = work / f"one-{path.suffix[1:]}-{workers}"
            prepare([path], tok, out, PrepareSettings(workers=workers, **settings))
            same_folders(want, out, other_corpus=True)
    pieces = plan_pieces([corpus], "auto", int(0.05 * (1 << 20)), split_sentences)
    assert len(pieces) > 5 and len(staged) == 4 * len(pieces)  # each piece staged once a run
    assert not any(p.exists() for p in staged)


def test_the_stager_writes_each_pieces_text_in_any_order(work, corpus):
    """Pieces asked for in plan order are read in one pass (skipping those left out, as after a
    resume); an earlier one starts the stream again; a file shorter than planned is an error."""
    import zstandard

    from torchbert.data.pretraining import split_sentences
    from torchbert.data.sources import Stager, plan_pieces

    text = corpus.read_bytes()
    path = work / "stage.txt.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(text))
    pieces = plan_pieces([path], "auto", 40_000, split_sentences)
    assert len(pieces) > 6
    with Stager() as stager:
        for i in (1, 2, 5, 0, 6):
            stager.stage(pieces[i], work / "staged" / f"{i}.txt")
            assert (work / "staged" / f"{i}.txt").read_bytes() == text[pieces[i].start:pieces[i].stop]
        path.write_bytes(zstandard.ZstdCompressor().compress(text[:pieces[3].stop - 10]))
        with pytest.raises(ValueError, match=r"stage\.txt\.zst: the text ends 10 bytes early"):
            stager.stage(pieces[3], work / "staged" / "3.txt")


def test_a_documents_block_is_its_tokens_own():
    """prepare deals a document by a hash of its tokens: the same wherever it lies (issue 58)."""
    from torchbert.data.masking import document_uniforms

    tokens = np.array([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 3], dtype=np.int32)
    u = document_uniforms(1, tokens, np.array([0, 3, 5, 8, 11]))  # [5 6 7] [8 9] [5 6 7] [1 2 3]
    assert u[0] == u[2] and len(set(u.tolist())) == 3 and ((0 <= u) & (u < 1)).all()
    moved = document_uniforms(1, np.r_[tokens[8:], tokens[:8]], np.array([0, 3, 6, 8, 11]))
    assert moved[0] == u[3] and moved[1] == u[0] and moved[2] == u[1]
    assert document_uniforms(2, tokens, np.array([0, 3, 5, 8, 11]))[0] != u[0]
    assert document_uniforms(1, np.array([6, 5, 7], dtype=np.int32), np.array([0, 3]))[0] != u[0]  # order counts


def test_bad_inputs_name_the_file_and_line_and_leave_nothing(work, tok):
    import zstandard

    bad = work / "bad"
    bad.mkdir()
    gz = bad / "a.txt.gz"
    gz.write_bytes(gzip.compress("好的。\n\n很好。\n".encode() * 1000 + b"ok\nok \xff bad\n"))
    zst = bad / "b.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "x"}\n' * 500 + b'{"text": 3}\n'))
    missing = bad / "c.jsonl"
    missing.write_text('{"body": "x"}\n', encoding="utf-8")
    cases = [
        ([gz], r"a\.txt\.gz:3002: not valid UTF-8 \(byte b'\\xff' at column 4\)"),
        ([zst], r"b\.jsonl\.zst:501: expected an object with a string 'text' field"),
        ([missing], r"c\.jsonl:1: expected an object with a string 'text' field"),
        ([str(bad / "*.nothing")], r"no corpus file matches"),
    ]
    for paths, message in cases:
        out = work / "bad-out"
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            prepare(paths, tok, out, PrepareSettings(block_mb=0.01, workers=2))
        assert not out.exists() and not (work / "bad-out.partial").exists()


def test_a_byte_order_mark_is_not_text(work):
    """A file that begins with a UTF-8 byte order mark (as Windows tools write them): its first record
    parses as JSON, its first sentence does not begin with U+FEFF."""
    from torchbert.data.pretraining import split_sentences
    from torchbert.data.sources import Piece, piece_documents

    for name, layout, text in (("bom.jsonl", "jsonl", '\ufeff{"text": "第一句。第二句。"}\n{"text": "再一句。"}\n'),
                               ("bom.txt", "text", "\ufeff第一句。第二句。\n\n再一句。\n")):
        path = work / name
        path.write_text(text, encoding="utf-8")
        size = path.stat().st_size
        docs = [d for part, _ in piece_documents(Piece(str(path), layout, 0, size, size, 1), 1 << 16, split_sentences)
                for d in part]
        assert docs == [["第一句。", "第二句。"], ["再一句。"]], name


def test_parquet_without_the_text_column_is_named(work, tok):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = work / "cols.parquet"
    pq.write_table(pa.table({"body": ["他来了。", "她走了。"]}), path)
    with pytest.raises(ValueError, match=r"cols\.parquet: no column 'text' \(it has body\); name the text column "
                                         "with --text-field"):
        prepare([path], tok, work / "cols")


# ----------------------------------------------------------------------------------------------
# resume


def _command(corpus, tok, out, *extra):
    return [sys.executable, "-m", "torchbert", "prepare", "--corpus", str(corpus), "--tokenizer", str(tok),
            "--out", str(out), "--block-mb", "0.02", "--dupe-factor", "3", "--heldout-docs", "10", "--seed", "6",
            "--quiet", *extra]


@pytest.mark.e2e
def test_resume_after_sigkill_equals_an_uninterrupted_run(work, corpus, tok):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    whole = work / "whole"
    started = time.perf_counter()
    subprocess.run(_command(corpus, tok, whole, "--workers", "2"), check=True, env=env)
    took = time.perf_counter() - started  # kills come at random moments within a run's time
    out = work / "killed"
    partial = Path(str(out) + ".partial")
    rng = random.Random(0)
    kills = resumed = 0
    while True:
        if (out / "manifest.json").is_file() and not partial.exists():  # finished (a kill may come as it exits)
            if resumed >= 2:
                break
            shutil.rmtree(out)  # finished before enough kills came: start again from nothing
            kills = resumed = 0
        extra = ["--workers", "2"] + (["--resume"] if partial.exists() else [])
        resumed += partial.exists()
        proc = subprocess.Popen(_command(corpus, tok, out, *extra), env=env, start_new_session=True,
                                stderr=subprocess.PIPE, text=True)
        try:
            proc.wait(timeout=rng.uniform(0.3, 0.95) * took if kills < 6 else 300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the command and its workers, at a random moment
            proc.wait()
            kills += 1
            continue
        assert proc.returncode == 0, proc.stderr.read()
    assert kills >= 2
    same_folders(whole, out)
    assert not Path(str(out) + ".partial").exists()


def test_resume_refuses_other_settings_and_a_rerun_names_resume(work, corpus, tok, capsys):
    out = work / "stopped"
    partial = work / "stopped.partial"
    args = ["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out", str(out), "--block-mb", "0.02",
            "--quiet", "--workers", "1"]
    from torchbert.data import pipeline

    real = pipeline.run_block
    calls = []

    def stop_after_two(work_, block):
        calls.append(block)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(work_, block)

    pipeline.run_block = stop_after_two
    try:
        assert main(args) == 130
    finally:
        pipeline.run_block = real
    err = capsys.readouterr().err
    assert f"{partial} keeps the finished pieces and blocks; continue with: torchbert prepare" in err
    assert err.rstrip().endswith("--resume")
    assert len(list((partial / "blocks").glob("*/block.json"))) == 2
    assert main(args) == 2
    assert "an unfinished prepare is there; continue it with --resume" in capsys.readouterr().err
    assert main(args + ["--resume", "--seed", "9"]) == 2
    assert "--seed 12345 -> 9" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0
    assert not partial.exists() and (out / "manifest.json").is_file()
    assert main(args + ["--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err


def test_resume_after_a_kill_between_out_and_removing_partial(work, corpus, tok, monkeypatch):
    """The last moment a kill can come: OUT is in place, OUT.partial not yet removed. --resume sees
    that the run had finished, removes OUT.partial and leaves OUT as it is."""
    from torchbert.io import files

    settings = PrepareSettings(block_mb=0.05, dupe_factor=1, workers=1, seed=8)
    whole = work / "late-whole"
    prepare([corpus], tok, whole, settings)
    real = files.swap_in

    def swap_then_die(new, final):
        real(new, final)
        raise KeyboardInterrupt

    out = work / "late"
    monkeypatch.setattr(files, "swap_in", swap_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare([corpus], tok, out, settings)
    monkeypatch.setattr(files, "swap_in", real)
    assert Path(str(out) + ".partial").is_dir() and (out / "manifest.json").is_file()
    m = prepare([corpus], tok, out, settings, resume=True)
    assert m["counts"]["instances"] > 0 and not Path(str(out) + ".partial").exists()
    same_folders(whole, out)


# ----------------------------------------------------------------------------------------------
# the packed layout (--pairs none)


def test_packed_sentences_layout(work, corpus, tok, capsys):
    out = work / "packed"
    m = prepare([corpus], tok, out, PrepareSettings(pairs="none", max_seq_len=64, masking="dynamic", dupe_factor=1))
    assert m["counts"]["is_random_next"] == 0
    data = PretrainingData(out)
    t = BertTokenizer.from_pretrained(tok)
    cls, sep = t.cls_token_id, t.sep_token_id
    body = []
    for i in range(len(data)):
        inst = data.instance(i)
        tokens = inst["tokens"]
        assert tokens[0] == cls and tokens[-1] == sep and len(tokens) <= 64
        assert inst["a_len"] == len(tokens) and not inst["random_next"]  # one segment
        body.append(tokens[1:-1])
    # end to end, the instances are the corpus: its tokens in order, a [SEP] between documents
    joined = np.concatenate(body)
    from torchbert.data.pretraining import read_documents, tokenize_corpus

    c = tokenize_corpus(read_documents([corpus]), t)
    docs = [c.tokens[c.sent_starts[c.doc_sents[d]]:c.sent_starts[c.doc_sents[d + 1]]] for d in range(c.num_documents)]
    assert np.array_equal(joined[joined != sep], c.tokens)
    assert (joined == sep).sum() >= c.num_documents - 1 - len(data)  # a boundary at an instance's end needs none
    assert len(docs) == 300
    # an objective with NSP cannot learn from it: pretrain says so before it starts
    assert main(["pretrain", "--data", str(out), "--out", str(work / "nsp-run"), "--config", "tiny", "--steps", "1",
                 "--quiet"]) == 2
    assert "prepared with --pairs none" in capsys.readouterr().err
