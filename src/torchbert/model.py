"""BERT: Pre-training of Deep Bidirectional Transformers (Devlin et al., 2019), the encoder.

    tokens -> embeddings (word + position + token type, LayerNorm, dropout)
           -> N x [ self-attention -> add & LayerNorm -> feed-forward (GELU) -> add & LayerNorm ]
           -> last_hidden_state, and the pooler: tanh(dense(h_[CLS]))

Notation used in the shape comments:
    B batch size        T tokens per (padded) sequence    N real tokens of a packed batch
    H hidden size       A attention heads                 D = H / A, head size
    I intermediate size (4H in every released BERT)

Two input paths give the same numbers (tested to 1e-5 in fp32):
  * padded:   input_ids [B, T] with attention_mask [B, T] (1 = token, 0 = padding);
  * unpadded: input_ids [N], the real tokens of all sequences packed end to end, with
    cu_seqlens [B + 1] (cumulative lengths, starting at 0) and max_seqlen. Embeddings, projections
    and the feed-forward then run on real tokens only; attention runs per sequence (packed q/k/v are
    scattered into a [B, A, T, D] block for the attention function and gathered back).

Attention itself is a function picked by name from ATTENTION: "sdpa" (torch's
scaled_dot_product_attention) or "eager" (the steps written out, which also gives the
probabilities). Nothing here depends on the device: the fast pieces for training on CPU live in
torchbert.fast, which the training loop applies from outside.

Parameter names are our own and short; `io/hf.py` holds the one key map to Hugging Face's.
Self-attention uses one fused [H -> 3H] projection for q, k, v: one matrix product instead of three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from .io.hf import HFCheckpoint


@dataclass
class BertOutput:
    last_hidden_state: Tensor  # [B, T, H] padded, [N, H] unpadded, [K, H] at output_positions
    pooler_output: Tensor | None = None  # [B, H]
    hidden_states: tuple[Tensor, ...] | None = None  # N+1 of them: embeddings, then each layer
    attentions: tuple[Tensor, ...] | None = None  # each [B, A, T, T]


def activation(name: str):
    return {
        "gelu": F.gelu,  # exact erf form, as in the original BERT code
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
        "silu": F.silu,
    }[name]


@dataclass
class Layout:
    """Where the tokens of a batch sit, computed once per forward and shared by every layer.

    Attention always works on a padded [B, T] block. For packed hidden states [N, H], `index` gives
    each token's row in the flattened [B*T] block and `pad` the rows that hold no token. When every
    sequence has the same length the packed tokens are the block itself, and both are None; so is
    `key_mask` when no position is padding."""

    batch: int  # B
    seqlen: int  # T
    key_mask: Tensor | None  # [B, 1, 1, T] bool, True where a real token can be attended to
    seq: Tensor | None = None  # [N] sequence of each packed token
    index: Tensor | None = None  # [N] row of each packed token in the block: seq * T + position
    pad: Tensor | None = None  # [B*T - N] the block's rows that are padding

    def heads(self, t: Tensor, heads: int, head_size: int) -> Tensor:
        """Projections [B, T, P*H] or packed [N, P*H] -> one block [P, B, A, T, D] of P contiguous parts
        for the attention products (padding rows zero: little of them in length-sorted batches)."""
        P = t.shape[-1] // (heads * head_size)
        # the row maps are made here, not inside the autograd function, which the compiler traces
        # as a graph of its own that cannot fill the cache
        maps = None if self.index is None else (*self.head_sources(heads, P), self.head_rows(heads, P))
        return _Heads.apply(t, self, heads, head_size, maps)

    def tokens(self, ctx: Tensor) -> Tensor:
        """Attention output [B, A, T, D] -> [B, T, H], or packed [N, H] (the real tokens)."""
        B, A, T, D = ctx.shape
        if self.index is None:
            return ctx.transpose(1, 2).reshape(B, T, A * D)
        # the inverse map serves the backward only: not made when no gradient will flow (inference)
        back = self.head_sources(A) if torch.is_grad_enabled() and ctx.requires_grad else (None, None)
        return _Tokens.apply(ctx, self.head_rows(A), *back)

    @cached_property
    def pos(self) -> Tensor:
        """[N] the position of each packed token in its row of the block."""
        return self.index - self.seq * self.seqlen

    @cached_property
    def pad_rows(self) -> tuple[Tensor, Tensor]:
        """The padding slots of the block as (sequence, position), each [B*T - N]."""
        return self.pad // self.seqlen, self.pad % self.seqlen

    def head_rows(self, heads: int, parts: int = 1) -> Tensor:
        """[N*P*A]: where head a of part p of each packed token sits in P blocks [P, B, A, T, D] seen as
        [P*B*A*T, D] rows, in the order of the packed [N, P, A, D] rows."""
        key = ("rows", heads, parts)
        if key not in self._cache:
            A, device = heads, self.seq.device
            a = torch.arange(A, device=device)
            p = torch.arange(parts, device=device)[:, None] * (self.batch * A * self.seqlen)  # [P, 1]
            rows = (self.seq[:, None] * A + a) * self.seqlen + self.pos[:, None]  # [N, A] in one block
            self._cache[key] = (rows[:, None, :] + p).flatten()
        return self._cache[key]

    def head_sources(self, heads: int, parts: int = 1) -> tuple[Tensor, Tensor]:
        """The inverse of `head_rows`: for every row of the P blocks, the packed row it comes from (0 at
        padding), and the padding rows."""
        key = ("sources", heads, parts)
        if key not in self._cache:
            B, T, A, device = self.batch, self.seqlen, heads, self.seq.device
            rows = self.head_rows(A, parts)
            src = torch.zeros(parts * B * A * T, dtype=torch.long, device=device)
            src[rows] = torch.arange(rows.numel(), device=device)
            b, t = self.pad_rows
            pad = (b[:, None] * A + torch.arange(A, device=device)) * T + t[:, None]  # [B*T - N, A] in one block
            p = torch.arange(parts, device=device)[:, None] * (B * A * T)  # [P, 1]
            self._cache[key] = (src, (pad.flatten() + p).flatten())
        return self._cache[key]

    @cached_property
    def _cache(self) -> dict:
        return {}

    def score_bias(self, like: Tensor, heads: int) -> tuple[Tensor, int]:
        """(bias, beta) for baddbmm(bias, q, k^T, beta=beta), in the dtype and on the device of `like`:
        [B*A, 1, T], 0 at real tokens and the most negative value at padding keys, with beta 1; a zero
        scalar and beta 0 when no key is padding."""
        if self.key_mask is None:
            return like.new_zeros(()), 0
        B, T = self.batch, self.seqlen
        bias = like.new_zeros(self.key_mask.shape).masked_fill_(~self.key_mask, torch.finfo(like.dtype).min)  # [B, 1, 1, T]
        return bias.expand(B, heads, 1, T).reshape(B * heads, 1, T), 1


class _Heads(torch.autograd.Function):
    """Projections [B, T, P*A*D] or packed [N, P*A*D] -> a block [P, B, A, T, D], in one pass: each
    block row (one head of one slot, D numbers) is gathered from its packed token (the padding slots
    set to zero). The backward gathers the block's gradient straight back into the [.., P*A*D]
    layout, where autograd's own backward would reorder and then gather it."""

    @staticmethod
    def forward(ctx, t: Tensor, layout: Layout, heads: int, head_size: int,
                maps: tuple[Tensor, Tensor, Tensor] | None) -> tuple[Tensor, ...]:
        # maps (packed only): Layout.head_sources (src, pad) and head_rows, for P = t's parts
        B, T, A, D = layout.batch, layout.seqlen, heads, head_size
        P = t.shape[-1] // (A * D)
        ctx.shape, ctx.packed = t.shape, maps is not None
        if maps is None:
            out = t.reshape(B, T, P, A, D).permute(2, 0, 3, 1, 4).contiguous()  # [P, B, A, T, D]
        else:
            src, pad, rows = maps
            ctx.save_for_backward(rows)
            out = t.reshape(-1, D).index_select(0, src).index_fill_(0, pad, 0).view(P, B, A, T, D)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        D = grad.shape[-1]
        if not ctx.packed:
            g = grad.permute(1, 3, 0, 2, 4).reshape(ctx.shape)  # [B, T, P, A, D] -> [B, T, P*A*D]
        else:
            g = grad.reshape(-1, D).index_select(0, ctx.saved_tensors[0])  # [N*P*A, D]
        return g.view(ctx.shape), None, None, None, None


