"""Reading text files: lines with FILE:LINE errors, and texts one per line (.txt) or JSON Lines (.jsonl).

Every error names the file and the line, so a user can find a bad byte in a million-line file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()  # record.get(key, MISSING): a field the record lacks, told apart from one that holds null


def shown(value: object, width: int = 40) -> str:
    """How an error names a field's value: 'is missing', or 'is' and the value as JSON, cut to width."""
    return "is missing" if value is MISSING else f"is {json.dumps(value, ensure_ascii=False)[:width]}"


def json_loads(text: str | bytes):
    """json.loads, where a document nested too deeply for the parser (a 10^6-deep list) is a
    JSONDecodeError like any other malformed JSON, so every reader's error names its file."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("arrays or objects nested too deeply to read", "", 0) from None


CONFIG_BYTES = 16 << 20  # a config.json of a model with 10^5 labels is a few MB; a larger one is not read


def read_json(path: Path, kind: type = dict, what: str = "JSON file", max_bytes: int = 64 << 20):
    """A JSON file through its bounds, every error a ValueError naming the file: not a regular file,
    larger than max_bytes (checked before reading), not UTF-8, not JSON, nested too deeply, or its top
    level not a `kind` (dict or list)."""
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, what)
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{path}: {size:,} bytes, more than a {what} holds (at most {max_bytes:,}); not read")
    try:
        value = json_loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(value, kind):
        names = {dict: "an object", list: "a list"}
        raise ValueError(f"{path}: a {what} is {names.get(kind, kind.__name__)} in JSON, this file holds "
                         f"{names.get(type(value), type(value).__name__)}")
    return value


def not_a_file(path: Path, what: str) -> Exception:
    """The error for an input that is not a regular file, saying what it is instead (a named pipe or a
    device would be read for ever, or block)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return FileNotFoundError(f"{path}: no such {what}")
    except OSError as e:
        return FileNotFoundError(f"{path}: cannot read this {what} ({e.strerror})")
    from .files import kind

    what_it_is = "a folder" if stat.S_ISDIR(mode) else kind(path) or "not a regular file"
    return ValueError(f"{path}: is {what_it_is}, not a regular file; give the {what} as a file")


def _physical_lines(f) -> Iterator[bytes]:
    """The lines of a binary file as universal newlines split them: at \\n, \\r\\n or a lone \\r (old Mac
    files), each with its ending."""
    for raw in f:
        if b"\r" not in raw[:-2]:  # the common case: no carriage return before the ending
            yield raw
            continue
        end = 2 if raw.endswith(b"\r\n") else 1 if raw.endswith((b"\n", b"\r")) else 0
        body, ending = raw[:len(raw) - end], raw[len(raw) - end:]
        parts = body.split(b"\r")
        for k, part in enumerate(parts):
            yield part + (b"\r" if k < len(parts) - 1 else ending)


def lines(path: Path, keepends: bool = False, expected: str = "a UTF-8 text file") -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a file, streamed; lines end at \\n, \\r\\n or \\r (as Python's
    universal newlines); a leading byte-order mark is dropped, and a bad byte is an error naming the
    file, the line and the column."""
    with open(path, "rb") as f:
        for n, raw in enumerate(_physical_lines(f), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(path, n, raw[e.start:e.start + 1], e.start + 1, expected) from None
            if n == 1:
                line = line.removeprefix("\ufeff")
            yield n, (line if keepends else line.rstrip("\r\n"))


def read_utf8(path: Path, expected: str = "a UTF-8 text file") -> str:
    """A whole file as text (for formats read at once, such as JSON); errors as in `lines`."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise _not_utf8(path, data.count(b"\n", 0, e.start) + 1, data[e.start:e.start + 1], e.start - line_start + 1,
                        expected) from None


def _not_utf8(path: Path, line: int, byte: bytes, column: int, expected: str) -> ValueError:
    return ValueError(f"{path}:{line}: not valid UTF-8 (byte {byte!r} at column {column}); expected {expected}")


def json_text(line: str, field: str, path, n: int) -> str:
    """The string `field` of a JSON Lines record; an error names the file and line."""
    try:
        record = json_loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        raise ValueError(f"{path}:{n}: expected an object with a string {field!r} field")
    return record[field]


def read_texts(path: str | os.PathLike, field: str = "text") -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, "input file")
    jsonl = path.suffix.lower() == ".jsonl"
    texts = []
    for n, line in lines(path):
        if not jsonl:
            texts.append(line)
            continue
        if not line.strip():
            continue  # blank lines between records are allowed in JSON Lines
        texts.append(json_text(line, field, path, n))
    if not texts:
        raise ValueError(f"{path}: no texts in the file")
    return texts


def json_records(path: Path) -> Iterator[tuple[int, dict]]:
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
