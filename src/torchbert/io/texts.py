"""Reading text inputs: one text per line (.txt) or JSON Lines with a `text` field (.jsonl).

Every error names the file and the line, so a user can find a bad byte in a million-line file."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_texts(path: str | os.PathLike, field: str = "text") -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such input file")
    jsonl = path.suffix.lower() == ".jsonl"
    texts = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = raw[e.start:e.start + 1]
                raise ValueError(f"{path}:{n}: not valid UTF-8 (byte {e.start}: {bad!r})") from None
            line = line.rstrip("\r\n")
            if n == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark is not text
            if not jsonl:
                texts.append(line)
                continue
            if not line.strip():
                continue  # blank lines between records are allowed in JSON Lines
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise ValueError(f"{path}:{n}: expected an object with a string {field!r} field")
            texts.append(record[field])
    if not texts:
        raise ValueError(f"{path}: no texts in the file")
    return texts
