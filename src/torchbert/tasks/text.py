"""The text family: one text or a pair of texts -> a class (classification, pair) or a number
(regression), read from the pooled [CLS] vector (the BERT paper's Figure 4a-b).

Files: TSV / CSV with a header or JSON Lines, columns found by name (layout `auto`; one text may be
the one column besides the label and the id, whatever its name); the official GLUE TSVs (`glue-*`);
SNLI / MultiNLI JSON Lines (`nli-jsonl`); for predict, also a .txt of one text a line. Model rows:
`[CLS] a [SEP] (b [SEP])`, cut "longest_first". Scores: accuracy, F1, MCC; Pearson and Spearman for
regression.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..baselines.elmo import ELMoForSequenceClassification
from ..baselines.gpt import OpenAIGPTForSequenceClassification
from ..architectures import architecture_of
from ..eval import metrics
from ..heads import BertForSequenceClassification
from ..io.texts import json_records, lines
from .encode import Encoded, check_room, label_id, where_of
from .families import TaskFamily, register_family
from .formats import (ID_KEYS, PathLike, Warn, existing, find_key, keyed_rows, no_examples, note,
                      read_table, table_format, table_rows, text_field)


@dataclass
class TextExample:
    """Single sentence (text_b None) or sentence pair; classification or regression."""

    id: str
    text_a: str
    text_b: str | None
    label: str | float | None  # None in unlabelled (predict) inputs
    where: str = ""

    def label_names(self) -> list[str]:
        if not isinstance(self.label, str):
            what = "no label" if self.label is None else f"label {self.label!r} is a score, not a class"
            raise ValueError(f"{self.where}: {what}; a label map is built from labelled classification examples")
        return [self.label]

    def label_places(self) -> list[tuple[str, str]]:
        return [] if self.label is None else [(str(self.label), self.where)]


# The text columns, label and id of each GLUE TSV, by header name (matched ignoring case).  The GLUE test
# files have the same header less the label.  CoLA's train/dev files alone have no header (see _COLA).
_GLUE: dict[str, tuple[str, str | None, str, str]] = {
    "glue-cola": ("sentence", None, "label", "index"),
    "glue-sst2": ("sentence", None, "label", "index"),
    "glue-mrpc": ("#1 String", "#2 String", "Quality", "index"),
    "glue-stsb": ("sentence1", "sentence2", "score", "index"),  # columns 7 and 8, the score last
    "glue-qqp": ("question1", "question2", "is_duplicate", "id"),
    "glue-mnli": ("sentence1", "sentence2", "gold_label", "index"),  # columns 8 and 9, gold_label last
    "glue-qnli": ("question", "sentence", "label", "index"),
    "glue-rte": ("sentence1", "sentence2", "label", "index"),
    "glue-wnli": ("sentence1", "sentence2", "label", "index"),
}


_COLA = ["source", "label", "mark", "sentence"]  # CoLA train/dev: no header; mark is the author's "*"


_NLI_JSONL = ("sentence1", "sentence2", "gold_label", "pairID")  # SNLI / MultiNLI .jsonl


# (pair, regression) of each text layout, to catch a layout given with the wrong task type.
TEXT_LAYOUTS: dict[str, tuple[bool, bool]] = {
    name: (b is not None, name == "glue-stsb") for name, (_, b, _, _) in _GLUE.items()
} | {"nli-jsonl": (True, False)}


# Layout `auto`: column names (or JSON keys) accepted for each field, in order of preference.
_SINGLE = ("sentence", "text")


_PAIRS = (("sentence1", "sentence2"), ("text_a", "text_b"), ("premise", "hypothesis"), ("question", "sentence"))


_LABELS = ("label", "gold_label")


@dataclass(frozen=True)
class _Columns:
    """The keys (header names or JSON keys) of a text example's fields; None where the file lacks one."""

    a: str
    b: str | None
    label: str | None
    id: str | None


