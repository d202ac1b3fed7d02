"""Serving under load: `torchbert serve` against a naive server of the same weights, side by side.

Both servers run as subprocesses on this machine with the same CPU threads, serve MiniLM's mean-
pooled normalized embeddings over loopback, and get the same requests: each of C concurrent clients
sends its share of a fixed list of real mixed-length texts, one text per request, and waits for the
answer before sending the next. The naive server is what a user writes first: Starlette (FastAPI's
core) on uvicorn, `transformers.BertModel`, one forward per request in the threadpool of a sync
handler. torchbert's batches what arrives together (serve.py). All servers start at once and take
turns, one round at a time, so a slow moment of a shared host does not fall on one of them; each
is reported by its median round. Every fp32 answer must agree with offline embeddings within 1e-5
(the last column; bf16 answers move by about 1e-3, --int8 answers by about 0.05).

    python bench/bench_serve.py                          # 1, 8 and 32 clients, 400 requests, 3 rounds
    python bench/bench_serve.py --clients 32 --requests 800 --systems torchbert bf16 naive

Fairness (`--fairness`): one client sends a huge request (--huge-texts texts cut at the model's 512
tokens) while --small-clients others send one short text each, one request after another, until the
huge one is answered; the small requests' latencies are reported (p50, p99, max) beside the huge
one's time. `--before DIR` also serves from another checkout's src/ (say, a `git worktree` of an
older commit), side by side in the same rounds:

    git worktree add /tmp/before 8ae9286
    python bench/bench_serve.py --fairness --before /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import realdata  # noqa: E402
from bench_embed import load_texts  # noqa: E402
from machine import cpu_name  # noqa: E402

NAIVE = '''
import sys, torch, torch.nn.functional as F
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.routing import Route
from transformers import AutoTokenizer, BertModel
torch.set_num_threads(int(sys.argv[2]))
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = BertModel.from_pretrained(sys.argv[1]).eval()

def forward(texts):
    with torch.inference_mode():
        enc = tok(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
        h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
        return F.normalize((h * m).sum(1) / m.sum(1), dim=-1).tolist()

async def embeddings(request):
    body = await request.json()
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    vectors = await run_in_threadpool(forward, texts)  # what a sync FastAPI handler does
    return JSONResponse({"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]})

async def health(request):
    return JSONResponse({"status": "ok"})

app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/health", health)])
'''


LABELS = {"torchbert": "torchbert serve (fp32)", "bf16": "torchbert serve --precision bf16",
          "int8": "torchbert serve --int8", "naive": "naive (transformers, a forward per request)"}
FLAGS = {"torchbert": ("--precision", "fp32"), "bf16": ("--precision", "bf16"), "int8": ("--int8",)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, threads: int, flags: tuple[str, ...], folder: Path,
          extra: tuple[str, ...] = (), src: Path | None = None) -> tuple[subprocess.Popen, str]:
    """A server subprocess (torchbert's from `src` when given, another checkout's) and its URL, once healthy."""
    import httpx

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    model = str(realdata.minilm_dir())
    if name == "torchbert":
        cmd = [sys.executable, "-m", "torchbert", "serve", "--model", model, "--port", str(port), "--log-level",
               "warning", *flags, *extra]
    else:
        (folder / "naive.py").write_text(NAIVE, encoding="utf-8")
        cmd = [sys.executable, "-c", f"import sys; sys.argv = ['naive', {model!r}, '{threads}']; "
               f"exec(open({str(folder / 'naive.py')!r}).read()); import uvicorn; "
               f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning')"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"{name} server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} server did not start")


async def load(url: str, texts: list[str], clients: int) -> tuple[float, np.ndarray, list]:
    """Each client sends its share of `texts` one request at a time: (seconds, latencies, vectors)."""
    import httpx

    latencies = np.zeros(len(texts))
    vectors: list = [None] * len(texts)

    async def client(c, k):
        for i in range(k, len(texts), clients):
            start = time.perf_counter()
            r = await c.post("/v1/embeddings", json={"input": texts[i]})
            latencies[i] = time.perf_counter() - start
            r.raise_for_status()
            vectors[i] = r.json()["data"][0]["embedding"]

    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients)) as c:
        await c.post("/v1/embeddings", json={"input": texts[:4]})  # warm up
        start = time.perf_counter()
        await asyncio.gather(*(client(c, k) for k in range(clients)))
        return time.perf_counter() - start, latencies, vectors


async def fairness(url: str, huge: list[str], small: list[str], clients: int) -> tuple[float, np.ndarray]:
    """One huge request, and `clients` clients sending a small one at a time until it is answered:
    (the huge request's seconds, the small requests' latencies)."""
    import httpx

    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients + 1)) as c:
        await c.post("/v1/embeddings", json={"input": small[:4]})  # warm up
        start = time.perf_counter()
        big = asyncio.create_task(c.post("/v1/embeddings", json={"input": huge}))

        async def client(k):
            i = k
            while not big.done():
                t = time.perf_counter()
                r = await c.post("/v1/embeddings", json={"input": [small[i % len(small)]]})
                r.raise_for_status()
                latencies.append(time.perf_counter() - t)
                i += clients

        await asyncio.gather(*(client(k) for k in range(clients)))
        (await big).raise_for_status()
        return time.perf_counter() - start, np.asarray(latencies)


def fairness_main(args) -> None:
    import tempfile

    huge_source = " ".join(load_texts(400, "sentences"))
    huge = [f"{k} {huge_source[k * 7:k * 7 + args.huge_chars]}" for k in range(args.huge_texts)]
    small = load_texts(200, "sentences")
    print(f"# {args.threads} threads per server; {cpu_name()}; {time.strftime('%Y-%m-%d')}")
    print(f"# one request of {len(huge)} texts of {args.huge_chars} characters (cut at 512 tokens) while "
          f"{args.small_clients} clients send one short text at a time; {args.repeats} round(s), servers in turns\n")
    systems = {"torchbert serve": None, **({f"torchbert serve from {args.before}": Path(args.before) / "src"}
                                          if args.before else {})}
    results: dict[str, list] = {}
    servers = {}
    with tempfile.TemporaryDirectory() as folder:
        try:
            for name, src in systems.items():
                servers[name] = start("torchbert", args.threads, FLAGS["torchbert"], Path(folder), src=src)
            for _ in range(args.repeats):
                for name, (_, url) in servers.items():
                    time.sleep(0.5)
                    results.setdefault(name, []).append(asyncio.run(fairness(url, huge, small, args.small_clients)))
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(60)
    print("| server | huge request s | small requests | small p50 ms | small p99 ms | small max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rounds in results.items():
        seconds = np.median([x for x, _ in rounds])
        lat = np.concatenate([x for _, x in rounds]) * 1000
        p50, p99 = np.percentile(lat, [50, 99])
        print(f"| {name} | {seconds:.1f} | {len(lat)} | {p50:.0f} | {p99:.0f} | {lat.max():.0f} |")


def main() -> None:
    import tempfile

    import torch
    import transformers

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=400, help="requests per round (one text each)")
    p.add_argument("--repeats", type=int, default=3, help="rounds per server and client count, the servers "
                                                          "taking turns; the median round is reported (default 3)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    p.add_argument("--systems", nargs="+", choices=tuple(LABELS), default=["torchbert", "naive"],
                   help="bf16: torchbert serve --precision bf16; int8: torchbert serve --int8 (torchbert: fp32)")
    p.add_argument("--serve-args", default="", help="more options for torchbert serve, e.g. '--max-wait-ms 2'")
    p.add_argument("--fairness", action="store_true", help="the fairness case instead (see above)")
    p.add_argument("--huge-texts", type=int, default=256, help="--fairness: texts of the huge request (default 256)")
    p.add_argument("--huge-chars", type=int, default=3000, help="--fairness: characters per huge text (default 3000)")
    p.add_argument("--small-clients", type=int, default=4, help="--fairness: clients of small requests (default 4)")
    p.add_argument("--before", help="--fairness: also serve from this checkout (its src/), side by side")
    args = p.parse_args()
    if args.fairness:
        fairness_main(args)
        return

    texts = load_texts(args.requests, "sentences")
    print(f"# {args.threads} threads per server; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{cpu_name()}; {time.strftime('%Y-%m-%d')}")
    print(f"# {len(texts)} requests of one real text each (tweets and People's Daily sentences), per round; "
          f"{args.repeats} rounds each, the servers taking turns; the median round's figures\n")
    from torchbert.features import embed
    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer

    want = embed(BertModel.from_pretrained(realdata.minilm_dir()).eval(),
                 BertTokenizer.from_pretrained(realdata.minilm_dir()), texts, normalize=True)
    rounds: dict[tuple[str, int], list] = {}
    servers = {}
    with tempfile.TemporaryDirectory() as folder:
        try:
            for name in args.systems:  # all up at once, idle but for their turn
                servers[name] = start("naive" if name == "naive" else "torchbert", args.threads, FLAGS.get(name, ()),
                                      Path(folder), tuple(args.serve_args.split()) if name != "naive" else ())
            for _ in range(args.repeats):
                for clients in args.clients:
                    for name, (_, url) in servers.items():  # one server at a time has the machine
                        time.sleep(0.5)
                        seconds, lat, vectors = asyncio.run(load(url, texts, clients))
                        diff = float(np.abs(np.asarray(vectors, dtype=np.float32) - want).max())
                        rounds.setdefault((name, clients), []).append((len(texts) / seconds, lat, diff))
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(60)
    print("| system | clients | requests/s | p50 ms | p95 ms | p99 ms | torchbert throughput x | "
          "max abs diff vs offline |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    median = {key: sorted(r, key=lambda x: x[0])[len(r) // 2] for key, r in rounds.items()}
    for name in args.systems:
        for clients in args.clients:
            rps, lat, _ = median[(name, clients)]
            diff = max(d for _, _, d in rounds[(name, clients)])
            p50, p95, p99 = np.percentile(lat * 1000, [50, 95, 99])
            ours = median.get(("torchbert", clients))
            ratio = f"{ours[0] / rps:.2f}x" if ours else "-"
            print(f"| {LABELS[name]} | {clients} | {rps:.1f} | {p50:.1f} | {p95:.1f} | {p99:.1f} | {ratio} | "
                  f"{diff:.1e} |")


if __name__ == "__main__":
    main()
