"""Reading fine-tuning task files into examples (examples.py), checking them as they are read.

A fine-tuning run can fail hours in on one bad row, so every row is checked here, up front, and every
problem is a ValueError that starts with "FILE:LINE: " (or "FILE: " where no line applies) and says what
was found and what was expected.  Bytes are decoded one line at a time, so even a bad byte names its line.

Formats, by task type:
- text tasks (classification, pair, regression): TSV / CSV with a header or JSON Lines, columns found by
  name (layout `auto`); the official GLUE TSVs (`glue-*`); SNLI / MultiNLI JSON Lines (`nli-jsonl`);
- token: CoNLL, a token and its tag per line (`read_conll`);
- qa, qa-v2: SQuAD v1.1 / v2.0 JSON (`read_squad`);
- multiple-choice: SWAG CSV or JSON Lines (`read_choices`).
`LabelMap` turns the string labels of classification and tagging into ids, and back.
"""

# ruff: noqa: TRY004  (a wrong type of value in a file is bad input, a ValueError like every other)

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..io.texts import json_loads, lines, not_a_file, read_utf8
from .examples import TASK_TYPES, Answer, ChoiceExample, QAExample, TextExample, TokenExample

Warn = Callable[[str], object]


def note(message: str) -> None:
    """The default `warn`: a note on standard error, so that standard output holds only results."""
    print(f"note: {message}", file=sys.stderr)


PathLike = str | os.PathLike


@dataclass(frozen=True)
class TaskPreset:
    """A named benchmark: its task type, the metric that picks the best epoch, and the layout of its files."""

    name: str
    type: str  # one of TASK_TYPES
    metric: str  # accuracy | f1 | mcc | pearson | exact_match; f1 is binary F1, span F1 or SQuAD F1 by type
    layout: str  # one of LAYOUTS


# Metrics as each benchmark reports them (GLUE: Wang et al. 2018, table 1; F1 where GLUE gives accuracy and F1);
# SQuAD selects by its token F1, CoNLL-2003 by entity F1.
PRESETS: dict[str, TaskPreset] = {p.name: p for p in (
    TaskPreset("cola", "classification", "mcc", "glue-cola"),
    TaskPreset("sst2", "classification", "accuracy", "glue-sst2"),
    TaskPreset("mrpc", "pair", "f1", "glue-mrpc"),
    TaskPreset("stsb", "regression", "pearson", "glue-stsb"),
    TaskPreset("qqp", "pair", "f1", "glue-qqp"),
    TaskPreset("mnli", "pair", "accuracy", "glue-mnli"),
    TaskPreset("qnli", "pair", "accuracy", "glue-qnli"),
    TaskPreset("rte", "pair", "accuracy", "glue-rte"),
    TaskPreset("wnli", "pair", "accuracy", "glue-wnli"),
    TaskPreset("snli", "pair", "accuracy", "nli-jsonl"),
    TaskPreset("squad", "qa", "f1", "squad"),
    TaskPreset("squad_v2", "qa-v2", "f1", "squad"),
    TaskPreset("conll2003", "token", "f1", "conll"),
    TaskPreset("swag", "multiple-choice", "accuracy", "swag"),
)}

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
LAYOUTS = ("auto", *TEXT_LAYOUTS, "squad", "conll", "swag")

# Layout `auto`: column names (or JSON keys) accepted for each field, in order of preference.
_SINGLE = ("sentence", "text")
_PAIRS = (("sentence1", "sentence2"), ("text_a", "text_b"), ("premise", "hypothesis"), ("question", "sentence"))
_LABELS = ("label", "gold_label")
_IDS = ("id", "idx", "index")


def resolve_task(name: str) -> tuple[str, TaskPreset | None]:
    """A task type as is, or a preset name as its type and preset: `--task` accepts either."""
    if name in TASK_TYPES:
        return name, None
    preset = PRESETS.get(name.lower())
    if preset is None:
        raise ValueError(f"unknown task {name!r}: expected a task type ({', '.join(TASK_TYPES)}) "
                         f"or a preset ({', '.join(PRESETS)})")
    return preset.type, preset


