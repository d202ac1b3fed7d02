"""Where `torchbert serve` runs its model: a worker process of its own.

A PyTorch model runs in one process (`worker_pool`) that loads the endpoints a folder serves and
runs every batch. On a thread beside the event loop, each of the model's hundreds of small steps per
batch must take back Python's interpreter lock, and waits whenever the loop holds it: beside a busy
Python thread, MiniLM embedded 2.3 texts/s instead of 49.5. Measured side by side over HTTP (2
cores, bench_serve.py), the process served 1.20x the requests of the thread at 1 client, 1.32x at
8 and the same at 32. The INT8 encoder runs a batch in one ONNX Runtime call, which lets go of the
lock, and the process's hand-offs cost more than they save there (0.75x at 1 to 8 clients): it runs
on a thread (create_app without workers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .batcher import Limits
from .endpoints import ENDPOINTS, Endpoint


@dataclass(frozen=True)
class Spec:
    """What builds the served endpoints from a folder: in the server, their request side (load=False);
    in the worker process, the models themselves."""

    model_dir: str
    name: str
    max_length: int | None = None
    options: dict[str, Any] = field(default_factory=dict)  # an endpoint's name -> its own settings (its Settings)
    limits: Limits = field(default_factory=Limits)  # the server's, the one carrier of each limit
    device: str = "cpu"
    precision: str = "fp32"  # fp32, bf16 or int8
    threads: int | None = None  # --threads (None: shared with the other torchbert jobs, fast/threads.py)


def build(spec: Spec, load: bool = True) -> list[Endpoint]:
    """The endpoints that serve the folder (ENDPOINTS' `serves`): a BERT folder serves embeddings; a
    fine-tuned one serves predictions, and embeddings from its encoder when that is a BERT."""
    from ..architectures import load_config

    folder = Path(spec.model_dir)
    config = load_config(folder)
    loaded: dict = {}  # what one endpoint loaded and the next may share
    return [cls.from_spec(spec, load, loaded) for cls in ENDPOINTS if cls.serves(folder, config)]


_SERVED: dict[str, Callable] = {}  # in the worker process: endpoint -> its loaded model side
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
    if not os.environ.get("TORCHBERT_DEBUG"):  # this process is torchbert's own: its warnings in its voice
        import warnings

        from ..errors import one_line_warning

        warnings.showwarning = one_line_warning
    try:
        served = build(spec, load=True)
    except Exception as e:  # noqa: BLE001 - handed to the server with the first call
        _FAILED.append(e)
        return
    _SERVED.update({x.endpoint: x for x in served})


def run_in_worker(endpoint: str, items: list):
    """A batch of `endpoint`'s items, run by the worker's model (the function the server hands the pool)."""
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
