"""Keep freed memory in the process from one training step to the next (glibc's malloc, Linux).

It changes the whole process, so only the CLI's training commands call it (not with --no-fast).

A training step frees and allocates again the same large tensors every step. By default glibc
gives freed memory at the top of its heap back to the kernel (trimming), and it serves requests
above an adaptive threshold, which starts at 128 kB, with fresh `mmap`s. Either way the next step
writes into fresh pages, and every 4 kB page costs a page fault and a zero-fill in the kernel:
measured here, 13,000-100,000 faults and 0.05-0.5 s of system time per pretraining step of the
small preset (about 3 s on 2 threads), and an [N, D] row gather 8.4 ms into a fresh output
against 4.7 ms into a kept one.

`keep_freed_memory` fixes the mmap threshold at glibc's largest (32 MB) and turns trimming off, so
freed memory stays in the heap for the next step. A request above 32 MB that no free chunk of the
heap fits is still mapped afresh and given back when freed, so a huge one-off tensor (an eval
batch's logits over the vocabulary) does not pin its memory for the rest of the run; the MLM
head keeps its own [M, V] buffer (fast/decoder.py: _FREE). The cost: the process keeps the high-water mark
of its heap, which a training process reaches in its first steps anyway. Settings given through
glibc's environment variables (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_MAX_, ..., GLIBC_TUNABLES)
win: then nothing is changed. So does another malloc the user preloads (`allocator`).

What it does not fix: glibc's heap fragments when the sizes change from step to step. Fine-tuning
batches of unlike lengths (mails cut at 256 tokens, MiniLM, batch 32) leave holes in the heap that
later tensors do not fit, and the peak grows with the steps: 5.7-6.1 GB after 60 steps and 7.8 GB
after 148, for 2.5 GB in use at most (batches of one length level off at 4.0 GB); pretraining at up
to 512 tokens, whose packed batches differ in token count, from 2.7 GB at step 10 to 6.1 GB at 300.
tcmalloc keeps large and small blocks apart and gives idle pages back a few at a time: the same 148
steps peak at 3.3 GB in the same time (bench/README.md, 2026-11-30). A process cannot change its malloc once it
runs, so the user preloads it (`LD_PRELOAD=libtcmalloc_minimal.so.4`); `torchbert env` says which
malloc is in use and how to get tcmalloc, and a training command whose memory grew after the first
tenth of its run says so at its end (`growth_note`). jemalloc holds it too, but only with its freed
pages kept (`JEMALLOC_CONF`); with its defaults it faults them in again each step, 1.7x slower, and
the same commands say so (`jemalloc_advice`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from pathlib import Path

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: never trim below 2 GB of free heap top
_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_")
_done = False
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"  # jemalloc keeping freed pages (bench/README.md, 2026-11-30)
TCMALLOC = "libtcmalloc_minimal.so.4"  # gperftools' tcmalloc without the profiler (Debian/Ubuntu: libtcmalloc-minimal4)
_NAMES = {"libc": "glibc", "libtcmalloc": "tcmalloc", "libjemalloc": "jemalloc", "libmimalloc": "mimalloc"}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


@functools.cache
def malloc_library() -> str | None:
    """The file of the shared library whose `malloc` this process calls (the first in the search
    order: libc's, or one in LD_PRELOAD), or None where that cannot be told (not Linux, a static
    build)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        process = ctypes.CDLL(None)
        address = ctypes.cast(process.malloc, ctypes.c_void_p)
        info = _DlInfo()
        found = process.dladdr(address, ctypes.byref(info))  # glibc >= 2.34 has dladdr in libc itself
    except (OSError, AttributeError):
        return None
    return os.fsdecode(info.dli_fname) if found and info.dli_fname else None


def allocator(library: str | None = None) -> str:
    """The malloc in use, by name: glibc, tcmalloc, jemalloc, mimalloc, the library's file name for
    another, or "unknown"."""
    library = malloc_library() if library is None else library
    if not library:
        return "unknown"
    name = Path(library).name
    stem = name.split(".so")[0].split("_")[0].split("-")[0]
    return _NAMES.get(stem, name)


