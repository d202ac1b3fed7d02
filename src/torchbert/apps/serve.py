"""`torchbert serve`: a model behind HTTP, the requests of concurrent clients batched together.

    POST /v1/embeddings   sentence embeddings, OpenAI's request and response (input, model, encoding_format)
    POST /predict         a fine-tuned model's predictions: {"inputs": [examples]} -> the records of
                          `torchbert predict` (classification, regression, tagging, QA, multiple choice)
    GET  /health          {"status": "ok", ...} once the model is loaded
    GET  /metrics         Prometheus text: requests by endpoint and status, latency, batch sizes, queue depth

Dynamic batching: a request's texts are checked and tokenized as it arrives, then queued. One
batcher task takes, as soon as the model is free, texts from every request that waited meanwhile (and
from what arrives within `max_wait_ms`, 0 by default), up to `max_batch_tokens` tokens, and hands
them to the model, which runs them as packed, length-sorted forward passes; each request gets its own
rows back, in its order. The requests share each batch in turns, a text from each in arrival order,
round after round, until the budget is full: a request of 256 long texts is answered over many
batches, and a one-text request that arrives meanwhile rides the next one, so it waits about one
batch, whatever else is queued. The event loop never runs the model, so requests keep arriving (and
joining the next batch) while one batch computes. The queue is bounded in texts: past it a request
gets 503 and Retry-After.

Clients are answered honestly: a malformed request gets a 4xx naming the field (a body nested past
what JSON decoding takes, a text that is not valid Unicode, a body that is not application/json, a
`dimensions` the model cannot give, a model name this server does not serve); a failure of the
server's own is a 500 that says only that, and the detail goes to the server's log. A body must
arrive within `body_timeout_s` (else 408); a client that goes away mid-body is counted under status
499 (nginx's "client closed request"), apart from the server's errors.

Where the model runs: `torchbert serve` loads a PyTorch model in a worker process of its own
(`worker_pool`). On a thread beside the event loop, each of its hundreds of small steps per batch
must take back Python's interpreter lock, and waits whenever the loop holds it: beside a busy
Python thread, MiniLM embedded 2.3 texts/s instead of 49.5. Measured side by side over HTTP (2
cores, bench_serve.py), the process served 1.20x the requests of the thread at 1 client, 1.32x at
8 and the same at 32. The INT8 encoder runs a batch in one ONNX Runtime call, which lets go of the
lock, and the process's hand-offs cost more than they save there (0.75x at 1 to 8 clients): it runs
on a thread. Without `workers`, create_app runs the given models on one thread.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

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
                                      "it takes what arrived while the last batch ran)", low=0)
    max_queue: int = setting(1024, "texts waiting or running before new requests get 503 + Retry-After", low=1)
    max_texts: int = setting(256, "texts per request, else 413", low=1)
    max_chars: int = setting(20000, "characters per text, else 413", low=1)
    body_timeout_s: float = setting(30.0, "seconds a client has to send a request's whole body, else 408",
                                    above=0, flag="--body-timeout", metavar="SECONDS")
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


# -- the model ---------------------------------------------------------------------------------------

class Embedder:
    """A BERT encoder's sentence embeddings, as `torchbert embed` computes them: from a folder, or
    from the encoder and tokenizer of a loaded model. load=False: the tokenizer side only (what the
    server's event loop needs when the model runs in a worker process)."""

    endpoint = "embeddings"

    def __init__(self, model_dir: Path | None, *, name: str, pooling: str = "mean", normalize: bool = True,
                 max_length: int | None = None, max_batch_tokens: int = MAX_BATCH_TOKENS, device: str = "cpu",
                 precision: str = "fp32", model=None, tokenizer=None, load: bool = True):
        import torch

        from ..config import load_config
        from ..model import BertModel
        from ..tokenizer import BertTokenizer

        self.name, self.pooling, self.normalize, self.max_batch_tokens = name, pooling, normalize, max_batch_tokens
        self.precision = precision
        self.tokenizer = tokenizer or BertTokenizer.from_pretrained(model_dir)
        self.model = model
        if model is None and load:
            self.model = BertModel.from_pretrained(model_dir).eval().to(torch.device(device))
            if precision == "int8":
                from ..fast.int8 import int8

                self.model = int8(self.model)
        self.config = model.config if model is not None else load_config(model_dir)
        limit = self.config.max_position_embeddings
        self.max_length = min(max_length or limit, limit)
        self.sep = self.tokenizer.sep_token_id

    def tokenize(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        """Token ids per text (with [CLS] and [SEP]), cut to max_length; and the indexes of those cut."""
        ids = self.tokenizer.encode_ids(texts)
        cut = [i for i, x in enumerate(ids) if len(x) > self.max_length]
        for i in cut:
            ids[i] = ids[i][:self.max_length - 1] + [self.sep]
        return ids, cut

    def __call__(self, ids: list[list[int]]) -> np.ndarray:
        from ..features import embed_ids

        out = np.empty((len(ids), self.config.hidden_size), dtype=np.float32)
        with _autocast(self.precision, self.model), _fast(self.model):
            for idx in budget_batches([len(x) for x in ids], self.max_batch_tokens):
                out[idx] = embed_ids(self.model, [ids[i] for i in idx], pooling=self.pooling,
                                     normalize=self.normalize, batch_size=len(idx))
        return out


def _fast(model):
    """torchbert.fast's attention for inference: on a CUDA GPU under bf16, FlashAttention's varlen
    kernel over the packed batch (1.26x the texts/s of SDPA on a padded block, bench/README.md); the
    plain path elsewhere."""
    from .. import fast

    return fast.inference(model)


def _autocast(precision: str, model):
    """bf16: the model's matrix products in bfloat16 (torch.autocast; its weights stay fp32). fp32
    and int8 (an encoder that is already 8-bit) run as they are."""
    import contextlib
    import itertools

    from ..train.loop import autocast

    if precision != "bf16":
        return contextlib.nullcontext()
    return autocast(precision, next(itertools.chain(model.parameters(), model.buffers())).device)


class Predictor:
    """A model fine-tuned by torchbert: for JSON examples, the records `torchbert predict` writes."""

    endpoint = "predict"

    def __init__(self, model_dir: Path, *, name: str, device: str = "cpu", precision: str = "fp32",
                 load: bool = True):
        import itertools

        import torch

        from ..config import load_config
        from ..tasks.families import TaskSettings, family
        from ..tasks.predict import id2label, load_finetuned

        self.name, self.precision = name, precision  # fp32, bf16 or int8
        if load:
            self.model, self.tokenizer, self.ts, _ = load_finetuned(model_dir, None, torch.device(device),
                                                                    self.precision == "int8")
            self.config = self.model.config
        else:  # the task's settings, to read requests; the model runs elsewhere
            self.model, self.tokenizer, self.config = None, None, load_config(model_dir)
            self.ts = TaskSettings.from_config(self.config, str(model_dir))
        self.family, self.id2label = family(self.ts.type), id2label(self.config)
        self.device = torch.device(device)
        self.serial = itertools.count()  # examples of different requests share a batch: their ids must not clash

    def examples(self, body: Any, limits: Limits) -> tuple[list, list[str], list[int]]:
        """The request's examples (with ids unique to this server), the ids to answer with, and an
        estimate of each one's tokens; or Rejected naming the field that is wrong."""
        from dataclasses import replace

        if not isinstance(body, dict):
            raise Rejected(400, f"the body must be a JSON object, not {type(body).__name__}")
        records = body.get("inputs")
        if not isinstance(records, list) or not records:
            raise Rejected(400, "field 'inputs' must be a non-empty list of examples (JSON objects, as the lines "
                                f"of a {self.ts.type} task's JSON Lines file)")
        if len(records) > limits.max_texts:
            raise Rejected(413, f"field 'inputs' holds {len(records)} examples; at most {limits.max_texts} per request")
        examples, ids, sizes = [], [], []
        for i, record in enumerate(records):
            where = f"inputs[{i}]"
            if not isinstance(record, dict):
                raise Rejected(400, f"field '{where}' is {type(record).__name__}; expected a JSON object")
            for text in _strings(record):
                _check_unicode(text, where)
            chars = sum(len(x) for x in _strings(record))
            if chars > limits.max_chars:
                raise Rejected(413, f"field '{where}' holds {chars} characters; at most {limits.max_chars}")
            try:
                example = self.family.from_record(record, where, str(i))
            except ValueError as e:
                raise Rejected(400, str(e)) from None
            ids.append(example.id)
            examples.append(replace(example, id=f"#{next(self.serial)}"))
            sizes.append(max(1, min(chars, self.ts.max_length)))  # about: a token per character at most, as Chinese
        return examples, ids, sizes

    def __call__(self, examples: list) -> list[dict]:
        from ..tasks.batches import TaskData
        from ..tasks.predict import predict

        encoded = self.family.encode(self.tokenizer, examples, self.ts, None, training=False, use_labels=False)
        with _autocast(self.precision, self.model), _fast(self.model):
            return predict(self.model, TaskData(encoded, self.family), examples, self.ts, self.id2label, 64,
                           self.device)


def _check_unicode(text: str, where: str) -> None:
    """Rejected unless `text` is valid Unicode: JSON's \\u escapes can spell a lone surrogate (half of a
    UTF-16 pair), which no encoder takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Rejected(400, f"field '{where}' holds a lone surrogate (\\u{ord(text[e.start]):04x} at character "
                            f"{e.start}): not valid Unicode text") from None


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


# -- the worker process -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """What builds the served models from a folder: in the server, their request side (load=False);
    in the worker process, the models themselves."""

    model_dir: str
    name: str
    pooling: str = "mean"
    normalize: bool = True
    max_length: int | None = None
    max_batch_tokens: int = MAX_BATCH_TOKENS
    device: str = "cpu"
    precision: str = "fp32"  # fp32, bf16 or int8
    threads: int | None = None  # --threads (None: shared with the other torchbert jobs, fast/threads.py)


def build(spec: Spec, load: bool = True) -> tuple[Embedder | None, Predictor | None]:
    """A BERT folder serves embeddings; a fine-tuned one serves predictions, and embeddings from its
    encoder when that is a BERT."""
    from ..config import BertConfig, load_config

    model_dir = Path(spec.model_dir)
    config = load_config(model_dir)
    kw = dict(name=spec.name, pooling=spec.pooling, normalize=spec.normalize, max_length=spec.max_length,
              max_batch_tokens=spec.max_batch_tokens, precision=spec.precision)
    if "torchbert_task" not in config.extra:
        return Embedder(model_dir, device=spec.device, load=load, **kw), None
    predictor = Predictor(model_dir, name=spec.name, device=spec.device, precision=spec.precision, load=load)
    if not isinstance(config, BertConfig):  # GPT, ELMo: no BERT encoder to embed with
        return None, predictor
    if not load:
        return Embedder(model_dir, load=False, **kw), predictor
    return Embedder(None, model=predictor.model.bert, tokenizer=predictor.tokenizer, **kw), predictor


_SERVED: dict[str, Callable] = {}  # in the worker process: endpoint -> the loaded Embedder or Predictor
_FAILED: list[BaseException] = []  # in the worker process: why loading failed, raised by every call
_WORKER = contextlib.ExitStack()  # in the worker process: what it holds until it ends


def _worker_start(spec: Spec) -> None:
    import multiprocessing
    import os
    import signal
    import threading
    from multiprocessing.connection import wait

    # Ctrl-C and SIGTERM reach the whole process group; the server stops this process itself, after
    # answering what is in flight
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # a server killed outright (kill -9, out of memory) cannot stop it: it goes when its parent goes
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (wait([parent.sentinel]), os._exit(1)), daemon=True,
                         name="torchbert-orphan-watch").start()
    from ..fast import threads

    _WORKER.enter_context(threads.governed(spec.threads))  # for the worker's life: it computes every batch
    try:
        embedder, predictor = build(spec, load=True)
    except Exception as e:  # noqa: BLE001 - handed to the server with the first call
        _FAILED.append(e)
        return
    _SERVED.update({x.endpoint: x for x in (embedder, predictor) if x is not None})


def _worker_run(endpoint: str, items: list):
    if _FAILED:
        raise _FAILED[0]
    return _SERVED[endpoint](items)


def _worker_ready() -> bool:
    if _FAILED:
        raise _FAILED[0]
    return True


def worker_pool(spec: Spec):
    """One process that loads the models and runs every batch: the model's many small Python steps
    never wait for the server's event loop to let go of the interpreter lock. Returns it once the
    models are loaded, or raises what loading raised."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start,
                               initargs=(spec,))
    try:
        pool.submit(_worker_ready).result()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    return pool


# -- HTTP --------------------------------------------------------------------------------------------

def _texts(body: Any, limits: Limits) -> list[str]:
    """The `input` of an embeddings request as a list of texts, or Rejected naming what is wrong."""
    if not isinstance(body, dict):
        raise Rejected(400, f"the body must be a JSON object, not {type(body).__name__}")
    if "input" not in body:
        raise Rejected(400, "missing field 'input': a string or a list of strings")
    texts = body["input"]
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise Rejected(400, "field 'input' must be a string or a non-empty list of strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise Rejected(400, f"field 'input[{i}]' is {type(t).__name__}; expected a string (token arrays "
                                "are not accepted: send text)")
    if len(texts) > limits.max_texts:
        raise Rejected(413, f"field 'input' holds {len(texts)} texts; at most {limits.max_texts} per request")
    for i, t in enumerate(texts):
        if len(t) > limits.max_chars:
            raise Rejected(413, f"field 'input[{i}]' is {len(t)} characters; at most {limits.max_chars}")
        _check_unicode(t, f"input[{i}]")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise Rejected(400, f"field 'encoding_format' is {json.dumps(fmt)[:40]}; expected \"float\" or \"base64\"")
    return texts


def _check_dimensions(body: dict, size: int) -> None:
    """OpenAI's `dimensions` shortens the vectors of models trained for it (Matryoshka); a BERT's are
    not, so only its own size is accepted."""
    if "dimensions" not in body:
        return
    d = body["dimensions"]
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise Rejected(400, f"field 'dimensions' must be a positive integer, got {json.dumps(d)[:40]}")
    if d != size:
        raise Rejected(400, f"field 'dimensions' is {d}: this model's embeddings have {size} dimensions and it was "
                            "not trained to shorten them (leave 'dimensions' out)")


def _check_model(body: Any, served: str) -> None:
    """The request's `model`, if it names one, must be the one served here (else 404, as OpenAI's API)."""
    if not isinstance(body, dict) or "model" not in body:
        return
    if not isinstance(body["model"], str):
        raise Rejected(400, "field 'model' must be a string")
    if body["model"] != served:
        raise Rejected(404, f"field 'model': {json.dumps(body['model'])[:80]} is not served here; this server "
                            f"serves {json.dumps(served)}")


class _Disconnected(Exception):
    """The client went away before its body arrived: counted under 499, apart from the server's errors."""


log = logging.getLogger("torchbert.apps.serve")


def server_settings(limits: Limits, host: str, port: int, log_level: str = "info") -> dict[str, Any]:
    """uvicorn's settings for a server of these limits (uvicorn.run(app, **them), uvicorn.Config(app, **them)):
    open connections bounded by limits.max_connections (503 past it)."""
    return {"host": host, "port": port, "log_level": log_level, "access_log": log_level == "debug",
            "limit_concurrency": limits.max_connections}


class OneLength:
    """A request that gives both Content-Length and Transfer-Encoding is answered 400 and its connection
    closed (RFC 9112 section 6.1): the two framings disagree on where the request ends, and a proxy in
    front may have read the rest as a second request, smuggled past it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                body = json.dumps({"error": {"message": "the request has both Content-Length and Transfer-Encoding; "
                                                       "send one", "type": "invalid_request_error"}}).encode()
                await send({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def create_app(embedder: Embedder | None, limits: Limits, predictor: Predictor | None = None,
               workers: Executor | None = None, api_key: str | None = None):
    """The ASGI application: Starlette routes and a Batcher per model function. The models run on one
    inference thread, or in `workers` (from `worker_pool`; the embedder and predictor given are then
    their request side only), which the app shuts down when it stops. With `api_key`, the model
    endpoints want `Authorization: Bearer KEY` (else 401); /health and /metrics stay open."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    if embedder is None and predictor is None:
        raise ValueError("nothing to serve: give an embedder, a predictor or both")
    metrics = Metrics()
    # the model runs one batch at a time
    pool = workers or ThreadPoolExecutor(1, thread_name_prefix="torchbert-inference")
    batchers = {x.endpoint: Batcher(x if workers is None else partial(_worker_run, x.endpoint), limits, metrics,
                                    pool, x.endpoint) for x in (embedder, predictor) if x is not None}
    body_limit = limits.max_texts * (limits.max_chars * 4 + 256) + 4096  # UTF-8, JSON escapes and keys
    name = (predictor or embedder).name
    precision = (predictor or embedder).precision

    @asynccontextmanager
    async def lifespan(app):
        for b in batchers.values():
            await b.start()
        yield
        for b in batchers.values():  # after the server has answered what was in flight
            await b.stop()
        pool.shutdown(wait=True)

    def answer(endpoint: str, start: float, status: int, content: Any, headers: dict | None = None):
        try:
            response = JSONResponse(content, status_code=status, headers=headers)
        except ValueError:  # JSON has no NaN or inf: the model gave them (weights are checked when loaded)
            log.error("%s: the model's output holds NaN or inf", endpoint)
            status, response = 500, JSONResponse({"error": {
                "message": "the model's output for this request holds NaN or inf, which JSON cannot carry",
                "type": "server_error"}}, status_code=500)
        metrics.requests.labels(endpoint, str(status)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        return response

    def failed(endpoint: str, start: float, e: Exception):
        if isinstance(e, _Disconnected):  # nobody reads this answer; the count is what matters
            return answer(endpoint, start, 499, {"error": {"message": "the client closed the request",
                                                           "type": "client_closed"}})
        if isinstance(e, Rejected):
            kind = ("invalid_request_error" if e.status < 500 else "unavailable") if e.status != 401 else \
                "authentication_error"
            return answer(endpoint, start, e.status, {"error": {"message": e.message, "type": kind}}, e.headers)
        # the server failed on this request (its batch, most likely); it stays up. The client learns
        # that, and no more: the detail is for the operator
        log.error("%s: a request failed", endpoint, exc_info=e)
        return answer(endpoint, start, 500, {"error": {"message": "the server failed on this request (the detail "
                                                                  "is in the server's log)", "type": "server_error"}})

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), api_key.encode()):
            raise Rejected(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                           {"WWW-Authenticate": "Bearer"})

    async def read_json(request: Request) -> Any:
        check_key(request)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":  # a web page can send text/plain or a form without asking first
            raise Rejected(415, f"the body must be application/json (Content-Type: {kind or 'none given'})")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > body_limit:
            raise Rejected(413, f"the body is {int(length):,} bytes; at most {body_limit:,}")
        body = bytearray()
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > body_limit:
                        raise Rejected(413, f"the body is over {body_limit:,} bytes")
        except TimeoutError:
            raise Rejected(408, f"the body did not arrive within {limits.body_timeout_s:g} s") from None
        except ClientDisconnect:
            raise _Disconnected() from None
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise Rejected(400, f"the body is not valid JSON ({getattr(e, 'msg', e)})") from None
        except RecursionError:
            raise Rejected(400, "the body nests arrays or objects too deeply to read") from None

    async def embeddings(request: Request):
        start = time.perf_counter()
        try:
            if embedder is None:
                raise Rejected(404, f"{name} is not a BERT encoder: it serves POST /predict only")
            body = await read_json(request)
            texts = _texts(body, limits)
            _check_model(body, name)
            _check_dimensions(body, embedder.config.hidden_size)
            ids, cut = embedder.tokenize(texts)
            vectors = await batchers["embeddings"].submit(ids, [len(x) for x in ids])
        except Exception as e:
            return failed("embeddings", start, e)
        tokens = sum(len(x) for x in ids)
        metrics.texts.labels("embeddings").inc(len(texts))
        metrics.tokens.labels("embeddings").inc(tokens)
        if body.get("encoding_format", "float") == "base64":
            data = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vectors]
        else:
            data = [v.tolist() for v in vectors]
        content = {"object": "list", "model": name,
                   "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        if cut:  # OpenAI's API has no such field; ours says what was done
            content["truncated"] = {"indexes": cut, "max_tokens": embedder.max_length,
                                    "kept": "the first tokens ([SEP] last)"}
        return answer("embeddings", start, 200, content)

    async def predict(request: Request):
        start = time.perf_counter()
        try:
            if predictor is None:
                raise Rejected(404, f"{name} is not fine-tuned for a task: it serves POST /v1/embeddings only")
            body = await read_json(request)
            _check_model(body, name)
            examples, ids, sizes = predictor.examples(body, limits)
            records = await batchers["predict"].submit(examples, sizes)
        except Exception as e:
            return failed("predict", start, e)
        metrics.texts.labels("predict").inc(len(examples))
        for record, ident in zip(records, ids):
            record["id"] = ident
        return answer("predict", start, 200, {"model": predictor.name, "task": predictor.ts.type,
                                              "predictions": records})

    async def health(request: Request):
        if any(b.broken for b in batchers.values()):
            return JSONResponse({"status": "broken", "model": name}, status_code=503)
        return JSONResponse({"status": "ok", "model": name, "endpoints": sorted(batchers), "precision": precision,
                             "queue_texts": sum(b.waiting for b in batchers.values())})

    async def prometheus(request: Request):
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    app = Starlette(lifespan=lifespan, middleware=[Middleware(OneLength)], routes=[
        Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/predict", predict, methods=["POST"]),
        Route("/health", health, methods=["GET"]), Route("/metrics", prometheus, methods=["GET"])])
    app.state.batchers, app.state.metrics = batchers, metrics
    return app
