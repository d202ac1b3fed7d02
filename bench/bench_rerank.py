"""A reranker on top of a first-stage search: `finetune --task reranker` from a pretrained BERT, then each
test query's top candidates reordered by it (issue 50 item 2).

    python bench/bench_rerank.py --model runs/demo/pretrain/bert

Held-out set: the test split of bench_simcse.py (People's Daily inverse cloze, 1,000 queries over their
1,000 passages). First stage: the idf-weighted bag of the model's tokens (bench_sparse.py, the best first
stage on this set), its top --top passages per query. Training: the inverse cloze pairs of the paragraphs
neither split uses (`inverse_cloze(..., seed=0)[2000:]`, 3,963 pairs), listwise loss (each query's
passage among 3 passages of other queries, sampled, and --hard negatives mined by the first stage
from the training passages), 1 epoch, batch 16 queries, max_length 128. The
reranker scores every (query, candidate) pair (`torchbert predict` on {"query", "documents"} lines);
nDCG@10 ± SE over the queries before and after, a query whose passage is not among the candidates
scoring 0 both times.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_simcse import heldout_and_sentences  # noqa: E402
from bench_sparse import bag as bag_of_tokens  # noqa: E402

from torchbert.apps.samples import RETRIEVAL_QUERIES, inverse_cloze, jsonl_text, peoples_daily_paragraphs  # noqa: E402
from torchbert.eval.retrieval import retrieval_scores, search  # noqa: E402


def summary(ranked: list[np.ndarray], relevant: list[set[int]]) -> tuple[float, float]:
    per = [retrieval_scores([r], [rel])["ndcg@10"] for r, rel in zip(ranked, relevant)]
    return float(np.mean(per)), float(np.std(per, ddof=1) / math.sqrt(len(per)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--top", type=int, default=20, help="first-stage candidates reranked per query (default 20)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=100000, help="training pairs at most")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hard", type=int, default=0, help="hard negatives per training pair: the first stage's best "
                                                       "wrong passages among the training passages (default 0)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from torchbert.tasks.predict import run_predict
    from torchbert.tokenizer import BertTokenizer
    from torchbert.tasks.families import TaskSettings
    from torchbert.train.finetune import FinetuneSettings, run_finetuning

    torch.set_num_threads(args.threads)
    test, _ = heldout_and_sentences(1)
    test = test[:args.queries]
    corpus = list(dict.fromkeys(p["positive"] for p in test))
    ids = {t: i for i, t in enumerate(corpus)}
    relevant = [{ids[p["positive"]]} for p in test]
    tok = BertTokenizer.from_pretrained(args.model)

    bag = partial(bag_of_tokens, tok)
    db = bag(corpus)
    idf = np.log(len(corpus) / (1.0 + (db > 0).sum(0))).astype(np.float32)
    _, first = search(bag([p["query"] for p in test]) * idf, db * idf, args.top)
    before = summary(list(first), relevant)
    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)[2 * RETRIEVAL_QUERIES:][:args.pairs]
    if args.hard:  # mined as the first stage finds them: its best passages that are not the pair's own
        train_corpus = [p["positive"] for p in pairs]
        tb = bag(train_corpus)
        tidf = np.log(len(tb) / (1.0 + (tb > 0).sum(0))).astype(np.float32)
        _, mined = search(bag([p["query"] for p in pairs]) * tidf, tb * tidf, args.hard + 1)
        pairs = [{**p, "negative": [train_corpus[i] for i in row if i != k][:args.hard]}
                 for k, (p, row) in enumerate(zip(pairs, mined))]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "train.jsonl").write_text(jsonl_text(pairs), encoding="utf-8")
        s = FinetuneSettings(task="reranker", model=args.model, train=work / "train.jsonl", out=work / "rerank",
                             epochs=1.0, task_settings=TaskSettings(type="reranker", max_length=128))
        s, cfg = s.resolve(batch_size=16, lr=args.lr, seed=args.seed, progress=False)
        start = time.perf_counter()
        run_finetuning(s, cfg, log=lambda *a, **k: None)
        train_s = time.perf_counter() - start
        (work / "candidates.jsonl").write_text("".join(json.dumps({"query": p["query"], "documents": [
            corpus[i] for i in row]}, ensure_ascii=False) + "\n" for p, row in zip(test, first)), encoding="utf-8")
        start = time.perf_counter()
        records = run_predict(work / "rerank", work / "candidates.jsonl", torch.device("cpu"), progress=False)
        score_s = time.perf_counter() - start
    reranked = [row[np.asarray(r["ranking"])] for row, r in zip(first, records)]
    after = summary(reranked, relevant)
    print(f"# {args.model}: {len(pairs):,} training pairs, {len(test):,} test queries, top {args.top} reranked")
    print("| search | nDCG@10 ± SE | s |\n|---|---:|---:|")
    print(f"| idf-weighted bag of tokens | {before[0]:.3f} ± {before[1]:.3f} | |")
    print(f"| + reranker (lr {args.lr:g}, seed {args.seed}, {args.hard} hard negatives) | {after[0]:.3f} ± {after[1]:.3f} | train {train_s:.0f}, "
          f"score {score_s:.0f} |")
    hits = np.mean([bool(set(row) & rel) for row, rel in zip(first, relevant)])
    print(f"# the passage is among the top {args.top} for {hits:.1%} of the queries (the reranker's ceiling)")


if __name__ == "__main__":
    main()
