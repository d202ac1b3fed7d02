"""The MLM decoder's cross-entropy with its gradient made in the forward, and the word embeddings
tied to it so that their gradients meet in place (fast pieces: `fast.training` swaps them in).

MaskedLMHead (heads.py) computes logits = h W_e^T + b and F.cross_entropy over them. Here:
  * FusedMaskedLMHead: the same head through _DecoderCrossEntropy, which turns the log-softmax the
    loss needs into the loss's gradient in place, and keeps that [M, V] buffer from one step to the
    next (_FREE);
  * tie_first: a forward pre-hook on the pretraining model that takes the word embeddings through
    _Tied before the encoder runs, for the head to use as its decoder weight.
Tests hold both to the plain head: the same loss and gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..heads import MaskedLMHead
from ..losses import IGNORE


class _DecoderCrossEntropy(torch.autograd.Function):
    """The decoder and its cross-entropy in one function whose forward also makes the loss's gradient with respect
    to the logits, softmax - one_hot, from the log-probabilities the loss needs anyway (one pass over
    the [M, V] logits, in place). Autograd's own backward makes a zero [M, V] tensor for the loss,
    then runs the log-softmax backward over two more: about 1.5% of a pretraining step. The backward
    scales by the incoming gradient inside the products (alpha). Used in training with fp32 or bf16
    weights (fast/bf16.py: the products in bf16, the loss and its gradient in fp32); under autocast
    and the compiler the plain head runs; a test holds the two to the same loss and gradients."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        logits = torch.addmm(bias, h, weight.t())  # [M, V], in the weights' dtype
        # the log-probabilities and the loss's gradient in fp32 whatever the weights' dtype (under
        # bf16 weights the logits are cast once, as autocast casts them for its fp32 loss)
        ctx.buffer = _take_buffer(logits, torch.float32)
        logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32,
                                 out=ctx.buffer[:logits.numel()].view(logits.shape))
        scored = targets != IGNORE  # [M]
        rows = torch.where(scored, targets, 0)[:, None]  # [M, 1]
        count = scored.sum()
        loss = -logp.gather(1, rows).squeeze(1).masked_fill(~scored, 0).sum() / count  # nan when none, as F
        grad = logp.exp_()  # the softmax, in place: d loss_i / d logits_i = softmax_i - one_hot(target_i)
        grad.scatter_add_(1, rows, -scored.to(grad.dtype)[:, None])
        if not bool(scored.all()):
            grad.masked_fill_(~scored[:, None], 0)
        ctx.save_for_backward(h, weight, grad, count)
        ctx.set_materialize_grads(False)  # an output nothing used gets None in the backward, not zeros
        return loss, logits

    @staticmethod
    def backward(ctx, g_loss: Tensor | None, g_logits: Tensor | None):
        h, weight, grad, count = ctx.saved_tensors
        # the loss is the mean over the scored targets (none scored: the loss is nan and passes nothing)
        scale = float(g_loss / count) if g_loss is not None and count > 0 else 0.0
        if g_logits is not None:  # the logits were used on their own too
            grad, scale = torch.add(g_logits, grad, alpha=scale), 1.0
        db = grad.sum(0).mul_(scale).to(weight.dtype) if ctx.needs_input_grad[2] else None
        grad = grad.to(weight.dtype)  # the products in the weights' dtype
        dh = torch.mm(grad, weight).mul_(scale) if ctx.needs_input_grad[0] else None
        # addmm with beta 0 reads nothing from its first argument and scales the product in place
        dw = torch.addmm(weight, grad.t(), h, beta=0, alpha=scale) if ctx.needs_input_grad[1] else None
        buffer, ctx.buffer = ctx.buffer, None  # given back once, also when a retained graph runs twice
        if buffer is not None:
            _give_buffer(buffer)
        return dh, dw, db, None


# Buffers for _DecoderCrossEntropy's [M, V] loss gradient on CPU, kept from its backward to the next
# forward. The gradient (42 MB for a Chinese vocabulary at 500 masked tokens) is above glibc's
# largest mmap threshold, 32 MB: whenever the heap holds no free chunk that fits it, a fresh one is
# mapped and faulted in page by page (about 10,000 faults). A buffer is handed out by a forward and
# back by its backward; a graph freed without a backward just drops its own. A second backward of a
# retained graph whose buffer a later forward has taken fails on the version counter of the saved
# gradient, as any in-place change does.
_FREE: list[Tensor] = []


def _take_buffer(like: Tensor, dtype: torch.dtype) -> Tensor:
    """A 1-D buffer of `dtype` with at least like.numel() elements: from _FREE when one fits; a new one
    on CPU with a quarter to spare, for the next batches' counts of masked tokens."""
    n = like.numel()
    if like.device.type != "cpu":
        return torch.empty(n, dtype=dtype, device=like.device)
    for i, buf in enumerate(_FREE):
        if buf.dtype == dtype and buf.numel() >= n:
            return _FREE.pop(i)
    return torch.empty(n + n // 4, dtype=dtype)


def _give_buffer(buf: Tensor) -> None:
    """Keep buf for a later forward (CPU; the two largest given back)."""
    if buf.device.type == "cpu":
        _FREE.append(buf)
        _FREE.sort(key=Tensor.numel, reverse=True)
        del _FREE[2:]


class _Tied(torch.autograd.Function):
    """The word embeddings [V, H] as the MLM decoder's weight: the identity, both ways. Taken before
    the encoder runs, so that its backward runs after the embedding lookup's (autograd runs the
    nodes made later first): the lookup's gradient, rows under SparseRows, reaches the shared
    weight first, and the decoder's dense [V, H] gradient then takes it in place. In the other
    order autograd adds the rows into a fresh copy of the [V, H] matrix, 43 MB for a Chinese BERT."""

    @staticmethod
    def forward(ctx, weight: Tensor) -> Tensor:
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


class FusedMaskedLMHead(MaskedLMHead):
    """MaskedLMHead (same parameters) whose training loss runs through _DecoderCrossEntropy. `tied`,
    when tie_first set it for this forward, is the word embeddings taken through _Tied."""

    tied: Tensor | None = None

    def forward(self, h: Tensor, word_embeddings: Tensor,
                targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        fused = targets is not None and torch.is_grad_enabled() and not torch.is_autocast_enabled(h.device.type) \
            and not torch.compiler.is_compiling() and h.device.type == "cpu"  # on a GPU it would read counts on the host
        tied, self.tied = self.tied, None
        if not fused:
            return super().forward(h, word_embeddings, targets)
        if tied is not None and tied.data_ptr() == word_embeddings.data_ptr():
            word_embeddings = tied
        h = self.norm(self.act(self.dense(h)))  # [M, H]
        loss, logits = _DecoderCrossEntropy.apply(h, word_embeddings, self.bias, targets)
        return logits, loss


def tie_first(model: nn.Module, args, kwargs) -> None:
    """Forward pre-hook for a model with `bert` and a FusedMaskedLMHead `mlm`: take the word
    embeddings through _Tied before the encoder runs (see _Tied)."""
    w = model.bert.embeddings.word.weight
    if isinstance(model.mlm, FusedMaskedLMHead) and torch.is_grad_enabled() and w.requires_grad:
        model.mlm.tied = _Tied.apply(w)