# ----------------------------------------------------------------------------------------------
# lines, rows and records


def _existing(path: PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, "file")
    return path


def _rows(path: Path, tsv: bool) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of each non-blank row.  TSV fields are never quoted: GLUE's TSVs hold stray
    quotes (MNLI, QQP) that a quoting reader would run across lines.  CSV follows RFC 4180 quoting."""
    texts = (text for _, text in lines(path, keepends=True))
    if tsv:
        reader = csv.reader(texts, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(texts, strict=True)
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise ValueError(f"{path}:{reader.line_num}: not a valid {'TSV' if tsv else 'CSV'} row ({e})") from None
        if any(field.strip() for field in row):
            yield start, row


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line, object) of each non-blank line of a JSON Lines file."""
    for n, line in lines(path):
        if not line.strip():
            continue
        try:
            record = json_loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno}); "
                             "expected one JSON object per line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object, found {type(record).__name__}")
        yield n, record


def _table(path: Path, tsv: bool) -> tuple[int, list[str], Iterator[tuple[int, dict]]]:
    """A table with a header: (header line, header, rows as {column: field}), each row checked for its length."""
    rows = _rows(path, tsv)
    first = next(rows, None)
    if first is None:
        raise ValueError(f"{path}: empty file; expected a header line and examples")
    hline, header = first
    return hline, header, _keyed(path, tsv, hline, header, rows)


def _keyed(path: Path, tsv: bool, hline: int | None, header: list[str],
           rows: Iterable[tuple[int, list[str]]]) -> Iterator[tuple[int, dict]]:
    sep = "tab" if tsv else "comma"
    for n, row in rows:
        if len(row) != len(header):
            like = f"the header on line {hline}" if hline else f"{len(header)} columns ({', '.join(header)})"
            raise ValueError(f"{path}:{n}: {len(row)} {sep}-separated fields; expected {len(header)} like {like}")
        yield n, dict(zip(header, row))


def _format(path: Path) -> str:
    """tsv, csv or jsonl, by the file's extension."""
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".csv"):
        return suffix[1:]
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    raise ValueError(f"{path}: cannot tell the format from the extension {suffix!r}; "
                     "expected .tsv, .csv, .jsonl or .json")


def _find(keys: Iterable[str], name: str) -> str | None:
    """The key spelled `name` ignoring case and surrounding spaces, as the file spells it."""
    return next((k for k in keys if k.strip().lower() == name.lower()), None)


def _no_examples(path: Path, what: str) -> ValueError:
    return ValueError(f"{path}: no examples in the file; expected {what}")


# ----------------------------------------------------------------------------------------------
# text tasks: classification, pair, regression


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
        a, b, label, ident = (_find(keys, n) if n else None for n in names)
        for name, key in ((names[0], a), (names[1], b), (names[2], label)):
            if name and key is None and (name != names[2] or labelled):
                raise ValueError(f"{where}: no {name!r} column, which a {layout} file has; {found}")
        return _Columns(a, b, label, ident)
    pairs = [(a, b) for a, b in ((_find(keys, x), _find(keys, y)) for x, y in _PAIRS) if a and b]
    single = next((k for k in (_find(keys, n) for n in _SINGLE) if k), None)
    if pair or (pair is None and pairs):
        if not pairs:
            raise ValueError(f"{where}: sentence2 is missing: a pair task needs two text columns, sentence1 + "
                             f"sentence2 (or text_a + text_b, premise + hypothesis, question + sentence); {found}")
        a, b = pairs[0]
    else:
        if single is None:
            hint = f"; for sentence pairs ({pairs[0][0]}, {pairs[0][1]}) use the pair task" if pairs else ""
            raise ValueError(f"{where}: no sentence column: a single-sentence task needs a sentence (or text) "
                             f"column; {found}{hint}")
        a, b = single, None
    label = next((k for k in (_find(keys, n) for n in _LABELS) if k), None)
    if label is None and labelled:
        raise ValueError(f"{where}: no label column; expected label (or gold_label); {found}")
    return _Columns(a, b, label, next((k for k in (_find(keys, n) for n in _IDS) if k), None))


