"""Fine-tuning examples -> model input rows: token ids, segment ids and labels, unpadded.

What every family's encoder (in its module: text.py, tagging.py, qa.py, choice.py) returns: an
`Encoded`, one row per model input sequence (an example may give several rows), tokenized in batched
Rust calls; and the checks they share (room for the specials, label ids that name the example).
Rows are plain lists of ints; padding and tensors are the collator's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Encoded:
    """Model inputs, one row per sequence; the optional fields belong to one task family each."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    example_index: list[int]  # the example each row comes from
    # text: class id (int) or float (regression), per row; token: per-token label ids with IGNORE;
    # qa: (start, end) token positions per row; mc: the label index per example.
    labels: list | None = None
    # token classification: per token, the word of its example it predicts, or -1 (special tokens,
    # non-first sub-tokens, and words another window owns).
    word_index: list[list[int]] | None = None
    # extractive QA: per token, its (start, end) character span in the original context; None for
    # [CLS], the question, and the [SEP]s.
    offsets: list[list[tuple[int, int] | None]] | None = None
    # multiple choice: choices per example; the rows of example e are consecutive.
    num_choices: list[int] | None = None


def where_of(example: Any, index: int) -> str:
    return example.where or f"example {index} (id {example.id!r})"


def label_id(label: Any, label2id: dict[str, int], where: str) -> int:
    if label not in label2id:
        known = ", ".join(map(repr, list(label2id)[:20]))
        raise ValueError(f"{where}: unknown label {label!r} (known labels: {known})")
    return label2id[label]


def cut_note(max_length: int, longest: int, train: Encoded, dev: Encoded | None = None) -> str:
    """What --max-length cuts off in a family that cuts a long text rather than windowing it: how many
    training (and dev) rows reach it, where a longer text lost its end; "" when none does. `longest`:
    the model's own limit (its max_position_embeddings)."""
    counts = [(name, sum(len(ids) >= max_length for ids in e.input_ids), len(e.input_ids))
              for name, e in (("training", train), ("dev", dev)) if e is not None and e.input_ids]
    if not any(full for _, full, _ in counts):
        return ""
    parts = [f"{full:,} of {n:,} {name} sequences ({full / n:.0%})" for name, full, n in counts]
    return (f"--max-length {max_length} cuts what lies beyond it: {' and '.join(parts)} reach it"
            + (f" (up to {longest} keeps more of each text, at more cost per step)" if max_length < longest else ""))


# ----------------------------------------------------------------------------------------------
# sequence classification and regression


def check_room(max_length: int, pairs: bool) -> None:
    """Room for at least one token of each text beside [CLS] and [SEP]: below it a model would learn
    from the special tokens alone."""
    need = 5 if pairs else 3
    if max_length < need:
        raise ValueError(f"--max-length {max_length} leaves no room for the text: "
                         + ("[CLS] A [SEP] B [SEP] needs at least 5" if pairs else "[CLS] text [SEP] needs at least 3"))


# ----------------------------------------------------------------------------------------------
# token classification


# ----------------------------------------------------------------------------------------------
# extractive question answering


# ----------------------------------------------------------------------------------------------
# multiple choice


