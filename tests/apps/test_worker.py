"""serve's worker process on its own (apps/worker.py), with a tiny BERT: what it sets up as it starts
(signals left to the server, a watch on its parent, its threads, warnings in one line), the batches
it runs, a model that fails to load, and that it goes when its server is killed outright. The server
around it (503 once it is gone, parity with offline embeddings) is in test_serve.py."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from torchbert.apps.worker import Spec, run_in_worker, worker_pool


@pytest.fixture(scope="module")
def tiny(minilm_dir, tmp_path_factory):
    from clihelp import tiny_bert

    return tiny_bert(tmp_path_factory.mktemp("worker") / "tiny", minilm_dir)


def what_the_worker_set_up() -> dict:
    """Run in the worker process (this module is importable there: the pool's process starts with the
    test's sys.path)."""
    import threading
    import warnings

    from torchbert.fast import threads

    watch = [t for t in threading.enumerate() if t.name == "torchbert-orphan-watch"]
    return {"sigint": signal.getsignal(signal.SIGINT), "sigterm": signal.getsignal(signal.SIGTERM),
            "watch": [t.daemon for t in watch], "threads": threads._governor and threads._governor.fixed,
            "showwarning": warnings.showwarning.__name__}


def test_the_worker_leaves_signals_to_its_server_and_watches_it(tiny, monkeypatch):
    monkeypatch.delenv("TORCHBERT_DEBUG", raising=False)
    # Python's own Ctrl-C handler here, whatever this test was started with (a shell's background job
    # ignores SIGINT, and its children start so), so that the worker's SIG_IGN is its own doing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        pool = worker_pool(Spec(str(tiny), "m", threads=1))
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        seen = pool.submit(what_the_worker_set_up).result()
        assert pool._mp_context.get_start_method() == "spawn"  # a fresh interpreter, no forked threads
        rows = pool.submit(run_in_worker, "embeddings", [[101, 7592, 102], [101, 2088, 2003, 102]]).result()
    finally:
        pool.shutdown()
    assert seen["sigint"] == signal.SIG_IGN and seen["sigterm"] == signal.SIG_IGN  # the server stops it itself
    assert seen["watch"] == [True]  # one daemon thread that ends the worker when its parent goes
    assert seen["threads"] == 1  # governed by --threads, for the worker's whole life
    assert seen["showwarning"] == "one_line_warning"  # torchbert's warnings in its own voice
    assert np.asarray(rows).shape == (2, 128) and np.isfinite(rows).all()


def test_torchbert_debug_keeps_pythons_own_warnings(tiny, monkeypatch):
    monkeypatch.setenv("TORCHBERT_DEBUG", "1")
    pool = worker_pool(Spec(str(tiny), "m"))
    try:
        assert pool.submit(what_the_worker_set_up).result()["showwarning"] != "one_line_warning"
    finally:
        pool.shutdown()


def test_a_model_that_fails_to_load_fails_the_start_and_leaves_no_process(tiny, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    with open(bad / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(Exception, match="not a valid safetensors file"):  # the loading error itself, not a broken pool
        worker_pool(Spec(str(bad), "m"))
    assert {p.pid for p in multiprocessing.active_children()} <= before


def test_every_call_of_a_worker_whose_model_failed_raises_why(monkeypatch):
    from torchbert.apps import worker

    monkeypatch.setattr(worker, "_FAILED", [OSError("model.safetensors: truncated")])
    for call in (lambda: worker.run_in_worker("embeddings", [[101, 102]]), worker._worker_ready):
        with pytest.raises(OSError, match="truncated"):
            call()


WORKER_OF_A_SERVER = """
import sys, time
from torchbert.apps.worker import Spec, worker_pool
pool = worker_pool(Spec(sys.argv[1], "m"))
print(*pool._processes, flush=True)
time.sleep(600)
"""


def test_the_worker_goes_when_its_server_is_killed_outright(tiny):
    server = subprocess.Popen([sys.executable, "-c", WORKER_OF_A_SERVER, str(tiny)], stdout=subprocess.PIPE,
                              text=True)
    try:
        worker = int(server.stdout.readline())
        os.kill(worker, 0)  # it is there
        server.kill()  # kill -9: nothing of the server runs to stop it
        server.wait(60)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the worker outlived its server")
    finally:
        server.kill()
