"""Distillation: a smaller student learns a fine-tuned teacher's outputs (Hinton et al. 2015, "Distilling
the Knowledge in a Neural Network"; for BERT, DistilBERT, Sanh et al. 2019, and TinyBERT, Jiao et al. 2020).

The student is the teacher with fewer layers: its embeddings, pooler and task head are the teacher's,
and its k layers are k of the teacher's L, spread as DistilBERT took 6 of BERT-base's 12 (0, 2, 4, 7,
9, 11: layer round(i (L - 1) / (k - 1)) for i < k); or a pretrained BERT of the user's own under a
new head (--student), or fresh weights of a size (--student-config), either with the teacher's
vocabulary. It trains with the fine-tuning loop on the labelled training file; its loss is

    (1 - soft_weight) * the task's own loss on the labels + soft_weight * T^2 * KL(teacher_T || student_T)
        + hidden_weight * the hidden-state loss + relation_weight * the relation loss

where X_T is the softmax of the logits over T (the temperature; T^2 keeps the soft part's gradients the
size of the hard part's, as Hinton et al. scale it). What is a distribution depends on the family,
and the hidden-state (TinyBERT) and relation (MiniLMv2) losses compare the student's layers with the
teacher's, the teacher run beside it at every step: train/distill_losses.py holds them all.

A student can also learn from examples without labels (`unlabeled_examples`, --unlabeled): raw texts
for a classification or tagging task, or a file in the task's own layout (pairs, multiple choice's
questions and choices, QA's questions on their contexts) with its labels unread. Their rows follow
the labelled ones, each of their targets (a sequence, a word's first sub-token, an example's choice,
a window's start and end) labelled UNLABELLED (`mark_unlabelled`), which the head is given as IGNORE:
they add to the soft part alone (DistillTask's labelled_rows), as DistilBERT and TinyBERT learn a task
from the teacher's outputs on text nobody labelled.

An embedding student learns from texts alone, with no labels (`distill_texts`: a corpus as prepare
reads it): its loss is the squared error of its vector of each text to the teacher's (the mean over
the dimensions; sentence-transformers' MSELoss, as Reimers and Gurevych 2020 distil a multilingual
student), and, for a teacher trained with Matryoshka dimensions, of each first D dimensions too
(weights 1: MatryoshkaLoss around it); the temperature and the soft weight do not enter.

The teacher is run once, in eval mode, over the training rows before the first step (`teacher_outputs`),
and its outputs are kept a row at a time; a batch of any order gathers its rows' (`TeacherOutputs.of`).
They are saved in the student's run folder (TEACHER_CACHE, safetensors) until the run has finished,
so a resumed run reads them instead of running the teacher again; they are keyed by the teacher's
folder and the encoded rows, and a file of other rows or cut short is not trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..io.files import atomic_write
from ..io.texts import json_loads, lines
from ..losses import IGNORE
from ..settings import Checked, SettingError, setting
from ..tasks.batches import TaskBatch, TaskData
from ..tasks.embedding import PairExample, read_pairs
from ..tasks.families import TaskFamily
from .distill_losses import SOFT_TARGETS, SoftTargets, hidden_loss, last_layer_relations, layer_map


@dataclass
class DistillSettings(Checked):
    """How the student is made and what it learns from the teacher (`torchbert distill`'s own flags)."""

    student_layers: int | None = setting(None, "the student's layers, taken from the teacher's and spread over them "
                                               "as DistilBERT takes them; its width, embeddings and head are the "
                                               "teacher's (or --student)", low=1, metavar="K")
    student: str | None = setting(None, "a pretrained BERT as the student, in place of the teacher's own layers: a "
                                        "Hugging Face folder or a name --model takes (minilm, a hub id); its encoder "
                                        "under a new head, its vocabulary the teacher's", metavar="FOLDER")
    student_config: str | None = setting(None, "a student of fresh weights in this shape: a size (tiny: 2 layers of "
                                               "128, mini, small, medium, base) or a config.json; the teacher's "
                                               "vocabulary, positions and labels", metavar="NAME")
    temperature: float = setting(2.0, "the softmax temperature of the teacher's and the student's outputs in the "
                                      "soft-target loss", above=0, high=100, metavar="T")
    soft_weight: float = setting(0.5, "the share of the soft-target loss; the rest is the task's loss on the labels",
                                 low=0, high=1)
    unlabeled: str | None = setting(None, "more texts to learn the teacher's outputs on, with no labels: a corpus as "
                                          "prepare reads it (one text a line, or JSON Lines or Parquet with a text "
                                          "field, plain, .gz or .zst), or a file in --train's layout (its labels, "
                                          "if any, unread); a pair, multiple-choice or QA task's must be in its "
                                          "layout", metavar="TEXT")
    hidden_weight: float = setting(0.0, "the weight of the hidden-state loss (TinyBERT's): the squared error of the "
                                        "student's embeddings and of its layer i of K to the teacher's layer "
                                        "round(i L / K); the teacher then runs beside the student at every step",
                                   low=0, high=1000, metavar="W")
    relation_weight: float = setting(0.0, "the weight of the self-attention relation loss (MiniLMv2's): KL(teacher "
                                          "|| student) of the last layer's query-query, key-key and value-value "
                                          "relations; the teacher then runs beside the student at every step",
                                     low=0, high=1000, metavar="W")

    def one_student(self) -> None:
        """Exactly one student is named (a rule between fields: checked where the student is made)."""
        if sum(x is not None for x in (self.student_layers, self.student, self.student_config)) != 1:
            raise SettingError("student_layers", "K, --student FOLDER or --student-config NAME: give one of them (the "
                               "teacher's own layers, a pretrained BERT of yours, or fresh weights of a size)")

    @property
    def layer_losses(self) -> bool:
        """The student learns the teacher's layers too (the teacher runs at every step)."""
        return bool(self.hidden_weight or self.relation_weight)


def taken_layers(teacher_layers: int, k: int) -> list[int]:
    """The teacher's layers a k-layer student starts from: spread from the first to the last, as
    DistilBERT took 6 of 12 (k = 1: the first)."""
    if not 1 <= k <= teacher_layers:
        raise ValueError(f"--student-layers {k}: the teacher has {teacher_layers} layers; a student takes 1 to "
                         f"{teacher_layers} of them")
    return [0] if k == 1 else [round(i * (teacher_layers - 1) / (k - 1)) for i in range(k)]


def student_of(teacher: nn.Module, k: int, **head_arguments) -> nn.Module:
    """The teacher (a BertModel or a task model on one) with k of its layers (taken_layers): every
    other weight the teacher's."""
    layers = taken_layers(teacher.config.num_hidden_layers, k)
    config = dataclasses.replace(teacher.config, num_hidden_layers=k, extra=dict(teacher.config.extra))
    student = type(teacher)(config, **head_arguments)
    state = {}
    for key, value in teacher.state_dict().items():
        layer = LAYER_KEY.match(key)
        if layer is not None:
            if int(layer["index"]) not in layers:
                continue
            key = f"{layer['prefix']}{layers.index(int(layer['index']))}.{layer['rest']}"
        state[key] = value.clone()
    student.load_state_dict(state, strict=True)
    return student


def fresh_student_config(name: str, teacher):
    """The teacher's task config (labels, vocabulary, positions) in the shape of a size (config.PRESETS:
    layers, width, heads; 4 x the width inside) or of a config.json's."""
    from ..architectures import load_config
    from ..config import PRESETS
    if name in PRESETS:
        layers, width, heads = PRESETS[name]
        inner = 4 * width
    else:
        if not Path(name).is_file():
            raise ValueError(f"--student-config {name}: neither a size ({', '.join(PRESETS)}) nor a config.json")
        shape = load_config(name)
        layers, width, heads, inner = (shape.num_hidden_layers, shape.hidden_size, shape.num_attention_heads,
                                       shape.intermediate_size)
    return dataclasses.replace(teacher, num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                               intermediate_size=inner, extra=dict(teacher.extra))


def check_student(where: str, student, teacher, s: DistillSettings, same_vocab: bool, max_length: int) -> None:
    """A student not made of the teacher's layers (its task config `student`) fits the teacher's task:
    the same vocabulary, room for the task's length, and the teacher's width for the hidden-state loss
    (ValueError naming `where` otherwise)."""
    if not same_vocab:
        raise ValueError(f"{where}: its vocabulary is not the teacher's; the student reads the teacher's "
                         "token ids (give a student of the same vocab.txt)")
    if student.max_position_embeddings < max_length:
        raise ValueError(f"{where}: {student.max_position_embeddings} positions, fewer than the task's "
                         f"--max-length {max_length}")
    if s.hidden_weight and student.hidden_size != teacher.hidden_size:
        raise ValueError(f"--hidden-weight {s.hidden_weight:g}: the student is {student.hidden_size} wide and the "
                         f"teacher {teacher.hidden_size}; the hidden-state loss compares states of one width "
                         "(--relation-weight compares the relations of any)")


UNLABELLED = IGNORE - 1  # a target of a text without a label: the soft part's, IGNORE to the head (`head_targets`)


def mark_unlabelled(encoded, examples: int) -> int:
    """The rows of the examples from number `examples` on, texts without labels encoded with a
    placeholder label, get UNLABELLED at each target; returns the first such row."""
    first = next((r for r, e in enumerate(encoded.example_index) if e >= examples), len(encoded.example_index))
    if encoded.num_choices is not None:  # multiple choice: a label an example
        encoded.labels[examples:] = [UNLABELLED] * (len(encoded.labels) - examples)
        return first
    for r in range(first, len(encoded.labels)):
        label = encoded.labels[r]
        if isinstance(label, list):  # a tag a token
            encoded.labels[r] = [IGNORE if t == IGNORE else UNLABELLED for t in label]
        else:  # a class, or a window's (start, end)
            encoded.labels[r] = (UNLABELLED, UNLABELLED) if isinstance(label, tuple) else UNLABELLED
    return first


def placeholder(example, label_map):
    """An example without a label as an example of its family with a placeholder at each target, to be
    encoded as the labelled ones are (`mark_unlabelled` then makes the targets UNLABELLED)."""
    if hasattr(example, "words"):  # a tagging example: a tag a word
        return dataclasses.replace(example, tags=[label_map.labels[0]] * len(example.words))
    if hasattr(example, "choices"):  # multiple choice: the first choice
        return dataclasses.replace(example, label=0)
    if hasattr(example, "answers"):  # a QA question: no answers (every window kept, its target (0, 0))
        return dataclasses.replace(example, answers=None, is_impossible=False)
    return dataclasses.replace(example, label=label_map.labels[0])


def head_targets(fam: TaskFamily, batch: TaskBatch) -> dict:
    """The family's targets of a batch for the head, an UNLABELLED target given as IGNORE (no loss)."""
    targets = fam.targets(batch)
    for key in ("labels", "start_positions", "end_positions"):
        if isinstance(targets.get(key), Tensor) and not targets[key].is_floating_point():
            targets[key] = targets[key].masked_fill(targets[key] == UNLABELLED, IGNORE)
    return targets


LAYER_KEY = re.compile(r"(?P<prefix>(bert\.)?layers\.)(?P<index>\d+)\.(?P<rest>.+)")  # BertModel's layer i


def soft_targets(fam: TaskFamily) -> SoftTargets:
    if fam.soft_targets not in SOFT_TARGETS:
        raise ValueError(f"{fam.type} tasks are not distilled from labelled examples")
    return SOFT_TARGETS[fam.soft_targets]


def distill_texts(path, note=None, empty: str = "an embedding student learns from texts, one a line"
                  ) -> list[PairExample]:
    """The texts an embedding student learns the teacher's vectors of, each distinct one once, in
    order: every non-blank line of a corpus file as prepare reads it (text, one sentence a line, JSON
    Lines or Parquet with a text field, plain, .gz or .zst; a record's text line by line), or the texts
    of an embedding file (query and passage pairs, NLI: tasks/embedding.py)."""
    from ..data.sources import corpus_documents, corpus_files

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (a text file, JSON Lines or Parquet: the texts to distil on)")
    if _embedding_file(path):
        texts = [t for ex in read_pairs(path) for t in (ex.query, ex.positive, *ex.negatives)]
    else:
        texts = [line for docs in corpus_documents(corpus_files([path]), "auto", 1 << 24, _one_line,
                                                   **({"note": note} if note else {}))
                 for doc in docs for line in doc]
    if not texts:
        raise ValueError(f"{path}: no text in it; {empty}")
    return [PairExample(str(k), text, None, [], str(path)) for k, text in enumerate(dict.fromkeys(texts))]


def unlabeled_examples(fam: TaskFamily, path, layout: str, note=None) -> list:
    """The examples of --unlabeled for a student, with no labels: for a classification or tagging task,
    each distinct non-blank line of a corpus (as `distill_texts` reads it) as a text, or for tagging a
    sentence cut into words as BERT cuts it (each Chinese character a word); or a file in the task's own
    layout (a table of texts, a pair task's file, CoNLL, multiple choice's, SQuAD's), its labels unread."""
    from ..tasks.tagging import TokenExample, split_words
    from ..tasks.text import TextExample

    path = Path(path)
    learns_unlabelled = fam.soft_targets in ("classes", "spans") or fam.type == "multiple-choice"  # not a reranker
    if not learns_unlabelled or getattr(fam, "regression", False):
        raise ValueError(f"--unlabeled {path}: a {fam.type} student learns from its labelled examples alone "
                         "(examples without labels: classification, pair, tagging, multiple-choice and QA tasks)")
    if not path.is_file():
        raise ValueError(f"--unlabeled {path}: no such file")
    own = (".tsv", ".csv") if not fam.per_word else (".conll",)
    if fam.soft_targets != "classes":  # questions with their choices or contexts: the task's own layout alone
        try:
            examples = fam.read(path, layout, labelled=False)
        except ValueError as e:
            raise ValueError(f"--unlabeled: {e} (a {fam.type} student's examples without labels are a file in "
                             "--train's layout)") from None
    elif getattr(fam, "pair", False) or path.suffix.lower() in own:
        examples = [dataclasses.replace(e, **{fam.gold: None}) for e in fam.read(path, layout, labelled=False)]
    else:
        texts = distill_texts(path, note, "the teacher labels texts, one a line")
        where = [f"{path} text {k + 1}" for k in range(len(texts))]
        examples = [TokenExample(f"unlabeled-{k}", split_words(ex.query), None, where[k]) if fam.per_word else
                    TextExample(f"unlabeled-{k}", ex.query, None, None, where[k]) for k, ex in enumerate(texts)]
        examples = [e for e in examples if not fam.per_word or e.words]
    if not examples:
        raise ValueError(f"--unlabeled {path}: no text in it; the teacher labels texts, one a line")
    return examples


def _embedding_file(path: Path) -> bool:
    """A file in the embedding family's layouts (TSV or CSV; JSON Lines whose records have no text field)."""
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".csv"):
        return True
    if suffix not in (".jsonl", ".json"):
        return False
    first = next((line for _, line in lines(path) if line.strip()), "")
    try:
        record = json_loads(first)  # a record nested too deeply is malformed JSON, not a RecursionError
    except ValueError:
        return False  # the corpus reader names the line
    return isinstance(record, dict) and "text" not in record and ("query" in record or "sentence1" in record)


