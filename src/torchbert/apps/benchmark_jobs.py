"""`torchbert benchmark --jobs N`: the runs of a benchmark in N worker processes side by side.

The protocol (Bench.steps) yields the runs it needs a batch at a time, independent within a batch:
every task's grid goes to the workers at once, and its seeds as soon as its grid is done. Each
worker runs what Bench.run_one runs in the benchmark's own process, its output into the run's log
file, its threads shared with the other torchbert jobs (fast/threads.py) or fixed by --threads; with
several GPUs each worker computes on one of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import StudyInterrupted
from .benchmark import Bench, Cell, Plan, Protocol
from .stages import Stages
from .suites import SUITES


def _in_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One run of `--jobs`, in a worker process: what Bench.run_one does in the benchmark's own,
    its output into the run's log file, its threads shared with the other jobs (or `threads`)."""
    import contextlib

    from ..fast import threads

    log_file = Path(spec["log"])
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8", buffering=1) as f, contextlib.redirect_stdout(f), \
            contextlib.redirect_stderr(f), threads.governed(spec["threads"]):
        suite = SUITES[spec["suite"]]
        t = suite.task(spec["task"])
        plan = Plan(suite, {k: Path(v) for k, v in spec["models"].items()}, Path(spec["data"]),
                    Protocol(**spec["protocol"]), [t], Path(spec["out"]), spec["precision"])
        r = Stages(plan.out, lambda m: print(m, flush=True), device=spec["device"], keep=False)
        bench = Bench(plan, r, {t.name: {k: Path(v) for k, v in spec["files"].items()}},
                      {t.name: Path(spec["train"])}, {t.name: spec["count"]})
        c = spec["cell"]
        return bench.run_one(c["model"], t, c["lr"], c["batch"], c["seed"])


def _pin_device(counter, gpus: int) -> None:
    """A worker's initializer: with several GPUs, each worker process computes on one of its own."""
    import os

    with counter.get_lock():
        k, counter.value = counter.value, counter.value + 1
    if gpus > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(k % gpus)


class Parallel:
    """The benchmark's runs in `jobs` worker processes: every task's grid at once, and each task's seeds
    as soon as its grid is done (Bench.steps); runs found on disk are not run again. A worker's output
    goes to the run's log file (runs/MODEL/TASK/RUN.log); each run is announced as it starts and ends
    here, with the time left at the pace so far. Ctrl-C or SIGTERM: the workers are interrupted too
    (each saves its checkpoint) and waited for; --resume continues every run."""

    def __init__(self, bench: Bench, jobs: int, device: str, threads: int | None, log):
        self.bench, self.jobs, self.device, self.threads, self.log = bench, jobs, device, threads, log
        p = bench.plan.protocol
        self.runs = len(bench.plan.models) * sum(len(p.lrs) * len(p.batch_sizes) - 1
                                                 + (p.restarts if bench.restarts(t) else p.seeds)
                                                 for t in bench.plan.tasks)
        self.finished, self.seconds = 0, []

    def spec(self, c: Cell) -> dict[str, Any]:
        plan, b = self.bench.plan, self.bench
        return {"suite": plan.suite.name, "task": c.task, "models": {k: str(v) for k, v in plan.models.items()},
                "data": str(plan.data), "protocol": asdict(plan.protocol), "out": str(plan.out),
                "precision": plan.precision,
                "files": {k: str(v) for k, v in b.files[c.task].items()}, "train": str(b.train_files[c.task]),
                "count": b.train_counts[c.task], "cell": asdict(c), "device": self.device, "threads": self.threads,
                "log": str(b.folder(c)) + ".log"}

    def left(self) -> str:
        if not self.seconds:
            return ""
        per = sum(self.seconds) / len(self.seconds)
        return f", about {_minutes((self.runs - self.finished) * per / self.jobs)} left"

    def run(self) -> dict[str, dict[str, Any]]:
        import concurrent.futures as cf
        import multiprocessing

        gpus = 0
        if self.device in ("auto", "cuda"):  # not one named: the workers spread over every GPU
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked OpenMP or CUDA state
        pool = cf.ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=_pin_device,
                                      initargs=(ctx.Value("i", 0), gpus))
        b, plan = self.bench, self.bench.plan
        steps = {(m, t.name): b.steps(m, t) for m in plan.models for t in plan.tasks}
        waiting: dict[tuple[str, str], list] = {}  # a task's batch of runs: their cells as they come, in order
        results: dict[str, dict[str, Any]] = {m: {} for m in plan.models}
        running: dict[cf.Future, tuple[tuple[str, str], int, Cell]] = {}

        def register(key: tuple[str, str], cells: list[Cell]) -> None:
            """A task's next batch: the runs on disk found, the others given to the workers."""
            waiting[key] = [b.on_disk(c) for c in cells]
            for k, (c, found) in enumerate(zip(cells, waiting[key])):
                if found is not None:
                    b.r.found(b.stages_of(plan.suite.task(c.task)))
                    self.finished += 1
                    continue
                running[pool.submit(_in_worker, self.spec(c))] = (key, k, c)
                self.log(f"== {c.model} {c.task} lr {c.lr:g} batch {c.batch} seed {c.seed}: in a worker, its "
                         f"output in {b.folder(c)}.log")

        def advance(key: tuple[str, str]) -> None:
            """Once a task's batch is complete, its next one (or its result)."""
            while all(x is not None for x in waiting[key]):
                try:
                    cells = steps[key].send(waiting.pop(key))
                except StopIteration as end:
                    results[key[0]][key[1]] = end.value
                    return
                register(key, cells)

        try:
            for key, gen in steps.items():
                register(key, next(gen))
                advance(key)
            while running:
                finished, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
                for future in finished:
                    key, k, c = running.pop(future)
                    try:
                        cell = future.result()  # a failed run raises here, as it does in this process
                    except StudyInterrupted:
                        raise StudyInterrupted(b.r.done, b.r.total) from None
                    self.finished += 1
                    self.seconds.append(cell["seconds"])  # its training, as the worker timed it
                    t = plan.suite.task(c.task)
                    b.r.found(b.stages_of(t))
                    self.log(f"done {c.model} {c.task} lr {c.lr:g} batch {c.batch} seed {c.seed}: dev {t.select} "
                             f"{cell['scores']['dev'][t.select]:.4f} ({self.finished} of {self.runs} runs{self.left()})")
                    waiting[key][k] = cell
                    advance(key)
        except BaseException as e:
            if not isinstance(e, KeyboardInterrupt):  # Ctrl-C reached the workers already (one process group)
                for process in list(getattr(pool, "_processes", {}).values()):  # each saves its checkpoint
                    with contextlib.suppress(OSError):
                        os.kill(process.pid, signal.SIGTERM)
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return results


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