def _columns(keys: list[str], pair: bool | None, layout: str, labelled: bool, where: str) -> _Columns:
    """The columns of a text task, by name; `where` names the header line (or the JSON line)."""
    found = f"found {', '.join(keys) if keys else 'none'}"
    if layout != "auto":
        names = _NLI_JSONL if layout == "nli-jsonl" else _GLUE[layout]
        a, b, label, ident = (find_key(keys, n) if n else None for n in names)
        for name, key in ((names[0], a), (names[1], b), (names[2], label)):
            if name and key is None and (name != names[2] or labelled):
                raise ValueError(f"{where}: no {name!r} column, which a {layout} file has; {found}")
        return _Columns(a, b, label, ident)
    pairs = [(a, b) for a, b in ((find_key(keys, x), find_key(keys, y)) for x, y in _PAIRS) if a and b]
    label = next((k for k in (find_key(keys, n) for n in _LABELS) if k), None)
    ident = next((k for k in (find_key(keys, n) for n in ID_KEYS) if k), None)
    single = next((k for k in (find_key(keys, n) for n in _SINGLE) if k), None)
    others = [k for k in keys if k not in (label, ident)]
    if single is None and len(others) == 1:  # one column besides the label and the id: the text, by any name
        single = others[0]
    if pair or (pair is None and pairs):
        if not pairs:
            raise ValueError(f"{where}: sentence2 is missing: a pair task needs two text columns, sentence1 + "
                             f"sentence2 (or text_a + text_b, premise + hypothesis, question + sentence); {found}")
        a, b = pairs[0]
    else:
        if single is None:
            hint = f"; for sentence pairs ({pairs[0][0]}, {pairs[0][1]}) use the pair task" if pairs else ""
            raise ValueError(f"{where}: no sentence column: a single-sentence task needs a sentence (or text) "
                             f"column, or one column besides the label and the id; {found}{hint}")
        a, b = single, None
    if label is None and labelled:
        raise ValueError(f"{where}: no label column; expected label (or gold_label); {found}")
    return _Columns(a, b, label, ident)



def _label(value: object, key: str, where: str, regression: bool, labelled: bool) -> str | float | None:
    """A class label as a string (JSON 3 becomes "3"), or a regression score as a float."""
    if value is None or (isinstance(value, str) and not value.strip()):
        if labelled:
            raise ValueError(f"{where}: empty {key!r}; expected a label")
        return None
    if regression:
        try:
            score = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
        except ValueError:
            score = None
        if score is None or not math.isfinite(score):
            raise ValueError(f"{where}: {key} {value!r} is not a number; a regression task expects a score like 3.8")
        return score
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{where}: {key} {value!r} is a {type(value).__name__}; expected a string or an integer")
    return str(value).strip()


def _kind(pair: bool | None, regression: bool) -> str:
    shape = {True: "pair ", False: "single-sentence ", None: ""}[pair]
    return shape + ("regression" if regression else "classification")


def _text_example(record: dict, cols: _Columns, where: str, default_id: str, regression: bool,
                  labelled: bool) -> TextExample:
    text_a = text_field(record, cols.a, where)
    text_b = text_field(record, cols.b, where) if cols.b else None
    label = _label(record.get(cols.label) if cols.label else None, cols.label or "label", where, regression, labelled)
    ident = record.get(cols.id) if cols.id else None
    return TextExample(default_id if ident is None or ident == "" else str(ident), text_a, text_b, label, where)


def text_example_from_record(record: dict, where: str, default_id: str, pair: bool | None,
                             regression: bool) -> TextExample:
    """An unlabelled text example from one JSON object, keyed as a JSON Lines task file is."""
    return _text_example(record, _columns(list(record), pair, "auto", False, where), where, default_id, regression,
                         False)