def _one_line(line: str) -> list[str]:
    return [line.strip()] if line.strip() else []


# -- the teacher's outputs, computed once ------------------------------------------------------------

class TeacherOutputs:
    """The teacher's outputs on every row of a TaskData: `values` [P, D] row after row, `starts` [R + 1]."""

    def __init__(self, values: Tensor, starts: np.ndarray, kind: SoftTargets):
        self.values, self.starts, self.kind = values, starts, kind

    def of(self, batch: TaskBatch, device=None):
        """The teacher's outputs for a batch's rows, in the layout of the head's own."""
        lo, hi = self.starts[batch.rows], self.starts[batch.rows + 1]
        index = np.repeat(lo, hi - lo) + _ranks(hi - lo)  # the rows' pieces, end to end
        return self.kind.gather(self.values[torch.from_numpy(index)].to(device or "cpu"), batch)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., c - 1 for each count c, end to end."""
    total = int(counts.sum())
    return np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)


@torch.no_grad()
def teacher_outputs(teacher: nn.Module, data: TaskData, batch_size: int, device) -> TeacherOutputs:
    """Every training row's teacher outputs, the teacher in eval mode (no dropout)."""
    kind = soft_targets(data.family)
    was = teacher.training
    teacher.eval()
    parts: dict[int, Tensor] = {}
    try:
        for batch in data.all_batches(batch_size):
            batch = batch.to(device)
            out = teacher(**batch.model_inputs(), **(head_targets(data.family, batch) if kind.labelled else {}))
            values, counts = kind.pieces(out, batch)
            for row, piece in zip(batch.rows.tolist(), values.cpu().split(counts.tolist())):
                parts[row] = piece
    finally:
        teacher.train(was)
    rows = len(data.encoded.input_ids)
    counts = np.array([len(parts[r]) for r in range(rows)], dtype=np.int64)
    return TeacherOutputs(torch.cat([parts[r] for r in range(rows)]), np.concatenate([[0], np.cumsum(counts)]), kind)


