"""A corpus as users hold it: many files, folders and globs; plain, gzip or zstd; text, JSON Lines or
Parquet; read as streams of documents, in pieces that workers can take in any order.

- `corpus_files(specs)`: the files named by files, folders (every file under them, sorted, hidden
  ones left out) and globs, each once, in a fixed order.
- `plan_pieces(files, fmt, piece_bytes)`: each file's layout (see below) and its pieces. A plain file
  is cut into pieces of about piece_bytes at document boundaries (a blank line, or a line break where
  each line is a document), found by seeking, so planning reads a few lines per piece, never the
  file. A compressed file is cut at the same places of its text, found in one pass over the stream
  (a stream cannot be entered in the middle, so its pieces are offsets into the text), and a
  Parquet file has a piece per row group. A piece depends only on the text and piece_bytes: never on
  how many workers read it, nor on whether the text came plain, gzip'd or zstd'd.
- `Stager`: the pieces of compressed files, decompressed once, in order, each into a plain file of
  its own just before a worker takes it (issue 58: one .gz or .zst is then read on every core, not
  on one).
- `piece_documents(piece, ...)`: the documents of a piece as lists of sentences, in parts of about
  part_bytes, each read as a stream: a worker's memory is set by part_bytes, not by the file.

Layouts (`--format`): `bert` (one sentence per line, a blank line between documents), `text` (each
line a paragraph, cut into sentences; blank lines separate documents), `lines` (each line a
document; `text` in a file without blank lines), `jsonl` (a document per line, its text field),
`parquet` (a document per row, its text column). `auto` takes jsonl and parquet from the name
(`.jsonl`, `.json`, `.parquet`, before any `.gz`/`.zst`) and tells the others apart by the file's
first 20,000 lines: `lines` if none is blank, `bert` if 90% of the others hold one sentence, else
`text`. Every error names the file and the line (or the row group).

Bounds: no line, record or document makes a reader hold more than a few tens of MB, however the file
is made (a 22 MB .gz can hold a 5 GB line): see LINE_BYTES, RECORD_BYTES and DOCUMENT_CHARS; what is
cut or skipped is noted with its file and line. A compressed file that is damaged or cut short is an
error naming the file and its last whole line (zstd included, whose own reader ends such a file
silently; compressed.py).
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..io.texts import json_text, not_a_file
from .compressed import COMPRESSIONS, compression, open_binary

FORMATS = ("auto", "bert", "text", "jsonl", "parquet")
SAMPLE_LINES = 20000
# Bounds on what one line can make a reader hold (a 22 MB .gz can hold a 5 GB line): a longer line
# reaches the layouts in parts of LINE_BYTES (cut after a space where there is one; still one line
# of one document); a JSON Lines record longer than RECORD_BYTES is skipped, and a document longer
# than DOCUMENT_CHARS cut, each with a note naming the file and line (or row).
LINE_BYTES = 1 << 20
RECORD_BYTES = 1 << 25
DOCUMENT_CHARS = 1 << 22  # and a sentence longer than LINE_BYTES characters goes on in pieces cut at a space


def corpus_files(specs: Sequence[str | os.PathLike]) -> list[Path]:
    """The files named by `specs` (files, folders, globs), each once, in the order given (a folder's
    files and a glob's matches sorted by name)."""
    files: list[Path] = []
    for spec in map(str, specs):
        if any(c in spec for c in "*?[") and not Path(spec).exists():
            found = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
            if not found:
                raise FileNotFoundError(f"{spec}: no corpus file matches this pattern")
        elif Path(spec).is_dir():
            found = sorted(p for p in Path(spec).rglob("*")
                           if p.is_file() and not any(part.startswith(".") for part in p.relative_to(spec).parts))
            if not found:
                raise FileNotFoundError(f"{spec}: the folder holds no corpus files")
        else:
            path = Path(spec)
            if not path.is_file():
                raise not_a_file(path, "corpus file")
            found = [path]
        files += found
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _inner_suffix(path: Path) -> str:
    """The suffix that says the layout: `.jsonl` of docs.jsonl.gz."""
    name = path.name.lower()
    for suffix in COMPRESSIONS:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return os.path.splitext(name)[1]


# ----------------------------------------------------------------------------------------------
# layouts


def split_text_field(text: str, split_sentences) -> list[str]:
    return [s for para in text.splitlines() for s in split_sentences(para)]


def _decode(path: Path, raw: bytes, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        n = line + raw.count(b"\n", 0, e.start)
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(f"{path}:{n}: not valid UTF-8 (byte {raw[e.start:e.start + 1]!r} at column {column})"
                         ) from None


def _sample_lines(path: Path) -> list[str]:
    """The first SAMPLE_LINES lines, each cut at LINE_BYTES (read past, not held, beyond that)."""
    raw = []
    with open_binary(path) as f:
        for _ in range(SAMPLE_LINES):
            line = f.readline(LINE_BYTES)
            if not line:
                break
            if len(line) == LINE_BYTES and not line.endswith(b"\n"):  # a sample of it is enough
                line = line[: _char_start(line, len(line) - 1)] + b"\n"
                _past_line(f)
            raw.append(line)
    text = _decode(path, b"".join(raw), 1)
    return text.removeprefix("\ufeff").splitlines()


def _past_line(f) -> tuple[int, bool]:
    """Reads to the end of the line f is in, however long, LINE_BYTES at a time: (its bytes, whether
    it is blank); (0, True) at the end of the file."""
    n, blank = 0, True
    while True:
        chunk = f.readline(LINE_BYTES)
        n += len(chunk)
        blank = blank and not chunk.strip()
        if not chunk or chunk.endswith(b"\n"):
            return n, blank


def _char_start(raw: bytes, at: int) -> int:
    """`at`, moved back to the start of the UTF-8 character it falls in."""
    while 0 < at < len(raw) and raw[at] & 0xC0 == 0x80:
        at -= 1
    return at


def _cut(raw: bytes) -> int:
    """Where to cut a line longer than LINE_BYTES (raw: more than LINE_BYTES of its bytes): after the
    last space or tab of the second half of its first LINE_BYTES, else at a character boundary."""
    space = max(raw.rfind(b" ", LINE_BYTES // 2, LINE_BYTES), raw.rfind(b"\t", LINE_BYTES // 2, LINE_BYTES))
    return space + 1 if space >= 0 else (_char_start(raw, LINE_BYTES) or LINE_BYTES)


def detect_layout(path: Path, fmt: str, split_sentences) -> str:
    """The layout of one file (see the module's docstring): bert, text, lines, jsonl or parquet."""
    inner = _inner_suffix(path)
    if fmt == "parquet" or (fmt == "auto" and inner == ".parquet"):
        if compression(path):
            raise ValueError(f"{path}: a Parquet file is compressed inside; give it without .gz/.zst")
        return "parquet"
    if fmt == "jsonl" or (fmt == "auto" and inner in (".jsonl", ".json")):
        return "jsonl"
    sample = _sample_lines(path)
    blank = any(not line.strip() for line in sample)
    if fmt == "bert":
        return "bert"
    if not blank:
        return "lines"
    if fmt == "text":
        return "text"
    filled = [line for line in sample if line.strip()]
    single = sum(1 for line in filled if len(split_sentences(line)) <= 1)
    return "bert" if filled and single >= 0.9 * len(filled) else "text"


# ----------------------------------------------------------------------------------------------
# pieces


@dataclass(frozen=True)
class Piece:
    """A part of one file that a worker reads alone: bytes [start, stop) of a plain file or of a
    compressed file's text (decompressed: staged for the worker by a Stager), or row groups
    [start, stop) of a Parquet file."""

    file: str
    layout: str
    start: int
    stop: int
    size: int  # bytes of text (of a Parquet file: of its row group), for progress
    line: int = 0  # the line number `start` begins, where planning counted it (0: counted when needed)

    def to_json(self) -> dict:
        return asdict(self)


def _boundary(f, offset: int, blank_separated: bool, size: int) -> int:
    """The first document boundary at or after `offset`: after the next blank line (or, where each
    line is a document, the next line break)."""
    f.seek(offset - 1)
    if f.read(1) == b"\n" and not blank_separated:
        return offset
    f.seek(offset)
    _past_line(f)  # the rest of the line `offset` falls in
    if not blank_separated:
        return f.tell()
    while True:
        n, blank = _past_line(f)
        if not n:
            return size
        if blank:
            return f.tell()


def plan_pieces(files: Sequence[Path], fmt: str, piece_bytes: int, split_sentences,
                announce: Callable[[str], None] | None = None) -> list[Piece]:
    """Every file's pieces, in file order (see the module's docstring); announce(message) before a
    compressed file's pass."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    pieces: list[Piece] = []
    for path in files:
        layout = detect_layout(path, fmt, split_sentences)
        size = path.stat().st_size
        if layout == "parquet":
            pieces += _parquet_pieces(path)
        elif compression(path):
            if announce is not None:
                announce(f"{path}: reading its text once, to cut it into pieces for the workers")
            pieces += _stream_pieces(path, layout, piece_bytes)
        elif size <= piece_bytes:
            pieces.append(Piece(str(path), layout, 0, size, size, 1))
        else:
            cuts = [0]
            with open(path, "rb") as f:
                for k in range(1, -(-size // piece_bytes)):
                    at = max(k * piece_bytes, cuts[-1] + 1)
                    if at >= size:
                        break
                    b = _boundary(f, at, layout in ("bert", "text"), size)
                    if b >= size:  # no boundary after `at`, so none after the next multiples either
                        break
                    if cuts[-1] < b:
                        cuts.append(b)
            cuts.append(size)
            pieces += [Piece(str(path), layout, a, b, b - a) for a, b in zip(cuts, cuts[1:])]
    return pieces


def _stream_pieces(path: Path, layout: str, piece_bytes: int) -> list[Piece]:
    """A compressed file's pieces: its text cut where plan_pieces cuts the same text plain (_boundary
    at each multiple of piece_bytes), found in one pass over the stream; each with its first line."""
    blank_separated = layout in ("bert", "text")
    pos, lines = 0, 1
    cuts = [(0, 1)]  # (offset into the text, its line number)
    with open_binary(path) as f:

        def read(n: int) -> bytes:  # the next n bytes (fewer at the end), their lines counted
            nonlocal pos, lines
            last = b""
            while n > 0:
                block = f.read(min(n, 1 << 24))
                if not block:
                    break
                last, n = block, n - len(block)
                pos += len(block)
                lines += block.count(b"\n")
            return last[-1:]

        def readline() -> tuple[int, bool]:  # past the line, however long: (its bytes, blank)
            nonlocal pos, lines
            n, blank = _past_line(f)
            pos += n
            lines += n > 0
            return n, blank

        k = 1
        while True:
            at = max(k * piece_bytes, cuts[-1][0] + 1)
            k += 1
            read(at - 1 - pos)
            last = read(1)  # byte at - 1
            if not last or not f.peek(1):
                break  # the text ends at or before `at`
            if not (last == b"\n" and not blank_separated):  # _boundary: the rest of the line, and ...
                readline()
                while blank_separated:  # ... up to and with the next blank line
                    n, blank = readline()
                    if not n or blank:
                        break
            if not f.peek(1):
                break  # the boundary is the end of the text
            cuts.append((pos, lines))
        read(1 << 62)  # the rest: the text's size
    cuts.append((pos, lines))
    return [Piece(str(path), layout, a, b, b - a, line) for (a, line), (b, _) in zip(cuts, cuts[1:])]


def _parquet_pieces(path: Path) -> list[Piece]:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as e:  # noqa: BLE001 - pyarrow's errors have many types; all mean "not Parquet"
        raise ValueError(f"{path}: not a readable Parquet file ({e})") from None
    return [Piece(str(path), "parquet", g, g + 1, meta.row_group(g).total_byte_size)
            for g in range(meta.num_row_groups)]


# ----------------------------------------------------------------------------------------------
# documents


def _line_of(path: Path, offset: int) -> int:
    """The line number (1-based) that byte `offset` of a plain file starts."""
    n = 1
    with open(path, "rb") as f:
        left = offset
        while left > 0:
            block = f.read(min(left, 1 << 24))
            if not block:
                break
            n += block.count(b"\n")
            left -= len(block)
    return n


def _byte_parts(piece: Piece, part_bytes: int, staged: Path | None = None
                ) -> Iterator[tuple[int, bytes, bool]]:
    """(first line number, bytes, whether they stop inside a line) of a piece, cut after whole lines
    every ~part_bytes, and a line longer than LINE_BYTES in parts of its own (_cut): of a plain file,
    or of a compressed file's text as `staged` holds it (Stager). Memory holds part_bytes + LINE_BYTES.
    Line numbers of a plain piece that starts inside its file are counted on demand."""
    path = Path(piece.file)
    if compression(path):
        if staged is None:
            raise ValueError(f"{path}: a piece of a compressed file is read from its staged text (Stager)")
        source, offset = staged, 0
    else:
        source, offset = path, piece.start
    with open(source, "rb") as f:
        f.seek(offset)
        left = piece.stop - piece.start
        line = piece.line or (1 if piece.start == 0 else None)

        def first() -> int:
            return line if line is not None else _line_of(path, piece.start)

        rest = b""
        while True:
            want = min(part_bytes, left)
            block = f.read(want) if want > 0 else b""
            left -= len(block)
            if not block:
                if rest:
                    yield first(), rest, False
                return
            block = rest + block
            cut = block.rfind(b"\n") + 1
            while cut == 0 and len(block) > LINE_BYTES:  # inside one long line: its parts go on alone
                at = _cut(block)
                line = first()
                yield line, block[:at], True
                block = block[at:]
            if cut == 0:
                rest = block
                continue
            part, rest = block[:cut], block[cut:]
            line = first()
            yield line, part, False
            line += part.count(b"\n")


class _Documents:
    """Documents as a reader finds them, sentence by sentence, within the bounds: a sentence longer
    than LINE_BYTES characters in pieces cut at a space, a document longer than DOCUMENT_CHARS cut
    (noted once a document, naming where)."""

    def __init__(self, note: Callable[[str], None]):
        self.note, self.done, self.doc, self.size, self.cut = note, [], [], 0, False

    def add(self, sentences: list[str], where: str) -> None:
        lengths = list(map(len, sentences))
        if self.size + sum(lengths) <= DOCUMENT_CHARS and max(lengths, default=0) <= LINE_BYTES:
            self.doc += sentences  # within the bounds: every line of an ordinary corpus
            self.size += sum(lengths)
            return
        for sent in sentences:
            while sent:
                piece, sent = (sent, "") if len(sent) <= LINE_BYTES else _split_at_space(sent)
                self.doc.append(piece)
                self.size += len(piece)
                if self.size > DOCUMENT_CHARS:
                    if not self.cut:
                        self.note(f"{where}: a document longer than {DOCUMENT_CHARS:,} characters: cut into "
                                  "documents of that length")
                    self.close()
                    self.cut = True

    def close(self) -> None:
        if self.doc:
            self.done.append(self.doc)
        self.doc, self.size, self.cut = [], 0, False

    def take(self) -> list[list[str]]:
        done, self.done = self.done, []
        return done


def _split_at_space(text: str) -> tuple[str, str]:
    at = max(text.rfind(" ", LINE_BYTES // 2, LINE_BYTES), text.rfind("\t", LINE_BYTES // 2, LINE_BYTES)) + 1
    return text[: at or LINE_BYTES], text[at or LINE_BYTES:]


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=2)


def piece_documents(piece: Piece, part_bytes: int, split_sentences, text_field: str = "text",
                    staged: Path | None = None, note: Callable[[str], None] = _warn
                    ) -> Iterator[tuple[list[list[str]], int]]:
    """(documents, bytes) of a piece in parts of about part_bytes; a document never spans two parts.
    Documents without a sentence are dropped. staged: a compressed file's piece as Stager wrote it.
    note(message): what was cut or skipped to keep within LINE_BYTES, RECORD_BYTES and DOCUMENT_CHARS
    (default: a warning), each naming the file and line."""
    path = Path(piece.file)
    if piece.layout == "parquet":
        yield from _parquet_documents(piece, part_bytes, split_sentences, text_field, note)
        return
    found = _Documents(note)  # a document may run on into the next part: it goes with that one
    record: list[str] | None = []  # a JSON Lines record's text so far (a long one comes in parts); None: skipped
    record_size = 0
    pending: tuple[list[list[str]], int] | None = None
    for first_line, raw, open_end in _byte_parts(piece, part_bytes, staged):
        text = _decode(path, raw, first_line)
        if first_line == 1:
            text = text.removeprefix("\ufeff")
        lines = text.splitlines()
        for k, line in enumerate(lines):
            n = first_line + k
            whole = not (open_end and k == len(lines) - 1)  # the line ends in this part
            if piece.layout == "jsonl":
                if record is not None:
                    record.append(line)
                    record_size += len(line)
                    if record_size > RECORD_BYTES:
                        note(f"{path}:{n}: a JSON Lines record longer than {RECORD_BYTES >> 20} MiB: skipped")
                        record = None
                if whole:
                    if record is not None and (len(record) > 1 or line.strip()):
                        text_of = json_text("".join(record), text_field, path, n)
                        found.add(split_text_field(text_of, split_sentences), f"{path}:{n}")
                        found.close()
                    record, record_size = [], 0
            elif piece.layout == "lines":
                found.add(split_sentences(line), f"{path}:{n}")
                if whole:
                    found.close()
            elif line.strip():  # bert / text: blank lines between documents
                found.add([line.strip()] if piece.layout == "bert" else split_sentences(line), f"{path}:{n}")
            elif whole:
                found.close()
        if pending is not None:
            yield pending
        pending = ([d for d in found.take() if d], len(raw))
    found.close()
    last = found.take()
    if last:
        pending = ((pending[0] if pending else []) + last, pending[1] if pending else 0)
    if pending is not None:
        yield pending


def _parquet_documents(piece: Piece, part_bytes: int, split_sentences, text_field: str,
                       note: Callable[[str], None]):
    import pyarrow.parquet as pq

    path = Path(piece.file)
    pf = pq.ParquetFile(path)
    if text_field not in pf.schema_arrow.names:
        raise ValueError(f"{path}: no column {text_field!r} (it has {', '.join(pf.schema_arrow.names)}); "
                         "name the text column with --text-field")
    rows_per_part = max(1, int(part_bytes / max(1, pf.metadata.row_group(piece.start).total_byte_size)
                               * max(1, pf.metadata.row_group(piece.start).num_rows)))
    row = sum(pf.metadata.row_group(g).num_rows for g in range(piece.start))
    for batch in pf.iter_batches(batch_size=rows_per_part, row_groups=list(range(piece.start, piece.stop)),
                                 columns=[text_field]):
        column = batch.column(0)
        texts = column.to_pylist()
        found, empty = _Documents(note), []
        for k, text in enumerate(texts):
            if text is None:
                empty.append(row + k + 1)
                continue
            if not isinstance(text, str):
                raise ValueError(f"{path}: row {row + k + 1}: column {text_field!r} holds {type(text).__name__}, "
                                 "not text")
            found.add(split_text_field(text, split_sentences), f"{path}: row {row + k + 1}")
            found.close()
        if empty:
            note(f"{path}: {len(empty):,} row(s) with no text (null in column {text_field!r}) skipped, the first "
                 f"row {empty[0]}")
        row += len(texts)
        yield [d for d in found.take() if d], int(column.nbytes)


def corpus_documents(files: Sequence[Path], fmt: str, part_bytes: int, split_sentences, text_field: str = "text",
                     note: Callable[[str], None] = _warn) -> Iterator[list[list[str]]]:
    """The documents of corpus files in one process, a part at a time (vocab, small corpora): a
    compressed file's pieces staged one after the other in a temporary folder (Stager)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="torchbert-stage-") as tmp, Stager() as stager:
        for k, piece in enumerate(plan_pieces(files, fmt, part_bytes, split_sentences)):
            staged = None
            if compression(Path(piece.file)):
                staged = Path(tmp) / f"{k:06d}.txt"
                stager.stage(piece, staged)
            for docs, _ in piece_documents(piece, part_bytes, split_sentences, text_field, staged, note):
                yield docs
            if staged is not None:
                staged.unlink()


class Stager:
    """The pieces of compressed files as plain files of their own, for workers: each file is
    decompressed once, front to back, and a piece's text written (atomically) just before a worker
    takes it; the worker removes it when the piece is done. Asked for pieces in plan order (those
    done already left out), it skips what lies between them; asked for an earlier one, it starts the
    file again."""

    def __init__(self):
        self.path: Path | None = None
        self.stream = None
        self.pos = 0

    def __enter__(self) -> "Stager":
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def _close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self.stream, self.path, self.pos = None, None, 0

    def stage(self, piece: Piece, target: Path) -> None:
        path = Path(piece.file)
        if self.path != path or piece.start < self.pos:
            self._close()
            self.stream, self.path = open_binary(path), path
        self._copy(piece.start - self.pos, None)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        with open(tmp, "wb") as out:
            self._copy(piece.stop - piece.start, out)
        os.replace(tmp, target)

    def _copy(self, n: int, out) -> None:
        while n > 0:
            block = self.stream.read(min(n, 1 << 23))
            if not block:
                raise ValueError(f"{self.path}: the text ends {n} bytes early (did the file change while it "
                                 "was read?)")
            if out is not None:
                out.write(block)
            n -= len(block)
            self.pos += len(block)
