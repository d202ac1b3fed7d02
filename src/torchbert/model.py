"""BERT: Pre-training of Deep Bidirectional Transformers (Devlin et al., 2019), the encoder.

    tokens -> embeddings (word + position + token type, LayerNorm, dropout)
           -> N x [ self-attention -> add & LayerNorm -> feed-forward (GELU) -> add & LayerNorm ]
           -> last_hidden_state, and the pooler: tanh(dense(h_[CLS]))

With rotary positions (config.position_embedding_type "rotary", RoFormer: Su et al., 2021) the
embeddings have no position table; instead every layer turns each head's queries and keys, feature
pair by pair, by angles proportional to the token's position, so that q.k depends on how far apart
two tokens are (what a masked token most needs: its neighbours) from the first step.

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
    packing.py holds the Layout of a batch's tokens in that block, and turns one input into the other.

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
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from .architectures import HFCheckpoint
from .packing import Layout, packed_layout


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


def split_heads(qkv: Tensor, layout: Layout, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """The stacked projections [B, T, 3H] or packed [N, 3H] -> q, k, v, each [B, A, T, D]."""
    B, T = layout.batch, layout.seqlen
    D = qkv.shape[-1] // (3 * heads)
    return layout.to_block(qkv).view(B, T, 3, heads, D).permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(ctx: Tensor, layout: Layout) -> Tensor:
    """Attention output [B, A, T, D] -> the tokens' layout: [B, T, H], or packed [N, H]."""
    B, A, T, D = ctx.shape
    return layout.from_block(ctx.transpose(1, 2).reshape(B, T, A * D))


def eager_attention(qkv: Tensor, layout: Layout, heads: int, p: float) -> tuple[Tensor, Tensor]:
    """dropout(softmax(q k^T / sqrt(D) + mask)) v, step by step, the mask the most negative float at
    padding keys. -> (output [B, T, H] or [N, H], probabilities [B, A, T, T] before dropout)."""
    q, k, v = split_heads(qkv, layout, heads)  # each [B, A, T, D]
    B, A, T, D = q.shape
    bias, beta = layout.score_bias(q, A)
    # one product with the scale and the mask in it: bias + (q k^T) / sqrt(D)
    scores = torch.baddbmm(bias, q.reshape(B * A, T, D), k.reshape(B * A, T, D).transpose(1, 2),
                           beta=beta, alpha=1 / math.sqrt(D)).view(B, A, T, T)
    probs = scores.softmax(dim=-1)
    return merge_heads(F.dropout(probs, p) @ v, layout), probs


def sdpa_attention(qkv: Tensor, layout: Layout, heads: int, p: float) -> tuple[Tensor, None]:
    """The same through torch's scaled_dot_product_attention (fused kernels where the device has
    them), without the probabilities."""
    q, k, v = split_heads(qkv, layout, heads)  # each [B, A, T, D]
    mask = None if layout.causal else layout.key_mask  # causal: padding only ever follows
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=layout.causal)
    return merge_heads(ctx, layout), None


def rotary_tables(max_positions: int, head_size: int) -> tuple[Tensor, Tensor]:
    """cos and sin [P, D/2] of RoFormer's angles: feature pair i of a head at position p is turned by
    p / 10000^(2i/D) (computed in float64, as transformers does, then rounded to float32)."""
    pos = torch.arange(max_positions, dtype=torch.float64)[:, None]
    angles = pos / 10000 ** (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)  # [P, D/2]
    return angles.cos().float(), angles.sin().float()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., A, D]: each feature pair (x_2i, x_2i+1) of each head turned by its angle; cos, sin [..., D/2]."""
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # each [..., A, D/2]
    c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)  # [..., 1, D/2]
    return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2)  # [..., A, D]


def rotate_heads(x: Tensor, rotary: tuple[Tensor, Tensor], heads: int) -> Tensor:
    """Queries or keys [..., H] (their tokens' rotary tables [..., D/2]) turned, head by head: [..., H]."""
    return rotate(x.unflatten(-1, (heads, -1)), *rotary).flatten(-2)


# Attention functions by name: (qkv [B, T, 3H] or [N, 3H], layout, heads, dropout_p) -> (output in
# the tokens' layout, probabilities or None). SelfAttention.impl picks one ("sdpa" by default,
# "eager" whenever the probabilities are asked for); torchbert.fast registers its own.
ATTENTION = {"sdpa": sdpa_attention, "eager": eager_attention}


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        # rotary positions live in the attention instead
        self.position = None if config.rotary else nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        # all inputs [B, T] or [N]; output [B, T, H] or [N, H]
        x = self.word(input_ids) + self.token_type(token_type_ids)
        if self.position is not None:
            x = x + self.position(position_ids)
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
                rows: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        # x [B, T, H] or [N, H]; rows [K]: flat token positions whose output alone is wanted ([K, H])
        attend = ATTENTION["eager" if need_weights else self.impl]
        qkv = self.qkv(x)  # [..., 3H]
        if layout.rotary is not None:  # queries and keys turned by their positions' angles
            q, k, v = qkv.chunk(3, dim=-1)
            qkv = torch.cat([self.turn(q, layout.rotary), self.turn(k, layout.rotary), v], -1)
        ctx, probs = attend(qkv, layout, self.heads, self.dropout_p if self.training else 0.0)
        if rows is not None:
            ctx = ctx.reshape(-1, ctx.shape[-1]).index_select(0, rows)  # [K, H]
        return self.out(ctx), probs  # [B, T, H], [N, H] or [K, H]

    def turn(self, x: Tensor, rotary: tuple[Tensor, Tensor]) -> Tensor:
        """Queries or keys [..., H] turned by their tokens' rotary angles (cos, sin [..., D/2])."""
        return rotate_heads(x, rotary, self.heads)


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
                rows: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        # rows [K] (the last layer, when a head reads a few tokens only): every token is still a key
        # and a value, but the output projection and the feed-forward run for those rows alone: [K, H]
        a, probs = self.attention(x, layout, need_weights, rows)
        if rows is not None:
            x = x.reshape(-1, x.shape[-1]).index_select(0, rows)  # [K, H]
        x = self.attention_norm(x + self.dropout(a))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs


class Pooler(nn.Module):
    """tanh(dense(h_[CLS])), BERT's; with rotary positions the model's own activation in place of
    tanh, as in RoFormer's classifier, whose first layer this is in its checkpoints (io/hf.py)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act) if config.rotary else torch.tanh

    def forward(self, cls: Tensor) -> Tensor:
        return self.act(self.dense(cls))  # [B, H]: the [CLS] state, for sentence-level tasks


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
        if config.rotary:  # cos, sin [P, D/2]: derived, never saved
            cos, sin = rotary_tables(config.max_position_embeddings, config.head_size)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)

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

        if self.config.rotary:
            layout.rotary = (self.rotary_cos[position_ids], self.rotary_sin[position_ids])  # [B, T, D/2] or [N, D/2]
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # [B, T, H] or [N, H]
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        cls_index = torch.arange(B, device=x.device) * T if cu_seqlens is None else cu_seqlens[:-1]  # [B]
        keep = None
        if output_positions is not None:  # the last layer's output at the wanted positions and [CLS]
            keep = torch.cat([output_positions, cls_index.to(output_positions.dtype)])  # [K + B]
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            x, probs = layer(x, layout, need_weights=output_attentions, rows=keep if last else None)
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
