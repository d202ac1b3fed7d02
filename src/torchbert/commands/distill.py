"""distil a fine-tuned model into a smaller student that learns its outputs

A student of fewer of the teacher's layers learns the fine-tuned teacher's outputs (soft targets at a
temperature) beside the labels of the training file, or, for sentence embeddings, the teacher's
vectors of unlabelled texts; the run folder is an ordinary fine-tuned model of the teacher's task
(evaluate, predict, serve, export, transformers and sentence-transformers read it as they read any)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..errors import UserError
from ..settings import Checked, SettingError, add_flags, check_field, setting
from .common import command, resolve_model, run_training, settings_from, shared_flags

WRITES_FOLDER = True
COMPUTES = True
TRAINS_RUN = True
EPILOG = """\
examples:
  torchbert distill --teacher runs/spam --train spam/train.tsv --dev spam/dev.tsv --out runs/spam-2 \\
      --student-layers 2
  torchbert distill --teacher runs/ner --train wnut16/train.conll --dev wnut16/dev.conll --out runs/ner-3 \\
      --student-layers 3 --temperature 1 --soft-weight 0.9
  torchbert distill --teacher runs/spam --train spam/train.tsv --dev spam/dev.tsv --out runs/spam-2u \\
      --student-layers 2 --unlabeled mail.txt.gz
  torchbert distill --teacher runs/spam --train spam/train.tsv --dev spam/dev.tsv --out runs/spam-own \\
      --student my-small-bert --relation-weight 1
  torchbert distill --teacher minilm --task embedding --train corpus.txt.gz --dev pairs.jsonl --out runs/emb-2 \\
      --student-layers 2

--teacher is a run folder that `torchbert finetune` wrote, of any task family: classification,
pairs and regression, token tagging, extractive QA, multiple choice, reranking (embedding: below). The
student keeps the teacher's task, labels, tokenizer and settings (--max-length, --doc-stride, ...): its
width, embeddings, pooler and head are the teacher's, and its K layers are K of the teacher's, spread
from the first to the last (DistilBERT's choice: 0, 2, 4, 7, 9, 11 of 12; a 2-layer student of 6
takes 0 and 5). --student FOLDER takes a pretrained BERT of your own instead (a smaller one you
pretrained or distilled with the same vocabulary): its encoder under a new head for the task.

It learns the teacher's outputs on every training example (computed once, before the first step, the
teacher without dropout) and the labels: (1 - W) * the task's loss + W * T^2 * KL(teacher || student)
at temperature T (--soft-weight W, --temperature T), the distribution over a sequence's classes, a
token's tags, an example's choices or candidates, or a window's answer starts and ends; a regression
student matches the teacher's score. The dev set is scored after every epoch and the best epoch is
kept, as in finetune; the run folder holds what finetune's does, and metrics.json says what it was
distilled from under "distill".

--hidden-weight W and --relation-weight W add the teacher's layers to what the student learns:
TinyBERT's hidden-state loss (the squared error of the student's embeddings and of its layer i of K
to the teacher's layer round(i L / K)) and MiniLMv2's self-attention relations (KL between the
teacher's and the student's query-query, key-key and value-value relations of the last layer, which
compare a student of any width). The teacher then runs beside the student at every step, so a step
costs more; bench/README.md says what each bought.

General distillation, a small task-agnostic BERT that learns a pretrained teacher's relations over a
corpus before any task, is pretraining: `torchbert pretrain --objective distill --teacher minilm
--data PREPARED --config tiny` (the corpus prepared with the teacher's tokenizer); the folder it
writes fine-tunes like any checkpoint, or is the --student here.

--unlabeled TEXT: texts without labels, which the teacher labels: the student learns the teacher's
outputs on them too (the soft part of the loss alone; the task's loss stays over the labelled
examples). For a classification or tagging teacher, a corpus as prepare reads it (every non-blank
line of a text file, or the text field of JSON Lines or Parquet, plain, .gz or .zst; each text once;
for tagging cut into words as BERT cuts them, each Chinese character a word), or a file in --train's
layout (a table of texts, CoNLL as .conll); for a pair, multiple-choice or QA teacher, a file in
--train's layout (pairs; questions with their choices; SQuAD questions on their contexts, each
window of a long context learning the teacher's start and end). Labels or answers such a file holds
are not read. An epoch passes over both. Regression and reranker students learn from their labelled
examples alone.

--task embedding: a student of a model that embeds (`minilm`, a sentence-transformers folder, an
embedding run) learns the teacher's vector of each text of --train, which needs no labels: every
non-blank line of a text file, or the text field of JSON Lines or Parquet, plain, .gz or .zst. Its
loss is the squared error to the teacher's vector (and to each first D dimensions of a teacher
trained with --matryoshka). The dev file is an embedding one (query and passage pairs, NLI, or scored
pairs), searched after every epoch as finetune --task embedding does; the folder is a
sentence-transformers model of the teacher's pooling.
"""


@dataclass
class DistillFlags(Checked):
    """Where the teacher, the data and the student's run folder are."""

    teacher: Path = setting(help="the fine-tuned run folder to distil (torchbert finetune --out); with --task "
                                 "embedding, any BERT that embeds: a sentence-transformers folder, `minilm`, a hub "
                                 "id, or an embedding run")
    train: Path = setting(help="training file, in the teacher's task layout; with --task embedding, texts (a text "
                               "file, JSON Lines or Parquet, plain or compressed, as prepare reads them)")
    out: Path = setting(help="the student's run folder")
    dev: Path | None = setting(None, "dev file, scored after each epoch (without it the last weights are kept)")
    task: str | None = setting(None, "embedding: the student learns the teacher's sentence vectors of the --train "
                                     "texts, no labels needed (default: the teacher's own task)",
                               choices=("embedding",))


