"""What this machine's processor can do, read once, and the precision torchbert picks from it.

A CPU multiplies bfloat16 natively when it has AMX (`amx_bf16`, Intel Sapphire Rapids and later) or
AVX512-BF16 (`avx512_bf16`, Intel Cooper Lake, AMD Zen 4 and later): there a bf16 matrix product is
2.7x fp32's (AMD EPYC, AVX512-BF16) to 4.3x (Intel Xeon, AMX), bench/README.md "Precision on the CPU".
Without them bf16 is emulated with fp32 instructions and conversions, 2x (pytorch #86270) to 6x slower
than fp32 (AMD Zen 3, AVX2: a bf16 matrix product at 1 GFLOP/s against fp32's 117, MiniLM's embed job
at 0.18x fp32's texts/s): `auto` never picks bf16 there. INT8 products are native with VNNI (`avx512_vnni`,
`avx_vnni`) or AMX (`amx_int8`).

Everything here is a pure function of `cpu()`, which reads /proc/cpuinfo once (Linux; elsewhere no
flags are known and `auto` stays fp32); tests replace `cpu` to act as another machine.

Also here: this process's resident memory, now and at its peak, which the training loop reports.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

PRECISIONS = ("auto", "fp32", "bf16")  # what inference commands take (--precision)
EMULATED_BF16 = ("this CPU has no native bf16 (no AMX or AVX512-BF16): it is emulated, 2x to 6x slower than fp32 "
                 "(MiniLM's embed job on AMD Zen 3: 0.18x fp32's texts/s)")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class CPU:
    name: str
    flags: frozenset[str]

    @property
    def amx(self) -> bool:
        return "amx_bf16" in self.flags

    @property
    def native_bf16(self) -> bool:
        """bf16 matrix products in hardware: AMX or AVX512-BF16."""
        return bool({"amx_bf16", "avx512_bf16"} & self.flags)

    @property
    def native_int8(self) -> bool:
        """int8 dot products in hardware: VNNI or AMX."""
        return bool({"amx_int8", "avx512_vnni", "avx_vnni"} & self.flags)

    def units(self) -> str:
        """The matrix units torchbert can use, in words."""
        names = [label for flag, label in (("amx_bf16", "AMX bf16"), ("amx_int8", "AMX int8"),
                                           ("avx512_bf16", "AVX512-BF16"), ("avx512_vnni", "AVX512-VNNI"),
                                           ("avx_vnni", "AVX-VNNI"), ("avx512f", "AVX512"), ("avx2", "AVX2"))
                 if flag in self.flags]
        return ", ".join(names) or "none known"


def read_cpuinfo(text: str) -> CPU:
    """A CPU from the text of /proc/cpuinfo (its first processor's model name and flags)."""
    name, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return CPU(name or platform.processor() or "unknown", flags)


@functools.cache
def cpu() -> CPU:
    """This machine's CPU (read once)."""
    try:
        return read_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:  # not Linux: no flags known, so nothing is assumed
        return CPU(platform.processor() or "unknown", frozenset())


def inference_precision(requested: str, device) -> tuple[str, str]:
    """The precision an inference command runs in (fp32 or bf16), and why, for --precision `requested`
    (auto, fp32 or bf16) on `device` (a torch.device)."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if device.type == "cuda":
        import torch

        has = torch.cuda.is_bf16_supported()
        if requested == "auto":
            return ("bf16", "this GPU multiplies bf16 natively") if has else ("fp32", "this GPU has no bf16")
        if requested == "bf16" and not has:
            raise ValueError("--precision bf16: this GPU does not support bfloat16")
        return requested, "as asked"
    c = cpu()
    if requested == "auto":
        if c.native_bf16:
            return "bf16", f"this CPU multiplies bf16 natively ({c.units()})"
        return "fp32", f"this CPU has no native bf16 (no AMX or AVX512-BF16; it has {c.units()}): bf16 would be slower"
    if requested == "bf16" and not c.native_bf16:
        return "bf16", f"as asked, though {EMULATED_BF16}"
    return requested, "as asked"


def int8_choice() -> tuple[bool, str]:
    """Whether --int8 runs on this CPU, and what to expect of it there (bench/README.md, "Precision on
    the CPU" and "INT8"): refused where bf16 is native, since bf16 is both faster and closer to fp32."""
    c = cpu()
    if c.native_bf16:
        return False, (f"this CPU multiplies bf16 natively ({c.units()}), and there bf16 is faster than INT8 and closer "
                       "to fp32 (MiniLM embed on AVX512-BF16: bf16 1.8-3.0x fp32's texts/s at cosine 0.9998; "
                       "--int8 2.0x at 0.987 on AMD Zen 5 with VNNI, 0.66x bf16's speed)")
    if c.native_int8:
        return True, (f"this CPU has 8-bit dot products ({c.units()}) and no native bf16; INT8 is not yet "
                      "measured on such a CPU")
    return True, (f"this CPU has no 8-bit dot products (no VNNI or AMX; it has {c.units()}): on 2 such cores "
                  "(AMD Zen 3) --int8 embedded texts at 0.92-1.20x fp32's speed (36 to 97 tokens a text), at cosine "
                  "0.997 to fp32 on average (0.988 at the least), and served 1.6x fp32's requests at 1 client")


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def peak_resident_bytes(children: bool = False) -> int | None:
    """The most memory this process has held resident since it started (getrusage's ru_maxrss: kB on
    Linux, bytes on macOS), or with `children` its largest child's that has ended (0 when none has),
    or None where there is no getrusage (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024


def describe() -> list[str]:
    """What this machine will use and why, a line each (`torchbert env`)."""
    import torch

    c = cpu()
    lines = [f"cpu: {c.name}", f"matrix units: {c.units()}",
             f"torch {torch.__version__}: {torch.get_num_threads()} threads, kernels for "
             f"{torch.backends.cpu.get_cpu_capability()}"]
    precision, why = inference_precision("auto", torch.device("cpu"))
    lines.append(f"inference on the cpu (--precision auto): {precision}: {why}")
    runs, why = int8_choice()
    lines.append(f"--int8: {'runs' if runs else 'refused'}: {why}")
    if torch.cuda.is_available():
        device = torch.device("cuda")
        precision, why = inference_precision("auto", device)
        lines.append(f"gpu: {torch.cuda.get_device_name(device)}; inference (--precision auto): {precision}: {why}")
    else:
        lines.append("gpu: none")
    return lines