def _keeps_dirty_pages(conf: str) -> bool:
    """Whether a jemalloc MALLOC_CONF keeps freed pages (dirty_decay_ms:-1): the last setting wins."""
    decay = [v for k, _, v in (o.partition(":") for o in conf.split(",")) if k.strip() == "dirty_decay_ms"]
    return bool(decay) and decay[-1].strip() == "-1"


def jemalloc_advice(library: str | None = None, conf: str | None = None) -> str | None:
    """Under a preloaded jemalloc whose MALLOC_CONF (`conf`: the environment's when not given) lets
    freed pages decay back to the kernel, what that costs and how to keep them; None otherwise."""
    conf = os.environ.get("MALLOC_CONF", "") if conf is None else conf
    if allocator(library) != "jemalloc" or _keeps_dirty_pages(conf):
        return None
    return ("jemalloc's pages decay (its default): it hands freed memory back and faults it in again each "
            "step, and fine-tuning took 1.7x the time of glibc's kept heap (bench/README.md). "
            f"MALLOC_CONF={JEMALLOC_CONF} keeps it, at the speed of tcmalloc and near its memory")


def describe_allocator(library: str | None = None, tcmalloc: str | None = None) -> str:
    """One line for `torchbert env`: the malloc in use and, under glibc's, how to run with tcmalloc
    (`tcmalloc`: the library found on this machine, looked up when not given)."""
    name = allocator(library)
    if name == "jemalloc" and (advice := jemalloc_advice(library)):
        return f"memory allocator: jemalloc ({library or malloc_library()}). {advice}"
    if name != "glibc":
        return f"memory allocator: {name}" + (f" ({library or malloc_library()})" if name != "unknown" else "")
    found = tcmalloc if tcmalloc is not None else ctypes.util.find_library("tcmalloc_minimal") or ""
    how = (f"it is installed here: LD_PRELOAD={found} torchbert finetune ..." if found else
           f"install it (Debian/Ubuntu: apt install libtcmalloc-minimal4), then LD_PRELOAD={TCMALLOC} torchbert finetune ...")
    return ("memory allocator: glibc's malloc (the training commands set it to keep freed memory). Training on "
            "texts of unlike, long lengths fragments its heap: the peak grows with the steps (3x what is in use after 148 steps of MiniLM at 256 tokens). "
            f"tcmalloc holds it near what is in use, at the same speed; {how}")


def growth_note(growth_gb: float | None, peak_gb: float | None, tcmalloc: str | None = None) -> str | None:
    """A line for the end of a training command whose resident memory grew by `growth_gb` after the
    first tenth of its steps, to a peak of `peak_gb`: under glibc's malloc keeping freed memory, growth of
    a tenth of the peak (and half a GB) is its heap fragmenting, and tcmalloc holds it. Measured
    (bench/README.md, 2026-11-30): 34% of the peak on MiniLM fine-tuned on mails of unlike lengths,
    47% on QA windows over 1,227 steps, 6% on batches of one length; with glibc trimming (its own
    settings), memory rises and falls with the batches, so nothing is told then. `tcmalloc`: as
    describe_allocator's."""
    if growth_gb is None or not peak_gb or not _done or allocator() != "glibc":
        return None
    if growth_gb < max(0.5, 0.1 * peak_gb):
        return None
    found = tcmalloc if tcmalloc is not None else ctypes.util.find_library("tcmalloc_minimal") or ""
    how = f"LD_PRELOAD={found} before the command" if found else \
        f"apt install libtcmalloc-minimal4, then LD_PRELOAD={TCMALLOC} before the command"
    return (f"note: this process's memory grew by {growth_gb:.1f} GB after the run's first tenth (peak "
            f"{peak_gb:.1f} GB): glibc's heap fragments when the batches' sizes vary. tcmalloc holds it near "
            f"what is in use at the same speed: {how} (torchbert env)")


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory (see the module's docstring); once per process.
    Returns whether the settings are in force (False off glibc, or when the environment sets them)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or any(k in os.environ for k in _ENV) \
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") or allocator() not in ("glibc", "unknown"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