def _text(record: dict, key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} is {json.dumps(value)[:40]}; expected a string")
    return value


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
    text_a = _text(record, cols.a, where)
    text_b = _text(record, cols.b, where) if cols.b else None
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
    path = _existing(path)
    if layout not in TEXT_LAYOUTS and layout != "auto":
        raise ValueError(f"{path}: layout {layout!r} is not one of a text task; expected auto or one of "
                         f"{', '.join(TEXT_LAYOUTS)}")
    if layout != "auto":
        layout_pair, layout_regression = TEXT_LAYOUTS[layout]
        if (pair is not None and pair != layout_pair) or regression != layout_regression:
            raise ValueError(f"{path}: layout {layout!r} is for {_kind(layout_pair, layout_regression)} tasks, "
                             f"not {_kind(pair, regression)}")
        pair = layout_pair
    fmt = "jsonl" if layout == "nli-jsonl" else "tsv" if layout.startswith("glue-") else _format(path)

    if fmt == "jsonl":
        by_keys: dict[frozenset, _Columns] = {}

        def columns(record: dict, n: int) -> _Columns:  # every JSON line has its own keys
            keys = frozenset(record)
            if keys not in by_keys:
                by_keys[keys] = _columns(list(record), pair, layout, labelled, f"{path}:{n}")
            return by_keys[keys]

        records: Iterable[tuple[int, dict]] = _records(path)
    else:
        hline, header, records = _table(path, fmt == "tsv")
        if layout == "glue-cola" and not any(h.strip().lower() in ("index", "sentence") for h in header):
            records = _keyed(path, True, None, _COLA, _rows(path, True))  # train/dev: the first row is data
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
    if not examples:
        raise _no_examples(path, "a header line and rows" if fmt != "jsonl" else "one JSON object per line")
    return examples


# ----------------------------------------------------------------------------------------------
# token tagging: CoNLL


def read_conll(path: PathLike, labelled: bool = True) -> list[TokenExample]:
    """Sentences of a CoNLL file: a token per line, token first and its tag in the last column (tab or
    space separated, any columns between are ignored), a blank line between sentences.

    A line of only whitespace ends a sentence too (the WNUT-16 files hold a lone tab); -DOCSTART- lines
    are skipped.  An example's id and `where` are the line of its first token; token i is on that line + i.
    With labelled=False a file may hold bare tokens (tags None); then every line must be bare."""
    path = _existing(path)
    examples: list[TokenExample] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    tagged: bool | None = True if labelled else None  # unlabelled: the first token line decides
    decided_at = 0

    def end_sentence() -> None:
        if words:
            examples.append(TokenExample(str(start), words.copy(), tags.copy() if tagged else None,
                                         f"{path}:{start}"))
            words.clear()
            tags.clear()

    for n, line in lines(path):
        if not line.strip() or line.startswith("-DOCSTART-"):
            end_sentence()
            continue
        fields = [f.strip() for f in (line.split("\t") if "\t" in line else line.split(" ")) if f.strip()]
        if len(fields) == 1 and labelled:
            raise ValueError(f"{path}:{n}: one column {fields[0]!r}; expected TOKEN ... TAG (the token first, "
                             "its tag in the last column, separated by tabs or spaces)")
        if tagged is None:
            tagged, decided_at = len(fields) > 1, n
        elif tagged != (len(fields) > 1) and not labelled:
            raise ValueError(f"{path}:{n}: {len(fields)} columns, but line {decided_at} has "
                             f"{'a tag' if tagged else 'no tag'}; expected every line TOKEN ... TAG or every "
                             "line a bare TOKEN")
        if not words:
            start = n
        words.append(fields[0])
        tags.append(fields[-1])
    end_sentence()
    if not examples:
        raise _no_examples(path, "CoNLL lines TOKEN ... TAG with a blank line between sentences")
    return examples


