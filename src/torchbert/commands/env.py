"""what this machine's processor can do, and the precision torchbert will use on it

Print the CPU, the matrix units torchbert can use on it (AMX, AVX512-BF16, VNNI), the GPU if there is
one, and the precision that `--precision auto` picks for embed, predict, evaluate and serve, with the
reason."""

from __future__ import annotations

from .common import command

EPILOG = """\
examples:
  torchbert env

bf16 is picked only where the processor multiplies it natively: a CPU with AMX (Intel Sapphire
Rapids and later) or AVX512-BF16 (Intel Cooper Lake, AMD Zen 4 and later), or a GPU with bf16.
Elsewhere bf16 is emulated and about 2x slower than fp32, so `auto` stays fp32.
"""


def add(sub) -> None:
    command(sub, __name__)


def run(args) -> None:
    from ..hardware import describe

    for line in describe():
        print(line)
