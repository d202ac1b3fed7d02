"""Attention for training on CPU with dropout, with a backward of its own (registered as "cpu").

On CPU, scaled_dot_product_attention runs the plain steps (bmm, softmax, dropout, bmm) whenever
attention dropout is on, with torch's Bernoulli mask, which costs more than the products. Here the
same steps run as one autograd function: the mask comes from fast/dropout.py, 1 / sqrt(D) and the
padding mask ride in one baddbmm, and the backward scales the gradients of q and k inside its
products, where autograd's would take passes of their own. Everywhere else (no dropout, another
device, autocast, the compiler) it is model.sdpa_attention. A test holds it to
model.eager_attention, values and gradients.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..model import ATTENTION, Layout, sdpa_attention
from .dropout import scaled_mask


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, beta: int, p: float) -> Tensor:
        # q [B, A, Q, D], k and v [B, A, T, D]; bias, beta: Layout.score_bias. Output [B, A, Q, D].
        B, A, Q, D = q.shape
        qs, ks, vs = (t.reshape(B * A, -1, D) for t in (q, k, v))
        ctx.scale = 1 / math.sqrt(D)
        scores = torch.baddbmm(bias, qs, ks.transpose(1, 2), beta=beta, alpha=ctx.scale)  # [B*A, Q, T]
        probs = scores.softmax(dim=-1)
        mask = scaled_mask(probs.shape, p, probs.dtype)
        dropped = probs * mask
        ctx.shapes = (q.shape, k.shape)
        ctx.save_for_backward(qs, ks, vs, probs, mask, dropped)
        return torch.bmm(dropped, vs).view(B, A, Q, D)

    @staticmethod
    def backward(ctx, grad: Tensor):
        qs, ks, vs, probs, mask, dropped = ctx.saved_tensors
        q_shape, kv_shape = ctx.shapes
        g = grad.reshape(qs.shape)  # [B*A, Q, D]
        dv = torch.bmm(dropped.transpose(1, 2), g)
        d_probs = torch.bmm(g, vs.transpose(1, 2)).mul_(mask)  # [B*A, Q, T]
        d_scores = torch._softmax_backward_data(d_probs, probs, -1, probs.dtype)
        dq = torch.baddbmm(qs, d_scores, ks, beta=0, alpha=ctx.scale)  # beta 0: qs is not read
        dk = torch.baddbmm(ks, d_scores.transpose(1, 2), qs, beta=0, alpha=ctx.scale)
        return dq.view(q_shape), dk.view(kv_shape), dv.view(kv_shape), None, None, None


def cpu_attention(q: Tensor, k: Tensor, v: Tensor, layout: Layout, p: float) -> tuple[Tensor, None]:
    """model.ATTENTION's signature: _Attention when training on CPU in fp32 with 0 < p < 1."""
    if 0 < p < 1 and q.device.type == "cpu" and not torch.is_autocast_enabled("cpu") \
            and not torch.compiler.is_compiling():
        return _Attention.apply(q, k, v, *layout.score_bias(q, q.shape[1]), p), None
    return sdpa_attention(q, k, v, layout, p)


ATTENTION["cpu"] = cpu_attention
