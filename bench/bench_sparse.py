"""Does serving sparse embeddings pay? SPLADE-style vectors from a pretrained BERT's own MLM head, untrained
for retrieval, against an idf-weighted bag of its WordPiece tokens, on the held-out set of bench_simcse.py
(issue 50 item 5: "optional sparse embeddings ... if your measurements show it pays").

    python bench/bench_sparse.py --model runs/demo/pretrain/bert [--model minilm-folder ...]

Sparse: each text's vector over the vocabulary is the max over its tokens of log(1 + ReLU(MLM logit))
(SPLADE's pooling, Formal et al. 2021), scored by dot product. Bag of words: 1 for each token of the
text, times the token's idf over the passages (log(N / (1 + df))), scored by dot product. Both searched
exactly (eval/retrieval.py) over the 1,000 test passages; nDCG@10 ± its standard error over the queries.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_simcse import heldout_and_sentences  # noqa: E402

from torchbert.eval.retrieval import retrieval_scores, search  # noqa: E402


def bag(tok, texts: list[str]) -> np.ndarray:
    """1 for each WordPiece token of each text (its specials left out): [texts, vocabulary]."""
    m = np.zeros((len(texts), len(tok.vocab)), np.float32)
    for i, row in enumerate(tok.encode_ids(texts)):
        m[i, row[1:-1]] = 1.0
    return m


def ndcg(queries: np.ndarray, docs: np.ndarray, relevant: list[set[int]]) -> tuple[float, float]:
    _, ranked = search(queries.astype(np.float32), docs.astype(np.float32), 100)
    per = [retrieval_scores(ranked[i:i + 1], relevant[i:i + 1])["ndcg@10"] for i in range(len(relevant))]
    return float(np.mean(per)), float(np.std(per, ddof=1) / math.sqrt(len(per)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, nargs="+", required=True, help="BERT folders with their MLM head")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from torchbert.architectures import load_config
    from torchbert.heads import BertForMaskedLM
    from torchbert.tokenizer import BertTokenizer

    torch.set_num_threads(args.threads)
    test, _ = heldout_and_sentences(1)
    test = test[:args.queries]
    corpus = list(dict.fromkeys(p["positive"] for p in test))
    ids = {t: i for i, t in enumerate(corpus)}
    relevant = [{ids[p["positive"]]} for p in test]
    print(f"# People's Daily ICT test: {len(test):,} queries over {len(corpus):,} passages")
    print("| model | vectors | nDCG@10 ± SE | nonzero terms per passage |\n|---|---|---:|---:|")
    for folder in args.model:
        model = BertForMaskedLM.from_pretrained(folder, config=load_config(folder)).eval()
        tok = BertTokenizer.from_pretrained(folder)

        def sparse(texts: list[str], batch: int = 32) -> np.ndarray:
            out = []
            for i in range(0, len(texts), batch):
                enc = tok(texts[i:i + batch], padding=True, truncation=True, max_length=256, return_tensors="pt")
                with torch.no_grad():
                    logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                   token_type_ids=enc["token_type_ids"]).mlm_logits  # [B, T, V]
                weights = torch.log1p(torch.relu(logits)) * enc["attention_mask"][..., None]
                out.append(weights.max(1).values.numpy())
            return np.concatenate(out)

        d = sparse(corpus)
        value, se = ndcg(sparse([p["query"] for p in test]), d, relevant)
        print(f"| {folder} | MLM head, max log(1+ReLU) | {value:.3f} ± {se:.3f} | {(d > 0).sum(1).mean():,.0f} "
              f"of {d.shape[1]:,} |")
        db = bag(tok, corpus)
        idf = np.log(len(corpus) / (1.0 + (db > 0).sum(0))).astype(np.float32)
        value, se = ndcg(bag(tok, [p["query"] for p in test]) * idf, db * idf, relevant)
        print(f"| {folder} | idf-weighted bag of its tokens | {value:.3f} ± {se:.3f} | {(db > 0).sum(1).mean():,.0f} |")


if __name__ == "__main__":
    main()
