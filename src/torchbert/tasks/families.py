"""Task families: everything that differs between kinds of fine-tuning task, one class each.

    TextTask    classification, pair, regression  [CLS] a [SEP] (b [SEP]) -> a class, or a score
    TokenTask   token                             words -> a tag each (NER, part of speech)
    SpanTask    qa, qa-v2                         question + context window -> answer start and end
    ChoiceTask  multiple-choice                   context + each ending -> which ending

A family reads a task file into examples (tasks/formats.py), encodes them into model rows
(tasks/encode.py), gives a batch's targets to its head (heads.py) and counts them for the loss,
reads the head's outputs back into one record per example, and scores the records
(eval/metrics.py). Fine-tuning, prediction and the CLI call `family(task_type)` and never switch on
the task type themselves.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..baselines.elmo import ELMoForSequenceClassification, ELMoForTokenClassification
from ..baselines.gpt import (OpenAIGPTForMultipleChoice, OpenAIGPTForQuestionAnswering,
                             OpenAIGPTForSequenceClassification, OpenAIGPTForTokenClassification)
from ..config import BertConfig, ELMoConfig, GPTConfig
from ..eval import metrics
from ..heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                     BertForTokenClassification)
from ..io.hf import with_labels
from ..io.record import RECORD_FILE, read_record
from ..losses import IGNORE
from ..packing import pad
from ..settings import Checked, setting
from . import encode as enc
from . import formats, hub
from .examples import LabelMap, QAExample, TokenExample


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

    model_class: type[nn.Module]  # the task model on BERT (heads.py)
    gpt_class: type[nn.Module]  # the same task on GPT (gpt.py), the paper's left-to-right baseline
    elmo_class: type[nn.Module] | None = None  # a task model on ELMo's frozen features (elmo.py), where there is one
    gold = "label"  # the example field that holds the gold answer (None: always read with the example)
    label_set = False  # class or tag names, kept in config.json as id2label
    file_format = "text"  # what a hub split is written as (tasks/hub.py)
    layouts = ("auto",)  # file layouts it reads (tasks/formats.py LAYOUTS)
    metrics: tuple[str, ...] = ()  # what score() reports; the first picks the best epoch

    def __init__(self, task_type: str):
        self.type = task_type

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.type!r})"

    # -- reading -------------------------------------------------------------------------------

    def read(self, path: formats.PathLike, layout: str = "auto", labelled: bool = True,
             warn: formats.Warn = formats.note) -> list:
        """The examples of a file (or hf:NAME[:CONFIG]:SPLIT); labelled=False reads predict inputs."""
        if layout not in formats.LAYOUTS:
            raise ValueError(f"{path}: unknown layout {layout!r}; expected one of {', '.join(formats.LAYOUTS)}")
        if hub.is_hub(path):  # written out in our layout and read from there
            with tempfile.TemporaryDirectory(prefix="torchbert-hub.") as folder:
                local = hub.export(str(path), self.file_format, Path(folder))
                layout = "auto" if layout in formats.TEXT_LAYOUTS else layout  # our JSON Lines, not GLUE TSV
                return self.read(local, layout, labelled, warn)
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
        """The task model for a BERT config, or for one of its baselines' (GPT, ELMo)."""
        if isinstance(config, ELMoConfig):
            if self.elmo_class is None:
                raise ValueError(f"{self.type} tasks have no ELMo task model (ELMo's features feed a BiLSTM tagger "
                                 "or classifier here): fine-tune a BERT or a GPT for them")
            return self.elmo_class
        return self.gpt_class if isinstance(config, GPTConfig) else self.model_class

    def configure(self, config: BertConfig, label_map: LabelMap | None) -> BertConfig:
        """The model config with the head's labels."""
        return with_labels(config, label_map.labels) if label_map is not None else config

    def scoring(self, label_map: LabelMap | None) -> str | None:
        """How dev is scored when it depends on the labels (token tasks), else None."""
        return None

    def best_metric(self, label_map: LabelMap | None, preset: formats.TaskPreset | None) -> str:
        return preset.metric if preset is not None else self.metrics[0]


