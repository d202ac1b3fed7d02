"""what this machine's processor can do, the precision torchbert will use on it, and its malloc

Print the CPU, the matrix units torchbert can use on it (AMX, AVX512-BF16, VNNI), the GPU if there is
one, the precision that `--precision auto` picks for embed, predict, evaluate and serve, with the
reason, whether `--int8` runs here and what it measured on such a CPU, and the memory allocator in
use (glibc's malloc, or one preloaded such as tcmalloc)."""

from __future__ import annotations

from .common import command

EPILOG = """\
examples:
  torchbert env

bf16 is picked only where the processor multiplies it natively: a CPU with AMX (Intel Sapphire
Rapids and later) or AVX512-BF16 (Intel Cooper Lake, AMD Zen 4 and later), or a GPU with bf16.
Elsewhere bf16 is emulated, 2x to 6x slower than fp32 (MiniLM's embed job on AMD Zen 3: 0.18x
fp32's texts/s), so `auto` stays fp32, and a training command run with --precision bf16 says so.

Fine-tuning on long texts of unlike lengths fragments glibc's heap, and the peak memory grows with
the steps (MiniLM, 256 tokens: 7.8 GB after 148 steps for 2.5 GB in use); so does pretraining at up
to 512 tokens (the small preset: 4.5 GB after 100 steps). Preloading tcmalloc holds it near what is
in use at the same speed (the same 148 steps: 3.3 GB, in 444 s against 446 s; the 100: 2.4 GB):
  LD_PRELOAD=libtcmalloc_minimal.so.4 torchbert finetune ...
(Debian/Ubuntu: apt install libtcmalloc-minimal4.) jemalloc does as well only with its freed pages
kept, MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 (with its defaults: 1.7x the time). `env`
says which malloc is in use; finetune and pretrain say their peak memory, and whether it grew
after the first tenth of the run.
"""


def add(sub) -> None:
    command(sub, __name__)


def run(args) -> None:
    from ..fast.memory import describe_allocator
    from ..hardware import describe

    for line in [*describe(), describe_allocator()]:
        print(line)
