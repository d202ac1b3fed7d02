"""io/texts.py on its own: every reader's error names the file (and the line and column where there is
one), lines end as universal newlines end them, and JSON is read within its bounds. The commands'
errors on the same files are in test_failures.py and test_cli.py."""

import json
import os

import pytest

from torchbert.io.texts import json_loads, json_records, json_text, lines, read_json, read_texts, read_utf8


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_read_json_holds_a_file_to_its_bounds_and_names_it(tmp_path):
    good = write(tmp_path / "config.json", b'{"a": 1}')
    assert read_json(good) == {"a": 1}
    assert read_json(write(tmp_path / "list.json", b"[1, 2]"), list) == [1, 2]
    with pytest.raises(ValueError, match=r"list.json: a labels file is an object in JSON, this file holds a list"):
        read_json(tmp_path / "list.json", dict, "labels file")
    with pytest.raises(ValueError, match=r"n.json: a JSON file is a list in JSON, this file holds int"):
        read_json(write(tmp_path / "n.json", b"3"), list)
    with pytest.raises(ValueError, match=r"config.json: 8 bytes, more than a config.json holds \(at most 7\); not read"):
        read_json(good, dict, "config.json", max_bytes=7)
    assert read_json(good, dict, "config.json", max_bytes=8) == {"a": 1}  # exactly the bound is read
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON \(Expecting ',' delimiter, line 2\)"):
        read_json(write(tmp_path / "bad.json", b'{"a": 1\n "b": 2}'))
    with pytest.raises(ValueError, match=r"latin.json: not UTF-8 text \(byte 7\)"):
        read_json(write(tmp_path / "latin.json", b'{"a": "\xe9"}'))
    with pytest.raises(ValueError, match="deep.json: not valid JSON .arrays or objects nested too deeply to read"):
        read_json(write(tmp_path / "deep.json", b"[" * 100_000 + b"]" * 100_000), list)
    with pytest.raises(FileNotFoundError, match="absent.json: no such vocabulary file"):
        read_json(tmp_path / "absent.json", dict, "vocabulary file")
    with pytest.raises(ValueError, match=f"{tmp_path}: is a folder, not a regular file; give the JSON file as a file"):
        read_json(tmp_path)
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(ValueError, match=r"pipe.json: is a named pipe \(FIFO\), not a regular file"):
        read_json(tmp_path / "pipe.json")
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        json_loads("[" * 100_000)


def test_a_path_through_a_file_is_named_with_the_systems_words(tmp_path):
    write(tmp_path / "a.json", b"{}")
    with pytest.raises(FileNotFoundError, match=r"a.json/b.json: cannot read this JSON file \(Not a directory\)"):
        read_json(tmp_path / "a.json" / "b.json")


def test_lines_end_at_each_newline_and_keep_their_endings_when_asked(tmp_path):
    path = write(tmp_path / "mixed.txt", b"\xef\xbb\xbfunix\nwindows\r\nold mac\rtwo\r\rlast")
    assert list(lines(path)) == [(1, "unix"), (2, "windows"), (3, "old mac"), (4, "two"), (5, ""), (6, "last")]
    assert [t for _, t in lines(path, keepends=True)] == ["unix\n", "windows\r\n", "old mac\r", "two\r", "\r", "last"]
    path = write(tmp_path / "crlf.txt", b"a\r\nb\r\n")  # \r\n is one ending, not \r then an empty line
    assert list(lines(path)) == [(1, "a"), (2, "b")]
    path = write(tmp_path / "bom.txt", b"a\n\xef\xbb\xbfb\n")  # a byte-order mark is dropped on line 1 only
    assert list(lines(path)) == [(1, "a"), (2, "\ufeffb")]


def test_a_bad_byte_is_named_by_file_line_and_column(tmp_path):
    path = write(tmp_path / "t.txt", b"good\nalso good\nbad \xff here\n")
    with pytest.raises(ValueError, match=r"t.txt:3: not valid UTF-8 \(byte b'\\xff' at column 5\); expected a "
                                         r"UTF-8 text file"):
        list(lines(path))
    with pytest.raises(ValueError, match=r"t.txt:3: not valid UTF-8 \(byte b'\\xff' at column 5\); expected a "
                                         r"tokenizer.json"):
        read_utf8(path, "a tokenizer.json")
    assert read_utf8(write(tmp_path / "bom.json", b"\xef\xbb\xbf{}")) == "{}"


def test_texts_are_lines_or_a_json_lines_field(tmp_path):
    assert read_texts(write(tmp_path / "a.txt", b"one\n\nthree\n")) == ["one", "", "three"]  # a row per line
    jsonl = write(tmp_path / "a.JSONL", b'{"text": "one"}\n\n{"text": "two", "id": 3}\n')
    assert read_texts(jsonl) == ["one", "two"]  # blank lines between records are allowed
    assert read_texts(write(tmp_path / "q.jsonl", b'{"query": "q"}\n'), field="query") == ["q"]
    with pytest.raises(ValueError, match=r"b.jsonl:2: expected an object with a string 'text' field"):
        read_texts(write(tmp_path / "b.jsonl", b'{"text": "x"}\n{"text": 3}\n'))
    with pytest.raises(ValueError, match=r"c.jsonl:1: not valid JSON \(Expecting value\)"):
        read_texts(write(tmp_path / "c.jsonl", b"text\n"))
    with pytest.raises(ValueError, match="e.jsonl: no texts in the file"):
        read_texts(write(tmp_path / "e.jsonl", b"\n\n"))
    with pytest.raises(FileNotFoundError, match="none.txt: no such input file"):
        read_texts(tmp_path / "none.txt")
    with pytest.raises(ValueError, match="f.jsonl:1: expected an object with a string 'text' field"):
        json_text("[1]", "text", tmp_path / "f.jsonl", 1)


def test_json_records_are_the_objects_of_the_non_blank_lines(tmp_path):
    path = write(tmp_path / "r.jsonl", b'{"a": 1}\n\n  \n{"b": 2}\n')
    assert list(json_records(path)) == [(1, {"a": 1}), (4, {"b": 2})]
    with pytest.raises(ValueError, match=r"s.jsonl:2: not valid JSON \(Expecting ',' delimiter at column 9\); "
                                         "expected one JSON object per line"):
        list(json_records(write(tmp_path / "s.jsonl", b'{"a": 1}\n{"a": 1 "b": 2}\n')))
    with pytest.raises(ValueError, match=r"l.jsonl:1: expected a JSON object, found list"):
        list(json_records(write(tmp_path / "l.jsonl", b"[1]\n")))
