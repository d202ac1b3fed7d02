"""Fine-tuning examples as read from the task files, before tokenization.

One dataclass per task family. `id` is the example's id from the file when it has one, else its
line number (or index) as a string; `where` is "FILE:LINE" (or "FILE: id ...") for error messages.
Labels stay as read (strings, or floats for regression) until a label map (LabelMap, below) turns
them into ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# Task types of `torchbert finetune --task`.
TASK_TYPES = ("classification", "pair", "regression", "token", "qa", "qa-v2", "multiple-choice")


@dataclass
class TextExample:
    """Single sentence (text_b None) or sentence pair; classification or regression."""

    id: str
    text_a: str
    text_b: str | None
    label: str | float | None  # None in unlabelled (predict) inputs
    where: str = ""


@dataclass
class TokenExample:
    """A sentence as words, with one tag per word (CoNLL)."""

    id: str
    words: list[str]
    tags: list[str] | None  # None in unlabelled inputs
    where: str = ""


@dataclass
class Answer:
    text: str
    start: int  # character offset into the context


@dataclass
class QAExample:
    """A SQuAD question on a context; no answers and is_impossible for v2's unanswerable ones."""

    id: str
    question: str
    context: str
    answers: list[Answer] = field(default_factory=list)
    is_impossible: bool = False
    where: str = ""


@dataclass
class ChoiceExample:
    """A context (+ an optional question) and its candidate endings; label is an index into choices."""

    id: str
    context: str
    question: str
    choices: list[str]
    label: int | None
    where: str = ""


# ----------------------------------------------------------------------------------------------
# labels


def _word_where(where: str, i: int) -> str:
    """FILE:LINE of word i of a CoNLL example (see read_conll: word i is on the example's line + i)."""
    file, _, line = where.rpartition(":")
    return f"{file}:{int(line) + i}" if line.isdigit() else where


class LabelMap:
    """The label set of a classification or tagging task: built from the training examples, stored in
    config.json as id2label / label2id."""

    def __init__(self, labels: list[str]):
        if not labels:
            raise ValueError("a label map needs at least one label")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be unique, found {labels}")
        self.labels = list(labels)
        self._ids = {label: i for i, label in enumerate(self.labels)}

    @classmethod
    def from_examples(cls, examples: Iterable[TextExample | TokenExample]) -> LabelMap:
        """The labels (or tags) seen, sorted: numerically when all are integers ("2" before "10"), so the
        ids do not depend on the order of the training file."""
        seen: set[str] = set()
        for ex in examples:
            if isinstance(ex, TokenExample):
                if ex.tags is None:
                    raise ValueError(f"{ex.where}: no tags; a label map is built from labelled examples")
                seen.update(ex.tags)
            elif isinstance(ex, TextExample):
                if not isinstance(ex.label, str):
                    what = "no label" if ex.label is None else f"label {ex.label!r} is a score, not a class"
                    raise ValueError(f"{ex.where}: {what}; a label map is built from labelled classification examples")
                seen.add(ex.label)
            else:
                raise TypeError(f"label maps are for text and token examples, not {type(ex).__name__}")
        if not seen:
            raise ValueError("no examples to build a label map from")
        numeric = all(re.fullmatch(r"-?\d+", label) for label in seen)
        return cls(sorted(seen, key=int) if numeric else sorted(seen))

    @classmethod
    def from_config(cls, id2label: dict) -> LabelMap:
        """From config.json's id2label, whose keys are strings ("0") after a JSON round trip."""
        try:
            by_id = {int(k): v for k, v in id2label.items()}
        except (TypeError, ValueError):
            raise ValueError(f"id2label keys must be integers, found {list(id2label)}") from None
        if sorted(by_id) != list(range(len(by_id))) or not all(isinstance(v, str) for v in by_id.values()):
            raise ValueError(f"id2label must map 0..{len(by_id) - 1} to label strings, found {id2label}")
        return cls([by_id[i] for i in range(len(by_id))])

    def __len__(self) -> int:
        return len(self.labels)

    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.labels))

    def label2id(self) -> dict[str, int]:
        return dict(self._ids)

    def encode(self, label: str, where: str) -> int:
        i = self._ids.get(label)
        if i is None:
            shown = ", ".join(map(repr, self.labels[:10])) + (", ..." if len(self.labels) > 10 else "")
            raise ValueError(f"{where}: label {label!r} is not one of the {len(self.labels)} labels seen in "
                             f"training: {shown}")
        return i

    def check(self, examples: Iterable[TextExample | TokenExample]) -> None:
        """Every label and tag is known, checked before training starts (an error names the line)."""
        for ex in examples:
            if isinstance(ex, TokenExample):
                for i, tag in enumerate(ex.tags or ()):
                    if tag not in self._ids:
                        self.encode(tag, _word_where(ex.where, i))
            elif ex.label is not None:
                self.encode(ex.label, ex.where)