def read_text_examples(path: PathLike, pair: bool | None, regression: bool, layout: str = "auto",
                       labelled: bool = True, warn: Warn = note) -> list[TextExample]:
    """Sentences or sentence pairs with a class label or a score.  pair=None: whichever the file holds.

    An example's id is its id column (id, idx or index) where there is one, else its line number.  In the
    nli-jsonl layout, pairs whose gold_label is "-" (the annotators did not agree) are dropped from labelled
    files, and read with no label from predict inputs, so that every row still gets a prediction."""
    path = existing(path)
    if layout not in TEXT_LAYOUTS and layout != "auto":
        raise ValueError(f"{path}: layout {layout!r} is not one of a text task; expected auto or one of "
                         f"{', '.join(TEXT_LAYOUTS)}")
    if layout != "auto":
        layout_pair, layout_regression = TEXT_LAYOUTS[layout]
        if (pair is not None and pair != layout_pair) or regression != layout_regression:
            raise ValueError(f"{path}: layout {layout!r} is for {_kind(layout_pair, layout_regression)} tasks, "
                             f"not {_kind(pair, regression)}")
        pair = layout_pair
    if layout == "auto" and path.suffix.lower() == ".txt":
        return _plain_texts(path, pair, labelled)
    fmt = "jsonl" if layout == "nli-jsonl" else "tsv" if layout.startswith("glue-") else table_format(path)
    # GLUE's QQP train file holds rows cut short by a line break inside a question: left out, as GLUE's
    # own reader leaves them, and counted
    ragged: list[int] | None = [] if layout == "glue-qqp" else None

    if fmt == "jsonl":
        by_keys: dict[frozenset, _Columns] = {}

        def columns(record: dict, n: int) -> _Columns:  # every JSON line has its own keys
            keys = frozenset(record)
            if keys not in by_keys:
                by_keys[keys] = _columns(list(record), pair, layout, labelled, f"{path}:{n}")
            return by_keys[keys]

        records: Iterable[tuple[int, dict]] = json_records(path)
    else:
        hline, header, records = read_table(path, fmt == "tsv", ragged)
        if layout == "glue-cola" and not any(h.strip().lower() in ("index", "sentence") for h in header):
            records = keyed_rows(path, True, None, _COLA, table_rows(path, True))  # train/dev: the first row is data
            header = _COLA
        fixed = _columns(header, pair, layout, labelled, f"{path}:{hline}")

        def columns(record: dict, n: int) -> _Columns:
            return fixed

    examples, disputed = [], 0
    for n, record in records:
        cols = columns(record, n)
        if layout == "nli-jsonl" and cols.label and record.get(cols.label) == "-":
            if labelled:
                disputed += 1
                continue
            record = {**record, cols.label: None}
        examples.append(_text_example(record, cols, f"{path}:{n}", str(n), regression, labelled))
    if disputed:
        warn(f"{path}: dropped {disputed} pairs whose gold_label is '-' (no annotator majority)")
    if ragged:
        at = ", ".join(map(str, ragged[:5])) + (", ..." if len(ragged) > 5 else "")
        warn(f"{path}: left out {len(ragged)} rows whose fields are not the header's {len(header)} (lines {at}), "
             "as GLUE's own reader does")
    if not examples:
        raise no_examples(path, "a header line and rows" if fmt != "jsonl" else "one JSON object per line")
    return examples


def _plain_texts(path: Path, pair: bool | None, labelled: bool) -> list[TextExample]:
    """A predict input of one text a line (a .txt file): each non-blank line is an example, its id the
    line number."""
    if labelled:
        raise ValueError(f"{path}: a .txt file holds texts without labels, which only predict reads; training "
                         "and scoring read .tsv, .csv or .jsonl with a label column")
    if pair:
        raise ValueError(f"{path}: this model reads two texts an example, and a .txt file holds one a line; give "
                         ".tsv, .csv or .jsonl with two text columns")
    examples = [TextExample(str(n), line, None, None, f"{path}:{n}") for n, line in lines(path) if line.strip()]
    if not examples:
        raise no_examples(path, "one text per line")
    return examples


