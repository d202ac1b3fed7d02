"""export a BERT or a fine-tuned model to ONNX (and INT8), checked against PyTorch

Export a BERT folder (the encoder) or a model fine-tuned by torchbert (with its head) to ONNX, with
dynamic batch and sequence axes, and check the graph in onnxruntime against PyTorch (fp32, 1e-4)
before anything is written."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import Checked, add_flags, setting
from .common import check_out_folder, command, resolve_model, settings_from, shared_flags

WRITES_FOLDER = True
COMPUTES = True
EPILOG = """\
examples:
  torchbert export --model minilm --out onnx/minilm              # encoder: last_hidden_state, pooler_output
  torchbert export --model runs/ner --out onnx/ner --int8        # a tagger: logits [batch, sequence, tags]

Inputs: input_ids, attention_mask, token_type_ids (int64, [batch, sequence]; multiple choice
[batch, choices, sequence]), padded as the tokenizer pads. Outputs follow the model: an encoder's
last_hidden_state and pooler_output; logits for classification, regression, tagging and multiple
choice; start_logits and end_logits for QA. export.json records the check: the largest difference
from PyTorch per output, and with --int8 the cosine of the INT8 outputs to fp32.
"""


@dataclass(kw_only=True)
class ExportSettings(Checked):
    format: str = setting("onnx", "the output format (default: onnx)", choices=("onnx",))
    out: str = setting(help="output folder: model.onnx, config.json, the tokenizer, export.json")
    opset: int = setting(18, "ONNX opset", low=13, high=23)


def add(sub) -> None:
    p = command(sub, __name__)
    shared_flags(p, "model")
    add_flags(p, ExportSettings, only=("format", "out"))
    shared_flags(p, "int8", int8="also write model.int8.onnx (linear weights in 8 bits, ONNX Runtime's dynamic "
                                 "quantizer) and report how close its outputs stay")
    add_flags(p, ExportSettings, only=("opset",))
    shared_flags(p, "overwrite")


def run(args) -> None:
    from ..io.files import model_inputs

    s = settings_from(ExportSettings, args)
    out = Path(s.out)
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise UserError("torchbert export needs onnx, onnxscript and onnxruntime: "
                        "pip install onnx onnxscript onnxruntime") from None
    from ..apps.export import export_onnx

    model_dir = resolve_model(args.model)
    check_out_folder(out, args.overwrite, list(model_inputs(model_dir)))
    try:
        export_onnx(model_dir, out, int8=args.int8, opset=s.opset, log=lambda m: print(m, file=sys.stderr))
    except ValueError as e:
        raise UserError(str(e)) from None
