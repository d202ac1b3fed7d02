"""INT8 inference on CPU: a model's BERT encoder swapped for its ONNX graph with integer weights.

`int8(model)` exports `model.bert` (or the BertModel itself) to ONNX, the channels of its linear
layers' inputs evened out first (smoothed, below), quantizes their weights to 7 bits per output
channel with ONNX Runtime's dynamic quantizer (activations are quantized to 8 bits on the fly, per
batch), and puts an `OnnxEncoder` in its place: the same call and the same BertOutput as
BertModel's, padded or packed, so every head, `embed`, `predict`, `evaluate` and `serve` run on it
unchanged. The heads themselves stay in fp32 PyTorch. The export takes a few seconds per layer and
is done once per process. The feed-forward down projections stay in fp32 (io/onnx.py:
quantize_int8 says why).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..model import BertModel, BertOutput
from ..packing import pad


class OnnxEncoder(nn.Module):
    """BertModel's forward on an onnxruntime session (inference only)."""

    def __init__(self, session, config, pooler: bool):
        super().__init__()
        self.session, self.config, self.pooler_output = session, config, pooler
        self.register_buffer("_device", torch.empty(0), persistent=False)  # so that callers can ask for the device

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                output_positions: Tensor | None = None) -> BertOutput:
        if output_hidden_states or output_attentions:
            raise ValueError("INT8 inference gives the last layer only: no hidden states or attentions of every "
                             "layer (run without --int8 for those)")
        if position_ids is not None:
            raise ValueError("INT8 inference takes the default positions only")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        packed = cu_seqlens is not None
        if packed:  # [N] -> [B, T]
            ids = pad(input_ids, cu_seqlens, max_seqlen)
            types = pad(token_type_ids, cu_seqlens, max_seqlen)
            mask = torch.arange(max_seqlen) < cu_seqlens.diff()[:, None]
        else:
            ids, types = input_ids, token_type_ids
            mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        feed = {"input_ids": ids.numpy().astype(np.int64), "attention_mask": mask.numpy().astype(np.int64),
                "token_type_ids": types.numpy().astype(np.int64)}
        out = [torch.from_numpy(x) for x in self.session.run(None, feed)]
        hidden = out[0][mask] if packed else out[0]  # [N, H] or [B, T, H]
        if output_positions is not None:  # BertModel's rows: the wanted positions of the flat tokens
            hidden = hidden.reshape(-1, hidden.shape[-1])[output_positions]
        return BertOutput(last_hidden_state=hidden, pooler_output=out[1] if self.pooler_output else None)


class Smoothed(nn.Module):
    """A linear layer whose input is divided channel by channel by `s` and whose weight's columns are
    multiplied by it: the same product in exact arithmetic, over an input whose few large channels are
    brought nearer the rest (a Mul before the MatMul in the graph)."""

    def __init__(self, linear: nn.Linear, s: torch.Tensor):
        super().__init__()
        self.linear = linear
        self.register_buffer("inverse", 1 / s)
        with torch.no_grad():
            linear.weight.mul_(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inverse)


