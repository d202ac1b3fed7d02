"""What the benchmarks print about the machine they ran on."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's marketing name from /proc/cpuinfo with its family and model numbers (a VM may say
    only "AMD EPYC": family 23 is Zen 1 or 2, 25 Zen 3 or 4), else what platform knows."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break  # the first processor's block is enough
    except OSError:
        pass
    if "model name" in fields:
        numbers = f" (family {fields['cpu family']}, model {fields['model']})" if "cpu family" in fields else ""
        return fields["model name"] + numbers
    return platform.processor() or platform.machine()
