"""Fine-tuning examples as read from the task files, before tokenization.

One dataclass per task family. `id` is the example's id from the file when it has one, else its
line number (or index) as a string; `where` is "FILE:LINE" (or "FILE: id ...") for error messages.
Labels stay as read (strings, or floats for regression) until a label map turns them into ids.
"""

from __future__ import annotations

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
