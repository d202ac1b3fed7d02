"""data/compressed.py on its own: a corpus file's bytes the same plain, gzip or zstd (one frame or
many), and a damaged or cut file an error naming the file and its last whole line. prepare on such
files is in test_pretraining.py and test_failures.py."""

import gzip

import pytest
import zstandard

from torchbert.data.compressed import compression, open_binary

TEXT = b"".join(b"line %d of the corpus\n" % i for i in range(50_000))


def files(tmp_path):
    plain = tmp_path / "c.txt"
    plain.write_bytes(TEXT)
    gz = tmp_path / "c.txt.gz"
    gz.write_bytes(gzip.compress(TEXT))
    zst = tmp_path / "c.txt.ZST"  # suffixes in any case
    zst.write_bytes(zstandard.ZstdCompressor().compress(TEXT))
    frames = tmp_path / "frames.zstd"  # a file of many frames, as parallel compressors write
    frames.write_bytes(b"".join(zstandard.ZstdCompressor().compress(TEXT[i:i + 70_000]) for i in range(0, len(TEXT), 70_000)))
    return plain, gz, zst, frames


def test_every_kind_gives_the_same_bytes_by_read_readline_and_lines(tmp_path):
    plain, gz, zst, frames = files(tmp_path)
    assert [compression(p) for p in (plain, gz, zst, frames)] == [None, "gz", "zst", "zst"]
    for path in (plain, gz, zst, frames):
        with open_binary(path) as f:
            assert f.read() == TEXT, path
        with open_binary(path) as f:
            assert f.readline() == b"line 0 of the corpus\n" and f.read(7) == b"line 1 "
            assert f.peek(1)[:1] == b"o", path  # what is next, not taken
            rest = list(f)
            assert rest[0] == b"of the corpus\n" and rest[-1] == b"line 49999 of the corpus\n" and len(rest) == 49_999
    with open_binary(gz) as f:  # a reader counts the lines it handed out, for its errors
        f.readline()
        f.read(30)
        assert f.lines == 2
    gz.write_bytes(gzip.compress(b"a\nb"))  # a last line without its ending is not a whole line
    with open_binary(gz) as f:
        assert list(f) == [b"a\n", b"b"] and f.lines == 1


def test_a_zstd_file_cut_inside_a_frame_is_an_error_naming_the_last_whole_line(tmp_path):
    _, _, zst, frames = files(tmp_path)
    for path in (zst, frames):
        data = path.read_bytes()
        path.write_bytes(data[:len(data) * 2 // 3])
        with pytest.raises(ValueError, match=rf"{path.name}: the compressed text is damaged or cut short after line "
                                             r"\d+ \(the file ends inside a zstd frame\)") as e:
            with open_binary(path) as f:
                for _ in f:
                    pass
        assert int(str(e.value).split("after line ")[1].split()[0]) > 1000  # it read what was whole


def test_a_cut_or_damaged_gzip_file_names_itself(tmp_path):
    _, gz, _, _ = files(tmp_path)
    data = gz.read_bytes()
    gz.write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=r"c.txt.gz: the compressed text is damaged or cut short after line \d+"):
        with open_binary(gz) as f:
            f.read()
    gz.write_bytes(data[:20] + b"\xff" * 40 + data[60:])
    with pytest.raises(ValueError, match=r"c.txt.gz: the compressed text is damaged or cut short after line 0"):
        with open_binary(gz) as f:
            f.readline()


def test_a_highly_repetitive_zstd_file_is_read_a_slice_at_a_time(tmp_path):
    path = tmp_path / "zeros.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n" * (64 << 20)))  # 64 MB from a few KB
    with open_binary(path) as f:
        assert len(f.read(10)) == 10
        assert sum(len(chunk) for chunk in iter(lambda: f.read(1 << 22), b"")) == (64 << 20) - 10
