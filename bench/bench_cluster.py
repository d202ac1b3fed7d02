"""Which engine runs `prepare --cluster`'s tasks: Dask distributed or Ray, measured on one machine.

Each engine gets a local cluster of N worker processes (one thread each) started here, then:
- start: seconds until the cluster takes tasks;
- overhead: 2,000 empty tasks submitted at once, seconds per task;
- prepare: `prepare` of a real Chinese corpus (People's Daily and the reviews, --block-mb small enough
  for many blocks) with its pieces and blocks as the engine's tasks, wall seconds; the shards are
  checked equal to a local run's.
The local worker pool (`--workers N`) runs the same prepare for reference. Ray needs
`pip install ray` (not a torchbert dependency).

    python bench/bench_cluster.py --mb 20 --workers 2
"""

from __future__ import annotations

import argparse
import filecmp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_name  # noqa: E402


def _noop(i: int) -> int:
    return i


def same(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
        filecmp.cmp(a / f, b / f, shallow=False) for f in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--block-mb", type=float, default=2)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # this benchmark's own process and its workers

    from bench_prepare import corpus_of_size

    from torchbert.data import PrepareSettings, prepare
    from torchbert.data import runner
    from torchbert.tokenizer import BertTokenizer

    work = Path(tempfile.mkdtemp(prefix="bench_cluster."))
    corpus = work / "corpus.txt"
    corpus_of_size(corpus, args.mb)
    tok = work / "tok"
    BertTokenizer.train([corpus], vocab_size=8000, show_progress=False).save_pretrained(tok)
    settings = dict(block_mb=args.block_mb, dupe_factor=1, masking="dynamic")
    print(f"{cpu_name()}, {os.cpu_count()} cores; {args.mb:g} MB corpus, --block-mb {args.block_mb:g}, "
          f"{args.workers} worker processes\n")
    print("| engine | start s | s per empty task | prepare s | same shards |")
    print("|---|---:|---:|---:|---|")
    t0 = time.perf_counter()
    prepare([corpus], tok, work / "local", PrepareSettings(workers=args.workers, **settings))
    print(f"| local pool | - | - | {time.perf_counter() - t0:.1f} | (reference) |", flush=True)

    import distributed

    t0 = time.perf_counter()
    with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        start = time.perf_counter() - t0
        t0 = time.perf_counter()
        client.gather(client.map(_noop, range(2000), pure=False))
        per_task = (time.perf_counter() - t0) / 2000
        t0 = time.perf_counter()
        prepare([corpus], tok, work / "dask", PrepareSettings(cluster=cluster.scheduler_address, **settings))
        seconds = time.perf_counter() - t0
    print(f"| Dask distributed | {start:.1f} | {per_task * 1e3:.2f} ms | {seconds:.1f} | "
          f"{same(work / 'local', work / 'dask')} |", flush=True)

    try:
        import ray
    except ImportError:
        print("| Ray | (not installed) | | | |")
        return
    t0 = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    remote_call = ray.remote(num_cpus=1)(runner._call)
    ray.get(ray.remote(_noop).remote(0))
    start = time.perf_counter() - t0
    t0 = time.perf_counter()
    ray.get([ray.remote(_noop).remote(i) for i in range(2000)])
    per_task = (time.perf_counter() - t0) / 2000

    def run_on_ray(self, tasks):  # the same tasks as Runner.run gives Dask, as Ray tasks
        refs = [remote_call.remote(task) for task in tasks]
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            yield ray.get(done[0])

    real = runner.Runner.run
    runner.Runner.run = run_on_ray
    try:
        t0 = time.perf_counter()
        prepare([corpus], tok, work / "ray", PrepareSettings(workers=1, **settings))
        seconds = time.perf_counter() - t0
    finally:
        runner.Runner.run = real
        ray.shutdown()
    print(f"| Ray | {start:.1f} | {per_task * 1e3:.2f} ms | {seconds:.1f} | {same(work / 'local', work / 'ray')} |")


if __name__ == "__main__":
    main()
