"""Dropout with a cheaper random mask on CPU (a fast piece: `fast.training` swaps it in for nn.Dropout).

On CPU, `F.dropout` draws one Bernoulli sample per element from torch's Mersenne Twister, which
costs more than the matrix products around a small BERT's dropouts. Here the mask comes from
numpy's SFC64 generator, seeded from torch's generator (so `torch.manual_seed` and a saved torch
RNG state fix every mask): one 64-bit draw makes four 16-bit uniform integers, and an element is
dropped when its integer falls below round(p * 2^16), so the drop probability is p to within 2^-17
(0.1 becomes 0.100006). A large mask is drawn as two halves from two seeds, the second half on a
helper thread while the caller draws the first (numpy lets go of the GIL), so both cores work on
it; the split depends on the size only, so the mask does not depend on the threads.

The mask is a float tensor of 0 and 1 / (1 - p): the forward and the backward are one
multiplication each. Everywhere else (CUDA, torch.compile, p = 1) this is F.dropout.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

_INT16_MIN = -(2**15)
SPLIT = 1 << 18  # masks of more elements are drawn in two halves, one on the helper thread
_helper: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own


def _pool() -> ThreadPoolExecutor:
    global _helper
    if _helper is None or _helper[0] != os.getpid():
        _helper = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="torchbert-dropout"))
    return _helper[1]


def _fill(out: np.ndarray, seed: int, threshold: int, scale: float) -> None:
    """out[i] = keep_i * scale, keep_i = (16 random bits >= threshold)."""
    n = out.shape[0]
    bits = np.random.SFC64(seed).random_raw((n + 3) // 4).view(np.int16)[:n]
    np.multiply(bits >= threshold, out.dtype.type(scale), out=out)


def _mask(n: int, p: float, dtype: np.dtype, scale: float) -> np.ndarray:
    out = np.empty(n, dtype)
    threshold = _INT16_MIN + round(p * 2**16)
    seeds = torch.randint(0, 2**62, (2,)).tolist()  # from torch's generator
    if n <= SPLIT:
        _fill(out, seeds[0], threshold, scale)
    else:
        half = n // 2
        second = _pool().submit(_fill, out[half:], seeds[1], threshold, scale)
        _fill(out[:half], seeds[0], threshold, scale)
        second.result()
    return out


def scaled_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """The dropout mask as numbers: 0 with probability p (to within 2^-17), else 1 / (1 - p); in
    float64 for float64 data, else in float32 (so 1 / (1 - p) is exact enough under bf16 too)."""
    np_dtype = np.dtype(np.float64 if dtype == torch.float64 else np.float32)
    return torch.from_numpy(_mask(math.prod(shape), p, np_dtype, 1.0 / (1.0 - p))).view(shape)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> Tensor:
    """A bool tensor of `shape`, each element False (dropped) with probability p (to within 2^-17)."""
    return scaled_mask(shape, p) != 0


class _Masked(torch.autograd.Function):
    """x * mask, the mask a constant: its backward is grad * mask."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return x.mul(mask).to(x.dtype)  # the mask is fp32 under bf16 or fp16 (1 / (1 - p) in full)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad.mul(mask).to(grad.dtype), None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p), as F.dropout."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    return _Masked.apply(x, scaled_mask(x.shape, p, x.dtype))


class Dropout(nn.Dropout):
    """nn.Dropout (same arguments, same state dict) through `dropout` above: what `fast.training`
    turns each nn.Dropout of a model into while it trains."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
