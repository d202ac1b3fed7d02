"""Task families: everything that differs between kinds of fine-tuning task, one module each,
registered here by name (timm's pattern: a registry, and tests that run every entry).

    text.py     classification, pair, regression  [CLS] a [SEP] (b [SEP]) -> a class, or a score
    tagging.py  token                             words -> a tag each (NER, part of speech)
    qa.py       qa, qa-v2                         question + context window -> answer start and end
    choice.py   multiple-choice                   context + each ending -> which ending
    embedding.py  embedding                       query, its passage (+ negatives) -> vectors, in-batch negatives
    reranker.py   reranker                        query + passage -> relevance score (a cross-encoder)

A family module holds its example type, its file readers, its encoder, its `TaskFamily` subclass
and a `register_family(...)` per task type. The family reads a task file into examples, encodes
them into model rows (tasks/encode.py: `Encoded`), names its head for each architecture (`heads`:
bert, gpt, elmo), gives a batch's targets to that head and counts them for the loss, reads the
head's outputs back into one record per example, scores the records, and says how `export` traces
it. Fine-tuning, prediction, serve, export and the CLI call `family(task_type)` and never switch on
the task type themselves; tasks/__init__.py imports the family modules, so the registry is full
whenever any of tasks/ is imported.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..architectures import ARCHITECTURES, architecture_of
from ..config import BertConfig, ELMoConfig, GPTConfig
from ..io.hf import with_labels
from ..io.record import RECORD_FILE, read_record
from ..settings import Checked, setting
from . import encode as enc
from . import formats, hub
from .examples import LabelMap


@dataclass
class TaskSettings(Checked):
    """How a task's text becomes model inputs; kept in the fine-tuned folder's run record
    (torchbert.json, io/record.py) so that evaluate, predict and serve reuse it. The encoding flags of
    `finetune` are made from these fields."""

    type: str = setting(cli=False)
    preset: str | None = setting(None, cli=False)
    layout: str = setting("auto", cli=False)
    max_length: int = setting(128, "tokens per sequence, specials included", low=1)
    doc_stride: int = setting(128, "qa and token: tokens between the starts of overlapping windows over long "
                                   "contexts and sentences", low=1)
    max_query_length: int = setting(64, "QA: question tokens kept", low=1)
    label_all_subtokens: bool = setting(False, "token: train on every sub-token of a word, not only the first")
    n_best: int = setting(20, "QA: start and end candidates per window", low=1)
    max_answer_length: int = setting(30, "QA: longest answer in tokens", low=1)
    null_threshold: float = setting(0.0, "qa-v2: answer nothing when the null score beats the best span by more; "
                                         "dev scoring reports best_f1_threshold, the value that scored best on dev")
    pooling: str | None = setting(None, "embedding: how a text's tokens become its vector (default: the model "
                                        "folder's own, as its sentence-transformers files say, else mean); saved "
                                        "with the model", choices=("mean", "cls"))
    temperature: float = setting(0.05, "embedding: the softmax temperature of in-batch negatives over cosine "
                                       "similarities (0.05: sentence-transformers' scale 20)", above=0, high=1)
    learn_temperature: bool = setting(False, "embedding: learn the temperature with the model (CLIP's logit scale), "
                                             "starting at --temperature")
    matryoshka: list[int] | None = setting(None, "embedding: also train each vector's first D dimensions as an "
                                                 "embedding of its own, for each D given (Matryoshka representation "
                                                 "learning; `serve` then honours `dimensions`)", low=1, metavar="D")
    mini_batch: int | None = setting(None, "embedding: encode a training batch this many texts at a time and keep "
                                           "only each one's inputs, recomputing its activations in the backward "
                                           "(GradCache's memory: in-batch negatives over a batch of any size in the "
                                           "memory of MINI texts; MiniLM at batch 256 with 32: 5.4 GB, where batch 128 "
                                           "alone took 9.8)", low=1, metavar="MINI")
    rerank_loss: str = setting("listwise", "reranker: listwise, a softmax over each query's passages (each query "
                                           "needs a relevant one), or pointwise, binary cross-entropy per pair",
                               choices=("listwise", "pointwise"))
    sampled_negatives: int = setting(3, "reranker: passages of other queries added to each query's as negatives "
                                        "(drawn once, seeded; 0: only the file's)", low=0)

    @classmethod
    def of(cls, folder: str | Path) -> TaskSettings:
        """The task settings of a model folder torchbert fine-tuned (its run record)."""
        record = read_record(folder)
        saved = record.task if record is not None else None
        if not isinstance(saved, dict) or saved.get("type") not in FAMILIES:
            raise ValueError(f"{folder}: not a model fine-tuned by torchbert (it has no {RECORD_FILE} naming a task); "
                             "fine-tune it first with torchbert finetune")
        return cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__})




class TaskFamily:
    """The interface; the defaults suit tasks with one target per sequence."""

    # the task model per architecture: bert (heads.py), gpt (baselines/gpt.py, the paper's left-to-right
    # baseline), elmo (baselines/elmo.py, a task model on ELMo's frozen features), where there is one
    heads: dict[str, type[nn.Module]] = {}
    gold = "label"  # the example field that holds the gold answer (None: always read with the example)
    label_set = False  # class or tag names, kept in config.json as id2label
    per_word = False  # a tag per word: a tagger on frozen features (finetune --frozen) can learn it
    file_format = "text"  # what a hub split is written as (tasks/hub.py FORMATS; None: no hub splits)
    layouts = ("auto",)  # file layouts it reads (layouts(): every registered family's)
    metrics: tuple[str, ...] = ()  # what score() reports; the first picks the best epoch
    about = ""  # one line for `finetune --help`: what it maps to what, and the files it reads
    # a small labelled training file in the family's own layout, (name, text): what --train looks like
    # (docs/architecture.md), and what tests/tasks/test_every_family.py trains every registered family on
    example_file: tuple[str, str] = ("", "")
    # export (apps/export.py): the head's outputs, those given per token, and the shape of the inputs
    # it is traced on: text (one sequence), pair (two), choices ([batch, choices, sequence])
    # what `serve` offers for a run of this family (apps/endpoints.py, by endpoint name): its
    # predictions, and sentence embeddings from its BERT encoder
    endpoints: tuple[str, ...] = ("predict", "embeddings")
    # the TaskSettings fields only this family reads (finetune refuses them, set, for another task)
    settings: tuple[str, ...] = ()
    export_outputs: tuple[str, ...] = ("logits",)
    export_per_token: tuple[str, ...] = ()
    export_sample = "text"

    def __init__(self, task_type: str):
        self.type = task_type

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.type!r})"

    # -- reading -------------------------------------------------------------------------------

    def read(self, path: formats.PathLike, layout: str = "auto", labelled: bool = True,
             warn: formats.Warn = formats.note) -> list:
        """The examples of a file (or hf:NAME[:CONFIG]:SPLIT); labelled=False reads predict inputs."""
        if layout not in layouts():
            raise ValueError(f"{path}: unknown layout {layout!r}; expected one of {', '.join(layouts())}")
        if hub.is_hub(path) and self.file_format is None:
            raise ValueError(f"{path}: {self.type} tasks read no hub splits; write the split to a file in the "
                             "task's layout and give that")
        if hub.is_hub(path):  # written out in our layout and read from there
            with tempfile.TemporaryDirectory(prefix="torchbert-hub.") as folder:
                local = hub.export(str(path), self.file_format, Path(folder))
                return self.read(local, "auto", labelled, warn)  # our layout, not a benchmark's own (GLUE's)
        if layout not in self.layouts:
            raise ValueError(f"{path}: layout {layout!r} does not fit a {self.type} task; "
                             f"expected {', '.join(self.layouts[:-1])} or {self.layouts[-1]}")
        return self._read(path, layout, labelled, warn)

    def _read(self, path, layout: str, labelled: bool, warn) -> list:
        raise NotImplementedError

    def from_record(self, record: dict, where: str, default_id: str) -> Any:
        """An unlabelled example from one JSON object (`torchbert serve`'s /predict); ValueError names
        `where` and the field when it does not fit."""
        raise NotImplementedError

    def label_map(self, examples: list) -> LabelMap | None:
        """The label set of the training examples, for families that keep one."""
        return LabelMap.from_examples(examples) if self.label_set else None

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, tokenizer, examples: list, ts: TaskSettings, label_map: LabelMap | None,
               training: bool, use_labels: bool = True) -> enc.Encoded:
        """Examples -> model rows; without their labels when use_labels is False (prediction inputs
        may carry labels the model never saw)."""
        if not use_labels and self.gold is not None:
            examples = [replace(e, **{self.gold: None}) for e in examples]
        labelled = training or self.gold is None or all(getattr(e, self.gold) is not None for e in examples)
        label2id = label_map.label2id() if label_map is not None and labelled else None
        return self._encode(tokenizer, examples, ts, label2id, training)

    def _encode(self, tokenizer, examples: list, ts: TaskSettings, label2id, training: bool) -> enc.Encoded:
        raise NotImplementedError

    def batch_targets(self, encoded: enc.Encoded, rows: np.ndarray, units: np.ndarray) -> dict[str, Tensor]:
        """The TaskBatch fields that hold the targets of `rows` (grouped into `units`)."""
        return {"labels": torch.tensor([encoded.labels[r] for r in rows], dtype=torch.long)}

    # -- the loss ------------------------------------------------------------------------------

    def targets(self, batch) -> dict[str, Any]:
        """What the head takes besides the inputs to compute its loss."""
        return {"labels": batch.labels}

    def count(self, batch) -> int:
        """The loss targets of a batch on the host (TaskBatch.num_targets): sequences here."""
        return int(batch.cu_seqlens.numel() - 1)

    def total(self, data) -> int:
        """The loss targets of a whole TaskData."""
        return len(data.encoded.input_ids)

    def correct(self, out, batch) -> Tensor:
        """How many targets the head got right (a device tensor: no sync)."""
        return (out.logits.argmax(-1) == batch.labels).sum()

    # -- prediction ----------------------------------------------------------------------------

    def predict_inputs(self, batch, encoded: enc.Encoded) -> dict[str, Any]:
        """Head arguments for prediction besides the inputs."""
        return {}

    def outputs(self, out, batch, inputs: dict[str, Any]) -> list[tuple[int, Any]]:
        """(unit, its output on the host) for each unit of the batch; inputs: from predict_inputs."""
        return list(zip(batch.units.tolist(), out.logits.float().cpu()))

    def records(self, examples: list, encoded: enc.Encoded, outputs: list, ts: TaskSettings,
                id2label: dict[int, str] | None) -> list[dict[str, Any]]:
        """One record per example, in input order: what `torchbert predict` writes."""
        raise NotImplementedError

    def score(self, records: list[dict], examples: list, label_map: LabelMap | None) -> dict[str, float]:
        raise NotImplementedError

    # -- the model -----------------------------------------------------------------------------

    def model_for(self, config: BertConfig | GPTConfig | ELMoConfig) -> type[nn.Module]:
        """The task model for a BERT config, or for one of its baselines' (GPT, ELMo): `heads` by
        architecture, else the architecture's own head for this task type."""
        arch = architecture_of(config)
        if arch.name in self.heads or self.type in arch.heads:
            return self.heads.get(arch.name) or arch.heads[self.type]
        able = [a.title for a in ARCHITECTURES.values() if a.name in self.heads or self.type in a.heads]
        raise ValueError(f"{self.type} tasks have no {arch.title} task model{arch.no_head}; fine-tune a "
                         f"{' or '.join(filter(None, (', '.join(able[:-1]), able[-1])))} for them")

    def configure(self, config: BertConfig, label_map: LabelMap | None, ts: TaskSettings | None = None,
                  model_dir: Path | None = None) -> BertConfig:
        """The model config with the head's labels (and whatever else of the task settings `ts` the
        head reads) for the pretrained model in `model_dir`."""
        return with_labels(config, label_map.labels) if label_map is not None else config

    def check_settings(self, ts: TaskSettings) -> None:
        """A setting that only another family reads, set for this one, is an error, not ignored."""
        for fam in FAMILIES.values():
            for name in set(fam.settings) - set(self.settings):
                if getattr(ts, name) != TaskSettings.__dataclass_fields__[name].default:
                    raise ValueError(f"--{name.replace('_', '-')} is a setting of {fam.type} tasks; a "
                                     f"{self.type} task does not read it")

    def scoring(self, label_map: LabelMap | None) -> str | None:
        """How dev is scored when it depends on the labels (token tasks), else None."""
        return None

    def best_metric(self, label_map: LabelMap | None, preset: formats.TaskPreset | None,
                    dev: list | None = None) -> str:
        """The dev score that picks the best epoch (dev: the dev examples, for families whose score
        depends on what the dev file holds)."""
        return preset.metric if preset is not None else self.metrics[0]


class GroupedTask(TaskFamily):
    """A family whose example is several sequences scored together: multiple choice's choices, a
    reranker's candidates. An example's rows are batched together (TaskData's units), the loss and
    the counts are per example, and the head is told each example's number of rows."""

    def targets(self, batch) -> dict[str, Any]:
        return {"labels": batch.labels, "num_choices": batch.num_choices, "max_choices": batch.max_choices}

    def count(self, batch) -> int:
        return int(batch.num_choices.numel())

    def total(self, data) -> int:
        return len(data)

    def predict_inputs(self, batch, encoded: enc.Encoded) -> dict[str, Any]:
        return {"num_choices": batch.num_choices, "max_choices": batch.max_choices}

    def row_scores(self, logits: Tensor) -> Tensor:
        """[E, max_choices] logits -> what a record shows of each row (a probability)."""
        raise NotImplementedError

    def outputs(self, out, batch, inputs: dict[str, Any]) -> list[tuple[int, Any]]:
        """(example, the scores of its own rows) for each example of the batch."""
        scores = self.row_scores(out.logits.float()).cpu()
        return [(u, scores[k, :n].tolist()) for k, (u, n) in enumerate(zip(batch.units.tolist(),
                                                                          batch.num_choices.tolist()))]


FAMILIES: dict[str, TaskFamily] = {}  # task type -> its family; the family modules fill it


def register_family(fam: TaskFamily) -> TaskFamily:
    """Add a task type (its family object) to the registry; a name already taken is an error."""
    if fam.type in FAMILIES:
        raise ValueError(f"task type {fam.type!r} is registered already ({FAMILIES[fam.type]!r})")
    FAMILIES[fam.type] = fam
    return fam


def layouts() -> tuple[str, ...]:
    """Every file layout a registered family reads (`auto` first)."""
    return tuple(dict.fromkeys(x for fam in FAMILIES.values() for x in fam.layouts))


def resolve_task(name: str) -> tuple[str, formats.TaskPreset | None]:
    """A task type as is, or a preset name as its type and preset: `--task` accepts either."""
    if name in FAMILIES:
        return name, None
    preset = formats.TASK_PRESETS.get(name.lower())
    if preset is None:
        raise ValueError(f"unknown task {name!r}: expected a task type ({', '.join(FAMILIES)}) "
                         f"or a preset ({', '.join(formats.TASK_PRESETS)})")
    return preset.type, preset


def family(task_type: str) -> TaskFamily:
    """The family of a registered task type."""
    if task_type not in FAMILIES:
        raise ValueError(f"unknown task type {task_type!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[task_type]


def read_examples(path: formats.PathLike, task_type: str, layout: str = "auto", labelled: bool = True,
                  warn: formats.Warn = formats.note) -> list:
    """The examples of a file for a task type: `family(task_type).read(...)`."""
    if task_type not in FAMILIES:
        raise ValueError(f"{path}: unknown task type {task_type!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[task_type].read(path, layout, labelled, warn)
