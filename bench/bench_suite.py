"""`torchbert benchmark glue` against transformers' own fine-tuning (its Trainer) with the same protocol,
side by side, on a GLUE-layout folder built from real English data.

    python bench/bench_suite.py                         # about 25 min on 2 quiet cores
    python bench/bench_suite.py --max-train 300 --seeds 1 --lrs 1e-4   # a quick check (~3 min)
    python bench/bench_suite.py --tasks MNLI                         # the short rows alone (~9 min)

The folder (written into --work, in GLUE's exact layout, so `torchbert benchmark glue` reads it as it
reads GLUE's download):
  SST-2/{train,dev}.tsv   ../shared/data/en_spam: mail subject and body, spam 1 / ham 0 (header
                          sentence, label, as SST-2's)
  MNLI/train.tsv, dev_matched.tsv   ../shared/data/en_nli_presup: BIG-bench presuppositions as NLI, 3
                          labels, in MNLI's eleven (train) and sixteen (dev) columns with gold_label last
The protocol (both systems): for each task, each learning rate of --lrs with seed 0, batch 32, 3 epochs,
10% linear warmup, weight decay 0.01 (not on biases and LayerNorm), 128 tokens, each run's best epoch
on dev; the rate best on dev, then --seeds seeds at it, their mean the task's score. The training
files cut to their first --max-train examples (the same lines on both sides).

Systems:
  torchbert      `torchbert benchmark glue --model minilm --protocol FILE --max-train N`, the whole
                 command (it reads and checks every file, saves every run's model and checkpoint).
  transformers   BertForSequenceClassification (sdpa) on the same MiniLM weights, trained by
                 transformers' Trainer as its run_glue example does (AdamW, linear schedule with warmup,
                 clipping at 1.0, eps 1e-6 as torchbert's), the dev set scored after each epoch, the
                 best epoch kept; DataCollatorWithPadding (padding to the longest in a batch, the
                 faster of run_glue's two options), no checkpoints saved. Timed: tokenizing and
                 Trainer.train() of every run.
Both fp32, or both bf16 (--precision bf16: torchbert's `--precision bf16`, its weights held in bf16 for
each step and dev scored in fp32; the Trainer's `bf16=True`, torch.autocast for training and dev
scoring: each side's own way on a CPU that multiplies bf16 natively); the same threads, in one
process: torchbert first, then transformers.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import realdata  # noqa: E402
from machine import cpu_name  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
MNLI_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def write(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def glue_folder(root: Path) -> Path:
    g = root / "glue_data"
    for split in ("train", "dev"):
        spam = rows_of(SHARED / "en_spam" / f"{split}.tsv")
        write(g / "SST-2" / f"{split}.tsv", [["sentence", "label"]] +
              [[r["sentence"], "1" if r["label"] == "spam" else "0"] for r in spam])
        nli = rows_of(SHARED / "en_nli_presup" / f"{split}.tsv")
        head = [*MNLI_HEAD, "label1", "gold_label"] if split == "train" else \
            [*MNLI_HEAD, "label1", "label2", "label3", "label4", "label5", "gold_label"]
        body = [[str(i), str(i), f"{i}n", "presup", "( a )", "( b )", "(ROOT a)", "(ROOT b)", r["sentence1"],
                 r["sentence2"], *([r["label"]] * (len(head) - len(MNLI_HEAD)))] for i, r in enumerate(nli)]
        write(g / "MNLI" / ("train.tsv" if split == "train" else "dev_matched.tsv"), [head] + body)
    return g


TASKS = {"SST-2": ("SST-2/train.tsv", "SST-2/dev.tsv", ("sentence", None), "label"),
         "MNLI": ("MNLI/train.tsv", "MNLI/dev_matched.tsv", ("sentence1", "sentence2"), "gold_label")}
COLUMN = {"SST-2": "SST-2", "MNLI": "MNLI-m"}


def run_torchbert(g: Path, work: Path, protocol: Path, max_train: int,
                  precision: str) -> tuple[dict[str, float], float, dict]:
    from torchbert.cli import main

    out = work / f"torchbert-{precision}"
    start = time.perf_counter()
    code = main(["benchmark", "glue", "--model", "minilm", "--data", str(g), "--out", str(out), "--protocol",
                 str(protocol), "--max-train", str(max_train), "--tasks", *TASKS, "--precision", precision])
    seconds = time.perf_counter() - start
    if code not in (0, None):
        raise SystemExit(f"torchbert benchmark failed ({code})")
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    res = s["results"]["minilm"]
    return {t: res[t]["columns"][COLUMN[t]]["value"] for t in TASKS}, seconds, res


def run_transformers(g: Path, work: Path, p: dict, max_train: int,
                     precision: str) -> tuple[dict[str, float], float, dict]:
    import transformers
    from transformers import (BertForSequenceClassification, BertTokenizerFast, DataCollatorWithPadding, Trainer,
                              TrainingArguments)

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    minilm = realdata.minilm_dir()
    seconds, scores, detail = 0.0, {}, {}
    for task, (train_file, dev_file, (a, b), label) in TASKS.items():
        train, dev = rows_of(g / train_file)[:max_train], rows_of(g / dev_file)
        labels = sorted({r[label] for r in train})
        l2i = {x: i for i, x in enumerate(labels)}
        start = time.perf_counter()
        tok = BertTokenizerFast.from_pretrained(minilm)

        def feats(rows):
            enc = tok([r[a] for r in rows], [r[b] for r in rows] if b else None, truncation=True,
                      max_length=p["max_length"])
            return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                     "attention_mask": enc["attention_mask"][i], "labels": l2i[r[label]]} for i, r in enumerate(rows)]

        train_f, dev_f = feats(train), feats(dev)
        seconds += time.perf_counter() - start

        def one(lr: float, seed: int) -> float:
            nonlocal seconds
            transformers.set_seed(seed)
            model = BertForSequenceClassification.from_pretrained(minilm, num_labels=len(labels),
                                                                  attn_implementation="sdpa")
            args = TrainingArguments(
                output_dir=str(work / "hf"), learning_rate=lr, per_device_train_batch_size=p["batch_sizes"][0],
                per_device_eval_batch_size=64, num_train_epochs=p["epochs"], warmup_steps=p["warmup_ratio"],
                weight_decay=p["weight_decay"], adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear",
                eval_strategy="epoch", save_strategy="no", logging_strategy="no", report_to=[], seed=seed,
                use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False,
                bf16=precision == "bf16")  # on the CPU: torch.autocast in bf16
            trainer = Trainer(model=model, args=args, train_dataset=train_f, eval_dataset=dev_f,
                              data_collator=DataCollatorWithPadding(tok),
                              compute_metrics=lambda ev: {"accuracy": float((ev.predictions.argmax(-1)
                                                                             == ev.label_ids).mean())})
            trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no log lines
            t0 = time.perf_counter()
            trainer.train()
            seconds += time.perf_counter() - t0
            return max(e["eval_accuracy"] for e in trainer.state.log_history if "eval_accuracy" in e)

        task_start = seconds
        grid = {lr: one(lr, p["seed"]) for lr in p["lrs"]}
        best = max(p["lrs"], key=lambda lr: grid[lr])  # the first on a tie, as torchbert's
        runs = [grid[best]] + [one(best, p["seed"] + k) for k in range(1, p["seeds"])]
        scores[task] = statistics.fmean(runs)
        detail[task] = {"grid": grid, "lr": best, "runs": runs, "seconds": seconds - task_start}
        print(f"transformers {task}: grid {grid}, lr {best}, runs {runs}", flush=True)
    return scores, seconds, detail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=None, help="folder for the data and runs (default: a temporary one)")
    ap.add_argument("--max-train", type=int, default=1500)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 5e-5])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS), help="run these tasks only")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="both systems' training precision: bf16 is torchbert's --precision bf16 (weights held in "
                         "bf16 for each step) and the Trainer's bf16=True (torch.autocast); dev scored in fp32 by "
                         "torchbert, under the Trainer's autocast by transformers")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in list(TASKS):
        if name not in args.tasks:
            del TASKS[name]
    from torchbert.fast.memory import keep_freed_memory

    keep_freed_memory()  # as torchbert's training commands set for their process: both systems alike
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-suite."))
    g = glue_folder(work)
    p = {"lrs": args.lrs, "batch_sizes": [32], "epochs": 3, "warmup_ratio": 0.1, "weight_decay": 0.01,
         "max_length": 128, "seeds": args.seeds, "restarts": 0, "seed": 0}
    protocol = work / "protocol.json"
    protocol.write_text(json.dumps(p), encoding="utf-8")
    print(f"# {cpu_name()}, {args.threads} threads, {args.precision}, torch {torch.__version__}; data in {work}",
          flush=True)
    ours, our_s, our_detail = run_torchbert(g, work, protocol, args.max_train, args.precision)
    theirs, their_s, their_detail = run_transformers(g, work, p, args.max_train, args.precision)
    print("\n| task | torchbert | transformers | difference (points) |\n|---|---:|---:|---:|")
    for t in TASKS:
        print(f"| {COLUMN[t]} | {100 * ours[t]:.2f} | {100 * theirs[t]:.2f} | {100 * (ours[t] - theirs[t]):+.2f} |")
    avg_o, avg_t = np.mean(list(ours.values())), np.mean(list(theirs.values()))
    print(f"| average | {100 * avg_o:.2f} | {100 * avg_t:.2f} | {100 * (avg_o - avg_t):+.2f} |")
    print(f"\ntime: torchbert {our_s:.0f} s (the whole command), transformers {their_s:.0f} s (tokenizing and "
          f"Trainer.train): **{our_s / their_s:.2f}x**")
    for t in TASKS:
        print(f"{t}: torchbert {our_detail[t]['seconds']:.0f} s (its runs' finetune stages: loading, training, dev "
              f"scoring, saving), transformers {their_detail[t]['seconds']:.0f} s (Trainer.train, its "
              "evaluation after each epoch included)")
    for t in TASKS:
        print(f"{t}: torchbert lr {our_detail[t]['lr']:g}, dev grid {our_detail[t]['grid_dev']}, "
              f"seeds {our_detail[t]['columns'][COLUMN[t]]['values']}; transformers lr {their_detail[t]['lr']:g}, "
              f"grid {their_detail[t]['grid']}, seeds {their_detail[t]['runs']}")


if __name__ == "__main__":
    main()
