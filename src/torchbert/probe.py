"""How fast this CPU multiplies matrices in fp32, bf16 and INT8, measured, so that `--precision auto`
decides by speed rather than by the flags of /proc/cpuinfo.

A flag is not a speed: a virtual Intel Xeon that shows `avx512_bf16` without AMX ran bf16 products at
half fp32's rate, and auto took bf16 there from the flag (bench/README.md, "Precision on the CPU").
So before an inference job picks its precision it times one linear layer of the model's own shape
(`rows` tokens by the hidden size into the feed-forward's intermediate size, BERT's largest product)
with the thread count the job computes with: fp32 and bf16 as torch runs them (the bf16 path holds
its weights in bf16, fast/bf16.py), and INT8 as fast/int8.py runs it, ONNX Runtime's dynamically
quantized product (DynamicQuantizeLinear and MatMulInteger, which it fuses). A precision is timed for
a few calls after one to warm up, in turns with the others, its best call kept: a few tenths of a
second for fp32 and bf16, once (INT8, timed only where --int8 or `torchbert env` asks, adds the second
that loading ONNX Runtime takes).

The figures are cached per CPU (model name and flags), torch version, thread count and shape in
`cache_file()`, so a machine measures once; an entry that cannot be read back as this version wrote it
is ignored (measured again and written over), and a folder that cannot be written leaves the figures
in memory only. Tests replace `measure` (tests/conftest.py), so that no test depends on a host's speed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path

VERSION = 1  # of the cache's layout and of what is measured; another version's entries are not read
ROWS = 256  # tokens per timed product: a batch of short texts, or one of a long one
PRECISIONS = ("fp32", "bf16", "int8")
BUDGET_S = 0.05  # time each precision for about this long after its warm-up call (at least two calls)


def cache_file() -> Path:
    """Where the figures are kept: in torchbert's cache folder (io/files.py cache_folder)."""
    from .io.files import cache_folder

    return cache_folder() / "precision-probe.json"


def _best_seconds(calls: dict) -> dict:
    """The best time of each call, timed in turns (a, b, c, a, b, c, ...) so that a job beside this one
    slows each alike and their ratios hold."""
    for call in calls.values():
        call()  # the first call creates kernels and packs weights
    best, spent, rounds = dict.fromkeys(calls, float("inf")), 0.0, 0
    while rounds < 2 or (spent < BUDGET_S * len(calls) and rounds < 50):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            took = time.perf_counter() - start
            best[name], spent = min(best[name], took), spent + took
        rounds += 1
    return best


def _torch_product(dtype, hidden: int, intermediate: int):
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, hidden, generator=g).to(dtype)
    w = torch.randn(intermediate, hidden, generator=g).mul_(hidden ** -0.5).to(dtype)
    b = torch.zeros(intermediate, dtype=dtype)

    def call():
        with torch.no_grad():
            torch.nn.functional.linear(x, w, b)

    return call


def _int8_product(hidden: int, intermediate: int, threads: int):
    """ONNX Runtime's dynamically quantized product, as io/onnx.py's quantize_int8 writes it: uint8
    activations with their scale per call, int8 weights with a scale per output channel."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.integers(-63, 64, size=(hidden, intermediate), dtype=np.int8)  # 7 bits, as reduce_range keeps them
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["y32"]),
             helper.make_node("Cast", ["y32"], ["yf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["yf", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, intermediate])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(intermediate, np.int8), "wz"),
         numpy_helper.from_array(np.full(intermediate, 0.01, np.float32), "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # its threads would spin on after each call, taking the cores from the torch product timed next
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"x": rng.standard_normal((ROWS, hidden), dtype=np.float32)}
    return lambda: session.run(None, feed)


def measure(precisions: tuple[str, ...], hidden: int, intermediate: int, threads: int) -> dict[str, float]:
    """GFLOP/s of one [ROWS, hidden] x [hidden, intermediate] product in each of `precisions`, on `threads` threads."""
    import torch

    calls = {p: _int8_product(hidden, intermediate, threads) if p == "int8" else
             _torch_product(torch.float32 if p == "fp32" else torch.bfloat16, hidden, intermediate) for p in precisions}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # put back below: the probe leaves the process as it found it
    try:
        seconds = _best_seconds(calls)
    finally:
        torch.set_num_threads(before)
    return {p: 2 * ROWS * hidden * intermediate / seconds[p] / 1e9 for p in precisions}


def _key(machine, hidden: int, intermediate: int, threads: int) -> str:
    import torch

    text = json.dumps([VERSION, machine.name, sorted(machine.flags), torch.__version__, threads, ROWS, hidden,
                       intermediate])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(path: Path) -> dict:
    """The cache's entries, or none when the file is missing, corrupt or of another version."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def _valid(entry) -> bool:
    return isinstance(entry, dict) and all(isinstance(v, (int, float)) and v > 0 for v in entry.values())


def _write(path: Path, entries: dict) -> None:
    from .errors import UserError
    from .io.files import atomic_write_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"version": VERSION, "entries": entries}, indent=1, sort_keys=True))
    except (OSError, UserError):  # a read-only home, or not a regular file there: the figures stay in this process
        pass


@functools.cache
def _memory() -> dict:
    return {}


def gflops(precisions: tuple[str, ...], hidden: int, intermediate: int, machine,
           threads: int | None = None) -> dict[str, float]:
    """GFLOP/s of the model's largest product in each of `precisions` on this CPU (`machine`,
    hardware.cpu(): its name and flags key the cache), measured once and kept in `cache_file()`."""
    import torch

    threads = threads or torch.get_num_threads()
    key, path = _key(machine, hidden, intermediate, threads), cache_file()
    known = _memory().setdefault(key, {})
    missing = [p for p in precisions if p not in known]
    if missing:
        entries = _read(path)
        entry = entries.get(key)
        if _valid(entry):
            known.update({p: float(v) for p, v in entry.items() if p in PRECISIONS})
        missing = [p for p in precisions if p not in known]
        if missing:
            # all of them again, in turns: the ratios between figures of one measurement are what decide
            wanted = tuple(p for p in PRECISIONS if p in ("fp32", *known, *precisions))
            known.update(measure(wanted, hidden, intermediate, threads))
            entries[key] = dict(known)
            _write(path, entries)
    return {p: known[p] for p in precisions}


def encoder_speed(figures: dict[str, float], precision: str, hidden: int, intermediate: int) -> float:
    """An encoder layer's products in `precision` against fp32's (a ratio of speeds), from `figures`:
    for int8, the feed-forward down projection stays fp32 (io/onnx.py, quantize_int8), so its share
    of the work, intermediate / (4 * hidden + 2 * intermediate), runs at fp32's rate."""
    if precision != "int8":
        return figures[precision] / figures["fp32"]
    down = intermediate / (4 * hidden + 2 * intermediate)
    return 1 / (down + (1 - down) * figures["fp32"] / figures["int8"])