# -- kept on disk for a resumed run ----------------------------------------------------------------

TEACHER_CACHE = "teacher_outputs.safetensors"  # in the student's run folder until the run has finished


def outputs_key(data: TaskData, teacher: str) -> str:
    """What the teacher's outputs depend on: the teacher's folder and the training rows as encoded."""
    h = hashlib.sha256(str(teacher).encode())
    enc = data.encoded
    for rows in (enc.input_ids, enc.token_type_ids, enc.word_index or [], enc.num_choices or []):
        h.update(np.asarray([len(r) if isinstance(r, list) else r for r in rows], dtype=np.int64).tobytes())
        if rows and isinstance(rows[0], list):
            h.update(np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]).tobytes())
    return h.hexdigest()


def save_teacher_outputs(path: Path, outputs: TeacherOutputs, key: str) -> None:
    """The teacher's outputs, written atomically (safetensors: no code is read back)."""
    from safetensors.torch import save_file
    tensors = {"values": outputs.values.contiguous(), "starts": torch.from_numpy(outputs.starts)}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"key": key}))


def cached_teacher_outputs(path: Path, fam: TaskFamily, key: str) -> TeacherOutputs | None:
    """The outputs `save_teacher_outputs` wrote for the same teacher and rows; None where there are none,
    they are of other rows or teacher, or the file cannot be read (the teacher is then run again)."""
    from safetensors import safe_open
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("key") != key:
                return None
            values, starts = f.get_tensor("values"), f.get_tensor("starts").numpy()
    except Exception:  # a file cut short or not safetensors: scored again, not trusted
        return None
    if starts.ndim != 1 or starts[0] != 0 or starts[-1] != len(values):
        return None
    return TeacherOutputs(values, starts, soft_targets(fam))