def encode_texts(
    tokenizer, examples: list[TextExample], max_length: int, label2id: dict[str, int] | None, regression: bool = False
) -> Encoded:
    """Single texts and pairs, cut "longest_first" to max_length; labels None for unlabelled examples."""
    singles = [i for i, ex in enumerate(examples) if ex.text_b is None]
    pairs = [i for i, ex in enumerate(examples) if ex.text_b is not None]
    check_room(max_length, pairs=bool(pairs))
    rows: list[Any] = [None] * len(examples)
    # One batched call per kind (the tokenizer takes all-single or all-pair batches).
    for indices, is_pair in ((singles, False), (pairs, True)):
        if not indices:
            continue
        a = [examples[i].text_a for i in indices]
        b = [examples[i].text_b for i in indices] if is_pair else None
        enc = tokenizer(a, b, truncation="longest_first", max_length=max_length)
        for i, ids, types in zip(indices, enc["input_ids"], enc["token_type_ids"]):
            rows[i] = (ids, types)

    labelled = [ex.label is not None for ex in examples]
    labels: list | None = None
    if any(labelled):
        if not all(labelled):
            i = labelled.index(False)
            raise ValueError(f"{where_of(examples[i], i)}: no label, but other examples have labels")
        if regression:
            labels = []
            for i, ex in enumerate(examples):
                try:
                    labels.append(float(ex.label))
                except ValueError:
                    raise ValueError(f"{where_of(ex, i)}: regression label {ex.label!r} is not a number") from None
        elif label2id is None:
            raise ValueError(f"{where_of(examples[0], 0)}: examples have labels but no label map was given")
        else:
            labels = [label_id(ex.label, label2id, where_of(ex, i)) for i, ex in enumerate(examples)]
    return Encoded(
        input_ids=[r[0] for r in rows],
        token_type_ids=[r[1] for r in rows],
        example_index=list(range(len(examples))),
        labels=labels,
    )


class TextTask(TaskFamily):
    """One sequence per example; the pooled [CLS] vector is classified, or scored (regression)."""

    heads = {"bert": BertForSequenceClassification, "gpt": OpenAIGPTForSequenceClassification,
             "elmo": ELMoForSequenceClassification}
    layouts = ("auto", *TEXT_LAYOUTS)

    def __init__(self, task_type: str, pair: bool | None, regression: bool = False):
        super().__init__(task_type)
        if regression:
            self.example_file = ("sts.tsv", "sentence1\tsentence2\tlabel\nA man plays a guitar.\tA man plays music.\t4.2\n"
                                 "A dog runs.\tThe stock market fell.\t0.1\n猫在睡觉。\t一只猫在睡。\t4.8\n"
                                 "It rains.\tThe sun is out.\t1.0\n")
        elif pair:
            self.example_file = ("nli.jsonl", "".join(
                f'{{"sentence1": "{a}", "sentence2": "{b}", "label": "{c}"}}\n' for a, b, c in (
                    ("A man plays a guitar.", "A person makes music.", "entailment"),
                    ("A dog runs in a park.", "A cat sleeps indoors.", "contradiction"),
                    ("今天下雨了。", "地面是湿的。", "entailment"),
                    ("She reads a book.", "She is asleep.", "contradiction"))))
        else:
            self.example_file = ("reviews.tsv", "sentence\tlabel\n质量很好，非常满意\tpos\n房间太小了，隔音很差\tneg\n"
                                 "A lovely, warm film.\tpos\nDull and far too long.\tneg\n")
        self.pair, self.regression = pair, regression  # pair None: single sentences or pairs, as the file has
        self.label_set = not regression
        self.metrics = ("pearson", "spearman", "mse") if regression else ("accuracy", "f1", "mcc")
        self.export_sample = "pair" if pair else "text"
        self.about = ("two or one texts -> a number (label); MSE loss, Pearson/Spearman" if regression else
                      "two texts -> a label    sentence1, sentence2, label (also premise/hypothesis, ...)" if pair else
                      "one text -> a label     TSV/CSV with a header (sentence, label) or JSONL")

    def texts(self, example):
        return [t for t in (example.text_a, example.text_b) if t]

    def _read(self, path, layout, labelled, warn):
        return read_text_examples(path, self.pair, self.regression, layout, labelled, warn)

    def from_record(self, record, where, default_id):
        return text_example_from_record(record, where, default_id, self.pair, self.regression)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return encode_texts(tokenizer, examples, ts.max_length, label2id, regression=self.regression)

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

    def configure(self, config, label_map, ts=None, model_dir=None):
        if self.regression:
            config.extra.update(id2label={"0": "score"}, label2id={"score": 0}, problem_type="regression")
            if architecture_of(config).both_orders:  # similarity, as the GPT paper: pairs read in both orders
                config = replace(config, both_orders=True)
            return config
        return super().configure(config, label_map)


register_family(TextTask("classification", pair=False))
register_family(TextTask("pair", pair=True))
register_family(TextTask("regression", pair=None, regression=True))  # one sentence or pairs, as the file holds