def smoothed(model: nn.Module, alpha: float = 0.5) -> nn.Module:
    """A copy of `model` for 8-bit products with activations quantized per tensor (SmoothQuant, Xiao et
    al. 2023): BERT's activations have a few channels far larger than the rest, and one 8-bit scale
    per batch, set by them, leaves the rest a few levels. Each input channel j of a layer's q/k/v and
    feed-forward up projections is divided by s_j = max|x_j|^alpha / max|w_j|^(1 - alpha) and the
    weight's column j multiplied by it (Smoothed); the attention output projection's scales go into
    the value projection's rows instead (exact, at no cost). The maxima come from one fp32 pass over
    random tokens, each row opening and closing with one of the first 128 ids, where BERT vocabularies
    keep [CLS] and [SEP], whose activations are the largest: no data is needed, and on real text (1,000
    sentences, MiniLM) it did as well as calibrating on that text. Outputs equal `model`'s up to
    rounding; a model without torchbert BERT encoders is returned as it is."""
    model = copy.deepcopy(model)
    encoders = [m for m in model.modules() if isinstance(m, BertModel)]
    linears = [(layer, layer.attention.qkv, layer.ffn.up, layer.attention.out) for e in encoders for layer in e.layers]
    most: dict[nn.Module, torch.Tensor] = {}

    def record(module, inputs):
        x = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0)
        most[module] = torch.maximum(most[module], x) if module in most else x

    hooks = [linear.register_forward_pre_hook(record) for group in linears for linear in group[1:]]
    try:
        with torch.no_grad():
            for e in encoders:
                vocab, first = e.config.vocab_size, torch.arange(128)
                ids = torch.randint(0, vocab, (128, min(32, e.config.max_position_embeddings)),
                                    generator=torch.Generator().manual_seed(0))
                ids[:, 0], ids[:, -1] = first % vocab, (first + 1) % vocab  # row 101: [CLS] ... [SEP]
                e.eval()(ids, attention_mask=torch.ones_like(ids))
    finally:
        for h in hooks:
            h.remove()

    def scales(linear: nn.Linear) -> torch.Tensor:
        w = linear.weight.detach().abs().amax(0).clamp(min=1e-5)
        return (most[linear].clamp(min=1e-5) ** alpha / w ** (1 - alpha)).clamp(min=1e-5)

    with torch.no_grad():
        for layer, qkv, up, out in linears:
            s, hidden = scales(out), out.weight.shape[1]  # out's input is attention over v: v's rows carry 1 / s
            qkv.weight[2 * hidden:] /= s[:, None]
            qkv.bias[2 * hidden:] /= s
            out.weight.mul_(s)
            layer.attention.qkv = Smoothed(qkv, scales(qkv))
            layer.ffn.up = Smoothed(up, scales(up))
    return model


def encoder_session(encoder: BertModel, folder: Path, quantize: bool = True):
    """The encoder as ONNX in `folder`, its linear weights in INT8 (or left in fp32): an onnxruntime
    session, and whether it gives pooler_output."""
    import onnxruntime as ort

    from ..io.onnx import quantize_int8, write_onnx

    outputs = ("last_hidden_state", "pooler_output") if encoder.pooler is not None else ("last_hidden_state",)
    ids = torch.tensor([[101, 2000, 2001, 102], [101, 2002, 102, 0]]) % encoder.config.vocab_size
    write_onnx(smoothed(encoder) if quantize else encoder, outputs, folder / "fp32.onnx",
               {"input_ids": ids, "attention_mask": (ids > 0).long(), "token_type_ids": torch.zeros_like(ids)})
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # as many threads as PyTorch's own ops use
    if quantize:
        quantize_int8(folder / "fp32.onnx", folder / "int8.onnx", encoder.config)
    path = folder / ("int8.onnx" if quantize else "fp32.onnx")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), len(outputs) == 2


def int8(model: nn.Module, quantize: bool = True) -> nn.Module:
    """`model` (a BertModel, or a task model with `.bert`) with its encoder run in INT8 by onnxruntime.
    The model is changed in place and returned; it is for inference only. quantize=False keeps
    fp32 weights in the graph (the tests hold OnnxEncoder to BertModel with it)."""
    encoder = model if isinstance(model, BertModel) else getattr(model, "bert", None)
    if not isinstance(encoder, BertModel):
        raise ValueError(f"--int8 runs BERT encoders; this model is a {type(model).__name__}")
    with tempfile.TemporaryDirectory(prefix="torchbert-int8.") as folder:
        session, pooler = encoder_session(encoder, Path(folder), quantize)
    fast = OnnxEncoder(session, encoder.config, pooler)
    if model is encoder:
        return fast
    model.bert = fast
    return model