def add(sub) -> None:
    from ..train.distill import DistillSettings
    from ..train.finetune import LOOP_DEFAULTS, LOOP_DERIVED, FinetuneSettings
    from ..train.loop import TrainConfig

    p = command(sub, __name__)
    add_flags(p, DistillFlags)
    add_flags(p, DistillSettings)
    add_flags(p, FinetuneSettings, only=("epochs", "warmup_ratio", "eval_batch_size"))
    add_flags(p, TrainConfig, skip=LOOP_DERIVED, defaults=LOOP_DEFAULTS,
              helps={"lr": "peak learning rate (default: 5e-5)",
                     "batch_size": "sequences (multiple choice and reranking: examples) per micro-batch "
                                   "(default: 32)"})
    shared_flags(p, "device", "threads", "resume", "overwrite", "quiet",
                 overwrite="delete an existing --out and start again")


def teacher_task(teacher: Path, task: str | None = None):
    """The task settings of a teacher run folder (task None: its own task), or of any BERT for a
    student that learns from texts alone (task: embedding); a folder that is neither, or a run of
    another task, is an error naming it."""
    from ..io.hf import folder_max_length
    from ..io.record import read_record
    from ..tasks.families import TaskSettings, family

    if not teacher.is_dir():
        raise UserError(f"--teacher {teacher}: not a folder; give the run folder `torchbert finetune --out` wrote")
    try:
        record = read_record(teacher)
        fine_tuned = isinstance((record.task if record is not None else None), dict)
        if task is not None and not fine_tuned:  # a pretrained BERT: the family's defaults, at the model's length
            length = folder_max_length(teacher)
            return family(task).Settings(type=task, **({"max_length": length} if length else {}))
        ts = TaskSettings.of(teacher)
    except ValueError as e:
        hint = "; to distil its sentence vectors, give --task embedding" if task is None else ""
        raise UserError(f"--teacher {e}{hint}") from None
    if task is not None and ts.type != task:
        raise UserError(f"--teacher {teacher}: a model fine-tuned for {ts.type} tasks, not {task}; distil it without "
                        f"--task (a {ts.type} student), or give a teacher that embeds (`minilm`, a sentence-"
                        "transformers folder)")
    if (record.task or {}).get("tagger") is not None:
        raise UserError(f"--teacher {teacher}: a tagger trained on frozen features (finetune --frozen); distil a "
                        "fine-tuned BERT instead")
    if family(ts.type).soft_targets is None:
        raise UserError(f"--teacher {teacher}: a model of {ts.type} tasks, which distill does not take")
    return ts


def settings(args):
    from ..train.distill import DistillSettings
    from ..train.finetune import FinetuneSettings
    from ..train.loop import TrainConfig

    paths = settings_from(DistillFlags, args)
    distill = settings_from(DistillSettings, args)
    try:
        distill.one_student()
    except SettingError as e:
        raise UserError(e.as_flag()) from None
    for f in dataclasses.fields(TrainConfig):  # the loop's flags checked before the teacher is read
        if hasattr(args, f.name):
            try:
                check_field(f, getattr(args, f.name))
            except SettingError as e:
                raise UserError(e.as_flag()) from None
    teacher = resolve_model(str(paths.teacher), "--teacher")
    if distill.student is not None:  # a name --model takes, as a folder
        distill = dataclasses.replace(distill, student=str(resolve_model(distill.student, "--student")))
    ts = teacher_task(teacher, paths.task)
    if paths.task == "embedding":
        named = getattr(args, "given", None) or ()
        given = [f"--{k.replace('_', '-')}" for k in ("temperature", "soft_weight", "hidden_weight", "relation_weight")
                 if k in named]
        if distill.unlabeled is not None:
            raise UserError(f"--unlabeled {distill.unlabeled}: an embedding student learns from texts without labels "
                            "already; give them as --train")
        if given:
            raise UserError(f"{' and '.join(given)}: an embedding student learns the teacher's vectors (their squared "
                            "error), with no labels, no temperature and no layer losses; leave them out")
    s = settings_from(FinetuneSettings, args, task=ts.preset or ts.type, model=teacher, task_settings=ts,
                      distill=distill)
    loop = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    try:
        return s.resolve(**loop, progress=not args.quiet)
    except SettingError as e:
        raise UserError(e.as_flag()) from None


def run(args) -> None:
    from ..train.finetune import run_finetuning

    try:
        s, cfg = settings(args)
    except SettingError as e:
        raise UserError(e.as_flag()) from None
    run_training(args, cfg, partial(run_finetuning, s, cfg), report)


def report(result: dict, out: str) -> None:
    from ..train.finetune import report_lines

    d, layers = result["distill"], result["distill"]["layers"]
    if layers is None:  # --student, --student-config
        into = d["student"] or f"fresh weights of {d['student_config']}"
        print(f"distilled {d['teacher']} into {into}")
    else:
        taken = " and ".join(filter(None, (", ".join(map(str, layers[:-1])), str(layers[-1]))))
        print(f"distilled {d['teacher']} into {len(layers)} layer{'s' if len(layers) > 1 else ''} (the teacher's "
              f"{taken} of {d['teacher_layers']})")
    print("\n".join(report_lines(result, out)))
