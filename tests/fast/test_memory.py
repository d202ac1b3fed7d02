"""fast/memory.py: freed memory stays in the process, so later steps fault in no fresh pages."""

import ctypes.util
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


@pytest.mark.parametrize("library, name", [
    ("/lib/x86_64-linux-gnu/libc.so.6", "glibc"),
    ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "tcmalloc"),
    ("/usr/lib/libtcmalloc.so.4.5.10", "tcmalloc"),
    ("/opt/conda/lib/libjemalloc.so.2", "jemalloc"),
    ("/usr/local/lib/libmimalloc.so.2.1", "mimalloc"),
    ("/opt/lib/libhoard.so", "libhoard.so"),
    ("", "unknown"),
])
def test_the_malloc_in_use_is_named_by_its_library(library, name):
    from torchbert.fast.memory import allocator

    assert allocator(library) == name


MALLOC = "from torchbert.fast import memory; print(memory.allocator(), memory.keep_freed_memory())"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_plain_process_runs_glibcs_malloc_and_keeps_freed_memory():
    out = subprocess.run([sys.executable, "-c", MALLOC], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout.split()
    assert out == ["glibc", "True"]


def test_another_malloc_is_left_as_it_is(monkeypatch):
    """Under a preloaded malloc (tcmalloc, jemalloc) glibc's settings would change nothing: none is
    made, and keep_freed_memory says so."""
    import ctypes

    from torchbert.fast import memory

    monkeypatch.setattr(memory, "_done", False)
    for k in (*memory._ENV, "GLIBC_TUNABLES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(memory, "allocator", lambda library=None: "tcmalloc")
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: pytest.fail("libc was loaded to call mallopt"))
    assert memory.keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("tcmalloc_minimal"),
                    reason="tcmalloc is not installed (Debian/Ubuntu: libtcmalloc-minimal4)")
def test_a_preloaded_tcmalloc_is_seen():
    out = subprocess.run([sys.executable, "-c", MALLOC], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": ctypes.util.find_library("tcmalloc_minimal")})
    assert out.stdout.split() == ["tcmalloc", "False"]


def test_env_says_which_malloc_and_how_to_get_tcmalloc():
    from torchbert.fast.memory import TCMALLOC, describe_allocator

    glibc = "/lib/x86_64-linux-gnu/libc.so.6"
    here = describe_allocator(glibc, tcmalloc="libtcmalloc_minimal.so.4")
    assert here.startswith("memory allocator: glibc's malloc") and "fragments its heap" in here
    assert here.endswith("it is installed here: LD_PRELOAD=libtcmalloc_minimal.so.4 torchbert finetune ...")
    missing = describe_allocator(glibc, tcmalloc="")
    assert f"apt install libtcmalloc-minimal4), then LD_PRELOAD={TCMALLOC} torchbert finetune" in missing
    library = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    assert describe_allocator(library) == f"memory allocator: tcmalloc ({library})"
    assert describe_allocator("") == "memory allocator: unknown"


def test_a_run_whose_memory_grew_after_its_first_steps_is_told_how_to_hold_it(monkeypatch):
    """Measured (bench/README.md, 2026-11-30), after the first tenth of the steps: MiniLM on mails of
    unlike lengths grew 34% of its peak, on QA windows 47%; on batches of one length 6%."""
    from torchbert.fast import memory

    monkeypatch.setattr(memory, "_done", True)
    monkeypatch.setattr(memory, "allocator", lambda library=None: "glibc")
    note = memory.growth_note(1.917, 5.626, tcmalloc="libtcmalloc_minimal.so.4")
    assert note == ("note: this process's memory grew by 1.9 GB after the run's first tenth (peak 5.6 GB): "
                    "glibc's heap fragments when the batches' sizes vary. tcmalloc holds it near what is in use at "
                    "the same speed: LD_PRELOAD=libtcmalloc_minimal.so.4 before the command (torchbert env)")
    assert "apt install libtcmalloc-minimal4, then LD_PRELOAD" in memory.growth_note(1.077, 5.96, tcmalloc="")
    assert memory.growth_note(3.577, 7.61)  # the QA run that the second half's 0.72 GB missed
    assert memory.growth_note(0.231, 3.913) is None  # one length: levels off
    assert memory.growth_note(0.275, 1.495) is None  # under half a GB (WNUT-16 NER, one epoch)
    assert memory.growth_note(0.55, 8.0) is None  # under a tenth of the peak
    assert memory.growth_note(None, 5.96) is None and memory.growth_note(1.077, None) is None
    monkeypatch.setattr(memory, "_done", False)  # glibc trimming: its memory rises and falls anyway
    assert memory.growth_note(1.077, 5.96) is None
    monkeypatch.setattr(memory, "_done", True)
    monkeypatch.setattr(memory, "allocator", lambda library=None: "tcmalloc")
    assert memory.growth_note(1.077, 5.96) is None


def test_a_jemalloc_that_hands_its_pages_back_is_told_how_to_keep_them(monkeypatch):
    """Measured (bench/README.md, 2026-11-30): 60 steps of MiniLM took 302 s under jemalloc's default
    decay and 383 s with 10 s decay, 180 s with its pages kept (dirty_decay_ms:-1), as glibc's kept
    heap (179 s) and tcmalloc (176 s)."""
    from torchbert.fast import memory

    je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    advice = memory.jemalloc_advice(je, conf="")
    assert advice.startswith("jemalloc's pages decay (its default): it hands freed memory back")
    assert advice.endswith(f"MALLOC_CONF={memory.JEMALLOC_CONF} keeps it, at the speed of tcmalloc and near its memory")
    assert memory.jemalloc_advice(je, conf="dirty_decay_ms:10000,muzzy_decay_ms:10000") == advice
    assert memory.jemalloc_advice(je, conf=memory.JEMALLOC_CONF) is None
    assert memory.jemalloc_advice(je, conf="dirty_decay_ms:-1,dirty_decay_ms:5000") == advice  # the last one wins
    assert memory.jemalloc_advice("/lib/x86_64-linux-gnu/libc.so.6", conf="") is None
    monkeypatch.setenv("MALLOC_CONF", "background_thread:true")
    assert memory.describe_allocator(je) == f"memory allocator: jemalloc ({je}). {advice}"
    monkeypatch.setenv("MALLOC_CONF", f"background_thread:true,{memory.JEMALLOC_CONF}")
    assert memory.describe_allocator(je) == f"memory allocator: jemalloc ({je})"


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("jemalloc"),
                    reason="jemalloc is not installed (Debian/Ubuntu: libjemalloc2)")
def test_a_preloaded_jemalloc_gets_the_advice_unless_its_pages_are_kept():
    from torchbert.fast.memory import JEMALLOC_CONF

    line = "from torchbert.fast import memory; print(memory.describe_allocator())"
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": ctypes.util.find_library("jemalloc")}
    out = subprocess.run([sys.executable, "-c", line], capture_output=True, text=True, check=True, env=env).stdout
    assert out.startswith("memory allocator: jemalloc (") and "faults it in again" in out
    out = subprocess.run([sys.executable, "-c", line], capture_output=True, text=True, check=True,
                         env={**env, "MALLOC_CONF": JEMALLOC_CONF}).stdout
    assert out.startswith("memory allocator: jemalloc (") and "faults" not in out
