"""score a fine-tuned model on a labelled file; prints the metrics as JSON

Score a model fine-tuned by torchbert on a labelled file of its task."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..settings import add_flags
from .common import command, cpu_for_int8, inference_precision, resolve_model, settings_from, shared_flags

COMPUTES = True
EPILOG = """\
examples:
  torchbert evaluate --model ./ner --data wnut_test.conll
  torchbert evaluate --model ./sst2 --data SST-2/dev.tsv --out scores.json
  torchbert evaluate --model ./emb --data data/pdr/test.jsonl
  torchbert evaluate --model ./rerank --data data/pdr/test.jsonl --first-stage ./emb --top-k 20

The file has the layout of the task's training file, with its labels. Prints the task's metrics as one
JSON object, the same the fine-tuning run scored on dev (its metrics.json): accuracy, F1 and MCC for
classification (with two labels, f1 is the F1 of the label of id 1, named by f1_positive_label, as GLUE
scores MRPC and QQP; macro_f1 beside it is scikit-learn's average="macro"; Pearson, Spearman and MSE
for regression), entity precision, recall and F1 for tagging,
F1 and exact match for QA, accuracy for multiple choice, nDCG@10, MRR@10 and recall@k for embeddings
(a search over every passage of the file), and for a reranker the same over each query's own
candidates (candidates_ndcg@10: how it orders what it is given, not a search); --first-stage scores
a reranker as a search, reordering an embedding model's top --top-k of every passage in the file.
"""
PREDICT_EPILOG = """\
examples:
  torchbert predict --model ./ner --input tweets.conll --out tags.jsonl
  torchbert predict --model ./sst2 --input reviews.tsv --out labels.jsonl
  torchbert predict --model ./sst2 --input reviews.txt --out labels.jsonl   # one review a line
  torchbert predict --model ./ner --input news.jsonl --out tags.jsonl   # {"text": "江泽民在北京会见..."}
  torchbert predict --model ./sst2 --input reviews.txt --out - --quiet | head   # the lines to standard output

The input has the layout of the task's training file; labels may be missing. A model of one text
-> a label or a score also reads a .txt, each non-blank line a text, its id the line number; a
tagger also reads JSON Lines, each line's "tokens" (its words) or "text" (cut into words as BERT's
tokenizer cuts it: at spaces, around punctuation, each Chinese character a word). One JSON object
per example, in input order, with the example's id: {"label", "probability", "probabilities"} for
classification, {"score"} for regression, {"words", "tags"} for tagging, {"answer", "score",
"start"} for QA (v2 adds "null_score" and the best span, "span" and "span_score", even when the
answer is ""), {"choice", "text", "probability"} for multiple choice.
"""


# evaluate's figures are the same on every host and equal to the run's own dev scores: fp32 unless asked
# (bf16 moved one retrieval nDCG@10 by 0.0018 against fp32's, near the bound bench/README.md holds it to)
EVALUATE_PRECISION = ("fp32 (default here: the scores are the same on every host and equal to the fine-tuning "
                      "run's own dev scores); auto: bf16 where the device multiplies it natively, else fp32; "
                      "bf16: the encoder's weights in bfloat16 (MiniLM 1.9x fp32 on AVX512-BF16, bench/README.md)")


def finetuned_flags(p, settings, **helps: str) -> None:
    """The flags of the commands that run a fine-tuned model on a file (evaluate, predict)."""
    shared_flags(p, "model", model="fine-tuned run folder")
    add_flags(p, settings)
    shared_flags(p, "batch_size", "device", "threads", "quiet", "precision", "int8",
                 batch_size="sequences per batch (default: 64)", **helps)


def add(sub) -> None:
    from ..tasks.predict import EvaluateSettings

    p = command(sub, __name__)
    finetuned_flags(p, EvaluateSettings, precision=EVALUATE_PRECISION)
    p.set_defaults(precision="fp32")


def run(args) -> None:
    from ..io.files import atomic_write_text, check_output_file, model_inputs
    from ..tasks.predict import EvaluateSettings, run_evaluate

    s = settings_from(EvaluateSettings, args)
    if s.out:
        check_output_file(Path(s.out), inputs=[("--data", s.data), *model_inputs(args.model)])
    device = cpu_for_int8(args)
    model_dir = resolve_model(args.model)
    precision = inference_precision(args, device, model_dir)
    if s.first_stage is not None:
        from ..tasks.reranker import run_rerank_evaluate

        if s.task is not None:
            raise UserError("--task: a reranker is scored as a search with --first-stage; leave --task out")
        first = resolve_model(s.first_stage, "--first-stage")
        scores = run_rerank_evaluate(model_dir, Path(s.data), first, s.top_k, device, args.batch_size,
                                     progress=not args.quiet, precision=precision)
    else:
        scores, _ = run_evaluate(model_dir, Path(s.data), s.task, device,
                                 args.batch_size, progress=not args.quiet, precision=precision)
    text = json.dumps(scores, indent=2)
    if s.out:
        atomic_write_text(Path(s.out), text + "\n")
    print(text)
