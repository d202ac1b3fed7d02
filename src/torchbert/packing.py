"""Padded [B, T] <-> packed [N] tokens: the two input layouts BertModel takes (see model.py).

Packed, the real tokens of a batch's sequences lie end to end with cu_seqlens [B + 1], their
cumulative lengths from 0, and max_seqlen, the longest; nothing is computed for padding. A Layout
says where a batch's tokens sit in the padded block that attention works on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    B, N, T = cu_seqlens.numel() - 1, packed.shape[0], max_seqlen
    seqlens = cu_seqlens.diff()
    # each token's slot in the [B*T] block, with no host read (a boolean mask would count its Trues)
    seq = torch.arange(B, device=packed.device).repeat_interleave(seqlens, output_size=N)  # [N]
    pos = torch.arange(N, device=packed.device) - cu_seqlens[:-1].repeat_interleave(seqlens, output_size=N)
    out = packed.new_full((B * T, *packed.shape[1:]), value)
    return out.index_copy_(0, seq * T + pos, packed).view(B, T, *packed.shape[1:])


@dataclass
class Layout:
    """Where the tokens of a batch sit in the padded [B, T] block that attention works on, computed
    once per forward and shared by every layer. Padded input is the block itself; packed input [N]
    has `index`, each token's row in the flattened [B*T] block, unless every sequence is T long
    (then the packed tokens are the block). Causal (GPT): a token attends to itself and the tokens
    before it in its sequence only; padding then needs no mask, as it only ever follows."""

    batch: int  # B
    seqlen: int  # T
    key_mask: Tensor | None  # [B, 1, 1, T] bool, True where a real token can be attended to; None: no padding
    packed: bool = False  # the tokens come as [N, ...], not [B, T, ...]
    index: Tensor | None = None  # [N] row of each packed token in the [B*T] block
    causal: bool = False
    rotary: tuple[Tensor, Tensor] | None = None  # rotary positions: cos, sin of each token's angles, [B, T, D/2] or [N, D/2]
    cu_seqlens: Tensor | None = None  # packed: [B + 1] int32, the sequences' cumulative lengths (for varlen kernels)

    def to_block(self, x: Tensor) -> Tensor:
        """Token features [B, T, F] or packed [N, F] -> [B, T, F], zeros at padding."""
        B, T, F = self.batch, self.seqlen, x.shape[-1]
        if self.index is None:
            return x.view(B, T, F)
        return x.new_zeros(B * T, F).index_copy(0, self.index, x).view(B, T, F)

    def from_block(self, x: Tensor) -> Tensor:
        """[B, T, F] -> the tokens' own layout: [B, T, F], or packed [N, F] (the real tokens)."""
        if not self.packed:
            return x
        x = x.reshape(-1, x.shape[-1])  # [B*T, F]
        return x if self.index is None else x.index_select(0, self.index)

    def score_bias(self, like: Tensor, heads: int) -> tuple[Tensor, int]:
        """(bias, beta) for baddbmm(bias, q, k^T, beta=beta), in the dtype and on the device of `like`:
        [B*A, 1, T], 0 at real tokens and the most negative value at padding keys, with beta 1; a zero
        scalar and beta 0 when no key is padding. Causal: [1, T, T], the most negative value at every
        later key (padding is always later)."""
        B, T = self.batch, self.seqlen
        if self.causal:
            later = torch.ones(T, T, dtype=torch.bool, device=like.device).triu(1)
            return like.new_zeros(1, T, T).masked_fill_(later, torch.finfo(like.dtype).min), 1
        if self.key_mask is None:
            return like.new_zeros(()), 0
        bias = like.new_zeros(self.key_mask.shape)  # [B, 1, 1, T]
        bias.masked_fill_(~self.key_mask, torch.finfo(like.dtype).min)
        return bias.expand(B, heads, 1, T).reshape(B * heads, 1, T), 1


def packed_layout(cu_seqlens: Tensor, max_seqlen: int | None, n: int, causal: bool = False) -> tuple[Layout, Tensor]:
    """The Layout of N packed tokens, and each token's position in its sequence [N]."""
    device = cu_seqlens.device
    B = cu_seqlens.numel() - 1
    seqlens = cu_seqlens.diff()  # [B]
    T = int(max_seqlen) if max_seqlen is not None else int(seqlens.max())
    starts = cu_seqlens[:-1].repeat_interleave(seqlens, output_size=n)  # [N]
    pos = torch.arange(n, device=device) - starts  # [N]
    cu = cu_seqlens.int()
    if n == B * T:  # every sequence is T long: the packed tokens already are the [B, T] block
        return Layout(B, T, None, packed=True, causal=causal, cu_seqlens=cu), pos
    seq = torch.arange(B, device=device).repeat_interleave(seqlens, output_size=n)  # [N]
    key_mask = torch.arange(T, device=device) < seqlens[:, None]  # [B, T]
    return Layout(B, T, key_mask.view(B, 1, 1, T), packed=True, index=seq * T + pos, causal=causal,
                  cu_seqlens=cu), pos


def length_groups(lengths: list[int], most: int = 4) -> list[list[int]]:
    """The sequences of a packed batch (their indexes) grouped by length, short to long, into at most
    `most` groups, chosen to minimize the attention work of padding each group to its longest
    (sum of size x longest^2; dynamic programming over the sorted lengths). A batch of queries of 15
    tokens and passages of 100 to 256 attends over about a third of the padded block it would as one
    group (bench/README.md: training embeddings)."""
    import numpy as np

    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sizes = np.array([lengths[i] for i in order], dtype=np.float64)
    n = len(sizes)
    # best[k, j]: the least work for the first j sequences in k groups; cut[k, j]: where its last group starts
    best = np.full((most + 1, n + 1), np.inf)
    best[0, 0] = 0.0
    cut = np.zeros((most + 1, n + 1), dtype=np.int64)
    starts = np.arange(n + 1)
    for k in range(1, most + 1):
        for j in range(1, n + 1):
            work = best[k - 1, :j] + (j - starts[:j]) * sizes[j - 1] ** 2
            cut[k, j] = int(np.argmin(work))
            best[k, j] = work[cut[k, j]]
    k = int(np.argmin(best[1:, n])) + 1  # the fewest groups among equals
    groups, j = [], n
    while k > 0:
        i = int(cut[k, j])
        groups.append(order[i:j])
        j, k = i, k - 1
    return [g for g in reversed(groups) if g]


POOLINGS = ("cls", "mean", "max")  # how the tokens of a sequence become one vector


def pool_packed(features: Tensor, cu_seqlens: Tensor, pooling: str = "mean") -> Tensor:
    """Packed token features [N, F] with cu_seqlens [B+1] -> sentence embeddings [B, F]."""
    B = cu_seqlens.numel() - 1
    if pooling == "cls":
        return features[cu_seqlens[:-1]]
    lens = cu_seqlens.diff()
    seq = torch.arange(B, device=features.device).repeat_interleave(lens, output_size=features.shape[0])  # [N]
    if pooling == "mean":
        sums = features.new_zeros(B, features.shape[-1]).index_add_(0, seq, features)
        return sums / lens[:, None].to(features.dtype)
    if pooling == "max":
        out = features.new_full((B, features.shape[-1]), torch.finfo(features.dtype).min)
        return out.scatter_reduce_(0, seq[:, None].expand_as(features), features, "amax")
    raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
