"""What pretraining learns per step and per second: torchbert pretrain against a control, side by side.

The control (issue 36) is transformers.BertForPreTraining in a textbook loop: the same start weights,
the same prepared data and batch order, the same recipe (AdamW with BERT's settings and no decay on
biases and LayerNorm, linear warmup and decay, gradient clipping at 1.0, dropout as the config says),
scored on the same held-out batches. If the control leaves the unigram plateau and torchbert does not,
the bug is ours. Dropout masks differ between the two, so the curves agree within seed noise, not
exactly (tests/train/test_training_parity.py holds the steps equal with dropout off).

    python bench/bench_learning.py                      # the demo's data and recipe, 2,000 steps
    python bench/bench_learning.py --steps 600 --eval-every 100 --seeds 0 1
    python bench/bench_learning.py --against bf16 --seeds 0 1   # torchbert --precision bf16 as the other side

`--against bf16` puts torchbert's own `--precision bf16` (issue 58: bf16 weights, fp32 masters) in the
control's place: the same start weights, data and batch order, scored the same way, so what bf16 costs
in learning per step and buys in seconds shows side by side.

Data: the demo's corpus (compare.write_tasks: People's Daily and training reviews, no dev or test
text) through `torchbert vocab` and `torchbert prepare --whole-word --heldout-docs 100` in a cache
folder (--work), or --data DIR (a folder of `torchbert prepare` with a heldout/ in it). Both systems
are scored on the first --eval-batches held-out batches; the count yardsticks (eval/yardsticks.py)
are printed beside them. Seconds are training seconds only (evaluation is not counted), on one
process with torch's default threads.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_name  # noqa: E402

from torchbert.cli import main as cli  # noqa: E402
from torchbert.config import BertConfig  # noqa: E402
from torchbert.data.shards import PretrainingData  # noqa: E402
from torchbert.eval.yardsticks import yardsticks  # noqa: E402
from torchbert.heads import BertForPreTraining  # noqa: E402
from torchbert.train.pretrain import heldout_batches  # noqa: E402


def demo_data(work: Path, budget: str) -> Path:
    """The demo's corpus, vocabulary and whole-word instances with 100 held-out documents (cached)."""
    from torchbert.apps import demo
    from torchbert.apps.compare import write_tasks

    b = demo.QUICK if budget == "quick" else demo.FULL
    data = work / f"data-{budget}"
    if (data / "heldout" / "manifest.json").is_file():
        return data
    write_tasks(work / f"tasks-{budget}", b)
    corpus = work / f"tasks-{budget}" / "corpus.txt"
    steps = [["vocab", "--corpus", corpus, "--vocab-size", b.vocab_size, "--out", work / f"vocab-{budget}",
              "--quiet", "--overwrite"],
             ["prepare", "--corpus", corpus, "--tokenizer", work / f"vocab-{budget}", "--out", data, "--whole-word",
              "--max-seq-len", b.max_seq_len, "--heldout-docs", 100 if budget == "full" else 20, "--seed", 0,
              "--quiet", "--overwrite"]]
    for argv in steps:
        if cli([str(a) for a in argv]) != 0:
            raise SystemExit(f"torchbert {argv[0]} failed")
    return data


def start_weights(data: Path, preset: str, seed: int, folder: Path) -> Path:
    """A fresh BertForPreTraining (torchbert's init, drawn from `seed`) both systems start from."""
    vocab = PretrainingData(data).vocab_size
    torch.manual_seed(seed)
    BertForPreTraining(BertConfig.from_name(preset, vocab_size=vocab)).save_pretrained(folder)
    (folder / "vocab.txt").write_bytes((data / "vocab.txt").read_bytes())
    return folder


def run_torchbert(a, data: Path, start: Path, out: Path, seed: int, precision: str = "fp32") -> list[dict]:
    argv = ["pretrain", "--data", data, "--out", out, "--init", start, "--steps", a.steps, "--batch-size",
            a.batch_size, "--lr", a.lr, "--warmup-steps", a.warmup, "--schedule", "linear", "--seed", seed,
            "--log-every", a.eval_every, "--eval-every", a.eval_every, "--eval-batches", a.eval_batches,
            "--precision", precision, "--quiet", "--overwrite"]
    if cli([str(x) for x in argv]) != 0:
        raise SystemExit("torchbert pretrain failed")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], "tokens": r["tokens"], "seconds": r["seconds"], "accuracy": r["eval_mlm_accuracy"],
             "loss": r["eval_mlm_loss"]} for r in rows if "eval_mlm_accuracy" in r]


