"""prepare's plan on its own (data/plan.py): made from the corpus and the settings alone, held to a
sensible number of blocks, and told apart from an unfinished run's plan in the user's words. The runs
that use it, resumed included, are in test_pretraining.py and test_scale.py."""

import json
import os

import pytest

from torchbert.data.plan import MAX_BLOCKS, PIECE_BYTES, PLAN, differences, load_plan, make_plan, partial_folder
from torchbert.data.pretraining import PrepareSettings

TEXT = "".join(f"Sentence {i} of the first document. And its next one.\n" for i in range(40)) + "\n" + \
       "".join(f"Another document, line {i}.\n" for i in range(40))


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("b.txt", "a.txt"):
        (folder / name).write_text(TEXT, encoding="utf-8")
    return folder


def test_a_plan_is_the_corpus_and_the_settings_never_the_workers(corpus, tmp_path, monkeypatch):
    s = PrepareSettings(block_mb=0.001, workers=1)  # blocks of 1,048 bytes
    plan = make_plan([corpus], tmp_path, s, "abc")
    size = len(TEXT.encode())
    assert [f["path"] for f in plan["files"]] == [str(corpus / "a.txt"), str(corpus / "b.txt")]  # sorted by name
    assert plan["files"][0]["size"] == size and plan["bytes"] == 2 * size
    assert plan["blocks"] == -(-2 * size // 1048) and plan["piece_bytes"] == 1048
    # pieces of about a block, cut between documents: each file at its second document
    cut = len(TEXT[:TEXT.index("Another")].encode())
    assert [(p["start"], p["stop"]) for p in plan["pieces"]] == [(0, cut), (cut, size)] * 2
    assert "workers" not in plan["settings"] and "cluster" not in plan["settings"]
    assert plan["settings"]["block_mb"] == 0.001 and plan["tokenizer"] == str(tmp_path.resolve())
    assert plan == make_plan([corpus], tmp_path, PrepareSettings(block_mb=0.001, workers=2), "abc")
    assert make_plan([corpus], tmp_path, PrepareSettings(), "abc")["piece_bytes"] == PIECE_BYTES
    assert make_plan([corpus], tmp_path, PrepareSettings(), "abc")["blocks"] == 1
    monkeypatch.chdir(tmp_path)  # the tokenizer by its absolute path: a resume from elsewhere finds the same
    assert make_plan([corpus], "corpus", PrepareSettings(), "abc")["tokenizer"] == str(corpus.resolve())


def test_an_empty_corpus_or_too_many_blocks_are_refused_before_any_work(corpus, tmp_path):
    with pytest.raises(ValueError, match="the corpus is empty"):  # (files without text are refused by prepare)
        make_plan([], tmp_path, PrepareSettings(), "abc")
    big = tmp_path / "big.txt"
    big.write_text(("word " * 19 + "end.\n") * 150_000)  # 15 MB: at 1,048 bytes a block, 14,313 blocks
    with pytest.raises(ValueError, match=r"--block-mb 0.001: cuts this corpus \(14.3 MB of text\) into 14,313 blocks, "
                                         r"a folder each; at most 10,000: give --block-mb 0.002 or more"):
        make_plan([big], tmp_path, PrepareSettings(block_mb=0.001), "abc")
    assert make_plan([big], tmp_path, PrepareSettings(block_mb=0.0015), "abc")["blocks"] <= MAX_BLOCKS


def test_differences_name_what_changed_in_the_users_words(corpus, tmp_path):
    old = make_plan([corpus], tmp_path, PrepareSettings(), "abc")
    assert differences(old, json.loads(json.dumps(old))) == []
    new = make_plan([corpus], tmp_path, PrepareSettings(max_seq_len=64, dupe_factor=2), "abc")
    assert differences(old, new) == ["--max-seq-len 128 -> 64", "--dupe-factor 5 -> 2"]
    assert differences(old, make_plan([corpus], tmp_path, PrepareSettings(), "def")) == ["the tokenizer's vocab"]
    assert differences(old, make_plan([corpus / "a.txt"], tmp_path, PrepareSettings(), "abc")) == ["the corpus files"]
    one, other = (make_plan([corpus / name], tmp_path, PrepareSettings(), "abc") for name in ("a.txt", "b.txt"))
    assert differences(one, other) == ["the corpus files"]  # as many files, others
    st = os.stat(corpus / "b.txt")
    os.utime(corpus / "b.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: it may hold other text
    assert differences(old, make_plan([corpus], tmp_path, PrepareSettings(), "abc")) == [
        f"{corpus / 'b.txt'} changed since"]
    assert differences({**old, "version": 2}, old) == ["the plan (another torchbert version?)"]


def test_a_plan_is_read_once_until_its_file_changes(tmp_path):
    work = partial_folder(tmp_path / "data")
    assert work.name == "data.partial"
    work.mkdir()
    (work / PLAN).write_text(json.dumps({"blocks": 1}))
    first = load_plan(work)
    assert first == {"blocks": 1} and load_plan(work) is first  # every worker's tasks share one reading
    st = os.stat(work / PLAN)
    (work / PLAN).write_text(json.dumps({"blocks": 2}))
    os.utime(work / PLAN, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_plan(work) == {"blocks": 2}


def test_a_file_with_no_boundary_left_is_searched_once_not_once_a_piece(tmp_path, monkeypatch):
    """A corpus that is one long line (or ends in one) has no boundary after some point: one search finds
    that, where each later multiple of the piece size once searched to the end again (a 15 MB line with
    --block-mb 0.001: 91 s to plan)."""
    from torchbert.data import sources
    from torchbert.data.sources import plan_pieces
    from torchbert.data.pretraining import split_sentences

    text = "First document, line one.\nLine two.\n\nSecond document.\n\n" + "x" * 200_000 + "\n"
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    searches = []
    boundary = sources._boundary
    monkeypatch.setattr(sources, "_boundary", lambda *a: searches.append(a[1]) or boundary(*a))
    pieces = plan_pieces([path], "text", 16, split_sentences)
    cuts = [(p.start, p.stop) for p in pieces]
    first, second = text.index("Second"), text.index("x")
    assert cuts == [(0, first), (first, second), (second, len(text))]  # cut after each blank line, and no more
    assert len(searches) <= 4  # not one per 16 bytes of the long line (12,500)
