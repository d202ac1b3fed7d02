"""Dynamic batching for `torchbert serve`: the requests of concurrent clients share the model's batches.

A request's items (texts, or examples) are checked and measured in tokens as it arrives, then
queued. One batcher task takes, as soon as the model is free, items from every request that waited
meanwhile (and from what arrives within `max_wait_ms`, 0 by default), up to `max_batch_tokens`
tokens, and hands them to the model; each request gets its own results back, in its order. The
requests share each batch in turns, an item from each in arrival order, round after round, until the
budget is full: a request of 256 long texts is answered over many batches, and a one-text request
that arrives meanwhile rides the next one, so it waits about one batch, whatever else is queued. The
event loop never runs the model, so requests keep arriving (and joining the next batch) while one
batch computes. The queue is bounded in items: past it a request gets 503 and Retry-After.

`Limits` holds every limit of a server, each once and in one unit (a batch's size in tokens): the
batcher cuts batches by them, the endpoints check requests against them, and the worker that runs
the model reads the same object.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..settings import Checked, setting

MAX_BATCH_TOKENS = 2048  # tokens per batch: the fastest of 256 to 16384 measured on 2 CPU cores (bench_serve)


@dataclass
class Limits(Checked):
    """What one server accepts and how it batches, declared once (serve's flags are made from these
    fields); the defaults suit a small BERT on a few CPU cores."""

    max_batch_tokens: int = setting(MAX_BATCH_TOKENS, "tokens per batch; batches are packed, so padding never "
                                    "counts (default: 2048, the fastest of 256 to 16384 measured on 2 CPU cores; a "
                                    "GPU wants more)", low=1)
    max_wait_ms: float = setting(0.0, "how long a batch waits for more requests once the model is free (default: 0: "
                                      "it takes what arrived while the last batch ran)", low=0, high=60_000)
    max_queue: int = setting(1024, "texts waiting or running before new requests get 503 + Retry-After", low=1)
    max_texts: int = setting(256, "texts per request, else 413", low=1)
    max_chars: int = setting(20000, "characters per text, else 413", low=1)
    body_timeout_s: float = setting(30.0, "seconds a client has to send a request's whole body, else 408",
                                    above=0, high=86_400, flag="--body-timeout", metavar="SECONDS")
    max_connections: int = setting(256, "connections open at once; past it, 503 (uvicorn's limit_concurrency)",
                                   low=1)

    def check(self) -> None:
        super().check()
        if self.max_texts > self.max_queue:  # such a request would get 503 + Retry-After for ever
            raise ValueError(f"--max-texts {self.max_texts} is above --max-queue {self.max_queue}: a request of "
                             f"more than {self.max_queue} texts could never be queued; raise --max-queue or lower "
                             "--max-texts")


class Rejected(Exception):
    """A request the server answers with an error status and a one-line message."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


# -- batching ----------------------------------------------------------------------------------------

@dataclass
class _Job:
    items: list  # one per text, what `run` takes
    sizes: list[int]  # each item's tokens
    future: asyncio.Future = field(repr=False)
    done: int = 0  # items handed to the model so far (they go in order)
    results: list = field(default_factory=list, repr=False)

    @property
    def left(self) -> int:
        return len(self.items) - self.done