# ----------------------------------------------------------------------------------------------
# extractive QA: SQuAD JSON

_SHOWN_ANSWERS = 10  # answers not at their answer_start warned one by one; the rest are only counted


def read_squad(path: PathLike, v2: bool, labelled: bool = True, warn: Warn = note) -> list[QAExample]:
    """The questions of a SQuAD v1.1 (v2=False) or v2.0 JSON file, one example per question.

    An answer whose text is not at its answer_start in the context would train the model on the wrong
    span: it is dropped with a warning, and a labelled question left with no answer is skipped (counted),
    so it does not turn into an unanswerable one.  With labelled=False questions may have no answers."""
    path = _existing(path)
    text = read_utf8(path, expected="a UTF-8 JSON file")
    layout = 'expected a SQuAD file {"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}'
    try:
        doc = json_loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); {layout}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError(f"{path}: not a SQuAD file: no top-level \"data\" list; {layout}")

    examples: list[QAExample] = []
    seen: dict[str, str] = {}  # question id -> where it first was
    misplaced = skipped = 0
    for i, article in enumerate(doc["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise ValueError(f"{path}: data[{i}]: expected an object with a \"paragraphs\" list; {layout}")
        for j, para in enumerate(article["paragraphs"]):
            at = f"data[{i}].paragraphs[{j}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) \
                    or not isinstance(para.get("qas"), list):
                raise ValueError(f"{path}: {at}: expected an object with a \"context\" string and a \"qas\" list")
            context = para["context"]
            for k, qa in enumerate(para["qas"]):
                if not isinstance(qa, dict) or isinstance(qa.get("id"), bool) \
                        or not isinstance(qa.get("id"), (str, int)):
                    raise ValueError(f"{path}: {at}.qas[{k}]: expected a question object with an \"id\"")
                qid = str(qa["id"])
                where = f"{path}: question {qid}"
                if qid in seen:
                    raise ValueError(f"{where}: duplicate question id (first in {seen[qid]}); ids must be unique")
                seen[qid] = at
                question = qa.get("question")
                if not isinstance(question, str):
                    raise ValueError(f"{where}: \"question\" is {json.dumps(question)[:40]}; expected a string")
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise ValueError(f"{where}: is_impossible is {impossible!r}; expected true or false")
                if impossible and not v2:
                    raise ValueError(f"{where}: is_impossible is true, which only SQuAD v2.0 files have; "
                                     "use the qa-v2 task for this file")
                given = qa.get("answers", [])
                if not isinstance(given, list):
                    raise ValueError(f"{where}: \"answers\" is {type(given).__name__}; expected a list")
                if impossible and given:
                    raise ValueError(f"{where}: is_impossible is true but the question has {len(given)} answers; "
                                     "expected an empty answers list")
                answers = []
                for a in given:
                    ok = isinstance(a, dict) and isinstance(a.get("text"), str) \
                        and isinstance(a.get("answer_start"), int) and not isinstance(a["answer_start"], bool)
                    if not ok:
                        raise ValueError(f"{where}: answer {json.dumps(a)[:60]}; expected "
                                         '{"text": string, "answer_start": integer}')
                    answer, begin = a["text"], a["answer_start"]
                    if answer and 0 <= begin and context[begin:begin + len(answer)] == answer:
                        answers.append(Answer(answer, begin))
                        continue
                    misplaced += 1
                    if misplaced <= _SHOWN_ANSWERS and not answer.strip():
                        warn(f"{where}: an answer's text is empty; an answer is a span of the context (SQuAD "
                             "v2.0 marks a question without one is_impossible: true); the answer is dropped")
                    elif misplaced <= _SHOWN_ANSWERS:
                        found = context[max(begin, 0):max(begin, 0) + len(answer)]
                        warn(f"{where}: answer {answer!r} is not at answer_start {begin} of the context "
                             f"(which has {found!r} there); the answer is dropped")
                if not impossible and not answers:
                    if given and labelled:
                        skipped += 1
                        continue
                    if labelled:
                        raise ValueError(f"{where}: no answers; a labelled SQuAD "
                                         + ("v2.0 question has answers or is_impossible: true" if v2
                                            else "v1.1 question has at least one answer"))
                examples.append(QAExample(qid, question, context, answers, impossible, where))
    if misplaced:
        more = f" (the first {_SHOWN_ANSWERS} shown)" if misplaced > _SHOWN_ANSWERS else ""
        warn(f"{path}: dropped {misplaced} answers not found at their answer_start{more}; skipped {skipped} "
             "questions left with no answer")
    if not examples:
        raise _no_examples(path, "questions in data[].paragraphs[].qas[]")
    return examples


# ----------------------------------------------------------------------------------------------
# multiple choice: SWAG CSV or JSON Lines

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
    choices = record.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"{where}: \"choices\" is {json.dumps(choices)[:60]}; expected a list of strings")
    if len(choices) < 2:
        raise ValueError(f"{where}: {len(choices)} choices; a multiple-choice example needs at least 2")
    context = _text(record, "context", where)
    question = _text(record, "question", where) if "question" in record else ""
    ident = record.get("id")
    return ChoiceExample(default_id if ident is None or ident == "" else str(ident), context, question, choices,
                         _choice_label(record.get("label"), len(choices), where, labelled), where)


