"""Embedding gradients as rows, added into dense buffers kept across steps (a fast piece, used by
the training loop in one plain process; DDP and FSDP reduce dense gradients, and the compiler
traces dense ones)."""

from __future__ import annotations

import torch
from torch import nn


class SparseRows:
    """Dense gradients, kept from step to step, for parameters whose gradients come sparse: the
    embeddings, looked up with sparse=True (a gradient holding only the looked-up rows).

    Dense, a word embedding's gradient is a [V, H] matrix allocated and zero-filled every step, for
    the few hundred rows a batch holds (MiniLM: 47 MB for about 1,000 tokens). Here `densify` adds
    the rows into a buffer that lives across steps and makes it the gradient, which clipping and
    the optimizer read as any dense gradient; `reset`, after the step, zeroes those rows only."""

    def __init__(self, model: nn.Module):
        self.embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.weight.requires_grad]
        self.buffers: dict[nn.Parameter, torch.Tensor] = {}
        self.rows: dict[nn.Parameter, torch.Tensor] = {}

    def __enter__(self) -> SparseRows:
        for m in self.embeddings:
            m.sparse = True
        return self

    def __exit__(self, *exc) -> None:
        for m in self.embeddings:
            m.sparse = False

    def densify(self) -> None:
        for m in self.embeddings:
            p = m.weight
            if p.grad is None or not p.grad.is_sparse:  # no rows, or a dense gradient joined (tied weights)
                continue
            buf = self.buffers.get(p)
            if buf is None:
                buf = self.buffers[p] = torch.zeros_like(p)
            rows = p.grad._indices()[0]
            buf.index_add_(0, rows, p.grad._values())
            self.rows[p] = torch.cat([self.rows[p], rows]) if p in self.rows else rows
            p.grad = buf

    def norms(self) -> dict[nn.Parameter, torch.Tensor]:
        """The 2-norm of each gradient `densify` made, read from its rows only (the others are zero):
        for MiniLM's word embeddings, about 1,000 rows instead of 30,522."""
        return {p: self.buffers[p].index_select(0, rows.unique()).norm() for p, rows in self.rows.items()}

    def reset(self) -> None:
        """Zero the rows `densify` filled (after the step: the buffers are the next step's gradients)."""
        for p, rows in self.rows.items():
            self.buffers[p].index_fill_(0, rows, 0.0)
        self.rows.clear()
