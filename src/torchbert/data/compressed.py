"""A corpus file's bytes as a stream: plain, or gzip or zstd decompressed as it is read.

A compressed file that is damaged or cut short is an error naming the file and its last whole line:
zstd's own stream reader ends a file cut inside a frame silently (half a corpus read as if whole),
so its frames are read here one after the other (`_ZstdFrames`), and every decompressing reader is
wrapped in `_Checked`, which counts the lines it hands out to say where the text stopped.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}


def compression(path: Path) -> str | None:
    return COMPRESSIONS.get(path.suffix.lower())


def open_binary(path: Path):
    """The file's bytes as a stream, decompressed (gzip, zstd) as they are read; a compressed stream
    that is damaged or stops early is an error naming the file and its last whole line."""
    kind = compression(path)
    if kind == "gz":
        import gzip
        import zlib

        return _Checked(gzip.open(path, "rb"), path, (EOFError, gzip.BadGzipFile, zlib.error))
    if kind == "zst":
        import zstandard

        return _Checked(io.BufferedReader(_ZstdFrames(path), 1 << 20), path, (EOFError, zstandard.ZstdError))
    return open(path, "rb")


class _ZstdFrames(io.RawIOBase):
    """A .zst file's text, frame after frame. zstandard's own stream reader ends a file cut inside a
    frame without a word (half a corpus read as if whole); here that is an EOFError. The compressed
    bytes go in 8 KiB at a time, so one call makes at most a few hundred MB however the text repeats."""

    def __init__(self, path: Path):
        import zstandard

        self._new = zstandard.ZstdDecompressor().decompressobj
        self._file = open(path, "rb")
        self._frame = None  # the frame being read; None: between frames
        self._out, self._at = b"", 0  # decompressed and not yet returned: self._out[self._at:]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._at == len(self._out):
            chunk = self._file.read(8192)
            if not chunk:
                if self._frame is not None:
                    raise EOFError("the file ends inside a zstd frame")
                return 0
            out = []
            while chunk:
                if self._frame is None:
                    self._frame = self._new()
                out.append(self._frame.decompress(chunk))
                chunk = b""
                if self._frame.eof:
                    chunk, self._frame = self._frame.unused_data, None
            self._out, self._at = b"".join(out), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = self._out[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


class _Checked:
    """A decompressing reader whose errors (a damaged stream, a cut file) name the file and the last
    whole line read; it counts the lines it hands out."""

    def __init__(self, stream, path: Path, errors: tuple):
        self._stream, self._path, self._errors, self.lines = stream, path, errors, 0

    def _call(self, method, *args) -> bytes:
        try:
            data = method(*args)
        except self._errors as e:
            raise ValueError(f"{self._path}: the compressed text is damaged or cut short after line {self.lines} "
                             f"({e})") from None
        return data

    def read(self, n: int = -1) -> bytes:
        data = self._call(self._stream.read, n)
        self.lines += data.count(b"\n")
        return data

    def readline(self, n: int = -1) -> bytes:
        data = self._call(self._stream.readline, n)
        self.lines += data.endswith(b"\n")
        return data

    def peek(self, n: int = 1) -> bytes:
        return self._call(self._stream.peek, n)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> "_Checked":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
