"""Running prepare's tasks (a function and its arguments): here, in worker processes, or on a Dask
cluster (`Runner`), their results yielded as they finish. A worker process gets a share of the
cores for its thread pools (`_worker_init`) and gives each task's memory back to the system when
it ends (`_call`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator


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


class Runner:
    """Runs tasks (a function and its arguments) and yields their results as they finish."""

    def __init__(self, workers: int, cluster: str | None):
        self.workers, self.cluster = workers, cluster
        self._pool = self._client = None

    def __enter__(self) -> "Runner":
        if self.cluster:
            try:
                from distributed import Client
            except ImportError:
                raise ValueError("--cluster needs Dask's distributed (pip install 'dask[distributed]')") from None
            try:
                self._client = Client(self.cluster, timeout=30)
            except (OSError, TimeoutError) as e:
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

    def run(self, tasks: list) -> Iterator:
        if not tasks:
            return
        if self._client is not None:
            from distributed import as_completed

            futures = [self._client.submit(fn, *args, pure=False) for fn, args in tasks]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                self._client.cancel(futures)
        elif self.workers > 1 and len(tasks) > 1:
            from concurrent.futures import as_completed
            from concurrent.futures.process import BrokenProcessPool

            futures = [self._start_pool().submit(_call, task) for task in tasks]
            try:
                for future in as_completed(futures):
                    yield future.result()
            except BrokenProcessPool:
                raise RuntimeError("a worker process of prepare died (out of memory? lower --workers or "
                                   "--block-mb); the finished pieces and blocks are kept for --resume") from None
        else:  # one task (or one worker): here, with this process's thread pools
            for task in tasks:
                yield _call(task)
