"""How many threads a torchbert job computes with, so that two jobs on one machine share it.

PyTorch's OpenMP threads spin at every barrier, waiting for work. Two processes that each run a pool
as wide as the machine take turns on its cores while the other's threads spin, and each runs many
times slower than alone, not two (issue 46: 4x to 40x measured; bench/bench_threads.py). Spinning
less (OMP_WAIT_POLICY=PASSIVE) fixes the pair but costs a small model 20-90% alone, where threads
that sleep miss their many short parallel regions. So torchbert keeps the spinning pool while it runs
alone and gives each job a share of the cores when others compute beside it:

  threads = max(1, min(cap, cores // busy jobs))

- cores: the CPUs this process may use (its affinity mask, as `taskset` and containers set it);
- cap: `--threads N` fixes N (no sharing), else the user's OMP_NUM_THREADS, else the cores;
- busy jobs: the torchbert processes of this user computing now. Each holds an advisory lock on a
  file of its own in a shared folder while it computes (a training run for its whole loop; a server's
  worker only while a batch runs, so an idle server takes nothing); the kernel drops the lock when a
  process dies, so a killed job never counts.

A job looks again every half second, between steps or batches (`tick`), and changes its pool with
torch.set_num_threads. PyTorch splits sums among its threads, so the last bits of a result follow
the count: a run that must repeat bit for bit beside other jobs takes a fixed --threads. Nothing here runs unless a command started it (`governed`, in cli.main): the
library's functions never change the process's threads by themselves.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

EVERY = 0.5  # seconds between two looks at the other jobs


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def user_cap() -> int | None:
    """The user's OMP_NUM_THREADS, when it is a positive whole number."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def folder() -> Path:
    return Path(tempfile.gettempdir()) / f"torchbert-jobs-{os.getuid() if hasattr(os, 'getuid') else 0}"


class Governor:
    """One process's share of the cores (see the module's docstring)."""

    def __init__(self, fixed: int | None = None, where: Path | None = None):
        import torch

        self.fixed = fixed
        self.cap = fixed or user_cap() or cores()
        self.cores = cores()
        self.where = where or folder()
        self.before = torch.get_num_threads()
        self.threads = self.before
        self.fd: int | None = None
        self.held = 0  # busy() nesting
        self.next = 0.0

    # -- this job's lock file ---------------------------------------------------------------------
    def _open(self) -> int | None:
        if self.fd is None:
            try:
                self.where.mkdir(mode=0o700, exist_ok=True)
                self.fd = os.open(self.where / str(os.getpid()), os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:  # no shared folder: this job computes as if alone
                return None
        return self.fd

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """This job computes in the block: other jobs count it."""
        import fcntl

        fd = self._open()
        if fd is not None and self.held == 0:
            fcntl.flock(fd, fcntl.LOCK_EX)
        self.held += 1
        try:
            self.tick(force=True)
            yield
        finally:
            self.held -= 1
            if fd is not None and self.held == 0:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def busy_jobs(self) -> int:
        """The torchbert jobs of this user computing now, this one included when it is."""
        import fcntl

        count = 1 if self.held else 0
        try:
            names = os.listdir(self.where)
        except OSError:
            return max(count, 1)
        for name in names:
            if name == str(os.getpid()):
                continue
            try:
                fd = os.open(self.where / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                count += 1  # held: that job is computing
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                if name.isdigit() and not _alive(int(name)):
                    with contextlib.suppress(OSError):
                        os.unlink(self.where / name)  # a job that ended without removing its file
            finally:
                os.close(fd)
        return max(count, 1)

    def tick(self, force: bool = False) -> None:
        """Between steps or batches: the pool resized to this job's share, at most every EVERY seconds."""
        now = time.monotonic()
        if not force and now < self.next:
            return
        self.next = now + EVERY
        share = self.fixed or max(1, min(self.cap, self.cores // self.busy_jobs()))
        if share != self.threads:
            import torch

            torch.set_num_threads(share)
            self.threads = share

    def close(self) -> None:
        import torch

        if self.threads != self.before:
            torch.set_num_threads(self.before)
        if self.fd is not None:
            os.close(self.fd)
            with contextlib.suppress(OSError):
                os.unlink(self.where / str(os.getpid()))
            self.fd = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_governor: Governor | None = None


@contextlib.contextmanager
def governed(threads: int | None = None) -> Iterator[Governor]:
    """For a command's time (cli.main): this process shares the cores with the other torchbert jobs
    (threads None) or computes with `threads` threads. The pool is put back as it was after."""
    global _governor
    if _governor is not None:  # a command run by a command (the demo's stages): the outer one governs
        yield _governor
        return
    _governor = Governor(threads)
    try:
        yield _governor
    finally:
        _governor.close()
        _governor = None


def busy():
    """The block computes (a training loop, a batch of a server's worker); a no-op when no command
    governs this process."""
    return _governor.busy() if _governor is not None else contextlib.nullcontext()


def tick() -> None:
    """Between steps or batches; a no-op when no command governs this process."""
    if _governor is not None:
        _governor.tick()
