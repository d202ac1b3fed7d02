"""`benchmark --jobs` on its own (apps/benchmark_jobs.py): the protocol's runs handed to spawned worker
processes a batch at a time, runs found on disk not run again, each run announced as it starts and
ends with the time left, and a failed or interrupted run stopping the others. A run here is a stand-in
(`scored`, in this module, which the workers import) that scores by its learning rate and seed; the
same suite with real fine-tuning runs is in test_benchmark.py (e2e)."""

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from torchbert.apps import benchmark_jobs
from torchbert.apps.benchmark import Bench, Cell, Plan, Protocol
from torchbert.apps.benchmark_jobs import Parallel, _minutes
from torchbert.apps.stages import Stages
from torchbert.apps.suites import SUITES
from torchbert.errors import StudyInterrupted


def scored(spec: dict) -> dict:
    """A run, in a worker: its dev and test scores from its cell (lr 2e-3 is best on dev); in its log
    file, its process id, the GPU it was given and whether a name set in the parent reached it."""
    c = spec["cell"]
    if c["lr"] == 3e-3:
        raise ValueError(f"{spec['task']}: the run with lr 3e-3 failed")
    if c["lr"] == 4e-3:
        raise StudyInterrupted(0, 0)
    if c["lr"] == 5e-3:
        time.sleep(60)
    dev = {1e-3: 0.6, 2e-3: 0.8}[c["lr"]] + c["seed"] / 100
    if "log" in spec:
        Path(spec["log"]).parent.mkdir(parents=True, exist_ok=True)
        Path(spec["log"]).write_text(json.dumps({"pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                 "inherited": hasattr(benchmark_jobs, "set_in_the_parent")}))
    return {"lr": c["lr"], "batch_size": c["batch"], "seed": c["seed"],
            "run": f"{spec['task']}/{c['lr']:g}/{c['seed']}", "seconds": 60.0,
            "scores": {"dev": {"accuracy": dev, "f1": dev}, "test": {"accuracy": dev - 0.1, "f1": dev - 0.1}}}


def bench(tmp_path, lrs=(1e-3, 2e-3), seeds=3, tasks=("sentiment",), models=("tiny",)) -> Bench:
    suite = SUITES["local"]
    plan = Plan(suite, {m: tmp_path / m for m in models}, tmp_path / "data",
                Protocol(lrs=list(lrs), batch_sizes=[8], seeds=seeds, small=0), [suite.task(t) for t in tasks],
                tmp_path / "out")
    files = {t: {"dev": tmp_path / "data" / t / "dev.tsv", "test": tmp_path / "data" / t / "test.tsv"} for t in tasks}
    return Bench(plan, Stages(plan.out, log=lambda m: None, total=100, keep=False), files,
                 {t: tmp_path / "data" / t / "train.tsv" for t in tasks}, {t: 1000 for t in tasks})


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(benchmark_jobs, "_in_worker", scored)


def test_the_grid_then_the_seeds_at_the_best_rate_each_in_a_worker(tmp_path, stand_in, monkeypatch):
    monkeypatch.setattr(benchmark_jobs, "set_in_the_parent", True, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # (a GPU machine's own setting would reach them)
    b, log = bench(tmp_path), []
    p = Parallel(b, jobs=2, device="cpu", threads=None, log=log.append)
    assert p.runs == 4  # 2 learning rates with the first seed, then 2 more seeds at the best
    results = p.run()
    got = results["tiny"]["sentiment"]
    assert got["lr"] == 2e-3 and got["runs"] == ["sentiment/0.002/0", "sentiment/0.002/1", "sentiment/0.002/2"]
    assert got["columns"]["sentiment"]["values"] == pytest.approx([0.7, 0.71, 0.72])
    assert got["seconds"] == 240.0 and b.r.done == 4 * 2  # each run: its finetune and its test
    started = [x for x in log if x.startswith("== ")]
    assert started[:2] == [f"== tiny sentiment lr {lr:g} batch 8 seed 0: in a worker, its output in "
                           f"{tmp_path}/out/runs/tiny/sentiment/lr{lr:g}-bs8-seed0.log" for lr in (1e-3, 2e-3)]
    assert [x.split(":")[0] for x in started[2:]] == ["== tiny sentiment lr 0.002 batch 8 seed 1",
                                                      "== tiny sentiment lr 0.002 batch 8 seed 2"]
    done = [x for x in log if x.startswith("done ")]
    assert len(done) == 4 and done[-1].endswith("(4 of 4 runs, about 0 s left)")
    assert done[0].endswith("(1 of 4 runs, about 2 min left)")  # 3 left at 60 s each, on 2 workers
    logs = [json.loads(f.read_text()) for f in (tmp_path / "out" / "runs" / "tiny" / "sentiment").glob("*.log")]
    assert len(logs) == 4 and os.getpid() not in {x["pid"] for x in logs}  # each run in a worker, its output in its log
    assert not any(x["inherited"] for x in logs), logs  # a fresh interpreter (spawned): nothing of this process's state
    assert not any(x["gpu"] for x in logs), logs  # --device cpu: no GPU given out
    assert any(": dev accuracy 0.8000 (" in x for x in done)


def test_runs_found_on_disk_are_not_run_again(tmp_path, stand_in):
    b, log = bench(tmp_path, seeds=1), []
    on_disk(b, 1e-3, 0)
    p = Parallel(b, jobs=2, device="cpu", threads=None, log=log.append)
    results = p.run()
    assert results["tiny"]["sentiment"]["lr"] == 2e-3 and p.finished == 2 and b.r.done == 4
    assert [x.split(":")[0] for x in log if x.startswith("== ")] == ["== tiny sentiment lr 0.002 batch 8 seed 0"]


def on_disk(b, lr, seed):
    found = b.folder(Cell("tiny", "sentiment", lr, 8, seed))
    found.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        (found / name).write_text("")
    (found / "cell.json").write_text(json.dumps(scored({"task": "sentiment", "cell": {"lr": lr, "batch": 8,
                                                                                      "seed": seed}})))


def test_a_benchmark_found_whole_on_disk_runs_nothing(tmp_path, stand_in):
    b, log = bench(tmp_path, seeds=3), []
    for lr, seed in ((1e-3, 0), (2e-3, 0), (2e-3, 1), (2e-3, 2)):
        on_disk(b, lr, seed)
    p = Parallel(b, jobs=2, device="cpu", threads=None, log=log.append)
    got = p.run()["tiny"]["sentiment"]  # the grid found, then the seeds at its best found too
    assert got["runs"] == ["sentiment/0.002/0", "sentiment/0.002/1", "sentiment/0.002/2"] and log == []
    assert p.finished == 4 and b.r.done == 8


def test_restarts_on_a_small_task_are_counted_in_place_of_seeds(tmp_path):
    b = bench(tmp_path, seeds=3)
    b.plan.protocol = replace(b.plan.protocol, restarts=5, small=10_000)  # the task's 1,000 examples: small
    assert Parallel(b, jobs=2, device="cpu", threads=None, log=print).runs == 2 - 1 + 5


def test_with_several_gpus_the_workers_take_one_each(tmp_path, stand_in, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    b = bench(tmp_path, seeds=1)
    Parallel(b, jobs=2, device="auto", threads=None, log=lambda m: None).run()
    gpus = {json.loads(f.read_text())["gpu"] for f in (tmp_path / "out" / "runs" / "tiny" / "sentiment").glob("*.log")}
    assert gpus and gpus <= {"0", "1"}


def test_every_model_and_task_at_once(tmp_path, stand_in):
    b = bench(tmp_path, seeds=2, tasks=("sentiment", "ner"), models=("a", "b"))
    p = Parallel(b, jobs=2, device="cpu", threads=None, log=lambda m: None)
    assert p.runs == 2 * 2 * 3
    results = p.run()
    assert set(results) == {"a", "b"} and all(set(r) == {"sentiment", "ner"} for r in results.values())
    assert results["b"]["ner"]["runs"] == ["ner/0.002/0", "ner/0.002/1"]


def test_a_failed_run_fails_the_benchmark_with_its_own_error(tmp_path, stand_in):
    b = bench(tmp_path, lrs=(1e-3, 3e-3))
    with pytest.raises(ValueError, match="sentiment: the run with lr 3e-3 failed"):
        Parallel(b, jobs=2, device="cpu", threads=None, log=lambda m: None).run()


def test_an_interrupted_worker_interrupts_the_benchmark_with_its_count(tmp_path, stand_in):
    b = bench(tmp_path, lrs=(1e-3, 4e-3))
    b.r.done = 7
    with pytest.raises(StudyInterrupted) as e:
        Parallel(b, jobs=2, device="cpu", threads=None, log=lambda m: None).run()
    assert e.value.done in (7, 9) and e.value.total == 100  # where this study stands, not the worker's own count


def test_the_other_workers_are_stopped_not_waited_for(tmp_path, stand_in):
    b = bench(tmp_path, lrs=(3e-3, 5e-3))
    start = time.perf_counter()
    with pytest.raises(ValueError):
        Parallel(b, jobs=2, device="cpu", threads=None, log=lambda m: None).run()
    assert time.perf_counter() - start < 30  # the run of 60 s was sent SIGTERM, not waited for


def test_the_time_left_is_said_in_seconds_then_minutes(tmp_path):
    assert [_minutes(s) for s in (0, 89.4, 90, 3600)] == ["0 s", "89 s", "2 min", "60 min"]
    p = Parallel(bench(tmp_path), jobs=2, device="cpu", threads=None, log=lambda m: None)
    assert p.left() == ""  # nothing finished: no pace yet
    p.finished, p.seconds = 3, [100.0, 200.0]
    assert p.left() == ", about 75 s left"  # 1 run at 150 s, 2 at a time
    p.finished = 1
    assert p.left() == ", about 4 min left"


def test_a_workers_spec_is_the_run_it_is_given(tmp_path):
    b = bench(tmp_path)
    b.plan.precision = "bf16"
    c = Cell("tiny", "sentiment", 2e-3, 8, 1)
    spec = json.loads(json.dumps(Parallel(b, jobs=2, device="cpu", threads=3, log=print).spec(c)))  # plain data
    assert Protocol(**spec["protocol"]) == b.plan.protocol and spec["cell"] == {"model": "tiny", "task": "sentiment",
                                                                                "lr": 2e-3, "batch": 8, "seed": 1}
    assert (spec["suite"], spec["task"], spec["precision"], spec["device"], spec["threads"]) == (
        "local", "sentiment", "bf16", "cpu", 3)
    assert spec["models"] == {"tiny": str(tmp_path / "tiny")} and spec["out"] == str(tmp_path / "out")
    assert spec["files"]["dev"] == str(tmp_path / "data" / "sentiment" / "dev.tsv") and spec["count"] == 1000
    assert spec["train"] == str(tmp_path / "data" / "sentiment" / "train.tsv")
    assert spec["log"] == str(b.folder(c)) + ".log" and spec["data"] == str(tmp_path / "data")
