"""Two torchbert jobs on one machine: how much slower each runs than alone (issue 46).

A job is a `torchbert finetune` or `pretrain` at the tiny (L2 H128) and small (L4 H512) presets, run
as a command, its time the `train_seconds` of its metrics.json (loading and tokenizing left out).
Each job runs
  alone;
  beside a second copy of itself, both started together (each one's time reported);
  beside `torchbert serve` of a tiny BERT under load (two clients send 16 texts a request, one request
  after another, for as long as the job runs);
with the user's environment as it comes (no thread variable set) and with OMP_NUM_THREADS exported to
the machine's core count, as many guides advise. `--before DIR` runs the same jobs from another
checkout's src/ (a `git worktree` of an older commit) in the same session, for the same table.
The slowdown is each time over the same system's time alone (without the variable): two jobs that
shared the cores perfectly would each take 2x.

    git worktree add /tmp/before b0c3a35
    python bench/bench_threads.py --before /tmp/before
    python bench/bench_threads.py --before /tmp/before --alone 5   # alone only: what sharing costs a lone job

`--alone K` times each job alone K times, the systems taking turns, and prints the medians and their
ratio: the cost of the thread rule to a job that has the machine to itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_name  # noqa: E402

JOBS = {  # name: (command, preset, its flags)
    "finetune tiny": ("finetune", "tiny", ["--epochs", "6"]),
    "finetune small": ("finetune", "small", ["--epochs", "1"]),
    "pretrain tiny": ("pretrain", "tiny", ["--steps", "150"]),
    "pretrain small": ("pretrain", "small", ["--steps", "25"]),
}


def setup(work: Path) -> dict[str, Path]:
    """Real data from the packages: 300 sentiment reviews, People's Daily prepared for pretraining, and
    a tiny and a small BERT with random weights on its vocabulary."""
    import torch

    from torchbert.cli import main
    from torchbert.config import BertConfig
    from torchbert.model import BertModel

    paths = {"work": work}
    if not (work / "data" / "manifest.json").is_file():
        assert main(["samples", "sentiment-zh", "--out", str(work / "sentiment")]) == 0
        lines = (work / "sentiment" / "train.tsv").read_text(encoding="utf-8").splitlines()
        (work / "train.tsv").write_text("\n".join(lines[:301]) + "\n", encoding="utf-8")
        assert main(["samples", "peoples-daily", "--out", str(work / "pd")]) == 0
        assert main(["vocab", "--corpus", str(work / "pd" / "corpus.txt"), "--vocab-size", "4000", "--out",
                     str(work / "tok"), "--quiet"]) == 0
        assert main(["prepare", "--corpus", str(work / "pd" / "corpus.txt"), "--tokenizer", str(work / "tok"),
                     "--out", str(work / "data"), "--max-seq-len", "64", "--dupe-factor", "1", "--quiet"]) == 0
        for preset in ("tiny", "small"):
            torch.manual_seed(0)
            vocab = len((work / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines())
            BertModel(BertConfig.from_name(preset, vocab_size=vocab)).save_pretrained(work / preset)
            for f in (work / "tok").iterdir():
                if f.is_file() and not f.name.startswith("."):
                    shutil.copyfile(f, work / preset / f.name)
    return paths


def job_argv(job: str, work: Path, out: Path) -> list[str]:
    command, preset, flags = JOBS[job]
    if command == "finetune":
        return ["finetune", "--task", "classification", "--model", str(work / preset), "--train",
                str(work / "train.tsv"), "--out", str(out), "--max-length", "64", "--batch-size", "16", "--quiet",
                "--overwrite", *flags]
    return ["pretrain", "--data", str(work / "data"), "--out", str(out), "--config", preset, "--batch-size", "16",
            "--quiet", "--overwrite", *flags]


def environment(src: Path, omp: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(src)
    if omp:
        env["OMP_NUM_THREADS"] = str(os.cpu_count())
    return env


def start(job: str, work: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    shutil.rmtree(out, ignore_errors=True)
    return subprocess.Popen([sys.executable, "-m", "torchbert", *job_argv(job, work, out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def seconds(proc: subprocess.Popen, out: Path) -> float:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{out}: exit {proc.returncode}: {err[-500:]}")
    return json.loads((out / "metrics.json").read_text())["train_seconds"]


class Server:
    """`torchbert serve` of the tiny BERT, and two clients that keep it busy."""

    def __init__(self, work: Path, env: dict[str, str]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "torchbert", "serve", "--model", str(work / "tiny"),
                                      "--port", str(self.port), "--log-level", "warning"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.2)
        texts = [line.split("\t")[0] for line in (work / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
        self.body = json.dumps({"input": texts[:16]}).encode()
        self.stop = threading.Event()
        self.answered = 0
        self.clients = [threading.Thread(target=self._client, daemon=True) for _ in range(2)]
        for c in self.clients:
            c.start()

    def _client(self) -> None:
        while not self.stop.is_set():
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/embeddings", data=self.body,
                                             headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=60).read()
            self.answered += 1

    def close(self) -> None:
        self.stop.set()
        for c in self.clients:
            c.join(timeout=60)
        self.proc.terminate()
        self.proc.wait(timeout=60)


def measure(job: str, work: Path, src: Path, omp: bool) -> dict[str, float]:
    env = environment(src, omp)
    out = work / "runs"
    alone = seconds(start(job, work, out / "a", env), out / "a")
    a, b = start(job, work, out / "b", env), start(job, work, out / "c", env)
    pair = [seconds(a, out / "b"), seconds(b, out / "c")]
    server = Server(work, env)
    try:
        time.sleep(1)  # the clients under way
        served = seconds(start(job, work, out / "s", env), out / "s")
    finally:
        server.close()
    return {"alone": alone, "pair": max(pair), "pair_other": min(pair), "beside_serve": served,
            "requests_served": server.answered}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, help="another checkout, run side by side for the same table")
    p.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    p.add_argument("--work", type=Path, help="where the data and models are made (default: a temporary folder)")
    p.add_argument("--alone", type=int, metavar="K", help="only time each job alone, K times per system in turns")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-threads-"))
    setup(work)
    systems = {"now": ROOT / "src"} | ({"before": args.before / "src"} if args.before else {})
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs, torch threads by default: "
          f"{__import__('torch').get_num_threads()}")
    if args.alone:
        print("| job | " + " | ".join(f"{s} alone s (median of {args.alone})" for s in systems)
              + (" | now / before |" if len(systems) > 1 else " |"))
        print("|---|" + "---:|" * (len(systems) + (len(systems) > 1)))
        for job in args.jobs:
            times: dict[str, list[float]] = {s: [] for s in systems}
            for _ in range(args.alone):
                for system, src in systems.items():
                    out = work / "runs" / "a"
                    times[system].append(seconds(start(job, work, out, environment(src, False)), out))
            med = {s: statistics.median(t) for s, t in times.items()}
            print(f"| {job} | " + " | ".join(f"{m:.2f} ({min(times[s]):.2f}-{max(times[s]):.2f})"
                                             for s, m in med.items())
                  + (f" | {med['now'] / med['before']:.3f} |" if len(systems) > 1 else " |"), flush=True)
        return
    print("| job | system | OMP_NUM_THREADS | alone s | two side by side: each s | x alone | beside serve s | "
          "x alone |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for job in args.jobs:
        base = {}
        for omp in (False, True):
            for system, src in systems.items():
                r = measure(job, work, src, omp)
                base.setdefault(system, r["alone"])
                ref = base[system]
                print(f"| {job} | {system} | {os.cpu_count() if omp else '-'} | {r['alone']:.2f} | "
                      f"{r['pair']:.2f} / {r['pair_other']:.2f} | {r['pair'] / ref:.1f}x | {r['beside_serve']:.2f} "
                      f"({r['requests_served']} requests) | {r['beside_serve'] / ref:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
