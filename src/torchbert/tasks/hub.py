"""Task data from the Hugging Face hub, through the `datasets` library: `hf:NAME[:CONFIG]:SPLIT`.

    torchbert finetune --task sst2 --model minilm --train hf:nyu-mll/glue:sst2:train \
        --dev hf:nyu-mll/glue:sst2:validation --out runs/sst2
    torchbert finetune --task token --model minilm --train hf:conll2003:train ...

Optional: it needs `pip install datasets` and a network (or the datasets cache). A split is written
once, as a file in the layout its task type reads (JSON Lines, CoNLL, SQuAD JSON), and then read
like any local file, so every check of the local readers applies. Integer class labels become their
names (a ClassLabel's names); rows labelled -1 (GLUE's hidden test labels) are written unlabelled.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

PREFIX = "hf:"

# column pairs for sentence(-pair) tasks, the first that a dataset has wins
TEXT_COLUMNS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2"),
                ("question", "sentence"), ("sentence", None), ("text", None))
WORD_COLUMNS = ("tokens", "words")
TAG_COLUMNS = ("ner_tags", "tags", "labels", "pos_tags")


def is_hub(spec: str | Path) -> bool:
    return str(spec).startswith(PREFIX)


def parse(spec: str) -> tuple[str, str | None, str]:
    """'hf:NAME[:CONFIG]:SPLIT' -> (name, config or None, split)."""
    parts = spec[len(PREFIX):].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"{spec}: expected hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT "
                         "(e.g. hf:nyu-mll/glue:sst2:train)")
    return parts[0], parts[1] if len(parts) == 3 else None, parts[-1]


def export(spec: str, file_format: str, folder: Path) -> Path:
    """Load a hub split with `datasets` and write it into `folder` as a task file of `file_format`
    (one of FORMATS); returns its path."""
    name, config, split = parse(spec)
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{spec}: reading hub datasets needs the datasets library: pip install datasets") from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # network, unknown name, unknown split: many types, one message
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{spec}: could not load it with datasets ({type(e).__name__}: {first})") from None
    names = {col: _class_names(feature) for col, feature in ds.features.items()}
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec[len(PREFIX):])
    return write_rows(ds, {k: v for k, v in names.items() if v}, file_format,
                      folder / (stem + FORMATS[file_format][1]), source=spec)


def _class_names(feature: Any) -> list[str] | None:
    """The names of a ClassLabel, or of the ClassLabel inside a Sequence (tags per token)."""
    inner = getattr(feature, "feature", feature)
    return list(inner.names) if hasattr(inner, "names") else None


def write_rows(rows: Iterable[dict], label_names: dict[str, Sequence[str]], file_format: str, path: Path,
               source: str = "") -> Path:
    """Rows as `datasets` yields them -> a task file of `file_format` (FORMATS). label_names maps a
    column of integer class ids to the names of the ids."""
    if file_format not in FORMATS:
        raise ValueError(f"unknown task file format {file_format!r}; expected one of {', '.join(FORMATS)}")
    rows = list(rows)
    source = source or str(path)
    if not rows:
        raise ValueError(f"{source}: the split is empty")

    def name_of(col: str, value: Any) -> Any:
        if isinstance(value, int) and col in label_names:
            return label_names[col][value] if value >= 0 else None
        return value

    text = FORMATS[file_format][0](rows, set(rows[0]), name_of, source)
    from ..io.files import atomic_write_text

    atomic_write_text(path, text)  # its folder made
    return path


def _sentences(rows: list[dict], columns: set[str], name_of, source: str) -> str:
    """JSON Lines of sentence or sentence1/sentence2 and label (text tasks)."""
    pair = next(((a, b) for a, b in TEXT_COLUMNS if a in columns and (b is None or b in columns)), None)
    if pair is None:
        raise ValueError(f"{source}: no text columns for a sentence task; it has {', '.join(sorted(columns))}")
    a, b = pair
    lines = []
    for r in rows:
        out = {"sentence": r[a]} if b is None else {"sentence1": r[a], "sentence2": r[b]}
        label = name_of("label", r.get("label"))
        if label is not None:
            out["label"] = label
        lines.append(json.dumps(out, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def _conll(rows: list[dict], columns: set[str], name_of, source: str) -> str:
    """A word and its tag per line, a blank line after each sentence (token tasks)."""
    words = next((c for c in WORD_COLUMNS if c in columns), None)
    tags = next((c for c in TAG_COLUMNS if c in columns), None)
    if words is None or tags is None:
        raise ValueError(f"{source}: a token task needs a word column ({'/'.join(WORD_COLUMNS)}) and a tag "
                         f"column ({'/'.join(TAG_COLUMNS)}); it has {', '.join(sorted(columns))}")
    return "".join("".join(f"{w}\t{name_of(tags, t)}\n" for w, t in zip(r[words], r[tags])) + "\n"
                   for r in rows if r[words])


def _squad(rows: list[dict], columns: set[str], name_of, source: str, v2: bool = False) -> str:
    """SQuAD JSON, a paragraph per row; v2 marks the questions without answers is_impossible."""
    missing = {"id", "context", "question", "answers"} - columns
    if missing:
        raise ValueError(f"{source}: a SQuAD-style split needs id, context, question and answers; "
                         f"missing {', '.join(sorted(missing))}")
    data = []
    for r in rows:
        answers = [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
        qa = {"id": r["id"], "question": r["question"], "answers": answers}
        if v2:
            qa["is_impossible"] = not answers
        data.append({"title": r.get("title", ""), "paragraphs": [{"context": r["context"], "qas": [qa]}]})
    return json.dumps({"version": "v2.0" if v2 else "1.1", "data": data}, ensure_ascii=False)


def _swag(rows: list[dict], columns: set[str], name_of, source: str) -> str:
    """JSON Lines of context, question, choices and label (multiple choice)."""
    endings = sorted((c for c in columns if c.startswith("ending") and c[6:].isdigit()), key=lambda c: int(c[6:]))
    if "sent1" not in columns or not endings:
        raise ValueError(f"{source}: a multiple-choice split needs SWAG's sent1, sent2 and ending0..N; "
                         f"it has {', '.join(sorted(columns))}")
    lines = []
    for i, r in enumerate(rows):
        out = {"id": str(i), "context": r["sent1"], "question": r.get("sent2", ""), "choices": [r[c] for c in endings]}
        if isinstance(r.get("label"), int) and r["label"] >= 0:
            out["label"] = r["label"]
        lines.append(json.dumps(out, ensure_ascii=False))
    return "\n".join(lines) + "\n"


# The task file formats a split can be written as (families.py names its family's): writer, suffix.
FORMATS = {
    "text": (_sentences, ".jsonl"),
    "conll": (_conll, ".conll"),
    "squad": (_squad, ".json"),
    "squad-v2": (lambda *a: _squad(*a, v2=True), ".json"),
    "swag": (_swag, ".jsonl"),
}