def read_choices(path: PathLike, labelled: bool = True) -> list[ChoiceExample]:
    """Multiple-choice examples from a SWAG CSV (.csv) or JSON Lines (.jsonl / .json).

    SWAG: columns sent1 + sent2 (context, question) or startphrase (context; no question), ending0..endingK
    (the choices, in order) and label.  JSON Lines: {"id", "context", "question", "choices": [...], "label"},
    where rows may have different numbers of choices.  label is the index of the right choice."""
    path = _existing(path)
    suffix = path.suffix.lower()
    examples: list[ChoiceExample] = []
    if suffix == ".csv":
        hline, header, rows = _table(path, tsv=False)
        found = f"found {', '.join(header)}"
        endings = sorted((int(m.group(1)), h) for h in header if (m := _ENDING.fullmatch(h.strip())))
        if [i for i, _ in endings] != list(range(len(endings))):
            raise ValueError(f"{path}:{hline}: ending columns must be ending0, ending1, ... without gaps; {found}")
        if len(endings) < 2:
            raise ValueError(f"{path}:{hline}: {len(endings)} ending columns; a multiple-choice task needs at "
                             f"least 2 (ending0, ending1, ...); {found}")
        sent1, sent2, phrase = (_find(header, n) for n in ("sent1", "sent2", "startphrase"))
        if not (sent1 and sent2) and not phrase:
            raise ValueError(f"{path}:{hline}: no context columns; expected sent1 + sent2 or startphrase; {found}")
        label = _find(header, "label")
        if label is None and labelled:
            raise ValueError(f"{path}:{hline}: no label column; {found}")
        ident = next((k for k in (_find(header, n) for n in _IDS) if k), None)
        for n, row in rows:
            where = f"{path}:{n}"
            context, question = (row[sent1], row[sent2]) if sent1 and sent2 else (row[phrase], "")
            choices = [row[h] for _, h in endings]
            examples.append(ChoiceExample(row[ident] if ident and row[ident] else str(n), context, question, choices,
                                          _choice_label(row.get(label) if label else None, len(choices), where,
                                                        labelled), where))
    elif suffix in (".jsonl", ".json"):
        for n, record in _records(path):
            examples.append(choice_example_from_record(record, f"{path}:{n}", str(n), labelled))
    else:
        raise ValueError(f"{path}: cannot tell the format from the extension {suffix!r}; expected .csv (SWAG) "
                         "or .jsonl / .json")
    if not examples:
        raise _no_examples(path, "a header line and rows" if suffix == ".csv" else "one JSON object per line")
    return examples
