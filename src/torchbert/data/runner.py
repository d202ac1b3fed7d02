"""Running prepare's tasks (a function and its arguments): here, in worker processes, or on a Dask
cluster (`Runner`), their results yielded as they finish; `run_round` runs a round of them that are
not done yet, with a progress bar. A worker process gets a share of the cores for its thread pools
(`_worker_init`) and gives each task's memory back to the system when it ends (`_call`). Tasks are
handed out a few ahead of the workers, not all at once, so that what makes a task's input (the
Stager, which decompresses a compressed file for its pieces) stays just ahead of them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _worker_init(threads: int) -> None:
    """A worker process's thread pools: `threads` each, so that workers x threads fits the cores
    (runs in the worker, before any pool starts; the parent process is left as it is)."""
    global _trim
    for name in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    _trim = _malloc_trim()


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0): every free page of the heap given back to the system. A worker calls it
    after each task: glibc's threshold for mapping a large request on its own rises (up to 32 MB)
    after the first large free, later ones come from the heap, and a worker that runs task after task
    otherwise keeps the high-water mark of a fragmented heap (measured at 1 GB of corpus: one worker
    90 MB above the 100 MB run's, bench/README.md). None off glibc."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


_trim: Callable[[], object] | None = None  # set in our worker processes only


def _call(task):
    fn, args = task
    try:
        return fn(*args)
    finally:
        if _trim is not None:
            _trim()


def _lost() -> tuple[type[BaseException], ...]:
    """What a task's result raises when the scheduler or the connection to it is gone (not what a task
    itself raised: a full disk in a worker is an OSError too): distributed's CommClosedError, and a
    cancelled future (the scheduler dropped its tasks as it closed)."""
    from distributed.comm.core import CommClosedError

    return (CommClosedError, TimeoutError, asyncio.CancelledError, concurrent.futures.CancelledError)


class ClusterLost(RuntimeError):
    """The Dask cluster went away mid-round; what finished is kept."""

    def __init__(self, address: str, cause: BaseException):
        super().__init__(f"--cluster {address}: lost the Dask scheduler mid-run ({type(cause).__name__}"
                         f"{': ' + str(cause) if str(cause) else ''}); the tasks in flight were lost")
        self.address = address


def check_address(address: str) -> None:
    """A Dask scheduler's address (tcp://HOST:PORT, tls://..., or HOST:PORT), else a ValueError naming the flag."""
    import re

    if not re.fullmatch(r"(?:(?:tcp|tls|ucx|ws|wss)://)?[\w.\-\[\]:%]+(?::\d+)?(?:/[\w.\-]*)?"
                        r"|inproc://[\w.\-]+(?:/[\w.\-]+)*", address):  # inproc: an in-process LocalCluster's
        raise ValueError(f"--cluster {address!r}: not a Dask scheduler address (tcp://HOST:8786); leave --cluster "
                         "out to prepare on this machine")


class Runner:
    """Runs tasks (a function and its arguments) and yields their results as they finish."""

    def __init__(self, workers: int, cluster: str | None):
        self.workers, self.cluster = workers, cluster
        self._pool = self._client = None

    def __enter__(self) -> "Runner":
        if self.cluster is not None:
            check_address(self.cluster)
            try:
                from distributed import Client
            except ImportError:
                raise ValueError("--cluster needs Dask's distributed (pip install 'dask[distributed]')") from None
            try:
                self._client = Client(self.cluster, timeout=30)
            except OSError as e:  # refused, or no answer in 30 s (a TimeoutError is an OSError)
                raise ValueError(f"--cluster {self.cluster}: cannot reach the Dask scheduler ({e})") from None
        return self

    def _start_pool(self):
        """The worker processes, started for the first round of two tasks or more. A worker that dies
        (the OOM killer) breaks the pool: an error, never a wait for ever."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            threads = max(1, cores() // self.workers)
            self._pool = ProcessPoolExecutor(self.workers, multiprocessing.get_context("spawn"), _worker_init,
                                             (threads,))
        return self._pool

    def __exit__(self, kind, exc, tb) -> None:
        if self._pool is not None:
            if kind is not None:  # an error or an interrupt: stop the workers now, not after their tasks
                for process in list(getattr(self._pool, "_processes", {}).values()):
                    process.terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._client is not None:
            self._client.close()

    def run(self, tasks: Iterable, count: int) -> Iterator:
        """The results of `count` tasks, as they finish; a task is taken from `tasks` only when a
        worker is about to be free (one more than the workers are in flight)."""
        if count == 0:
            return
        tasks = iter(tasks)
        if self._client is not None:
            from distributed import as_completed

            ahead = sum(self._client.nthreads().values()) + 1
            running = as_completed()
            futures = []
            lost = _lost()

            def submit() -> None:
                task = next(tasks, None)
                if task is not None:
                    futures.append(self._client.submit(task[0], *task[1], pure=False))
                    running.add(futures[-1])

            try:
                for _ in range(ahead):
                    submit()
                for future in running:
                    yield future.result()
                    submit()
            except lost as e:
                raise ClusterLost(self.cluster, e) from None
            finally:
                with contextlib.suppress(*lost, OSError):  # a cluster that is gone has nothing left to cancel
                    self._client.cancel(futures)
        elif self.workers > 1 and count > 1:
            from concurrent.futures import FIRST_COMPLETED, wait
            from concurrent.futures.process import BrokenProcessPool

            pool, running = self._start_pool(), set()

            def fill() -> None:
                while len(running) < self.workers + 1:
                    task = next(tasks, None)
                    if task is None:
                        return
                    running.add(pool.submit(_call, task))

            try:
                fill()
                while running:
                    done, running = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield future.result()
                    fill()
            except BrokenProcessPool:
                raise RuntimeError("a worker process of prepare died (out of memory? lower --workers or "
                                   "--block-mb); the finished pieces and blocks are kept for --resume") from None
        else:  # one task (or one worker): here, with this process's thread pools
            for task in tasks:
                yield _call(task)


def run_round(runner: Runner, tasks: list, done_files: list[Path], sizes: list[int] | None, progress: bool,
              before: Callable[[int], None] | None = None) -> list[dict]:
    """Run the tasks whose done file is missing, with a progress bar: bytes of the corpus read, with
    tokens/s (sizes given), or blocks made. before(i): called just before task i is handed out.
    Returns what the tasks run now returned (a resumed run's earlier ones are not among them)."""
    from tqdm.auto import tqdm

    todo = [i for i, f in enumerate(done_files) if not f.is_file()]
    if sizes is not None:
        finished = sum(size for size, f in zip(sizes, done_files) if f.is_file())
        bar = tqdm(total=sum(sizes), initial=finished, unit="B", unit_scale=True, desc="read + tokenize",
                   disable=not progress, smoothing=0.1)
    else:
        bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), unit="block", desc="pairs + masks",
                   disable=not progress)

    def handed_out() -> Iterator:
        for i in todo:
            if before is not None:
                before(i)
            yield tasks[i]

    tokens, start, infos = 0, time.perf_counter(), []
    with bar:
        for info in runner.run(handed_out(), len(todo)):
            infos.append(info)
            for message in info.get("notes", ()):  # what a worker's reader cut or skipped, with file and line
                bar.write(f"note: {message}", file=sys.stderr)
            if sizes is not None:
                bar.update(info["bytes"])
                tokens += info["tokens"]
                bar.set_postfix_str(f"{tokens / max(1e-9, time.perf_counter() - start):,.0f} tokens/s", refresh=False)
            else:
                bar.update(1)
    return infos
