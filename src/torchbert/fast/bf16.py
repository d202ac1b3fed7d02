"""bfloat16 on CPUs with native bf16 (AMX, AVX512-BF16), for inference and for training.

Inference (`bf16`, what --precision bf16 and auto run): every BERT encoder of a model held in bf16,
its outputs given back in fp32.

Measured against torch.autocast on the same weights (bench/README.md, "Precision on the CPU"): weights
held in bf16 run every product and every elementwise step in bf16 with no cast per call, 1.91x fp32's
texts/s on MiniLM where autocast gave 1.72x. The encoder's outputs are turned back to fp32 as they
leave it, so that what reads them (pooling's sums over hundreds of tokens, the task heads, softmax)
adds in fp32: pooled in bf16, MiniLM's embeddings fell to cosine 0.996 against fp32's; pooled in fp32
the worst of 1,500 real texts is 0.9998. The heads stay fp32 (a few small products), so logits are
not rounded to bf16's 8 bits. The rotary tables (buffers) stay fp32.

`bf16` is for inference only: the model is changed in place (no gradients are meant to flow through
it). Training (`BF16Weights`, what the loop's --precision bf16 runs in one CPU process) holds the
weights in bf16 for a step only, and gives clipping, the optimizer and checkpoints fp32.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from ..model import BertModel


def _to_fp32(value):
    if isinstance(value, Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_to_fp32(v) for v in value)
    return value


def _outputs_to_fp32(module: nn.Module, args, output):
    return dataclasses.replace(output, **{f.name: _to_fp32(getattr(output, f.name))
                                          for f in dataclasses.fields(output)})


def encoders(model: nn.Module) -> list[BertModel]:
    """The BERT encoders in `model` (itself, its `.bert`, a feature tagger's)."""
    return [m for m in model.modules() if isinstance(m, BertModel)]


def is_bf16(model: nn.Module) -> bool:
    return any(p.dtype == torch.bfloat16 for p in model.parameters())


def bf16(model: nn.Module) -> nn.Module:
    """`model` with its BERT encoders' weights in bf16 and their outputs in fp32 (in place; a second
    call changes nothing). A model without a BERT encoder (GPT, ELMo) is a ValueError."""
    found = encoders(model)
    if not found:
        raise ValueError(f"bf16 inference runs BERT encoders; this model is a {type(model).__name__}")
    for encoder in found:
        if is_bf16(encoder):
            continue
        with torch.no_grad():
            for p in encoder.parameters():
                p.data = p.data.to(torch.bfloat16)
        encoder.register_forward_hook(_outputs_to_fp32)
    return model


class BF16Weights:
    """Training in bf16 with fp32 master weights, in one plain CPU process (the training loop's
    `--precision bf16` there; elsewhere it is torch.autocast). While the block runs, every fp32
    parameter holds a bf16 copy of itself (a trained one's refreshed from its fp32 weights on entry), so the
    forward and the backward run every product and every elementwise step in bf16 with no cast per
    call, and torchbert.fast's pieces with them; `collect()` after each backward moves the bf16
    gradients into fp32 sums; on exit each parameter holds its fp32 weights again, with the fp32
    gradient, for clipping, the optimizer and checkpoints, which never see bf16. Under autocast the
    fast pieces step aside and every call casts its operands (bench/README.md, "Precision on the
    CPU", measures both)."""

    def __init__(self, model: nn.Module):
        # every fp32 parameter, frozen ones too (a frozen encoder under a trained tagger: one dtype
        # throughout); only the trained ones change from step to step, so only theirs are refreshed
        self.params = [p for p in model.parameters() if p.dtype == torch.float32]
        self.copies: dict[nn.Parameter, Tensor] = {}
        self.masters: dict[nn.Parameter, Tensor] = {}
        self.grads: dict[nn.Parameter, Tensor] = {}

    def __enter__(self) -> "BF16Weights":
        with torch.no_grad():
            for p in self.params:
                copy = self.copies.get(p)
                if copy is None:
                    copy = self.copies[p] = p.data.to(torch.bfloat16)
                elif p.requires_grad:
                    copy.copy_(p.data)
                self.masters[p], p.data = p.data, copy
        return self

    def collect(self) -> None:
        """The bf16 gradients of the backward just run, added into the fp32 ones of the step."""
        for p in self.params:
            if p.grad is None or p.grad.dtype != torch.bfloat16:
                continue
            g = p.grad.float()
            self.grads[p] = g if p not in self.grads else self.grads[p] + g
            p.grad = None

    def __exit__(self, *exc) -> None:
        self.collect()
        for p in self.params:
            p.data = self.masters.pop(p)
            p.grad = self.grads.pop(p, None)