class Batcher:
    """Coalesces the jobs of concurrent requests into batches for `run` (items -> one result per item,
    in order), which runs on a single inference thread. Jobs share each batch in turns (`_take`)."""

    def __init__(self, run: Callable[[list], Sequence], limits: Limits, metrics: Metrics | None = None,
                 pool: Executor | None = None, name: str | None = None):
        self.run, self.limits, self.metrics = run, limits, metrics
        self.waiting = 0  # texts queued or running
        self.queue: asyncio.Queue[_Job | None] | None = None
        self.task: asyncio.Task | None = None
        self.own_pool = pool is None
        self.name = name or getattr(run, "endpoint", "model")
        self.broken = False  # the worker process died: every request gets 503
        self.pool = pool or ThreadPoolExecutor(1, thread_name_prefix="torchbert-inference")

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self.task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Finish what is queued, then stop."""
        if self.task is not None:
            self.queue.put_nowait(None)
            await self.task
            self.task = None
        if self.own_pool:
            self.pool.shutdown(wait=True)

    async def submit(self, items: list, sizes: Sequence[int]) -> list:
        """The results of `items` (sizes: each one's tokens), once the model has run them all."""
        if self.broken:
            raise Rejected(503, "the inference process has stopped (killed, or out of memory?); restart the server")
        if self.task is None or self.task.done():
            raise Rejected(503, "the server is shutting down", {"Retry-After": "1"})
        if self.waiting + len(items) > self.limits.max_queue:
            raise Rejected(503, f"the queue is full ({self.waiting} texts waiting); retry shortly",
                           {"Retry-After": "1"})
        self.waiting += len(items)
        self._gauge()
        future = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Job(items, list(sizes), future))
        try:
            return await future
        finally:
            self.waiting -= len(items)
            self._gauge()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue.labels(self.name).set(self.waiting)

    def _take(self, active: list[_Job]) -> list[tuple[_Job, int, int]]:
        """The next batch: a text from each job in turn (in the order of `active`), round after round, until the
        next text would pass max_batch_tokens (a text over it alone goes alone). [(job, start, stop)]:
        each job's texts in the batch, consecutive and in its order."""
        taken, used = [0] * len(active), 0
        more = True
        while more:
            more = False
            for i, j in enumerate(active):
                k = j.done + taken[i]
                if k == len(j.items):
                    continue
                if used and used + j.sizes[k] > self.limits.max_batch_tokens:
                    more = False
                    break
                taken[i] += 1
                used += j.sizes[k]
                more = True
        return [(j, j.done, j.done + n) for j, n in zip(active, taken) if n]

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        active: list[_Job] = []  # jobs with texts not yet run, in arrival order
        stopping = False

        def arrived(job: _Job | None) -> None:
            nonlocal stopping
            if job is None:
                stopping = True
            else:
                active.append(job)

        while True:
            if not active:
                if stopping:
                    return
                arrived(await self.queue.get())
                continue
            while not self.queue.empty():  # what arrived while the last batch ran joins without waiting
                arrived(self.queue.get_nowait())
            deadline = loop.time() + self.limits.max_wait_ms / 1000
            while not stopping and sum(s for j in active for s in j.sizes[j.done:]) < self.limits.max_batch_tokens:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:  # a cancelled get leaves its item in the queue
                    arrived(await asyncio.wait_for(self.queue.get(), remaining))
                except TimeoutError:
                    break
            active[:] = [j for j in active if not j.future.done()]  # done: a client that went away
            if active:
                parts = self._take(active)
                await self._batch(parts)
                # those served go to the back, in their order: a request the budget left out this time
                # is first in the next batch, so no request waits behind two others for ever
                served = {id(j) for j, _, _ in parts}
                active[:] = [j for j in active if id(j) not in served] + [j for j, _, _ in parts]
                active[:] = [j for j in active if j.left and not j.future.done()]
                del parts, served  # hold no finished request while waiting for the next one

    async def _batch(self, parts: list[tuple[_Job, int, int]]) -> None:
        items = [x for j, a, b in parts for x in j.items[a:b]]
        for j, _, b in parts:
            j.done = b
        if self.metrics is not None:
            self.metrics.batch_texts.labels(self.name).observe(len(items))
            self.metrics.batch_tokens.labels(self.name).observe(sum(s for j, a, b in parts for s in j.sizes[a:b]))
        try:
            results = await asyncio.get_running_loop().run_in_executor(self.pool, self.run, items)
        except BrokenExecutor:
            self.broken = True
            e = Rejected(503, "the inference process has stopped (killed, or out of memory?); restart the server")
            for j, _, _ in parts:
                if not j.future.done():
                    j.future.set_exception(e)
            return
        except Exception as e:  # the server stays up; the requests that did not cause it get their answers
            if len(parts) == 1:
                if not parts[0][0].future.done():
                    parts[0][0].future.set_exception(e)
                return
            results = await self._alone(parts)
            if results is None:
                return
        start = 0
        for j, a, b in parts:
            if not j.future.done():
                j.results.extend(results[start:start + b - a])
                if not j.left:
                    j.future.set_result(j.results)
            start += b - a

    async def _alone(self, parts: list[tuple[_Job, int, int]]) -> list | None:
        """After a batch failed: each request's part run by itself, so that one bad text fails only its own
        request. The results of the parts that ran (None in place of a failed one's), or None."""
        results: list = []
        for j, a, b in parts:
            try:
                got = await asyncio.get_running_loop().run_in_executor(self.pool, self.run, j.items[a:b])
            except BrokenExecutor:
                self.broken = True
                return None
            except Exception as e:  # noqa: BLE001 - this request's own failure
                if not j.future.done():
                    j.future.set_exception(e)
                got = [None] * (b - a)
            results.extend(got)
        return results


def budget_batches(lengths: Sequence[int], max_tokens: int) -> list[np.ndarray]:
    """Indices in batches of similar length, longest first, each under max_tokens tokens (a longer
    sequence goes alone), and none with a sequence under half its longest: attention works on the
    padded block, which stays at most half padding."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    batches, current, used = [], [], 0
    for i in order:
        if current and (used + lengths[i] > max_tokens or 2 * lengths[i] < lengths[current[0]]):
            batches.append(np.asarray(current))
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    if current:
        batches.append(np.asarray(current))
    return batches


# -- metrics -----------------------------------------------------------------------------------------

class Metrics:
    """Prometheus metrics in a registry of this server's own (none are process-wide)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("torchbert_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("torchbert_request_seconds", "request latency, arrival to response",
                                 ["endpoint"], registry=self.registry,
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.texts = Counter("torchbert_texts", "texts (or examples) answered", ["endpoint"], registry=self.registry)
        self.tokens = Counter("torchbert_tokens", "tokens of the texts answered", ["endpoint"], registry=self.registry)
        self.batch_texts = Histogram("torchbert_batch_texts", "texts per batch handed to the model", ["endpoint"],
                                     registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.batch_tokens = Histogram("torchbert_batch_tokens", "tokens per batch handed to the model", ["endpoint"],
                                      registry=self.registry,
                                      buckets=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536))
        self.queue = Gauge("torchbert_queue_texts", "texts waiting or running", ["endpoint"], registry=self.registry)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
