"""Speed for training (on CPU, and on a CUDA GPU), applied from outside the model, as torchtitan
applies parallelism.

model.py and heads.py are plain PyTorch. `training(model)` swaps the fast pieces in for as long as
its block runs, and puts the model back as it was afterwards (the state dict never changes):
  * every nn.Dropout -> fast.dropout.Dropout: the mask from numpy's SFC64 on two threads;
  * every SelfAttention -> fast.attention.RowsSelfAttention with attention "fast": on CPU, dropout
    and backwards of its own, the scores made in pieces the allocator keeps (under 32 MB), and a
    last layer that attends from the rows a head reads only; on a CUDA GPU in bf16/fp16,
    FlashAttention's varlen kernel over the packed batch (fast/flash.py);
  * every MaskedLMHead -> fast.decoder.FusedMaskedLMHead: the loss's gradient made in the forward,
    its [M, V] buffer kept from step to step, and the word embeddings tied so that their two
    gradients meet in place.
Each piece falls back to the plain path where it does not pay: off CPU, under autocast or the
compiler, in eval; with bf16 weights they run in bf16. The training loop applies it when
TrainConfig.fast is on (the default; the CLI's --no-fast turns it off). Three more pieces work
around the model, not in it:
  * fast.rows.SparseRows: the embeddings' gradients as rows, in the loop of one plain CPU process;
  * fast.bf16.BF16Weights: `--precision bf16` there, each step's weights held in bf16 (fp32 masters);
  * fast.memory.keep_freed_memory: glibc's allocator set to keep freed memory. It changes the whole
    process, so no library call makes it: the CLI's training commands do (not with --no-fast), and
    not under another malloc the user preloaded (tcmalloc holds fine-tuning's peak lower).
Each piece earned its place by a measured gain (bench/README.md), and a test holds it to the plain
path (tests/fast/test_fast.py).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ..architectures import encoder_of
from ..heads import MaskedLMHead
from ..model import SelfAttention
from .attention import RowsSelfAttention  # and model.ATTENTION["fast"]
from .bf16 import BF16Weights
from .decoder import FusedMaskedLMHead, tie_first
from .dropout import Dropout
from .memory import keep_freed_memory
from .rows import SparseRows

__all__ = ["BF16Weights", "SparseRows", "at_precision", "inference", "keep_freed_memory", "training"]


def _flash_fits(model: nn.Module) -> bool:
    """False on a CUDA GPU older than Ampere: FlashAttention's kernels need compute capability 8.0,
    so there attention stays SDPA, which picks what the card has. Asked here, outside the forward,
    so that nothing the compiler traces queries the device."""
    p = next(itertools.chain(model.parameters(), model.buffers()), None)
    return p is None or p.device.type != "cuda" or torch.cuda.get_device_capability(p.device) >= (8, 0)


def at_precision(model: nn.Module, precision: str) -> nn.Module:
    """`model` for inference in fp32 (as it is), bf16 (its BERT encoders' weights in bfloat16,
    fast/bf16.py) or int8 (its encoder run by onnxruntime in 8 bits, fast/int8.py); changed in place.
    `auto` decides as the commands' --precision auto does (hardware.inference_precision: bf16 where
    it measured faster on the model's device, for its encoder's shape), fp32 for a model without a
    BERT encoder."""
    if precision == "auto":
        from ..hardware import inference_precision
        from .bf16 import encoders

        found = encoders(model)
        if not found:
            return model
        config = found[0].config
        device = next(found[0].parameters()).device
        precision = inference_precision("auto", device, (config.hidden_size, config.intermediate_size))[0]
    if precision == "bf16":
        from .bf16 import bf16

        return bf16(model)
    if precision == "int8":
        from .int8 import int8

        return int8(model)
    if precision != "fp32":
        raise ValueError(f"precision must be auto, fp32, bf16 or int8, got {precision!r}")
    return model


@contextlib.contextmanager
def inference(model: nn.Module) -> Iterator[nn.Module]:
    """The model's attention through model.ATTENTION["fast"] while the block runs, and nothing
    else swapped: for inference (embed, serve), where on a CUDA GPU in bf16 it runs FlashAttention's
    varlen kernel over the packed batch (fast/flash.py) instead of a padded block; elsewhere the
    same as the plain path (CPU inference: SDPA)."""
    changed = [m for m in model.modules() if type(m) is SelfAttention and m.impl == "sdpa"] \
        if _flash_fits(model) else []
    for m in changed:
        m.impl = "fast"
    try:
        yield model
    finally:
        for m in changed:
            m.impl = "sdpa"


@contextlib.contextmanager
def training(model: nn.Module) -> Iterator[nn.Module]:
    """The model with the fast pieces in it, while the block runs (see the module's docstring)."""
    undo: list[Callable[[], None]] = []

    def swap(m: nn.Module, cls: type) -> None:  # a subclass with the same state: only the forward differs
        old, m.__class__ = m.__class__, cls
        undo.append(lambda: setattr(m, "__class__", old))

    fits = _flash_fits(model)
    for m in model.modules():
        if type(m) is nn.Dropout and not m.inplace:
            swap(m, Dropout)
        elif type(m) is SelfAttention and m.impl == "sdpa":
            swap(m, RowsSelfAttention)
            if fits:
                m.impl = "fast"
                undo.append(lambda m=m: setattr(m, "impl", "sdpa"))
        elif type(m) is MaskedLMHead:
            swap(m, FusedMaskedLMHead)
    for m in model.modules():
        if isinstance(getattr(m, "mlm", None), FusedMaskedLMHead) and encoder_of(m) is not None:
            undo.append(m.register_forward_pre_hook(tie_first, with_kwargs=True).remove)
    try:
        yield model
    finally:
        for f in reversed(undo):
            f()
