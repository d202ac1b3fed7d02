"""Padded [B, T] <-> packed [N] tokens: the two input layouts BertModel takes (see model.py).

Packed, the real tokens of a batch's sequences lie end to end with cu_seqlens [B + 1], their
cumulative lengths from 0, and max_seqlen, the longest; nothing is computed for padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def pack(seqs: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor, int]:
    """Token id sequences -> packed input_ids [N] (int64), cu_seqlens [B + 1] (int32), max_seqlen."""
    lengths = np.fromiter((len(x) for x in seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter((t for x in seqs for t in x), dtype=np.int64, count=int(lengths.sum()))
    cu_seqlens = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    return torch.from_numpy(flat), torch.from_numpy(cu_seqlens), int(lengths.max()) if len(seqs) else 0


def unpad(input_ids: Tensor, attention_mask: Tensor, *others: Tensor):
    """Padded [B, T] (+ other [B, T] tensors) -> packed [N] tensors, cu_seqlens [B+1], max_seqlen."""
    seqlens = attention_mask.sum(dim=1, dtype=torch.int32)  # [B]
    cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))  # [B + 1]
    keep = attention_mask.bool()
    packed = [t[keep] for t in (input_ids, *others)]  # each [N]
    return (*packed, cu_seqlens, int(seqlens.max()) if seqlens.numel() else 0)


def pad(packed: Tensor, cu_seqlens: Tensor, max_seqlen: int, value: float = 0.0) -> Tensor:
    """Packed [N, ...] -> padded [B, T, ...] (the inverse of `unpad`)."""
    B = cu_seqlens.numel() - 1
    seqlens = cu_seqlens.diff()
    mask = torch.arange(max_seqlen, device=packed.device) < seqlens[:, None]  # [B, T]
    out = packed.new_full((B, max_seqlen, *packed.shape[1:]), value)
    out[mask] = packed
    return out
