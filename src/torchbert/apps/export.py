"""`torchbert export`: a BERT or a fine-tuned task model as ONNX, checked against PyTorch.

The graph takes padded input_ids, attention_mask and token_type_ids, [batch, sequence] (a
multiple-choice model: [batch, choices, sequence]), both axes dynamic, and gives what the model's
head gives: last_hidden_state and pooler_output (an encoder), logits (classification, regression,
tagging, multiple choice), or start_logits and end_logits (QA). The exported folder holds
model.onnx, the config and the tokenizer, so it is all an ONNX Runtime user needs. On export the
graph runs in onnxruntime on inputs of other shapes than the traced ones and must match PyTorch
(fp32, 1e-4); `int8` adds model.int8.onnx, the linear layers' weights quantized to 7 bits by ONNX
Runtime's dynamic quantizer over inputs evened out first (fast/int8.py: smoothed; io/onnx.py:
quantize_int8), and reports how far its outputs move.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..io.onnx import INPUTS, Graph, write_onnx
from ..tasks.families import family
from ..tokenizer import TOKENIZER_FILES

TOLERANCE = 1e-4
PER_TOKEN = ("last_hidden_state",)  # the encoder's; a task model's: its family's export_per_token


def load_for_export(model_dir: Path) -> tuple[nn.Module, str, tuple[str, ...]]:
    """(model in eval mode, what it is, its output names) for a BERT folder or a torchbert fine-tune."""
    from ..architectures import architecture_of, load_config
    from ..io.record import read_record

    arch = architecture_of(load_config(model_dir))
    if not arch.exports:
        raise ValueError(f"{model_dir}: export handles BERT models; this is a {arch.title} model")
    record = read_record(model_dir)
    if record is not None and record.fine_tuned:
        from ..tasks.feature_tagger import TAGGER_FILE
        from ..tasks.predict import load_finetuned

        if (model_dir / TAGGER_FILE).is_file():  # its LSTM over the frozen encoder's features does not trace
            raise ValueError(f"{model_dir}: a feature-based tagger (finetune --frozen) does not export; export the "
                             "encoder it reads (its pretrained folder), or fine-tune the whole model without --frozen")
        model, _, ts, _ = load_finetuned(model_dir, None, torch.device("cpu"))
        outputs, kind = family(ts.type).export_outputs, ts.type
    elif not arch.embeds:  # the bare encoder exported is BERT's (embeds: its encoder is a BertModel)
        raise ValueError(f"{model_dir}: a {arch.title} encoder exports once fine-tuned for a task; fine-tune it first")
    else:
        from ..model import BertModel

        model, kind, outputs = BertModel.from_pretrained(model_dir), "encoder", ("last_hidden_state", "pooler_output")
    return model.eval(), kind, outputs


def sample_inputs(tokenizer, kind: str, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
    """Padded inputs of real text for tracing and checking; [B, C, T] for multiple choice."""
    sample = "text" if kind == "encoder" else family(kind).export_sample
    if sample == "choices":
        n = len(texts) // 2 * 2
        enc = tokenizer(texts[:n], texts[1:n] + texts[:1], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        return {k: enc[k].reshape(n // 2, 2, -1) for k in INPUTS}
    pair = sample == "pair"
    enc = tokenizer(texts, texts[::-1] if pair else None, padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt")
    return {k: enc[k] for k in INPUTS}


def _texts() -> list[str]:
    """Mixed-length text in English and Chinese: the ids export traces and checks with."""
    return ["a short one", "The graph is checked on sentences of several lengths, in two scripts.",
            "自然语言处理", "今天天气很好，我们去公园散步吧。", "BERT reads both directions at once.",
            "what time is it", "模型导出以后在另一个运行时里得到同样的结果。", "ok"]


def export_onnx(model_dir: Path, out: Path, *, int8: bool = False, opset: int = 18, log=print) -> dict[str, Any]:
    """Write OUT/model.onnx (+ model.int8.onnx), config and tokenizer, checked against PyTorch; the
    folder appears whole or not at all. Returns what export.json records."""
    import onnxruntime as ort

    from ..io.files import atomic_folder
    from ..tokenizer import BertTokenizer

    model, kind, outputs = load_for_export(model_dir)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    texts = _texts()
    trace = sample_inputs(tokenizer, kind, texts[:4], 16)
    check = sample_inputs(tokenizer, kind, texts, 48)  # other batch and sequence sizes than the trace's
    with atomic_folder(out, marked=True) as tmp:
        write_onnx(model, outputs, tmp / "model.onnx", trace, opset)
        with torch.no_grad():
            want = Graph(model, outputs)(*(check[k] for k in INPUTS))
        feed = {k: check[k].numpy() for k in INPUTS}
        mask = check["attention_mask"].bool().numpy()
        got = ort.InferenceSession(str(tmp / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, feed)
        given = PER_TOKEN if kind == "encoder" else family(kind).export_per_token
        per_token = {n: n in given for n in outputs}
        diffs = {name: _diff(g, w.numpy(), mask, per_token[name]) for name, g, w in zip(outputs, got, want)}
        worst = max(diffs.values())
        if not worst <= TOLERANCE:
            raise RuntimeError(f"the exported graph differs from PyTorch by {worst:.2e} (more than {TOLERANCE:g}) "
                               f"on {', '.join(k for k, v in diffs.items() if v == worst)}; nothing was written")
        report: dict[str, Any] = {"model": str(model_dir), "kind": kind, "inputs": list(INPUTS),
                                  "outputs": list(outputs), "opset": opset, "max_abs_diff_fp32": diffs,
                                  "checked_on": {"batch": int(check["input_ids"].shape[0]),
                                                 "sequence": int(check["input_ids"].shape[-1])}}
        if int8:
            from ..fast.int8 import smoothed
            from ..io.onnx import quantize_int8

            write_onnx(smoothed(model), outputs, tmp / "smoothed.onnx", trace, opset)  # the same outputs, in fp32
            quantize_int8(tmp / "smoothed.onnx", tmp / "model.int8.onnx", model.config)
            (tmp / "smoothed.onnx").unlink()
            q = ort.InferenceSession(str(tmp / "model.int8.onnx"), providers=["CPUExecutionProvider"]).run(None, feed)
            report["int8"] = {name: _closeness(a, w.numpy(), mask, per_token[name])
                              for name, a, w in zip(outputs, q, want)}
        for f in ("config.json", *TOKENIZER_FILES):
            if (model_dir / f).is_file():
                shutil.copyfile(model_dir / f, tmp / f)
        (tmp / "export.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log(f"wrote {out}: model.onnx ({kind}; outputs {', '.join(outputs)}), max |onnxruntime - PyTorch| "
        f"{worst:.1e} on a batch of {report['checked_on']['batch']} x {report['checked_on']['sequence']} tokens"
        + ("; model.int8.onnx, cosine to fp32 " + ", ".join(f"{k} {v['cosine']:.4f}" for k, v in
                                                             report["int8"].items()) if int8 else ""))
    return report


def _rows(a: np.ndarray, mask: np.ndarray, per_token: bool) -> np.ndarray:
    """The values that are real: a row per real token of per-token outputs (padding left out), else
    a row per example."""
    return a[mask] if per_token else a.reshape(a.shape[0], -1)


def _diff(got: np.ndarray, want: np.ndarray, mask: np.ndarray, per_token: bool) -> float:
    return float(np.abs(_rows(got, mask, per_token) - _rows(want, mask, per_token)).max())


def _closeness(got: np.ndarray, want: np.ndarray, mask: np.ndarray, per_token: bool) -> dict[str, float]:
    a, b = _rows(got, mask, per_token), _rows(want, mask, per_token)
    a, b = (a[None], b[None]) if a.ndim == 1 else (a, b)  # QA: one vector of every real position's logit
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return {"cosine": round(float(cos.mean()), 6), "cosine_min": round(float(cos.min()), 6),
            "max_abs_diff": round(float(np.abs(a - b).max()), 6)}
