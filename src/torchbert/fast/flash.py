"""Attention over a packed batch on a CUDA GPU through FlashAttention's variable-length kernel (a
fast piece: part of model.ATTENTION["fast"], which the training loop puts in the model).

The plain path (model.sdpa_attention) scatters the packed q/k/v [N, 3H] into a padded block
[3, B, A, T, D], attends with a padding mask, and gathers the output back: on a GPU that is three
passes over memory and attention work on every padding slot, and a mask forces SDPA off its flash
kernel onto the memory-efficient one. FlashAttention's varlen kernel (Dao, 2023) reads the packed
rows where they lie, sequence by sequence from cu_seqlens, with dropout from its own Philox state:
padding costs nothing and nothing is scattered. It takes fp16 or bf16 (under autocast the
projections are bf16) and heads of at most 256 features, a multiple of 8. Reached through torch's
`_flash_attention_forward`, the op behind SDPA's flash backend and torch.nn.attention.varlen, with
its autograd formula; torch.nn.attention.varlen.varlen_attn itself has no dropout.

Tests (tests/test_gpu.py, on a GPU) hold it to model.eager_attention in fp32 on the padded block.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..packing import Layout


def usable(qkv: Tensor, layout: Layout, heads: int) -> bool:
    """Whether the varlen kernel takes this batch: packed on a CUDA device, half precision, head
    size a multiple of 8 up to 256. (Plain Python on shapes and dtypes: the compiler traces through
    it without a graph break.)"""
    D = qkv.shape[-1] // (3 * heads)
    return (qkv.is_cuda and layout.packed and layout.cu_seqlens is not None
            and qkv.dtype in (torch.float16, torch.bfloat16) and D % 8 == 0 and D <= 256)


def flash_attention(qkv: Tensor, layout: Layout, heads: int, p: float) -> tuple[Tensor, None]:
    """model.ATTENTION's signature for a packed batch: qkv [N, 3H] -> output [N, H]."""
    N = qkv.shape[0]
    q, k, v = qkv.view(N, 3, heads, -1).unbind(1)  # each [N, A, D], views with the last dim contiguous
    T, cu = layout.seqlen, layout.cu_seqlens
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, T, T, p, layout.causal, False)[0]  # [N, A, D]
    return out.reshape(N, -1), None