class _Tokens(torch.autograd.Function):
    """Attention output [B, A, T, D] -> packed [N, A*D] in one gather, and back in one gather."""

    @staticmethod
    def forward(ctx, blk: Tensor, rows: Tensor, src: Tensor | None, pad: Tensor | None) -> Tensor:
        # rows: Layout.head_rows, and its inverse src, pad: Layout.head_sources (one part; for the
        # backward, None without one)
        B, A, T, D = blk.shape
        ctx.shape = blk.shape
        ctx.save_for_backward(src, pad)
        return blk.reshape(-1, D).index_select(0, rows).view(-1, A * D)

    @staticmethod
    def backward(ctx, grad: Tensor):
        src, pad = ctx.saved_tensors
        g = grad.reshape(-1, ctx.shape[-1]).index_select(0, src).index_fill_(0, pad, 0).view(ctx.shape)
        return g, None, None, None


def eager_attention(q: Tensor, k: Tensor, v: Tensor, layout: Layout, p: float) -> tuple[Tensor, Tensor]:
    """dropout(softmax(q k^T / sqrt(D) + mask)) v, step by step: q [B, A, Q, D], k and v [B, A, T, D],
    the mask the most negative float at padding keys (layout.score_bias).
    -> (output [B, A, Q, D], probabilities [B, A, Q, T], before dropout)."""
    B, A, Tq, D = q.shape
    Tk = k.shape[2]
    bias, beta = layout.score_bias(q, A)
    # one product with the scale and the mask in it: bias + (q k^T) / sqrt(D)
    scores = torch.baddbmm(bias, q.reshape(B * A, Tq, D), k.reshape(B * A, Tk, D).transpose(1, 2),
                           beta=beta, alpha=1 / math.sqrt(D)).view(B, A, Tq, Tk)
    probs = scores.softmax(dim=-1)
    return F.dropout(probs, p) @ v, probs


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, layout: Layout, p: float) -> tuple[Tensor, None]:
    """The same as eager_attention through torch's scaled_dot_product_attention (fused kernels where
    the device has them), without the probabilities."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=layout.key_mask, dropout_p=p), None


# Attention functions by name: (q, k, v, layout, dropout_p) -> (output, probabilities or None).
# SelfAttention.impl picks one ("sdpa" by default; "eager" whenever the probabilities are asked for);
# torchbert.fast registers its own.
ATTENTION = {"sdpa": sdpa_attention, "eager": eager_attention}


@dataclass
class Queries:
    """The K tokens whose final states are wanted (pretraining: the masked tokens and [CLS]), so that
    the last layer computes queries, attention rows, the output projection and the feed-forward for
    them only. Attention takes their queries as a [B, Q] block (`layout`): each sequence's in its
    own row of Q slots (Q = the most of one sequence), the free slots zero and their outputs unused."""

    rows: Tensor  # [K] flat token positions, into [B*T] (padded) or [N] (packed)
    layout: Layout  # [B, Q]: index = seq * Q + slot of each, pad = the free slots

    @classmethod
    def at(cls, rows: Tensor, layout: Layout) -> Queries:
        B = layout.batch
        seq = rows // layout.seqlen if layout.seq is None else layout.seq[rows]  # [K]
        counts = torch.bincount(seq, minlength=B)  # [B]
        Q = int(counts.max()) if seq.numel() else 0
        order = torch.argsort(seq, stable=True)
        first = counts.cumsum(0) - counts  # [B] where each sequence's queries start in `order`
        slot = torch.empty_like(seq)
        slot[order] = torch.arange(seq.numel(), device=seq.device) - first[seq[order]]
        index = seq * Q + slot  # [K]
        free = torch.ones(B * Q, dtype=torch.bool, device=seq.device)
        free[index] = False
        return cls(rows, Layout(B, Q, None, seq, index, free.nonzero().squeeze(1)))


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        # all inputs [B, T] or [N]; output [B, T, H] or [N, H]
        x = self.word(input_ids) + self.token_type(token_type_ids) + self.position(position_ids)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # q, k, v stacked
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.impl = "sdpa"  # a name in ATTENTION

    def forward(self, x: Tensor, layout: Layout, need_weights: bool = False,
                queries: Queries | None = None, xq: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        # x [B, T, H] or [N, H]. With `queries`, only those tokens ask (their q rows and attention
        # rows are computed, from xq [K, H]: x at queries.rows); every token is still a key and
        # value. The output is then [K, H].
        H, A = x.shape[-1], self.heads
        if queries is None or need_weights:
            blocks, q = layout.heads(self.qkv(x), A, H // A), None  # [3, B, A, T, D]: q, k, v
        else:
            w, b = self.qkv.weight, self.qkv.bias
            blocks = layout.heads(F.linear(x, w[H:], b[H:]), A, H // A)  # [2, B, A, T, D]: k, v
            q = queries.layout.heads(F.linear(xq, w[:H], b[:H]), A, H // A)[0]  # [B, A, Q, D]
        q, k, v = blocks.unbind(0) if q is None else (q, *blocks.unbind(0))  # each [B, A, T, D]
        attend = ATTENTION["eager" if need_weights else self.impl]
        ctx, probs = attend(q, k, v, layout, self.dropout_p if self.training else 0.0)  # [B, A, T, D]
        if queries is None:
            ctx = layout.tokens(ctx).reshape(x.shape)  # [B, T, H] or [N, H]
        elif need_weights:
            ctx = layout.tokens(ctx).reshape(-1, H)[queries.rows]  # [K, H]
        else:
            ctx = queries.layout.tokens(ctx)  # [K, H]
        return self.out(ctx), probs


class FeedForward(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))  # [..., H] -> [..., I] -> [..., H]


class Layer(nn.Module):
    """One post-LN transformer block, as in BERT (and the original Transformer)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, layout: Layout, need_weights: bool = False,
                queries: Queries | None = None) -> tuple[Tensor, Tensor | None]:
        # With `queries` (K tokens) the output is computed for those tokens only: [K, H].
        xq = None if queries is None else x.reshape(-1, x.shape[-1]).index_select(0, queries.rows)  # [K, H]
        a, probs = self.attention(x, layout, need_weights, queries, xq)
        if xq is not None:
            x = xq
        x = self.attention_norm(x + self.dropout(a))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs


class Pooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls: Tensor) -> Tensor:
        return torch.tanh(self.dense(cls))  # [B, H]: the [CLS] state, for sentence-level tasks


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initializer: normal(0, std) weights (std = initializer_range, 0.02), zero biases,
    LayerNorm as the identity, and a zero row for the padding embedding."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class BertModel(HFCheckpoint, nn.Module):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.apply(partial(init_weights, std=config.initializer_range))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        *,
        cu_seqlens: Tensor | None = None,
        max_seqlen: int | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        output_positions: Tensor | None = None,
    ) -> BertOutput:
        """output_positions [K]: flat token positions (into the [B*T] padded or [N] packed tokens)
        whose final states are wanted, e.g. the masked tokens in pretraining. The last layer then
        computes its output projection and feed-forward for those tokens and the [CLS] tokens only
        (its attention still reads every token), and last_hidden_state is [K, H]."""
        if cu_seqlens is None:  # padded: [B, T]
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be [batch, tokens] (or packed [N] with cu_seqlens), "
                                 f"got shape {tuple(input_ids.shape)}")
            B, T = input_ids.shape
            key_mask = None if attention_mask is None else attention_mask.bool().reshape(B, 1, 1, T)
            layout = Layout(B, T, key_mask)
            if position_ids is None:
                position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        else:  # unpadded: [N] with cu_seqlens [B + 1]
            if input_ids.dim() != 1:
                raise ValueError(f"packed input_ids must be 1-D [N], got shape {tuple(input_ids.shape)}")
            if attention_mask is not None:
                raise ValueError("pass either attention_mask (padded) or cu_seqlens (unpadded), not both")
            layout, offsets = packed_layout(cu_seqlens, max_seqlen, input_ids.numel())
            B, T = layout.batch, layout.seqlen
            if position_ids is None:
                position_ids = offsets
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if not torch.compiler.is_compiling():
            self._check_inputs(input_ids, token_type_ids, position_ids)

        x = self.embeddings(input_ids, token_type_ids, position_ids)  # [B, T, H] or [N, H]
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        cls_index = torch.arange(B, device=x.device) * T if cu_seqlens is None else cu_seqlens[:-1]  # [B]
        keep = None
        if output_positions is not None:
            keep = Queries.at(torch.cat([output_positions, cls_index.to(output_positions.dtype)]), layout)  # K + B
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            x, probs = layer(x, layout, need_weights=output_attentions, queries=keep if last else None)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(probs)

        if keep is not None:  # x: [K + B, H], the wanted positions, then the [CLS] tokens
            x, cls = x[: output_positions.numel()], x[output_positions.numel():]
        else:
            cls = x[:, 0] if cu_seqlens is None else x[cls_index]  # [B, H]
        pooled = self.pooler(cls) if self.pooler is not None else None
        return BertOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def _check_inputs(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> None:
        # An embedding lookup out of range fails with an opaque index error (or a device assert on
        # GPU); name the culprit instead.
        c = self.config
        for name, ids, limit, hint in (
            ("input_ids", input_ids, c.vocab_size, "vocab_size"),
            ("token_type_ids", token_type_ids, c.type_vocab_size, "type_vocab_size"),
            ("position_ids", position_ids, c.max_position_embeddings, "max_position_embeddings"),
        ):
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
                if name == "position_ids":
                    raise ValueError(
                        f"sequence of {int(ids.max()) + 1} tokens is longer than max_position_embeddings "
                        f"{limit}; truncate it (tokenizer: truncation=True, max_length={limit})")
                raise ValueError(f"{name} out of range: values in [{int(ids.min())}, {int(ids.max())}] "
                                 f"but {hint} is {limit}")

def packed_layout(cu_seqlens: Tensor, max_seqlen: int | None, n: int) -> tuple[Layout, Tensor]:
    """The Layout of N packed tokens, and each token's position in its sequence [N]."""
    device = cu_seqlens.device
    B = cu_seqlens.numel() - 1
    seqlens = cu_seqlens.diff()  # [B]
    T = int(max_seqlen) if max_seqlen is not None else int(seqlens.max())
    starts = cu_seqlens[:-1].repeat_interleave(seqlens, output_size=n)  # [N]
    pos = torch.arange(n, device=device) - starts  # [N]
    if n == B * T:  # every sequence is T long: the packed tokens already are the [B, T] block
        return Layout(B, T, None), pos
    seq = torch.arange(B, device=device).repeat_interleave(seqlens, output_size=n)  # [N]
    key_mask = torch.arange(T, device=device) < seqlens[:, None]  # [B, T]
    pad = (~key_mask).flatten().nonzero().squeeze(1)  # [B*T - N]
    return Layout(B, T, key_mask.view(B, 1, 1, T), seq, index=seq * T + pos, pad=pad), pos


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
