"""What the examples of every task family share: an `id` (the example's id from the file when it has
one, else its line number or index as a string), a `where` ("FILE:LINE", or "FILE: id ...") for error
messages, and, in families with a label set (classification, tagging), their labels as read (strings)
until a label map (LabelMap) turns them into ids. Each family's example type lives in its module
(text.py, tagging.py, qa.py, choice.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol


class Labelled(Protocol):
    """An example with class labels or tags (text.py TextExample, tagging.py TokenExample)."""

    where: str

    def label_names(self) -> list[str]:
        """Its labels, for a label map; ValueError naming `where` when it has none to give."""

    def label_places(self) -> list[tuple[str, str]]:
        """(label, where) for each label it holds, to check against a label map; [] when unlabelled."""


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
    def from_examples(cls, examples: Iterable[Labelled]) -> LabelMap:
        """The labels (or tags) seen, sorted: numerically when all are integers ("2" before "10"), so the
        ids do not depend on the order of the training file."""
        seen: set[str] = set()
        for ex in examples:
            if not hasattr(ex, "label_names"):
                raise TypeError(f"label maps are for examples with class labels or tags, not {type(ex).__name__}")
            seen.update(ex.label_names())
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

    def check(self, examples: Iterable[Labelled]) -> None:
        """Every label and tag is known, checked before training starts (an error names the line)."""
        for ex in examples:
            for label, where in ex.label_places():
                if label not in self._ids:
                    self.encode(label, where)
