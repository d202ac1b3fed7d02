"""What this machine's processor is and can do, and the precision torchbert computes in on it.

The flags of /proc/cpuinfo name the matrix units (AMX, AVX512-BF16, VNNI; `units()`), but a flag is
not a speed: bf16 is native with AMX or AVX512-BF16 and emulated without them, and one virtual Xeon
that shows `avx512_bf16` multiplies bf16 at half fp32's rate (bench/README.md, "Precision on the CPU").
So the choice of `--precision auto` on the CPU is made by measuring (probe.py): bf16 where its
products ran faster here, fp32 elsewhere; `torchbert env` prints the figures.

`cpu()` reads /proc/cpuinfo once (Linux; elsewhere no flags are known); tests replace `cpu` to act as
another machine, and the probe's `measure` to act as a fast or a slow one.

Also here: this process's resident memory, now and at its peak, which the training loop reports.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

PRECISIONS = ("auto", "fp32", "bf16")  # what inference commands take (--precision)
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


BF16_PAYS = 1.2  # auto takes bf16 where its products run at least this many times fp32's: the rest of the
# job (tokenizing, softmax, pooling in fp32) gains less than the products, so a tie in them is no gain
BASE_SHAPE = (768, 3072)  # BERT-base's hidden and intermediate sizes, for a decision made without a model


def bf16_speed(shape: tuple[int, int] | None = None) -> float:
    """bf16 matrix products against fp32's on this CPU, measured (probe.py) on `shape` (hidden, intermediate)."""
    from . import probe

    figures = probe.gflops(("fp32", "bf16"), *(shape or BASE_SHAPE), cpu())
    return figures["bf16"] / figures["fp32"]


def inference_precision(requested: str, device, shape: tuple[int, int] | None = None) -> tuple[str, str]:
    """The precision an inference command runs in (fp32 or bf16), and why, for --precision `requested`
    (auto, fp32 or bf16) on `device` (a torch.device), for a model of `shape` (hidden, intermediate
    size; BERT-base's when None). On the CPU, auto takes bf16 where it measured faster (probe.py);
    bf16 keeps the quality auto holds to (embeddings within cosine 0.999 of fp32's, bench/README.md
    "Precision on the CPU"), which INT8 does not, so auto never takes INT8."""
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
    if requested == "fp32":
        return "fp32", "as asked"
    speed = bf16_speed(shape)
    measured = f"bf16 products measured {speed:.2f}x fp32's speed on this CPU ({cpu().units()})"
    if requested == "auto":
        return ("bf16", measured) if speed >= BF16_PAYS else ("fp32", f"{measured}: bf16 would not be faster")
    return "bf16", "as asked" if speed >= 1 else f"as asked, though {measured}"


def int8_report(shape: tuple[int, int] | None = None) -> str:
    """What --int8 can expect of this CPU, measured (probe.py): its products' speed against fp32's and
    bf16's, and an encoder layer's, whose feed-forward down projection stays fp32."""
    from . import probe

    shape = shape or BASE_SHAPE
    figures = probe.gflops(("fp32", "bf16", "int8"), *shape, cpu())
    layer = probe.encoder_speed(figures, "int8", *shape)
    text = (f"INT8 products measured {figures['int8'] / figures['fp32']:.2f}x fp32's speed on this CPU "
            f"({cpu().units()}), an encoder layer's {layer:.2f}x")
    if figures["bf16"] / figures["fp32"] >= BF16_PAYS and figures["bf16"] / figures["fp32"] >= layer:
        text += f"; bf16's products are faster still here ({figures['bf16'] / figures['fp32']:.2f}x) and closer to fp32"
    return text


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
    from . import probe

    figures = probe.gflops(("fp32", "bf16", "int8"), *BASE_SHAPE, cpu())
    lines.append(f"matrix products measured (GFLOP/s, {probe.ROWS} x {BASE_SHAPE[0]} x {BASE_SHAPE[1]}, "
                 f"{torch.get_num_threads()} threads): " + ", ".join(f"{p} {v:.0f}" for p, v in figures.items())
                 + f" (cached in {probe.cache_file()})")
    precision, why = inference_precision("auto", torch.device("cpu"))
    lines.append(f"inference on the cpu (--precision auto): {precision}: {why}")
    lines.append(f"--int8: {int8_report()}")
    if torch.cuda.is_available():
        device = torch.device("cuda")
        precision, why = inference_precision("auto", device)
        lines.append(f"gpu: {torch.cuda.get_device_name(device)}; inference (--precision auto): {precision}: {why}")
    else:
        lines.append("gpu: none")
    return lines