class TextTask(TaskFamily):
    """One sequence per example; the pooled [CLS] vector is classified, or scored (regression)."""

    model_class = BertForSequenceClassification
    gpt_class = OpenAIGPTForSequenceClassification
    elmo_class = ELMoForSequenceClassification
    layouts = ("auto", *formats.TEXT_LAYOUTS)

    def __init__(self, task_type: str, pair: bool | None, regression: bool = False):
        super().__init__(task_type)
        self.pair, self.regression = pair, regression  # pair None: single sentences or pairs, as the file has
        self.label_set = not regression
        self.metrics = ("pearson", "spearman", "mse") if regression else ("accuracy", "f1", "mcc")

    def _read(self, path, layout, labelled, warn):
        return formats.read_text_examples(path, self.pair, self.regression, layout, labelled, warn)

    def from_record(self, record, where, default_id):
        return formats.text_example_from_record(record, where, default_id, self.pair, self.regression)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return enc.encode_texts(tokenizer, examples, ts.max_length, label2id, regression=self.regression)

    def batch_targets(self, encoded, rows, units):
        dtype = torch.float32 if self.regression else torch.long
        return {"labels": torch.tensor([encoded.labels[r] for r in rows], dtype=dtype)}

    def correct(self, out, batch):
        if self.regression:
            return ((out.logits.squeeze(-1) - batch.labels).abs() < 0.5).sum()  # within half a point
        return super().correct(out, batch)

    def records(self, examples, encoded, outputs, ts, id2label):
        if self.regression:
            return [{"id": ex.id, "score": round(float(logits[0]), 6)} for ex, logits in zip(examples, outputs)]
        records = []
        for ex, logits in zip(examples, outputs):  # one row per example, in order
            p = logits.softmax(-1)
            k = int(p.argmax())
            records.append({"id": ex.id, "label": id2label[k], "probability": round(float(p[k]), 6),
                            "probabilities": {id2label[i]: round(float(v), 6) for i, v in enumerate(p)}})
        return records

    def score(self, records, examples, label_map):
        if self.regression:
            return metrics.regression_scores([r["score"] for r in records], [float(x.label) for x in examples])
        l2i = label_map.label2id()
        return metrics.classification_scores([l2i[r["label"]] for r in records],
                                             [l2i[str(x.label)] for x in examples], len(l2i))

    def configure(self, config, label_map):
        if self.regression:
            config.extra.update(id2label={"0": "score"}, label2id={"score": 0}, problem_type="regression")
            if isinstance(config, GPTConfig):  # similarity, as the GPT paper: pairs read in both orders
                config = replace(config, both_orders=True)
            return config
        return super().configure(config, label_map)


class TokenTask(TaskFamily):
    """A tag per word, predicted at the word's first sub-token; long sentences in overlapping windows.
    Tags shaped like entity chunks (O, B-/I-/E-/S-) score by entity F1, any other tag set per word."""

    model_class = BertForTokenClassification
    gpt_class = OpenAIGPTForTokenClassification
    elmo_class = ELMoForTokenClassification
    gold = "tags"
    label_set = True
    file_format = "conll"
    layouts = ("auto", "conll")
    metrics = ("f1", "precision", "recall", "token_accuracy")

    def _read(self, path, layout, labelled, warn):
        return formats.read_conll(path, labelled)

    def from_record(self, record, where, default_id):
        words = record.get("tokens")
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
            raise ValueError(f"{where}: \"tokens\" is {json.dumps(words)[:60]}; expected a non-empty list of "
                             "words (strings), as the lines of a CoNLL file")
        ident = record.get("id")
        return TokenExample(default_id if ident is None or ident == "" else str(ident), words, None, where)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return enc.encode_tokens(tokenizer, examples, ts.max_length, ts.doc_stride, label2id,
                                 label_all_subtokens=ts.label_all_subtokens)

    def batch_targets(self, encoded, rows, units):
        labels = torch.tensor([t for r in rows for t in encoded.labels[r]], dtype=torch.long)
        return {"labels": labels, "label_positions": (labels != IGNORE).nonzero().squeeze(1)}  # on the host

    def targets(self, batch):  # logits [M, C] of the labelled tokens
        return {"labels": batch.labels, "labelled_only": True, "label_positions": batch.label_positions}

    def count(self, batch):
        return int((batch.labels != IGNORE).sum())

    def total(self, data):
        return sum(sum(t != IGNORE for t in labels) for labels in data.encoded.labels)

    def correct(self, out, batch):
        positions = batch.label_positions
        if positions is None:  # a batch made elsewhere
            positions = (batch.labels != IGNORE).nonzero().squeeze(1)
        return (out.logits.argmax(-1) == batch.labels.index_select(0, positions)).sum()

    def predict_inputs(self, batch, encoded):
        # only the token that owns a word is read: the last layer runs for those alone
        owned = torch.tensor([w >= 0 for r in batch.rows for w in encoded.word_index[r]])
        return {"labels": torch.where(owned, 0, IGNORE), "labelled_only": True}

    def outputs(self, out, batch, inputs):
        owned = inputs["labels"] != IGNORE
        tags = torch.full(owned.shape, -1, dtype=torch.long)  # -1 where no word is read
        tags[owned.cpu()] = out.logits.argmax(-1).cpu()
        return list(zip(batch.units.tolist(), (x.tolist() for x in tags.split(batch.cu_seqlens.diff().tolist()))))

    def records(self, examples, encoded, outputs, ts, id2label):
        words = enc.words_from_tokens(encoded, outputs, len(examples), [len(x.words) for x in examples])
        return [{"id": ex.id, "words": ex.words, "tags": [id2label[i] for i in ids]}
                for ex, ids in zip(examples, words)]

    def score(self, records, examples, label_map):
        true, pred = [list(x.tags) for x in examples], [r["tags"] for r in records]
        if self.scoring(label_map) == "tags":
            return metrics.tag_scores(true, pred)
        return metrics.entity_scores(true, pred)

    def scoring(self, label_map):
        return metrics.token_scoring(label_map.labels)

    def best_metric(self, label_map, preset):
        return metrics.TAG_METRICS[0] if self.scoring(label_map) == "tags" else super().best_metric(label_map, preset)