def run_transformers(a, data: Path, start: Path, seed: int) -> list[dict]:
    """The textbook loop: padded batches, torch's AdamW, transformers' linear schedule, clip_grad_norm_."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.BertForPreTraining.from_pretrained(start, attn_implementation="sdpa")
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=a.lr, betas=(0.9, 0.999), eps=1e-6)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, a.warmup, a.steps)
    train = PretrainingData(data, seed=seed)
    held = heldout_batches(PretrainingData(data / "heldout", seed=seed, shuffle=False), a.batch_size, a.eval_batches)
    stream = (b for epoch in range(10**6) for b in train.batches(a.batch_size, epoch=epoch))
    rows = [{"step": 0, "tokens": 0, "seconds": 0.0, **heldout_mlm(model, held)}]  # as torchbert's --init run does
    tokens, seconds = 0, 0.0
    for step in range(1, a.steps + 1):
        b = next(stream)
        started = time.perf_counter()
        model.train()
        loss = model(**b.padded()).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - started
        tokens += b.num_tokens
        if step % a.eval_every == 0 or step == a.steps:
            rows.append({"step": step, "tokens": tokens, "seconds": round(seconds, 3), **heldout_mlm(model, held)})
    return rows


@torch.no_grad()
def heldout_mlm(model, batches) -> dict[str, float]:
    model.eval()
    correct = n = 0
    loss = 0.0
    for b in batches:
        p = b.padded()
        logits = model(input_ids=p["input_ids"], attention_mask=p["attention_mask"],
                       token_type_ids=p["token_type_ids"]).prediction_logits
        at = p["labels"] != -100
        scored, labels = logits[at], p["labels"][at]
        loss += float(torch.nn.functional.cross_entropy(scored, labels, reduction="sum"))
        correct += int((scored.argmax(-1) == labels).sum())
        n += int(labels.numel())
    return {"accuracy": correct / n, "loss": loss / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a torchbert prepare folder with heldout/ (default: the demo's, made in --work)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench_learning"), help="cache and run folder")
    ap.add_argument("--budget", choices=("full", "quick"), default="full", help="the demo data's size (quick: a smoke test)")
    ap.add_argument("--config", default="tiny", help="preset (default: tiny, the demo's)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--against", choices=("transformers", "bf16"), default="transformers",
                    help="the other side: transformers' textbook loop (default), or torchbert --precision bf16")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = Path(a.data) if a.data else demo_data(work, a.budget)
    held = heldout_batches(PretrainingData(data / "heldout", shuffle=False), a.batch_size, a.eval_batches)
    counts = yardsticks(PretrainingData(data), held)
    print(f"# {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}; data {data}")
    print(f"recipe: {a.config}, {a.steps} steps of {a.batch_size}, lr {a.lr:g}, warmup {a.warmup}, linear decay, "
          f"seeds {a.seeds}")
    print(f"count yardsticks on {counts['masked']:,} held-out masked tokens: unigram {counts['unigram']:.3f}, "
          f"left {counts['left']:.3f}, both neighbours {counts['neighbours']:.3f}\n")
    other = "transformers" if a.against == "transformers" else "torchbert bf16"
    curves: dict[str, list[list[dict]]] = {"torchbert": [], other: []}
    for seed in a.seeds:
        start = start_weights(data, a.config, seed, work / f"start-{a.config}-{seed}")
        curves["torchbert"].append(run_torchbert(a, data, start, work / f"torchbert-{seed}", seed))
        curves[other].append(run_transformers(a, data, start, seed) if a.against == "transformers" else
                             run_torchbert(a, data, start, work / f"torchbert-bf16-{seed}", seed, "bf16"))
    print(f"| step | tokens | torchbert held-out MLM acc | {other} held-out MLM acc | torchbert s | {other} s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, row in enumerate(curves["torchbert"][0]):
        cells = [f"{row['step']:,}", f"{row['tokens']:,}"]
        for name in curves:
            accs = [c[i]["accuracy"] for c in curves[name]]
            spread = f" ± {statistics.stdev(accs):.3f}" if len(accs) > 1 else ""
            cells.append(f"{statistics.mean(accs):.3f}{spread}")
        cells += [f"{statistics.mean(c[i]['seconds'] for c in curves[name]):.0f}" for name in curves]
        print("| " + " | ".join(cells) + " |")
    last = {name: statistics.mean(c[-1]["accuracy"] for c in runs) for name, runs in curves.items()}
    se = math.sqrt(max(last[other] * (1 - last[other]), 1e-9) / counts["masked"])
    print(f"\nfinal held-out MLM accuracy: torchbert {last['torchbert']:.3f}, {other} {last[other]:.3f} "
          f"(one run's binomial standard error {se:.3f})")


if __name__ == "__main__":
    main()
