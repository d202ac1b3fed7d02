"""`torchbert samples`: the real data that packages ship, written as task files in a fixed split."""

import collections

import realdata
from clihelp import cli

from torchbert.apps.samples import SENTIMENT_DEV
from torchbert.tasks.families import read_examples


def test_wnut16_split_covers_every_tweet_once(tmp_path, capsys):
    code, out, err = cli(capsys, "samples", "wnut16", "--out", tmp_path / "w")
    assert code == 0, err
    splits = {s: read_examples(tmp_path / "w" / f"{s}.conll", "token") for s in ("train", "dev", "test")}
    assert {s: len(x) for s, x in splits.items()} == {"train": 1594, "dev": 400, "test": 400}
    assert "train.conll" in out
    written = collections.Counter((tuple(e.words), tuple(e.tags)) for x in splits.values() for e in x)
    assert written == collections.Counter(realdata.wnut_sentences())  # the file's tweets, each once
    first = (tmp_path / "w" / "dev.conll").read_bytes()
    code, _, _ = cli(capsys, "samples", "wnut16", "--out", tmp_path / "w", "--overwrite")
    assert code == 0 and (tmp_path / "w" / "dev.conll").read_bytes() == first  # the same split every time


def test_sentiment_split_has_no_text_twice(tmp_path, capsys):
    assert cli(capsys, "samples", "sentiment-zh", "--out", tmp_path)[0] == 0
    train = read_examples(tmp_path / "train.tsv", "classification")
    dev = read_examples(tmp_path / "dev.tsv", "classification")
    assert len(dev) == SENTIMENT_DEV and len(train) > 10_000
    texts = [e.text_a for e in train + dev]
    assert len(set(texts)) == len(texts)
    assert {e.label for e in train + dev} == {"pos", "neg"}
    pos = {" ".join(x.split()) for x in realdata.sentiment_paths()[0].read_text(encoding="utf-8").splitlines()}
    assert all((e.label == "pos") == (e.text_a in pos) for e in dev)


def test_peoples_daily_corpus(tmp_path, capsys):
    assert cli(capsys, "samples", "peoples-daily", "--out", tmp_path)[0] == 0
    docs = (tmp_path / "corpus.txt").read_text(encoding="utf-8").split("\n\n")
    paragraphs = [p for d in docs for p in d.strip().split("\n")]
    assert paragraphs == list(realdata.peoples_daily_lines())
    assert max(len(d.strip().split("\n")) for d in docs) == 5


def test_bad_arguments(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    code, _, err = cli(capsys, "samples", "wnut16", "--out", tmp_path)
    assert code == 2 and "--overwrite" in err and (tmp_path / "keep.txt").read_text() == "mine"
    code, _, err = cli(capsys, "samples", "imdb", "--out", tmp_path / "x")
    assert code == 2 and "NAME must be one of wnut16, " in err and "got 'imdb'" in err
    assert not (tmp_path / "x").exists()
    code, _, err = cli(capsys, "samples", "wnut16", "--out", tmp_path, "--overwrite")  # a folder of the user's
    assert code == 2 and "which torchbert did not write" in err and sorted(p.name for p in tmp_path.iterdir()) == [
        "keep.txt"]


def test_each_file_written_is_listed_with_its_lines_and_a_second_run_needs_overwrite(tmp_path, capsys):
    code, out, _ = cli(capsys, "samples", "wnut16", "--out", tmp_path / "w")
    files = sorted((tmp_path / "w").glob("*.conll"))
    assert code == 0 and len(files) == 3
    code, _, err = cli(capsys, "samples", "wnut16", "--out", tmp_path / "w")  # its own folder, not empty
    assert code == 2 and "the folder is not empty; pass --overwrite to write the sample into it" in err
    assert sorted(out.splitlines()) == sorted(
        f"{p}  ({p.read_text(encoding='utf-8').count(chr(10)):,} lines)" for p in files)


def test_peoples_daily_retrieval_is_the_inverse_cloze_task_with_apart_splits(tmp_path, capsys):
    import json

    from torchbert.apps.samples import RETRIEVAL_QUERIES, peoples_daily_paragraphs
    from torchbert.eval.retrieval import read_retrieval_set

    assert cli(capsys, "samples", "peoples-daily-retrieval", "--out", tmp_path)[0] == 0
    paragraphs = set(peoples_daily_paragraphs())
    seen = []
    for split in ("dev", "test", "train"):
        rows = [json.loads(x) for x in (tmp_path / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert len(rows) == (3963 if split == "train" else RETRIEVAL_QUERIES)
        for r in rows[:200]:  # the query is a sentence of the passage's paragraph, taken out of it
            q = r["query"].rstrip("”’」』）)")  # a whole sentence: to its end mark, or the paragraph's end
            assert len(q) > 2 and (q[-1] in "。！？" or r["positive"] + r["query"] in paragraphs), r["query"]
            whole = {r["positive"][:i] + r["query"] + r["positive"][i:] for i in range(len(r["positive"]) + 1)}
            assert whole & paragraphs, r["query"]
        seen.append({r["positive"] for r in rows})
        assert len(read_retrieval_set(tmp_path / f"{split}.jsonl").corpus) == len(rows)
    assert not seen[0] & seen[1] and not seen[2] & (seen[0] | seen[1])  # no passage in two splits
    # SimCSE's raw text: the training paragraphs' sentences, once each, none from dev or test
    sentences = (tmp_path / "sentences.txt").read_text(encoding="utf-8").splitlines()
    assert len(sentences) == len(set(sentences)) > 15_000 and min(map(len, sentences)) >= 4
    held = "".join(seen[0] | seen[1])
    assert sum(x in held for x in sentences[:300]) <= 3  # (a short common sentence may recur in another paragraph)


def test_peoples_daily_ner_tags_the_corpus_names_with_apart_paragraphs(tmp_path, capsys):
    from torchbert.apps.samples import NER_HELD, NER_TRAIN, peoples_daily_lines, peoples_daily_ner

    assert cli(capsys, "samples", "peoples-daily-ner", "--out", tmp_path)[0] == 0
    splits = {s: read_examples(tmp_path / f"{s}.conll", "token") for s in ("train", "dev", "test")}
    assert {s: len(x) for s, x in splits.items()} == {"train": NER_TRAIN, "dev": NER_HELD, "test": NER_HELD}
    tags = collections.Counter(t for x in splits.values() for e in x for t in e.tags)
    assert set(tags) == {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"} and tags["B-LOC"] > 1000
    # by hand: the corpus writes 江泽民 as two nr words (江/nr  泽民/nr), one person
    assert any("江/nr  泽民/nr" in line for line in peoples_daily_lines())
    tagged = [e for x in splits.values() for e in x if "江泽民" in "".join(e.words)]
    at = "".join(tagged[0].words).index("江泽民")
    assert tagged[0].tags[at:at + 3] == ["B-PER", "I-PER", "I-PER"]
    # whole paragraphs: test from the month's last, dev before them, train from the others
    where = collections.defaultdict(set)
    for p, chars, _ in peoples_daily_ner():
        where["".join(chars)].add(p)
    texts = {s: ["".join(e.words) for e in x] for s, x in splits.items()}
    assert min(max(where[t]) for t in texts["test"]) > max(min(where[t]) for t in texts["dev"])
    assert min(max(where[t]) for t in texts["dev"]) > max(min(where[t]) for t in texts["train"])
