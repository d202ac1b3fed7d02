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

The folder is this user's own: $XDG_RUNTIME_DIR/torchbert-jobs where the system gives one, else
torchbert-jobs-UID in the temporary folder, which others can write to (issue 59). It is used only as
a real directory owned by this user (made, or set, 0700), opened without following a link, and every
entry through that handle: regular files named as a process id only, opened without following a
link or waiting on them. Anything else there is passed over, and a folder that fails these checks
(a link, another user's) is not used: the job computes as if alone, after a one-line warning.

A job looks again every half second, between steps or batches (`tick`), and changes its pool with
torch.set_num_threads. PyTorch splits sums among its threads, so the last bits of a result follow
the count: a run that must repeat bit for bit beside other jobs takes a fixed --threads. Nothing here runs unless a command started it (`governed`, in cli.main): the
library's functions never change the process's threads by themselves.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

EVERY = 0.5  # seconds between two looks at the other jobs
PID_MAX = 1 << 22  # Linux's largest process id (pid_max at most 2^22): longer names are not a job's


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
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "torchbert-jobs"
    return Path(tempfile.gettempdir()) / f"torchbert-jobs-{os.getuid() if hasattr(os, 'getuid') else 0}"


_warned: set[str] = set()


def private_folder(path: Path) -> int | None:
    """A handle (a directory fd) on `path` as a folder of this user's alone: made 0700 when missing,
    set 0700 when it is this user's and open to others; None, after a one-line warning, when it is a
    link, not a folder, or another user's."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None  # no folder can be made there (read-only, missing parent): this job computes alone
    why = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # a link (followed, it could point anywhere) or no folder
        fd, why = None, "a link or not a folder"
    if fd is not None:
        st = os.fstat(fd)
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            why = f"owned by another user (uid {st.st_uid})"
        elif stat.S_IMODE(st.st_mode) & 0o077:
            try:
                os.fchmod(fd, 0o700)
            except OSError:
                why = "open to other users"
        if why is not None:
            os.close(fd)
            fd = None
    if why is not None and str(path) not in _warned:
        _warned.add(str(path))
        print(f"torchbert: warning: {path} is {why}: not used; this job computes as if alone (it does not share "
              "the cores with other torchbert jobs)", file=sys.stderr)
    return fd


def job_pid(name: str) -> int | None:
    """The process id a file of the folder is named for, or None when the name is not one."""
    if not (name.isdigit() and len(name) <= 7 and name[0] != "0"):
        return None
    pid = int(name)
    return pid if pid <= PID_MAX else None


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
        self.dir: int | None = None  # the folder's handle (private_folder); None: not (yet) used
        self.looked = False  # whether private_folder was asked (once: a folder it refused stays refused)
        self.fd: int | None = None
        self.held = 0  # busy() nesting
        self.next = 0.0

    # -- this job's lock file ---------------------------------------------------------------------
    def _folder(self) -> int | None:
        if not self.looked:
            self.looked, self.dir = True, private_folder(self.where)
        return self.dir

    def _open(self) -> int | None:
        if self.fd is None:
            if self._folder() is None:
                return None
            try:
                self.fd = os.open(str(os.getpid()), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=self.dir)
            except OSError:  # this job computes as if alone
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
        if self._folder() is None:
            return max(count, 1)
        try:
            names = os.listdir(self.dir)
        except OSError:
            return max(count, 1)
        for name in names:
            pid = job_pid(name)
            if pid is None or pid == os.getpid():
                continue
            try:  # never through a link, never waiting on a pipe
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.dir)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    count += 1  # held: that job is computing
                else:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    if not _alive(pid):
                        with contextlib.suppress(OSError):
                            os.unlink(name, dir_fd=self.dir)  # a job that ended without removing its file
            except OSError:
                continue
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
                os.unlink(str(os.getpid()), dir_fd=self.dir)
            self.fd = None
        if self.dir is not None:
            os.close(self.dir)
            self.dir = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
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
