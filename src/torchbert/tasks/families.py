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
from dataclasses import dataclass, fields, replace
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
    """How a task's text becomes model inputs, what every family reads; kept in the fine-tuned
    folder's run record (torchbert.json, io/record.py) so that evaluate, predict and serve reuse it.
    A family with settings of its own declares a subclass of its own (tagging.TokenSettings,
    qa.QASettings, embedding.EmbeddingSettings, reranker.RerankerSettings) as its `Settings`:
    `finetune` shows each family's flags under the family and builds that object."""

    type: str = setting(cli=False)
    preset: str | None = setting(None, cli=False)
    layout: str = setting("auto", cli=False)
    max_length: int = setting(128, "tokens per sequence, specials included", low=1)
    doc_stride: int | None = setting(None, "qa and token: tokens between the starts of overlapping windows over "
                                           "long contexts and sentences (default: a third of --max-length, 128 at "
                                           "384)", low=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.doc_stride is None:
            self.doc_stride = max(1, self.max_length // 3)

    @classmethod
    def own_fields(cls) -> tuple[str, ...]:
        """The settings of this class that TaskSettings itself has not: a family's own."""
        return tuple(f.name for f in fields(cls) if f.name not in TaskSettings.__dataclass_fields__)

    def flags(self) -> dict[str, Any]:
        """Its values that are flags of `finetune`, as the run record keeps them (what --resume compares)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("cli", False)}

    @staticmethod
    def of(folder: str | Path) -> TaskSettings:
        """The task settings of a model folder torchbert fine-tuned (its run record), as its family's class."""
        record = read_record(folder)
        saved = record.task if record is not None else None
        if not isinstance(saved, dict) or saved.get("type") not in FAMILIES:
            raise ValueError(f"{folder}: not a model fine-tuned by torchbert (it has no {RECORD_FILE} naming a task); "
                             "fine-tune it first with torchbert finetune")
        cls = FAMILIES[saved["type"]].Settings
        return cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__})


def task_settings(task: str, given: TaskSettings | None = None) -> TaskSettings:
    """The settings of `task` (a type, or a preset: its type, and the preset's layout): `given`, or
    its family's defaults. `given` is the family's Settings or a class it derives from (TaskSettings:
    the settings every family reads); another family's is an error naming both."""
    task_type, preset = resolve_task(task)
    cls = family(task_type).Settings
    if given is not None and type(given) not in cls.__mro__:
        owner = next((t for t, f in FAMILIES.items() if f.Settings is type(given)), type(given).__name__)
        raise ValueError(f"the settings of {owner} tasks ({type(given).__name__}) do not fit a {task_type} task; "
                         f"give a {cls.__name__}")
    kept = {f.name: getattr(given, f.name) for f in fields(given)} if given is not None else {}
    return cls(**{**kept, "type": task_type, "preset": preset.name if preset else None,
                  "layout": preset.layout if preset else "auto"})


class TaskFamily:
    """The interface; the defaults suit tasks with one target per sequence."""

    # the task model per architecture: bert (heads.py), gpt (baselines/gpt.py, the paper's left-to-right
    # baseline), elmo (baselines/elmo.py, a task model on ELMo's frozen features), where there is one
    heads: dict[str, type[nn.Module]] = {}
    gold = "label"  # the example field that holds the gold answer (None: always read with the example)
    label_set = False  # class or tag names, kept in config.json as id2label
    per_word = False  # a tag per word: a tagger on frozen features (finetune --frozen) can learn it
    # a long input becomes overlapping windows (--doc-stride), not one sequence cut at --max-length
    windows = False
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
    # its settings: TaskSettings, or a subclass with settings of its own (finetune shows their flags
    # under the family, and refuses them, set, for another task)
    Settings: type[TaskSettings] = TaskSettings
    # how `distill` teaches a student this family's outputs (train/distill.py SOFT_TARGETS, by name): classes
    # (a distribution, or a score, per sequence or labelled token), choices (one over an example's rows),
    # spans (start and end over a sequence's tokens), embeddings (a text's vector, from texts alone); None: not
    # distilled
    soft_targets: str | None = "classes"
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

                def named(text: str) -> str:  # the split the user gave, not a file that is gone
                    return text.replace(str(local), str(path))

                try:  # our layout, not a benchmark's own (GLUE's)
                    return self.read(local, "auto", labelled, lambda message: warn(named(message)))
                except ValueError as e:
                    raise ValueError(named(str(e))) from None
        if layout not in self.layouts:
            raise ValueError(f"{path}: layout {layout!r} does not fit a {self.type} task; "
                             f"expected {', '.join(self.layouts[:-1])} or {self.layouts[-1]}")
        return self._read(path, layout, labelled, warn)

    def _read(self, path, layout: str, labelled: bool, warn) -> list:
        raise NotImplementedError

    def texts(self, example) -> list[str]:
        """The example's texts, its labels left out, in reading order: what task-adaptive pretraining
        reads of a fine-tuning file (tasks/tapt.py)."""
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

    def head_arguments(self, ts: TaskSettings) -> dict[str, Any]:
        """What the head is built with besides its config: the settings of `ts` it trains by (the
        embedding head's temperature, the reranker's loss), which config.json does not keep."""
        return {}

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
