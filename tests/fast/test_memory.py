"""fast/memory.py: freed memory stays in the process, so later steps fault in no fresh pages."""

import subprocess
import sys

import pytest

# Rounds of eight 8 MB buffers made, filled and freed (the last made first, so that each joins the
# free top of the heap); prints whether the settings took and the page faults of the last three of
# six rounds. Under glibc's defaults the count depends on the heap's layout: between 0 and 16,000
# per round measured here, from trimming the freed top (or, below the adaptive threshold, from
# mapping each buffer afresh).
ROUNDS = """
import resource, sys
import torch
from torchbert.fast.memory import keep_freed_memory
kept = keep_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for r in range(6):
    if r == 3:
        before = faults()
    bufs = [torch.ones(2 << 20) for _ in range(8)]
    while bufs:
        bufs.pop()
print(kept, faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_memory_is_reused_without_page_faults():
    out = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout.split()  # no MALLOC_* variables
    assert out[0] == "True"
    pages = 3 * 8 * (8 << 20) // 4096  # what the three rounds write: 49,152 pages
    assert int(out[1]) < pages // 20


def test_glibc_settings_from_the_environment_win(monkeypatch):
    from torchbert.fast import memory

    monkeypatch.setattr(memory, "_done", False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert memory.keep_freed_memory() is False
