"""prepare's runner on its own (data/runner.py): tasks run here, in worker processes or on a Dask
cluster, handed out only a few ahead of the workers, each worker given its share of the cores; a lost
cluster or a dead worker said in one line; a round that skips what a resumed run has done. The runs of
prepare that use it are in test_scale.py."""

import operator
import os
import signal
import sys
import threading
import time
from concurrent.futures import CancelledError

import pytest

from torchbert.data import runner
from torchbert.data.runner import ClusterLost, Runner, check_address, run_round


def squares(n: int, taken: list):
    """n tasks, each noted in `taken` when it is handed out."""
    for i in range(n):
        taken.append(i)
        yield operator.mul, (i, i)


def test_the_cores_are_those_this_process_may_run_on(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert runner.cores() == 3


def test_a_worker_sets_its_thread_pools_to_its_share(monkeypatch):
    names = ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "TOKENIZERS_PARALLELISM")
    for name in names:
        monkeypatch.setenv(name, "9")
    monkeypatch.setattr(runner, "_trim", None)
    runner._worker_init(3)
    assert [os.environ[n] for n in names] == ["3", "3", "3", "3", "true"]
    assert (runner._trim is not None) == sys.platform.startswith("linux")
    runner._worker_init(1)
    assert [os.environ[n] for n in names] == ["1", "1", "1", "1", "false"]


