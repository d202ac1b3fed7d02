"""run a fine-tuned model on a file; JSONL predictions in input order

Predict with a model fine-tuned by torchbert."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .common import command, cpu_for_int8, inference_precision, resolve_model, settings_from
from .evaluate import PREDICT_EPILOG as EPILOG
from .evaluate import finetuned_flags

COMPUTES = True
STDOUT = True  # --out - writes the predictions to standard output
__all__ = ["EPILOG"]


def add(sub) -> None:
    from ..tasks.predict import PredictSettings

    finetuned_flags(command(sub, __name__), PredictSettings)


def run(args) -> None:
    from ..io.files import atomic_write_text, check_output_file, model_inputs
    from ..tasks.predict import PredictSettings, run_predict

    s = settings_from(PredictSettings, args)
    if s.out != "-":
        check_output_file(Path(s.out), inputs=[("--input", s.input), *model_inputs(args.model)])
    device = cpu_for_int8(args)
    model_dir = resolve_model(args.model)
    precision = inference_precision(args, device, model_dir)
    records = run_predict(model_dir, Path(s.input), device, args.batch_size,
                          progress=not args.quiet, precision=precision)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if s.out != "-":
        atomic_write_text(Path(s.out), lines)
        print(f"wrote {s.out}: {len(records)} predictions")
        return
    try:
        sys.stdout.write(lines)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader (head, jq ... | head) took what it wanted and went: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what Python flushes at exit goes nowhere