class SpanTask(TaskFamily):
    """Extractive QA (SQuAD): start and end logits over each context window; v2 may answer nothing."""

    model_class = BertForQuestionAnswering
    gpt_class = OpenAIGPTForQuestionAnswering
    gold = None  # answers are read with the examples; prediction needs none
    layouts = ("auto", "squad")

    def __init__(self, task_type: str, v2: bool):
        super().__init__(task_type)
        self.v2 = v2
        self.file_format = "squad-v2" if v2 else "squad"
        self.metrics = ("f1", "exact_match") + (
            ("HasAns_f1", "HasAns_exact_match", "NoAns_f1", "NoAns_exact_match", "best_f1", "best_f1_threshold",
             "best_exact_match", "best_exact_match_threshold") if v2 else ())

    def _read(self, path, layout, labelled, warn):
        return formats.read_squad(path, self.v2, labelled, warn)

    def from_record(self, record, where, default_id):
        for key in ("question", "context"):
            if not isinstance(record.get(key), str):
                raise ValueError(f"{where}: \"{key}\" is {json.dumps(record.get(key))[:40]}; expected a string")
        ident = record.get("id")
        return QAExample(default_id if ident is None or ident == "" else str(ident), record["question"],
                         record["context"], [], False, where)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return enc.encode_qa(tokenizer, examples, ts.max_length, ts.doc_stride, ts.max_query_length,
                             training=training, v2=self.v2)

    def batch_targets(self, encoded, rows, units):
        return {"start_positions": torch.tensor([encoded.labels[r][0] for r in rows], dtype=torch.long),
                "end_positions": torch.tensor([encoded.labels[r][1] for r in rows], dtype=torch.long)}

    def targets(self, batch):
        return {"start_positions": batch.start_positions, "end_positions": batch.end_positions}

    def correct(self, out, batch):
        """Sequences whose argmax start and end (over their own tokens) are both the gold ones."""
        starts = pad(out.start_logits, batch.cu_seqlens, batch.max_seqlen, float("-inf")).argmax(-1)
        ends = pad(out.end_logits, batch.cu_seqlens, batch.max_seqlen, float("-inf")).argmax(-1)
        return ((starts == batch.start_positions) & (ends == batch.end_positions)).sum()

    def outputs(self, out, batch, inputs):
        lengths = batch.cu_seqlens.diff().tolist()
        return [(u, (s.numpy(), t.numpy())) for u, s, t in zip(batch.units.tolist(),
                                                               out.start_logits.float().cpu().split(lengths),
                                                               out.end_logits.float().cpu().split(lengths))]

    def records(self, examples, encoded, outputs, ts, id2label):
        answers = enc.postprocess_qa(examples, encoded, [o[0] for o in outputs], [o[1] for o in outputs],
                                     n_best=ts.n_best, max_answer_length=ts.max_answer_length, v2=self.v2,
                                     null_threshold=ts.null_threshold)
        records = []
        for ex in examples:
            a = answers[ex.id]
            rec = {"id": ex.id, "answer": a["text"], "score": round(float(a["score"]), 6), "start": a["start"]}
            if self.v2:  # the best span even when "" wins, to choose --null-threshold on dev
                rec.update(null_score=round(float(a["null_score"]), 6), span=a["span"],
                           span_score=round(float(a["span_score"]), 6) if a["span"] else None)
            records.append(rec)
        return records

    def score(self, records, examples, label_map):
        gold = {x.id: [a.text for a in x.answers] for x in examples}
        scores = metrics.squad_scores(gold, {r["id"]: r["answer"] for r in records})
        if self.v2:
            with_span = [r for r in records if r.get("span")]
            spans = {r["id"]: r["span"] for r in with_span}
            margins = {r["id"]: r["null_score"] - r["span_score"] for r in with_span}
            scores.update(metrics.squad_best_thresholds(gold, spans, margins))
        return scores


