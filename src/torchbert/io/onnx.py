"""A BERT (or a task model on one) written as an ONNX graph, and its 8-bit version: the export and
quantization calls that `torchbert export` and the INT8 encoder (fast/int8.py) share.

The graph takes padded input_ids, attention_mask and token_type_ids (int64), [batch, sequence] or,
for multiple choice, [batch, choices, sequence], every axis dynamic, and returns the named fields of
the model's output in order.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from torch import nn

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Graph(nn.Module):
    """The model with plain tensor inputs and a tuple of outputs, as ONNX wants."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...]):
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(getattr(out, name) for name in self.outputs)


def write_onnx(model: nn.Module, outputs: tuple[str, ...], path: Path, example: dict[str, torch.Tensor],
               opset: int = 18) -> None:
    """Trace `model` (in eval mode) on `example` and write `path`, one file."""
    limit = model.config.max_position_embeddings
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=limit)
    axes = {0: batch, 1: seq} if example["input_ids"].dim() == 2 else {0: batch, 1: torch.export.Dim("choices"),
                                                                       2: seq}
    # the exporter's registry logs, for every export, that torchvision's detection ops are not there
    # (nms, roi_align, ...): nothing a BERT uses; its level is put back after
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and shape notes
        try:
            torch.onnx.export(Graph(model.eval(), outputs), tuple(example[k] for k in INPUTS), path,
                              input_names=list(INPUTS), output_names=list(outputs), opset_version=opset,
                              dynamic_shapes=tuple(axes for _ in INPUTS), dynamo=True, external_data=False,
                              verbose=False)
        finally:
            registry.setLevel(level)


def down_projections(path: Path, intermediate: int, hidden: int) -> list[str]:
    """The names of the graph's MatMul nodes by a constant [intermediate, hidden] weight: the
    feed-forward down projections (none when the two sizes are equal and the shape says nothing)."""
    import onnx

    if intermediate == hidden:
        return []
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {w.name for w in graph.initializer if tuple(w.dims) == (intermediate, hidden)}
    return [n.name for n in graph.node if n.op_type == "MatMul" and weights & set(n.input)]


def quantize_int8(src: Path, dst: Path, config) -> None:
    """`src` (best a graph of fast/int8.py's `smoothed(model)`) with the weights of its linear layers in 7 bits per
    output channel (ONNX Runtime's dynamic quantizer: activations are quantized on the fly, per batch,
    to unsigned 8 bits), except the feed-forward down projections, which stay in fp32. Their input,
    the GELU of the up projection, has the widest range, and one 8-bit scale for all of it loses the
    most: on MiniLM (300 real sentences) mean-pooled embeddings reach a cosine of 0.9877 to fp32 (min
    0.968) with every projection in 8 bits and 0.9932 (min 0.982) with the down projections in fp32;
    keeping q/k/v, the attention output or the up projections in fp32 instead gave 0.990, 0.988 and
    0.991. Per tensor instead of per channel: 0.931. 7 bits (reduce_range), not 8: a CPU without 8-bit
    dot products (AVX2) sums pairs of 8-bit products in 16 bits, which full-range weights overflow
    (255 x 127 x 2 > 32,767); with 7 bits the sums fit, so a graph gives the same results on every
    CPU, and smoothed weights, which overflowed most (cosine 0.954), gain (bench/README.md, 2026-11-30)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep = down_projections(src, config.intermediate_size, config.hidden_size)
    # the quantizer logs on the root logger, at every call, advice to run ONNX Runtime's pre-processing
    # first (shape inference and graph optimizations); the --int8 figures (bench/README.md) were
    # measured as it is, so the line asks a user for nothing: dropped while it runs, the filter taken off after
    root, advice = logging.getLogger(), _Drop("Please consider to run pre-processing before quantization")
    root.addFilter(advice)
    try:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                         nodes_to_exclude=keep)
    finally:
        root.removeFilter(advice)


class _Drop(logging.Filter):
    """Drops the records whose message starts with `start`."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)