def test_a_task_gives_its_memory_back_after_it_ends_even_when_it_fails(monkeypatch):
    trims = []
    monkeypatch.setattr(runner, "_trim", lambda: trims.append(len(trims)))
    assert runner._call((operator.add, (2, 3))) == 5 and trims == [0]
    with pytest.raises(ZeroDivisionError):
        runner._call((operator.truediv, (1, 0)))
    assert trims == [0, 1]
    monkeypatch.setattr(runner, "_trim", None)  # the parent process: nothing trimmed
    assert runner._call((operator.add, (1, 1))) == 2 and trims == [0, 1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_malloc_trim_is_glibcs_own():
    trim = runner._malloc_trim()
    assert trim is not None and trim() in (0, 1)  # 1: memory was given back; 0: there was none to give


def test_a_dask_scheduler_address_is_checked_before_anything_is_made():
    for good in ("tcp://10.0.0.5:8786", "tls://scheduler.example.org:8786", "ucx://10.0.0.5:13337",
                 "ws://host:8786", "scheduler:8786", "10.0.0.5", "tcp://[::1]:8786", "tcp://[fe80::1%eth0]:8786",
                 "tcp://host:8786/", "inproc://192.0.2.2/31321/1"):
        check_address(good)
    for bad in ("", "garbage!!", "tcp://", "http://host:8786", "tcp://host:8786 --workers 2", "host:8786\n",
                "tcp://host:8786?x=1", "inproc://", "inproc://h//1", "tcp://h:1/a/b"):
        with pytest.raises(ValueError, match=r"^--cluster .*: not a Dask scheduler address \(tcp://HOST:8786\); "
                                             "leave --cluster out to prepare on this machine$"):
            check_address(bad)


def test_a_lost_cluster_is_one_line_naming_the_address_and_the_cause():
    e = ClusterLost("tcp://h:8786", TimeoutError("no reply in 30 s"))
    assert str(e) == ("--cluster tcp://h:8786: lost the Dask scheduler mid-run (TimeoutError: no reply in 30 s); "
                      "the tasks in flight were lost") and e.address == "tcp://h:8786"
    assert "(CancelledError); the tasks" in str(ClusterLost("tcp://h:8786", CancelledError()))


def test_what_counts_as_a_lost_cluster():
    pytest.importorskip("distributed")
    import asyncio

    from distributed.comm.core import CommClosedError

    lost = runner._lost()
    for cause in (CommClosedError(), TimeoutError(), asyncio.CancelledError(), CancelledError()):
        assert isinstance(cause, lost), cause
    assert not isinstance(OSError(28, "No space left on device"), lost)  # a worker's full disk is its own error


# -- here and in worker processes ---------------------------------------------------------------------


def test_one_worker_runs_the_tasks_here_in_order_taking_each_when_it_is_due():
    taken, seen = [], []
    with Runner(1, None) as r:
        for result in r.run(squares(4, taken), 4):
            seen.append((result, len(taken)))
        assert list(r.run([(os.getpid, ())], 1)) == [os.getpid()]
        assert list(r.run(squares(3, taken := []), 0)) == [] and taken == []  # none due: none taken
        assert r._pool is None
    assert seen == [(0, 1), (1, 2), (4, 3), (9, 4)]


def test_a_single_task_runs_here_even_with_workers():
    with Runner(2, None) as r:
        assert list(r.run([(os.getpid, ())], 1)) == [os.getpid()] and r._pool is None


def test_workers_are_spawned_processes_with_a_share_of_the_cores_each(monkeypatch):
    monkeypatch.setattr(runner, "cores", lambda: 5)
    here = os.environ.get("OMP_NUM_THREADS")
    taken = []
    with Runner(2, None) as r:
        results = list(r.run(squares(8, taken), 8))
        pids = set(r.run([(os.getpid, ())] * 4, 4))
        env = set(r.run([(os.getenv, ("OMP_NUM_THREADS",)), (os.getenv, ("TOKENIZERS_PARALLELISM",))], 2))
        method = r._pool._mp_context.get_start_method()
    assert sorted(results) == [i * i for i in range(8)] and taken == list(range(8))
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert env == {"2", "true"}  # 5 cores // 2 workers
    assert os.environ.get("OMP_NUM_THREADS") == here  # this process's own setting is left as it was
    assert method == "spawn"  # a forked copy of a process running tokenizers' threads can hang


def test_tasks_are_handed_to_the_workers_one_ahead():
    """At most workers + 1 tasks are out at once: the Stager decompresses a file's pieces only just
    ahead of the workers that read them, so the disk never holds a whole compressed corpus."""
    taken, out = [], []
    with Runner(2, None) as r:
        for result in r.run(squares(9, taken), 9):
            out.append(len(taken) - len(out))  # handed out and not yet given back, as this result arrives
    assert max(out) == 3 and len(out) == 9


def test_a_worker_that_dies_is_an_error_never_a_wait():
    with Runner(2, None) as r:
        with pytest.raises(RuntimeError, match=r"^a worker process of prepare died \(out of memory\? lower "
                                               r"--workers or --block-mb\); the finished pieces and blocks are kept"):
            list(r.run([(os._exit, (9,)), (time.sleep, (0.5,))], 2))


def test_an_interrupt_stops_the_workers_at_once():
    with pytest.raises(KeyboardInterrupt):
        with Runner(2, None) as r:
            results = r.run([(operator.add, (1, 1)), (time.sleep, (60,)), (time.sleep, (60,))], 3)
            assert next(results) == 2
            processes = list(r._pool._processes.values())
            raise KeyboardInterrupt
    assert [p.exitcode for p in processes] == [-signal.SIGTERM] * 2  # killed, not waited for


# -- on a Dask cluster ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as c:
        yield c


def test_a_cluster_runs_each_task_once_a_few_ahead_of_its_threads(cluster):
    taken = []
    with Runner(1, cluster.scheduler_address) as r:
        out = [(result, len(taken)) for result in r.run(squares(6, taken), 6)]
        fresh = list(r.run([(os.urandom, (8,))] * 3, 3))
        client = r._client
    assert sorted(x for x, _ in out) == [i * i for i in range(6)]
    assert out[0][1] == 3 and max(n for _, n in out) == 6  # its 2 threads + 1 at first, then one per result
    assert len(set(fresh)) == 3  # the same function and arguments are still three tasks, not one cached
    assert client.status == "closed"


RELEASE = threading.Event()  # what the tasks of an in-process cluster below wait on


def held():
    RELEASE.wait(30)


def test_a_cluster_that_goes_away_is_a_cluster_lost_and_the_rest_is_cancelled(cluster):
    from distributed.comm.core import CommClosedError

    def gone():
        raise CommClosedError("in <TCP (closed)>: Stream is closed")

    try:
        with Runner(1, cluster.scheduler_address) as r:
            with pytest.raises(ClusterLost, match=r"lost the Dask scheduler mid-run \(CommClosedError: in <TCP"):
                list(r.run([(gone, ()), (held, ()), (held, ())], 3))
            deadline = time.time() + 10  # the tasks still out are given up, not left running on the cluster
            while any(r._client.processing().values()) and time.time() < deadline:
                time.sleep(0.05)
            assert not any(r._client.processing().values())
    finally:
        RELEASE.set()


def test_a_cluster_that_cannot_be_reached_or_used_is_named(monkeypatch):
    distributed = pytest.importorskip("distributed")

    def refused(address, timeout):
        assert timeout == 30
        raise OSError(f"Timed out trying to connect to {address} after 30 s")

    monkeypatch.setattr(distributed, "Client", refused)
    with pytest.raises(ValueError, match=r"^--cluster tcp://10.0.0.9:8786: cannot reach the Dask scheduler "
                                         r"\(Timed out trying to connect to tcp://10.0.0.9:8786 after 30 s\)$"):
        Runner(1, "tcp://10.0.0.9:8786").__enter__()
    with pytest.raises(ValueError, match="not a Dask scheduler address"):  # checked before any connection
        Runner(1, "garbage!!").__enter__()
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ValueError, match=r"^--cluster needs Dask's distributed \(pip install 'dask\[distributed\]'\)$"):
        Runner(1, "tcp://10.0.0.9:8786").__enter__()


