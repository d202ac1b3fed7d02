"""The multiple-choice family (SWAG): one sequence per choice, a score each, softmax over an
example's choices (the BERT paper's section 4.4). The unit of batching and of the loss is the example.

Files: SWAG CSV (sent1, sent2, ending0..N) or JSON Lines {id, context, question, choices, label}.
Model rows: one `(context, question + choice)` pair per choice. Score: accuracy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import torch

from ..baselines.gpt import OpenAIGPTForMultipleChoice
from ..eval import metrics
from ..heads import BertForMultipleChoice
from ..io.texts import json_records
from .encode import Encoded, check_room, where_of
from .families import GroupedTask, register_family
from .formats import ID_KEYS, MISSING, PathLike, existing, find_key, no_examples, read_table, shown, text_field


@dataclass
class ChoiceExample:
    """A context (+ an optional question) and its candidate endings; label is an index into choices."""

    id: str
    context: str
    question: str
    choices: list[str]
    label: int | None
    where: str = ""


_ENDING = re.compile(r"ending(\d+)", re.IGNORECASE)


def _choice_label(value: object, n_choices: int, where: str, labelled: bool) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if labelled:
            raise ValueError(f"{where}: no label; expected the index of the right choice, 0 to {n_choices - 1}")
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: label {value!r} is not a choice index; expected an integer 0 to {n_choices - 1}")
    if not 0 <= value < n_choices:
        raise ValueError(f"{where}: label {value} is out of range; expected 0 to {n_choices - 1} "
                         f"for {n_choices} choices")
    return value


def choice_example_from_record(record: dict, where: str, default_id: str, labelled: bool = False) -> ChoiceExample:
    """A multiple-choice example from one JSON object: {"id", "context", "question", "choices", "label"}."""
    choices = record.get("choices", MISSING)
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"{where}: \"choices\" {shown(choices, 60)}; expected a list of strings")
    if len(choices) < 2:
        raise ValueError(f"{where}: {len(choices)} choices; a multiple-choice example needs at least 2")
    context = text_field(record, "context", where)
    question = text_field(record, "question", where) if "question" in record else ""
    ident = record.get("id")
    return ChoiceExample(default_id if ident is None or ident == "" else str(ident), context, question, choices,
                         _choice_label(record.get("label"), len(choices), where, labelled), where)


def read_choices(path: PathLike, labelled: bool = True) -> list[ChoiceExample]:
    """Multiple-choice examples from a SWAG CSV (.csv) or JSON Lines (.jsonl / .json).

    SWAG: columns sent1 + sent2 (context, question) or startphrase (context; no question), ending0..endingK
    (the choices, in order) and label.  JSON Lines: {"id", "context", "question", "choices": [...], "label"},
    where rows may have different numbers of choices.  label is the index of the right choice."""
    path = existing(path)
    suffix = path.suffix.lower()
    examples: list[ChoiceExample] = []
    if suffix == ".csv":
        hline, header, rows = read_table(path, tsv=False)
        found = f"found {', '.join(header)}"
        endings = sorted((int(m.group(1)), h) for h in header if (m := _ENDING.fullmatch(h.strip())))
        if [i for i, _ in endings] != list(range(len(endings))):
            raise ValueError(f"{path}:{hline}: ending columns must be ending0, ending1, ... without gaps; {found}")
        if len(endings) < 2:
            raise ValueError(f"{path}:{hline}: {len(endings)} ending columns; a multiple-choice task needs at "
                             f"least 2 (ending0, ending1, ...); {found}")
        sent1, sent2, phrase = (find_key(header, n) for n in ("sent1", "sent2", "startphrase"))
        if not (sent1 and sent2) and not phrase:
            raise ValueError(f"{path}:{hline}: no context columns; expected sent1 + sent2 or startphrase; {found}")
        label = find_key(header, "label")
        if label is None and labelled:
            raise ValueError(f"{path}:{hline}: no label column; {found}")
        ident = next((k for k in (find_key(header, n) for n in ID_KEYS) if k), None)
        for n, row in rows:
            where = f"{path}:{n}"
            context, question = (row[sent1], row[sent2]) if sent1 and sent2 else (row[phrase], "")
            choices = [row[h] for _, h in endings]
            examples.append(ChoiceExample(row[ident] if ident and row[ident] else str(n), context, question, choices,
                                          _choice_label(row.get(label) if label else None, len(choices), where,
                                                        labelled), where))
    elif suffix in (".jsonl", ".json"):
        for n, record in json_records(path):
            examples.append(choice_example_from_record(record, f"{path}:{n}", str(n), labelled))
    else:
        raise ValueError(f"{path}: cannot tell the format from the extension {suffix!r}; expected .csv (SWAG) "
                         "or .jsonl / .json")
    if not examples:
        raise no_examples(path, "a header line and rows" if suffix == ".csv" else "one JSON object per line")
    return examples


def encode_choices(tokenizer, examples: list[ChoiceExample], max_length: int) -> Encoded:
    """One `(context, question + " " + choice)` pair per choice, cut "longest_first"; rows grouped by example."""
    check_room(max_length, pairs=True)
    firsts, seconds, example_index, num_choices = [], [], [], []
    for e, ex in enumerate(examples):
        if not ex.choices:
            raise ValueError(f"{where_of(ex, e)}: no choices")
        for k, choice in enumerate(ex.choices):
            if not choice.strip():
                raise ValueError(f"{where_of(ex, e)}: choice {k} is empty; every choice needs its text (a row with "
                                 "an empty ending would train the model on the context alone)")
            firsts.append(ex.context)
            seconds.append(f"{ex.question} {choice}" if ex.question else choice)
            example_index.append(e)
        num_choices.append(len(ex.choices))

    labelled = [ex.label is not None for ex in examples]
    labels: list | None = None
    if any(labelled):
        labels = []
        for e, ex in enumerate(examples):
            if ex.label is None:
                raise ValueError(f"{where_of(ex, e)}: no label, but other examples have labels")
            if not 0 <= ex.label < len(ex.choices):
                raise ValueError(f"{where_of(ex, e)}: label {ex.label} is not a choice index (0..{len(ex.choices) - 1})")
            labels.append(ex.label)

    enc = tokenizer(firsts, seconds, truncation="longest_first", max_length=max_length) if firsts else None
    return Encoded(
        input_ids=enc["input_ids"] if enc else [],
        token_type_ids=enc["token_type_ids"] if enc else [],
        example_index=example_index,
        labels=labels,
        num_choices=num_choices,
    )


class ChoiceTask(GroupedTask):
    """One sequence per choice, a score each, softmax over an example's choices (SWAG). The unit of
    batching and of the loss is the example."""

    heads = {"bert": BertForMultipleChoice, "gpt": OpenAIGPTForMultipleChoice}
    about = "pick one of N endings   SWAG CSV, or JSONL {id, context, question, choices, label}"
    export_sample = "choices"
    soft_targets = 'choices'
    example_file = ("swag.jsonl", "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in (
        {"id": "a", "context": "She opened the umbrella", "question": "because", "label": 0,
         "choices": ["it started to rain.", "the oven was hot.", "he sang a song."]},
        {"id": "b", "context": "He was hungry,", "question": "so he", "label": 1,
         "choices": ["went to sleep.", "made a sandwich.", "painted the wall."]},
        {"id": "c", "context": "天黑了，", "question": "她", "label": 2,
         "choices": ["吃了早饭。", "去上学。", "打开了灯。"]})))
    file_format = "swag"
    layouts = ("auto", "swag")
    metrics = ("accuracy",)

    def texts(self, example):
        return [t for t in (example.context, example.question, *example.choices) if t]

    def _read(self, path, layout, labelled, warn):
        return read_choices(path, labelled)

    def from_record(self, record, where, default_id):
        return choice_example_from_record(record, where, default_id)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return encode_choices(tokenizer, examples, ts.max_length)

    def batch_targets(self, encoded, rows, units):
        return {"labels": torch.tensor([encoded.labels[u] for u in units], dtype=torch.long)}

    def row_scores(self, logits):
        return logits.softmax(-1)  # over an example's choices

    def records(self, examples, encoded, outputs, ts, id2label):
        records = []
        for ex, probs in zip(examples, outputs):
            k = int(np.argmax(probs))
            records.append({"id": ex.id, "choice": k, "text": ex.choices[k], "probability": round(probs[k], 6),
                            "probabilities": [round(p, 6) for p in probs]})
        return records

    def score(self, records, examples, label_map):
        return {"accuracy": metrics.accuracy([r["choice"] for r in records], [x.label for x in examples])}


register_family(ChoiceTask("multiple-choice"))
