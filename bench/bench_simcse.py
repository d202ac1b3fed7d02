"""Unsupervised SimCSE on a BERT pretrained on the user's own corpus: does a corpus alone buy better
embeddings? (issue 50: "more than 2 standard errors over its raw mean-pooled embeddings").

    python bench/bench_simcse.py --model runs/demo/pretrain/bert            # the demo's Chinese BERT
    python bench/bench_simcse.py --model M --lr 5e-5 1e-4 3e-4 --seeds 0 1 2

Held-out set: the test split of `torchbert samples peoples-daily-retrieval` (the inverse cloze task on
People's Daily: 1,000 sentences as queries, the rest of each one's paragraph as its passage, searched
over all 1,000 passages). Training text: the sentences of the People's Daily paragraphs that neither
the dev nor the test split uses (`inverse_cloze(..., seed=0)[2000:]`, each sentence once), one a line:
`finetune --task embedding --train sentences.txt` (each sentence its own positive, the two encodings
differing by dropout alone, the batch's other sentences the negatives; Gao et al., 2021), 1 epoch,
temperature 0.05, mean pooling. Scores: nDCG@10 on the test split, with the standard error over its
queries; the gain of each trained model over the raw one in those standard errors.
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

from torchbert.apps.samples import RETRIEVAL_QUERIES, inverse_cloze, peoples_daily_paragraphs, sentences_of  # noqa: E402
from torchbert.eval.retrieval import retrieval_scores, search  # noqa: E402


def heldout_and_sentences(sentences: int) -> tuple[list[dict], list[str]]:
    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)
    test = pairs[RETRIEVAL_QUERIES:2 * RETRIEVAL_QUERIES]
    return test, sentences_of(pairs[2 * RETRIEVAL_QUERIES:])[:sentences]  # `samples`' sentences.txt


def score(folder: Path, test: list[dict], max_length: int) -> tuple[float, float]:
    """nDCG@10 of the test split, and its standard error over the queries."""
    from torchbert.features import embed
    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer

    model, tok = BertModel.from_pretrained(folder).eval(), BertTokenizer.from_pretrained(folder)
    corpus = list(dict.fromkeys(p["positive"] for p in test))
    ids = {t: i for i, t in enumerate(corpus)}
    q = embed(model, tok, [p["query"] for p in test], pooling="mean", normalize=True, max_length=max_length)
    d = embed(model, tok, corpus, pooling="mean", normalize=True, max_length=max_length)
    _, ranked = search(np.asarray(q), np.asarray(d), 100)
    relevant = [{ids[p["positive"]]} for p in test]
    per_query = [retrieval_scores(ranked[i:i + 1], relevant[i:i + 1])["ndcg@10"] for i in range(len(test))]
    return float(np.mean(per_query)), float(np.std(per_query, ddof=1) / math.sqrt(len(per_query)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a BERT folder (e.g. the demo's runs/demo/pretrain/bert)")
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-4])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sentences", type=int, default=20000, help="training sentences at most (default 20000)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=64, help="training tokens per sentence (default 64)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from torchbert.tasks.families import TaskSettings
    from torchbert.train.finetune import FinetuneSettings, run_finetuning

    torch.set_num_threads(args.threads)
    test, sentences = heldout_and_sentences(args.sentences)
    raw, raw_se = score(args.model, test, 256)
    print(f"# {args.model}: {len(sentences):,} training sentences, {len(test):,} test queries; batch {args.batch_size}, "
          f"1 epoch, max_length {args.max_length}, temperature 0.05, mean pooling")
    print(f"# raw (mean pooling): nDCG@10 {raw:.3f} ± {raw_se:.3f} (SE)")
    print("| lr | seed | nDCG@10 ± SE | gain | gain / raw SE | train s |\n|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "sentences.txt"
        corpus.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
        for lr in args.lr:
            got = []
            for seed in args.seeds:
                out = Path(tmp) / f"run-{lr}-{seed}"
                s = FinetuneSettings(task="embedding", model=args.model, train=corpus, out=out, epochs=1.0,
                                     task_settings=TaskSettings(type="embedding", max_length=args.max_length))
                s, cfg = s.resolve(batch_size=args.batch_size, lr=lr, seed=seed, progress=False)
                start = time.perf_counter()
                run_finetuning(s, cfg, log=lambda *a, **k: None)
                seconds = time.perf_counter() - start
                value, se = score(out, test, 256)
                got.append(value)
                print(f"| {lr:g} | {seed} | {value:.3f} ± {se:.3f} | {value - raw:+.3f} | {(value - raw) / raw_se:+.1f} | "
                      f"{seconds:.0f} |", flush=True)
            sd = float(np.std(got, ddof=1)) if len(got) > 1 else 0.0
            print(f"| {lr:g} | mean ± std | {np.mean(got):.3f} ± {sd:.3f} | {np.mean(got) - raw:+.3f} | "
                  f"{(np.mean(got) - raw) / raw_se:+.1f} | |")


if __name__ == "__main__":
    main()