class DistillTask:
    """The loss parts of a distilled student: "task" (its loss on the labels) and "soft" (the soft
    targets' loss), each summed over the family's targets, weighed 1 - soft_weight and soft_weight;
    from texts alone (an embedding student), "soft" only. With the layer losses, "hidden" and
    "relation" too (summed over the sequences, weighed hidden_weight and relation_weight; they have
    no accuracy: `unscored`), from the teacher run beside the student on each batch (`teacher_model`,
    kept in eval mode, without gradients).

    labelled_rows: the training rows from it on are examples without labels (--unlabeled, after the
    labelled ones; their targets UNLABELLED): they add to the soft part alone, the task part is over
    the labelled targets (its per-step count their share of the step's), and the soft part's figure is
    the targets where the student gives the teacher's answer (`SoftTargets.agree`). labelled_units:
    the same first unlabelled example as a unit of the data (a row, or a multiple-choice example), and
    units all of them: a choice or span student's targets are one a unit."""

    unscored = ("hidden", "relation")

    def __init__(self, fam: TaskFamily, teacher: TeacherOutputs, s: DistillSettings, config,
                 per_step: float | None = None, labelled_rows: int | None = None,
                 teacher_model: nn.Module | None = None, rows_per_step: float | None = None,
                 labelled_units: int | None = None, units: int | None = None):
        self.family, self.teacher, self.settings, self.config = fam, teacher, s, config
        self.labelled_rows = labelled_rows
        self.by_units = labelled_rows is not None and fam.soft_targets != "classes"  # a target a unit
        if self.by_units and (labelled_units is None or not units):
            raise ValueError(f"a {fam.type} student's examples without labels are counted by unit: give "
                             "labelled_units and units")
        self.labelled_units, self.units = labelled_units, units
        self.teacher_model = teacher_model.eval() if teacher_model is not None else None
        layers = tuple(p for p, w in (("hidden", s.hidden_weight), ("relation", s.relation_weight)) if w)
        if layers and (teacher_model is None or not teacher.kind.labelled):
            raise ValueError("the layer losses are a task student's, and need the teacher model beside it")
        self.parts = (("task", "soft") if teacher.kind.labelled else ("soft",)) + layers
        self.per_step = {p: per_step for p in self.parts} if per_step else None
        if self.per_step:
            self.per_step.update({p: rows_per_step for p in layers})
        if self.per_step and self.by_units:
            self.per_step["task"] = per_step * labelled_units / units
        elif self.per_step and labelled_rows is not None:  # the teacher's pieces: a row's targets
            self.per_step["task"] = per_step * teacher.starts[labelled_rows] / max(1, teacher.starts[-1])
        self.weights = {"task": 1.0 - s.soft_weight, "soft": s.soft_weight} if teacher.kind.labelled else {"soft": 1.0}
        self.weights.update(hidden=s.hidden_weight, relation=s.relation_weight)
        if layers:
            self.pairs = layer_map(teacher_model.config.num_hidden_layers, config.num_hidden_layers)

    def labelled(self, batch: TaskBatch) -> int:
        """The batch's labelled targets (counted on the host)."""
        if self.labelled_rows is None:
            return batch.num_targets
        if self.by_units:
            return int((np.asarray(batch.units) < self.labelled_units).sum())
        rows = np.asarray(batch.rows)
        rows = rows[rows < self.labelled_rows]
        return int((self.teacher.starts[rows + 1] - self.teacher.starts[rows]).sum())

    def counts(self, batch: TaskBatch) -> dict[str, int]:
        counts = {"task": self.labelled(batch), "soft": batch.num_targets} if "task" in self.parts else \
            {"soft": batch.num_targets}
        return counts | {p: len(batch.rows) for p in self.parts if p in self.unscored}

    def layer_parts(self, model: nn.Module, out, batch: TaskBatch) -> dict[str, tuple[Tensor, Tensor]]:
        """The hidden-state and relation losses of the student's states `out` against the teacher's on the batch."""
        if self.teacher_model is None:
            return {}
        from ..fast.bf16 import encoders
        with torch.no_grad():  # the teacher's encoder alone: its head has no part in these losses
            mine = encoders(self.teacher_model)[0](**batch.model_inputs(), output_hidden_states=True).hidden_states
        none, parts = torch.zeros((), device=batch.input_ids.device), {}
        if self.settings.hidden_weight:
            parts["hidden"] = (hidden_loss(out.hidden_states, mine, self.pairs, batch.cu_seqlens), none)
        if self.settings.relation_weight:
            parts["relation"] = (last_layer_relations(model, out.hidden_states, self.teacher_model, mine,
                                                      batch.cu_seqlens, batch.max_seqlen), none)
        return parts

    def forward(self, model: nn.Module, batch: TaskBatch) -> dict[str, tuple[Tensor, Tensor]]:
        states = {"output_hidden_states": True} if self.teacher_model is not None else {}
        if not self.teacher.kind.labelled:  # the teacher's vectors are the targets
            out = model(**batch.model_inputs())
            teacher = self.teacher.of(batch, batch.input_ids.device)
            soft = self.teacher.kind.loss(out, teacher, batch, self.settings.temperature, self.config)
            return {"soft": (soft, self.teacher.kind.correct(out, teacher))}
        n, labelled = batch.num_targets, self.labelled(batch)
        out = model(**batch.model_inputs(), **head_targets(self.family, batch), **states)
        correct = self.family.correct(out, batch)  # an UNLABELLED target is never right
        layers = self.layer_parts(model, out, batch)
        if not n:  # a micro-batch of token windows with no labelled token
            zero = (out.logits if out.logits is not None else out.start_logits).sum() * 0.0
            return {"task": (zero, correct), "soft": (zero, correct), **layers}
        teacher = self.teacher.of(batch, batch.input_ids.device)
        soft = self.teacher.kind.loss(out, teacher, batch, self.settings.temperature, self.config)
        task = out.loss.float() * labelled if labelled else soft * 0.0  # the loss: a mean over the labelled targets
        if self.labelled_rows is not None:  # the soft part's figure: the targets where the student says the teacher's answer
            return {"task": (task, correct), "soft": (soft, self.teacher.kind.agree(out, teacher, batch)), **layers}
        return {"task": (task, correct), "soft": (soft, correct), **layers}
