"""What reading any task file shares: rows of TSV/CSV tables and JSON Lines records with their line
numbers, keys found by name, the benchmark presets (GLUE, SNLI, SQuAD, CoNLL-2003, SWAG); each family's
readers, in its module (text.py, tagging.py, qa.py, choice.py), are built on them.

A fine-tuning run can fail hours in on one bad row, so every row is checked here, up front, and every
problem is a ValueError that starts with "FILE:LINE: " (or "FILE: " where no line applies) and says what
was found and what was expected.  Bytes are decoded one line at a time, so even a bad byte names its line.

Formats, by task family: text.py (TSV/CSV/JSON Lines, GLUE, SNLI), tagging.py (CoNLL), qa.py (SQuAD),
choice.py (SWAG).
"""

# ruff: noqa: TRY004  (a wrong type of value in a file is bad input, a ValueError like every other)

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..io.texts import MISSING, lines, not_a_file, shown

Warn = Callable[[str], object]


def note(message: str) -> None:
    """The default `warn`: a note on standard error, so that standard output holds only results."""
    print(f"note: {message}", file=sys.stderr)


PathLike = str | os.PathLike


@dataclass(frozen=True)
class TaskPreset:
    """A named benchmark: its task type, the metric that picks the best epoch, and the layout of its files."""

    name: str
    type: str  # a registered task type (families.py)
    metric: str  # accuracy | f1 | mcc | pearson | exact_match; f1 is binary F1, span F1 or SQuAD F1 by type
    layout: str  # one of the layouts the type's family reads


# Metrics as each benchmark reports them (GLUE: Wang et al. 2018, table 1; F1 where GLUE gives accuracy and F1);
# SQuAD selects by its token F1, CoNLL-2003 by entity F1.
TASK_PRESETS: dict[str, TaskPreset] = {p.name: p for p in (
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


ID_KEYS = ("id", "idx", "index")


# ----------------------------------------------------------------------------------------------
# lines, rows and records


def existing(path: PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, "file")
    return path


def table_rows(path: Path, tsv: bool) -> Iterator[tuple[int, list[str]]]:
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


def read_table(path: Path, tsv: bool,
               ragged: list[int] | None = None) -> tuple[int, list[str], Iterator[tuple[int, dict]]]:
    """A table with a header: (header line, header, rows as {column: field}), each row checked for its
    length (`ragged` given: the lines of rows of another length go there, and the rows are left out)."""
    rows = table_rows(path, tsv)
    first = next(rows, None)
    if first is None:
        raise ValueError(f"{path}: empty file; expected a header line and examples")
    hline, header = first
    return hline, header, keyed_rows(path, tsv, hline, header, rows, ragged)


def keyed_rows(path: Path, tsv: bool, hline: int | None, header: list[str],
               rows: Iterable[tuple[int, list[str]]], ragged: list[int] | None = None) -> Iterator[tuple[int, dict]]:
    sep = "tab" if tsv else "comma"
    for n, row in rows:
        if len(row) != len(header) and ragged is not None:
            ragged.append(n)
            continue
        if len(row) != len(header):
            like = f"the header on line {hline}" if hline else f"{len(header)} columns ({', '.join(header)})"
            raise ValueError(f"{path}:{n}: {len(row)} {sep}-separated fields; expected {len(header)} like {like}")
        yield n, dict(zip(header, row))


def table_format(path: Path) -> str:
    """tsv, csv or jsonl, by the file's extension."""
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".csv"):
        return suffix[1:]
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    raise ValueError(f"{path}: cannot tell the format from the extension {suffix!r}; "
                     "expected .tsv, .csv, .jsonl or .json")


def find_key(keys: Iterable[str], name: str) -> str | None:
    """The key spelled `name` ignoring case and surrounding spaces, as the file spells it."""
    return next((k for k in keys if k.strip().lower() == name.lower()), None)


def no_examples(path: Path, what: str) -> ValueError:
    return ValueError(f"{path}: no examples in the file; expected {what}")


def text_field(record: dict, key: str, where: str) -> str:
    value = record.get(key, MISSING)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} {shown(value)}; expected a string")
    return value

