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
win: then nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: never trim below 2 GB of free heap top
_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_")
_done = False


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory (see the module's docstring); once per process.
    Returns whether the settings are in force (False off glibc, or when the environment sets them)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or any(k in os.environ for k in _ENV) \
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