class ChoiceTask(TaskFamily):
    """One sequence per choice, a score each, softmax over an example's choices (SWAG). The unit of
    batching and of the loss is the example."""

    model_class = BertForMultipleChoice
    gpt_class = OpenAIGPTForMultipleChoice
    file_format = "swag"
    layouts = ("auto", "swag")
    metrics = ("accuracy",)

    def _read(self, path, layout, labelled, warn):
        return formats.read_choices(path, labelled)

    def from_record(self, record, where, default_id):
        return formats.choice_example_from_record(record, where, default_id)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return enc.encode_choices(tokenizer, examples, ts.max_length)

    def batch_targets(self, encoded, rows, units):
        return {"labels": torch.tensor([encoded.labels[u] for u in units], dtype=torch.long)}

    def targets(self, batch):
        return {"labels": batch.labels, "num_choices": batch.num_choices, "max_choices": batch.max_choices}

    def count(self, batch):
        return int(batch.num_choices.numel())

    def total(self, data):
        return len(data)

    def predict_inputs(self, batch, encoded):
        return {"num_choices": batch.num_choices, "max_choices": batch.max_choices}

    def outputs(self, out, batch, inputs):
        probs = out.logits.float().softmax(-1).cpu()
        return [(u, probs[k, :n].tolist()) for k, (u, n) in enumerate(zip(batch.units.tolist(),
                                                                          batch.num_choices.tolist()))]

    def records(self, examples, encoded, outputs, ts, id2label):
        records = []
        for ex, probs in zip(examples, outputs):
            k = int(np.argmax(probs))
            records.append({"id": ex.id, "choice": k, "text": ex.choices[k], "probability": round(probs[k], 6),
                            "probabilities": [round(p, 6) for p in probs]})
        return records

    def score(self, records, examples, label_map):
        return {"accuracy": metrics.accuracy([r["choice"] for r in records], [x.label for x in examples])}


FAMILIES: dict[str, TaskFamily] = {f.type: f for f in (
    TextTask("classification", pair=False),
    TextTask("pair", pair=True),
    TextTask("regression", pair=None, regression=True),  # one sentence or pairs, whichever the file holds
    TokenTask("token"),
    SpanTask("qa", v2=False),
    SpanTask("qa-v2", v2=True),
    ChoiceTask("multiple-choice"),
)}


def family(task_type: str) -> TaskFamily:
    """The family of a task type (tasks/examples.py TASK_TYPES)."""
    if task_type not in FAMILIES:
        raise ValueError(f"unknown task type {task_type!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[task_type]


def read_examples(path: formats.PathLike, task_type: str, layout: str = "auto", labelled: bool = True,
                  warn: formats.Warn = formats.note) -> list:
    """The examples of a file for a task type: `family(task_type).read(...)`."""
    if task_type not in FAMILIES:
        raise ValueError(f"{path}: unknown task type {task_type!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[task_type].read(path, layout, labelled, warn)
