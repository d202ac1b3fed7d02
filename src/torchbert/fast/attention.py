"""Self-attention for training on CPU with dropout, in three functions with backwards of their own
(registered in model.ATTENTION as "fast", which on a CUDA GPU runs FlashAttention's varlen kernel
instead: fast/flash.py).

The plain path (model.sdpa_attention) scatters the packed q/k/v projections into a padded block,
splits the heads with a permute, and runs scaled_dot_product_attention, which on CPU with dropout
runs the plain steps (bmm, softmax, dropout, bmm) with torch's Bernoulli mask. Training pays for
each of those passes twice. Here:
  * _Heads: the projections [N, 3H] (or [B, T, 3H]) -> one contiguous block [3, B, A, T, D] in one
    gather, and the block's gradient straight back into [N, 3H] in one gather (autograd would
    stack the three gradients, reorder them, then scatter);
  * _Attention: the products, softmax and dropout (the mask from fast/dropout.py), with 1 / sqrt(D)
    and the padding mask in one baddbmm; the backward writes the gradients of q, k and v into one
    block and scales inside its products; the [B*A, T, T] tensors made CHUNK_BYTES at a time, so
    that long sequences do not fault in fresh pages every step, and the dropped probabilities
    multiplied again in the backward rather than kept;
  * _Tokens: the output [B, A, T, D] -> packed [N, H] in one gather, and back;
  * a packed batch of sequences of unlike lengths (sentence pairs of 20 to 128 tokens) attends in up
    to four blocks of like length (length_blocks) rather than one padded to the longest.
Everywhere else (no dropout, another device, autocast, the compiler) it is model.sdpa_attention.
Tests hold it to model.eager_attention, values and gradients.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import ATTENTION, SelfAttention, sdpa_attention
from ..packing import Layout, length_groups, packed_layout
from . import flash
from .dropout import scaled_mask


def _cached(layout: Layout, key: tuple, make):
    """Maps made once per forward (per Layout) and shared by every layer."""
    cache = layout.__dict__.setdefault("_fast_maps", {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def head_rows(layout: Layout, heads: int, parts: int = 1) -> Tensor:
    """[N*P*A]: where head a of part p of each packed token sits in P blocks [P, B, A, T, D] seen as
    [P*B*A*T, D] rows, in the order of the packed [N, P, A, D] rows."""
    def make():
        B, T, A = layout.batch, layout.seqlen, heads
        seq, pos = layout.index // T, layout.index % T  # [N]
        a = torch.arange(A, device=seq.device)
        p = torch.arange(parts, device=seq.device)[:, None] * (B * A * T)  # [P, 1]
        rows = (seq[:, None] * A + a) * T + pos[:, None]  # [N, A] in one block
        return (rows[:, None, :] + p).flatten()
    return _cached(layout, ("rows", heads, parts), make)


def head_sources(layout: Layout, heads: int, parts: int = 1) -> tuple[Tensor, Tensor]:
    """The inverse of `head_rows`: for every row of the P blocks, the packed row it comes from (0 at
    padding), and the padding rows."""
    def make():
        B, T, A = layout.batch, layout.seqlen, heads
        rows = head_rows(layout, A, parts)
        src = torch.zeros(parts * B * A * T, dtype=torch.long, device=rows.device)
        src[rows] = torch.arange(rows.numel(), device=rows.device)
        slots = (~layout.key_mask.view(B, T)).flatten().nonzero().squeeze(1)  # [B*T - N] padding slots
        pad = ((slots // T)[:, None] * A + torch.arange(A, device=rows.device)) * T + (slots % T)[:, None]
        p = torch.arange(parts, device=rows.device)[:, None] * (B * A * T)  # [P, 1]
        return src, (pad.flatten() + p).flatten()
    return _cached(layout, ("sources", heads, parts), make)


class _Heads(torch.autograd.Function):
    """Projections [B, T, P*A*D] or packed [N, P*A*D] -> a block [P, B, A, T, D], in one pass: each
    block row (one head of one slot, D numbers) is gathered from its packed token (the padding slots
    set to zero). The backward gathers the block's gradient straight back into the [.., P*A*D]
    layout."""

    @staticmethod
    def forward(ctx, t: Tensor, P: int, B: int, T: int, A: int,
                maps: tuple[Tensor, Tensor, Tensor] | None) -> Tensor:
        # maps (packed with padding only): head_sources (src, pad) and head_rows, for P parts
        D = t.shape[-1] // (P * A)
        ctx.shape, ctx.packed = t.shape, maps is not None
        if maps is None:
            return t.reshape(B, T, P, A, D).permute(2, 0, 3, 1, 4).contiguous()  # [P, B, A, T, D]
        src, pad, rows = maps
        ctx.save_for_backward(rows)
        return t.reshape(-1, D).index_select(0, src).index_fill_(0, pad, 0).view(P, B, A, T, D)

    @staticmethod
    def backward(ctx, grad: Tensor):
        D = grad.shape[-1]
        if not ctx.packed:
            g = grad.permute(1, 3, 0, 2, 4).reshape(ctx.shape)  # [B, T, P, A, D] -> [B, T, P*A*D]
        else:
            g = grad.reshape(-1, D).index_select(0, ctx.saved_tensors[0])  # [N*P*A, D]
        return g.view(ctx.shape), None, None, None, None, None


def heads_block(t: Tensor, layout: Layout, heads: int, parts: int) -> Tensor:
    """_Heads for `layout`: projections [.., P*H] -> [P, B, A, T, D]."""
    maps = None
    if layout.index is not None:
        maps = (*head_sources(layout, heads, parts), head_rows(layout, heads, parts))
    return _Heads.apply(t, parts, layout.batch, layout.seqlen, heads, maps)


class _Tokens(torch.autograd.Function):
    """Attention output [B, A, T, D] -> packed [N, A*D] in one gather, and back in one gather."""

    @staticmethod
    def forward(ctx, blk: Tensor, rows: Tensor, src: Tensor, pad: Tensor) -> Tensor:
        # rows: head_rows, and its inverse src, pad: head_sources (one part)
        B, A, T, D = blk.shape
        ctx.shape = blk.shape
        ctx.save_for_backward(src, pad)
        return blk.reshape(-1, D).index_select(0, rows).view(-1, A * D)

    @staticmethod
    def backward(ctx, grad: Tensor):
        src, pad = ctx.saved_tensors
        g = grad.reshape(-1, ctx.shape[-1]).index_select(0, src).index_fill_(0, pad, 0).view(ctx.shape)
        return g, None, None, None


# The [B*A, Q, T] scores, probabilities, dropout mask and their gradients are made at most this many
# bytes at a time. A larger tensor is above glibc's largest mmap threshold (32 MB, fast/memory.py), so
# each would be mapped afresh and faulted in page by page, in every layer of every step: fine-tuning
# MiniLM at 256 tokens, batch 32 (100 MB a tensor), spent a quarter of its time in the kernel.
CHUNK_BYTES = 30 << 20


def spans(rows: int, row_bytes: int) -> list[tuple[int, int]]:
    """[start, end) of the rows of each CHUNK_BYTES piece of rows x row_bytes (at least one row a piece)."""
    step = max(1, CHUNK_BYTES // row_bytes)
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


class _Attention(torch.autograd.Function):
    """dropout(softmax(q k^T / sqrt(D) + bias)) v on a block of q, k, v (or of k, v with q apart),
    CHUNK_BYTES of scores at a time."""

    @staticmethod
    def forward(ctx, blocks: Tensor, q: Tensor | None, bias: Tensor, beta: int, p: float) -> Tensor:
        # blocks [3, B, A, T, D] (q, k, v), or [2, B, A, T, D] (k, v) with q [B, A, Q, D] given;
        # bias, beta: Layout.score_bias. Output [B, A, Q, D] (Q = T when q is in the block).
        P, B, A, T, D = blocks.shape
        qs, k, v = _Attention.operands(blocks, q)
        ctx.scale = 1 / math.sqrt(D)
        ctx.spans = spans(qs.shape[0], qs.shape[1] * T * max(qs.element_size(), 4))  # the mask is fp32 under bf16
        out, saved = [], []
        for a, b in ctx.spans:
            part = bias[a:b] if bias.dim() and bias.shape[0] == qs.shape[0] else bias  # [B*A, 1, T], or shared
            scores = torch.baddbmm(part, qs[a:b], k[a:b].transpose(1, 2), beta=beta, alpha=ctx.scale)  # [b-a, Q, T]
            probs = scores.softmax(dim=-1)
            mask = scaled_mask(probs.shape, p, probs.dtype)  # fp32 under bf16: 1 / (1 - p) in full
            saved += [probs, mask]  # the backward multiplies them again rather than keep the product
            out.append(torch.bmm((probs * mask).to(probs.dtype), v[a:b]))
        ctx.save_for_backward(blocks, q, *saved)
        return (out[0] if len(out) == 1 else torch.cat(out)).view(B, A, -1, D)

    @staticmethod
    def operands(blocks: Tensor, q: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """q [B*A, Q, D], k and v [B*A, T, D]: views into the block (and into q)."""
        P, B, A, T, D = blocks.shape
        flat = blocks.view(P, B * A, T, D)
        return flat[0] if q is None else q.reshape(B * A, -1, D), flat[-2], flat[-1]

    @staticmethod
    def backward(ctx, grad: Tensor):
        blocks, q, *saved = ctx.saved_tensors
        P, B, A, T, D = blocks.shape
        qs, k, v = _Attention.operands(blocks, q)
        g = grad.reshape(B * A, -1, D)  # [B*A, Q, D]
        d_blocks = torch.empty_like(blocks)
        dq, dk, dv = _Attention.operands(d_blocks, None if q is None else torch.empty_like(q))
        for i, (a, b) in enumerate(ctx.spans):
            probs, mask = saved[2 * i:2 * i + 2]
            dropped = (probs * mask).to(probs.dtype)
            torch.bmm(dropped.transpose(1, 2), g[a:b], out=dv[a:b])
            d_probs = torch.bmm(g[a:b], v[a:b].transpose(1, 2)).mul_(mask)  # [b-a, Q, T] (in place: in g's dtype)
            d_scores = torch._softmax_backward_data(d_probs, probs, -1, probs.dtype)
            torch.baddbmm(dq[a:b], d_scores, k[a:b], beta=0, alpha=ctx.scale, out=dq[a:b])
            torch.baddbmm(dk[a:b], d_scores.transpose(1, 2), qs[a:b], beta=0, alpha=ctx.scale, out=dk[a:b])
        return d_blocks, None if q is None else dq.view(q.shape), None, None, None


def _fast_here(t: Tensor, p: float) -> bool:
    return 0 < p < 1 and t.device.type == "cpu" and not torch.is_autocast_enabled("cpu") \
        and not torch.compiler.is_compiling()


def fast_attention(qkv: Tensor, layout: Layout, heads: int, p: float) -> tuple[Tensor, None]:
    """model.ATTENTION's signature: the three functions above when training on CPU with 0 < p < 1,
    not causal, on one block or on blocks of like length; FlashAttention's varlen kernel on a packed
    half-precision batch on a CUDA GPU (fast/flash.py); model.sdpa_attention otherwise."""
    if flash.usable(qkv, layout, heads):
        return flash.flash_attention(qkv, layout, heads, p)
    if not _fast_here(qkv, p) or layout.causal:
        return sdpa_attention(qkv, layout, heads, p)
    groups = length_blocks(layout)
    if groups is not None:  # sequences of like length in a block of their own, the outputs put back in order
        rows, layouts, back = groups
        out = [block_attention(qkv.index_select(0, r), sub, heads, p) for r, sub in zip(rows, layouts)]
        return torch.cat(out).index_select(0, back), None  # [N, H]
    return block_attention(qkv, layout, heads, p), None


def block_attention(qkv: Tensor, layout: Layout, heads: int, p: float) -> Tensor:
    """The three functions on one padded block of the layout's sequences: [N, 3H] or [B, T, 3H] ->
    [N, H] or [B, T, H]."""
    A = heads
    blocks = heads_block(qkv, layout, A, 3)  # [3, B, A, T, D]
    ctx = _Attention.apply(blocks, None, *layout.score_bias(blocks, A), p)  # [B, A, T, D]
    if layout.index is not None:
        return _Tokens.apply(ctx, head_rows(layout, A), *head_sources(layout, A))  # [N, H]
    return ctx.transpose(1, 2).reshape(*qkv.shape[:-1], -1)  # [B, T, H], or [N, H] when all are full


GROUPED_AT = 0.75  # a packed batch's attention is split when its groups need at most this share of one block's work


def length_blocks(layout: Layout) -> tuple[list[Tensor], list[Layout], Tensor] | None:
    """A packed batch whose sequences differ in length attends in up to four blocks of sequences of
    like length (packing.length_groups) instead of one block padded to the longest: its attention
    works on sum(size x longest^2) of the groups, not B x T^2 (GLUE-like pairs of 20 to 128 tokens:
    2.4-5x less). Per block, the packed rows of its sequences [N_g] and its Layout; and the rows that
    put the blocks' outputs, one after another, back in the batch's order [N]. None where the saving
    is small (every sequence near the longest, as in pretraining) or the batch is padded."""
    def make():
        if layout.index is None or layout.cu_seqlens is None or layout.causal or layout.batch < 2:
            return None
        cu = layout.cu_seqlens.long()
        lengths = cu.diff()  # [B]
        whole = layout.batch * layout.seqlen ** 2
        if float(lengths.square().sum()) > GROUPED_AT * whole:  # even perfect groups would save little
            return None
        sizes = lengths.tolist()
        groups = length_groups(sizes)
        if sum(len(g) * max(sizes[i] for i in g) ** 2 for g in groups) > GROUPED_AT * whole:
            return None
        rows, layouts = [], []
        for g in groups:
            g = sorted(g)
            rows.append(torch.cat([torch.arange(cu[i], cu[i + 1], device=cu.device) for i in g]))  # [N_g]
            cu_g = torch.zeros(len(g) + 1, dtype=torch.int32, device=cu.device)
            cu_g[1:] = torch.tensor([sizes[i] for i in g], device=cu.device).cumsum(0)
            layouts.append(packed_layout(cu_g, max(sizes[i] for i in g), rows[-1].numel())[0])
        order = torch.cat(rows)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        return rows, layouts, back
    return _cached(layout, ("groups",), make)


ATTENTION["fast"] = fast_attention


def query_layout(rows: Tensor, layout: Layout) -> Layout:
    """The K tokens at `rows` (flat positions into the batch's tokens) as a [B, Q] block: each
    sequence's in its own row of Q slots (Q = the most of one sequence), the free slots empty."""
    B, T = layout.batch, layout.seqlen
    seq = rows // T if layout.index is None else layout.index[rows] // T  # [K]
    counts = torch.bincount(seq, minlength=B)  # [B]
    Q = int(counts.max()) if seq.numel() else 0
    order = torch.argsort(seq, stable=True)
    first = counts.cumsum(0) - counts  # [B] where each sequence's rows start in `order`
    slot = torch.empty_like(seq)
    slot[order] = torch.arange(seq.numel(), device=seq.device) - first[seq[order]]
    index = seq * Q + slot  # [K]
    used = torch.zeros(B * Q, dtype=torch.bool, device=seq.device)
    used[index] = True
    return Layout(B, Q, used.view(B, 1, 1, Q), packed=True, index=index)


class RowsSelfAttention(SelfAttention):
    """SelfAttention (same parameters) that, asked for a few rows only (the last layer under a head
    that reads the masked tokens and [CLS]), computes queries, attention rows and the output for
    those rows alone; every token is still a key and a value. In the plain SelfAttention the last
    layer attends from every token and keeps the rows afterwards. Used where cpu_attention is."""

    def forward(self, x: Tensor, layout: Layout, need_weights: bool = False,
                rows: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        p = self.dropout_p if self.training else 0.0
        if rows is None or need_weights or not _fast_here(x, p):
            return super().forward(x, layout, need_weights, rows)
        H, A = x.shape[-1], self.heads
        w, b = self.qkv.weight, self.qkv.bias
        kv = F.linear(x, w[H:], b[H:])  # [..., 2H]
        xq = x.reshape(-1, H).index_select(0, rows)  # [K, H]
        q = F.linear(xq, w[:H], b[:H])  # [K, H]
        if layout.rotary is not None:  # keys turned at every token, queries at the rows
            k, v = kv.chunk(2, dim=-1)
            kv = torch.cat([self.turn(k, layout.rotary), v], -1)
            q = self.turn(q, tuple(t.reshape(-1, t.shape[-1]).index_select(0, rows) for t in layout.rotary))
        blocks = heads_block(kv, layout, A, 2)  # [2, B, A, T, D]: k, v
        queries = query_layout(rows, layout)  # [B, Q]
        q = heads_block(q, queries, A, 1)[0]  # [B, A, Q, D]
        ctx = _Attention.apply(blocks, q, *layout.score_bias(blocks, A), p)  # [B, A, Q, D]
        out = _Tokens.apply(ctx, head_rows(queries, A), *head_sources(queries, A))  # [K, H]
        return self.out(out), None

    def turn(self, x: Tensor, rotary: tuple[Tensor, Tensor]) -> Tensor:
        """Rotary positions as one complex product where this attention trains fast (fp32 CPU): each
        feature pair (x_2i, x_2i+1) is the complex number x_2i + i x_2i+1, turned by e^(i angle).
        The same numbers as the plain pairwise turn (model.rotate), fewer operations: rotary's cost
        over learned positions per tiny training step falls from 18% to 6% (bench/README.md)."""
        if not (self.training and _fast_here(x, self.dropout_p)) or x.dtype != torch.float32:
            return super().turn(x, rotary)
        cos, sin = rotary
        pairs = torch.view_as_complex(x.unflatten(-1, (self.heads, -1, 2)))  # [..., A, D/2] complex
        return torch.view_as_real(pairs * torch.complex(cos, sin).unsqueeze(-2)).flatten(-3)  # [..., H]
