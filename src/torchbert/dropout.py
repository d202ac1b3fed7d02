"""Dropout with a cheaper random mask on CPU.

On CPU, `F.dropout` draws one Bernoulli sample per element from the generator, which costs more
than the matrix products around a small BERT's dropouts. Here one 64-bit draw makes four 16-bit
uniform integers, and an element is dropped when its integer falls below round(p * 2^16): the drop
probability is p to within 2^-17 (0.1 becomes 0.100006). The mask is then made a float tensor of 0
and 1 / (1 - p), so that the forward and the backward are one multiplication each (a bool mask
and a separate scale take two). Everywhere else (CUDA, torch.compile, p = 1) this is F.dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_INT16_MIN = -(2**15)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> Tensor:
    """A bool tensor of `shape`, each element False (dropped) with probability p (to within 2^-17)."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)  # all 64 bits
    return (bits.view(torch.int16)[:n] >= _INT16_MIN + round(p * 2**16)).view(shape)


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
    dtype = x.dtype if x.dtype == torch.float64 else torch.float32
    mask = keep_mask(x.shape, p, x.device).to(dtype).mul_(1.0 / (1.0 - p))  # 0 or 1 / (1 - p)
    return _Masked.apply(x, mask)


class Dropout(nn.Dropout):
    """nn.Dropout (same arguments, same state dict) through `dropout` above."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