# -- a round of tasks ---------------------------------------------------------------------------------


def piece(size: int, tokens: int, notes=()):
    return {"bytes": size, "tokens": tokens, "notes": list(notes)}


def test_a_round_runs_only_what_is_not_done_and_says_what_workers_noted(tmp_path, capsys):
    done = [tmp_path / f"{i}.done" for i in range(4)]
    done[1].write_text("")
    tasks = [(piece, (10 * (i + 1), 7 * (i + 1), [f"a.txt line {i}: cut"] if i == 2 else [])) for i in range(4)]
    before = []
    with Runner(1, None) as r:
        infos = run_round(r, tasks, done, [10, 20, 30, 40], progress=True, before=before.append)
    err = capsys.readouterr().err
    assert before == [0, 2, 3] and [i["bytes"] for i in infos] == [10, 30, 40]
    assert "note: a.txt line 2: cut" in err
    last = err.strip().replace("\r", "\n").splitlines()[-1]
    assert last.startswith("read + tokenize: 100%") and "100/100" in last, err  # 20 bytes done before, 80 now
    assert " tokens/s" in last and " 0 tokens/s" not in last, err


def test_a_round_of_blocks_counts_blocks(tmp_path, capsys):
    done = [tmp_path / f"{i}.done" for i in range(3)]
    done[0].write_text("")
    with Runner(1, None) as r:
        infos = run_round(r, [(dict, ()), (dict, ()), (dict, ())], done, None, progress=True)
    err = capsys.readouterr().err
    assert infos == [{}, {}]
    assert "pairs + masks: 100%" in err and "3/3" in err.replace("\r", "\n").splitlines()[-1], err
    assert run_round(Runner(1, None), [(dict, ())], [done[0]], None, progress=False) == []  # all done: none run
    done[1].write_text("")
    with Runner(2, None) as r:  # one block left of three: run here, no workers started for it
        assert run_round(r, [(dict, ())] * 3, done, None, progress=False) == [{}] and r._pool is None
