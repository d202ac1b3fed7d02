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


# -- each reader on text written by hand (the packages' files cannot show every case) ----------------------


def test_a_sample_names_the_package_it_needs():
    import pytest

    from torchbert.apps.samples import package_dir

    for name in ("no_such_package_here", "os"):  # missing, or a module with no data folder
        with pytest.raises(ValueError, match=f"^this sample is read from the '{name}' package: pip install {name}$"):
            package_dir(name)


def test_wnut16_tweets_end_at_blank_or_tab_only_lines_and_tags_are_trimmed(tmp_path, monkeypatch):
    from torchbert.apps import samples

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "ner.txt").write_text("Empire\tB-facility \nState\tI-facility\n\n\n@me\tO\n  \t\nlast\tO",
                                               encoding="utf-8")
    monkeypatch.setattr(samples, "package_dir", lambda name: tmp_path)
    assert samples.wnut16_sentences() == [(["Empire", "State"], ["B-facility", "I-facility"]), (["@me"], ["O"]),
                                          (["last"], ["O"])]


def test_reviews_are_whitespace_normalized_once_each_and_never_in_both_files(tmp_path, monkeypatch):
    from torchbert.apps import samples

    (tmp_path / "sentiment").mkdir()
    (tmp_path / "sentiment" / "pos.txt").write_text("好  用\n\n  \n很好\n两边都有\n很好\n", encoding="utf-8")
    (tmp_path / "sentiment" / "neg.txt").write_text("太差\n两边都有\n", encoding="utf-8")
    monkeypatch.setattr(samples, "package_dir", lambda name: tmp_path)
    rows = samples.sentiment_reviews()
    assert sorted(rows) == [("太差", "neg"), ("好 用", "pos"), ("很好", "pos")]


def test_peoples_daily_keeps_paragraph_numbers_and_untags_words(tmp_path, monkeypatch):
    from torchbert.apps import samples

    (tmp_path / "tag").mkdir()
    (tmp_path / "tag" / "199801.txt").write_text("甲/n\n\n  \n乙/n\n", encoding="utf-8")
    with monkeypatch.context() as m:
        m.setattr(samples, "package_dir", lambda name: tmp_path)
        assert samples.peoples_daily_lines() == ["甲/n", "乙/n"]  # blank lines left out

    lines = samples.peoples_daily_lines()  # the real file: no blank lines kept, no bracketed compounds in it
    assert len(lines) > 19_000 and all(line.strip() for line in lines)
    assert not any(token.startswith("[") for line in lines for token in line.split())
    monkeypatch.setattr(samples, "peoples_daily_lines", lambda: ["19980101-01/m  迈向/v  １/m  张/q", "Ａ/w  １/m"])
    assert samples.peoples_daily_paragraphs() == ["19980101-01迈向１张", "Ａ１"]


def test_names_are_tagged_by_character_across_adjacent_words(monkeypatch):
    from torchbert.apps import samples

    lines = ["中央/nt  广播/nt  江/nr  泽民/nr  和/c  李/nr  鹏/nr  在/p  北京/ns  。/w  新/a  /w  年/t  好/a  ！/w",
             "短/a  。/w  " + "长/a  " * 101 + "。/w",
             "上海/ns  很/d  大/a"]
    monkeypatch.setattr(samples, "peoples_daily_lines", lambda: lines)
    out = samples.peoples_daily_ner()
    assert [(p, "".join(c)) for p, c, _ in out] == [(0, "中央广播江泽民和李鹏在北京。"), (0, "新年好！"), (2, "上海很大")]
    assert out[0][2] == ["B-ORG", "I-ORG", "I-ORG", "I-ORG", "B-PER", "I-PER", "I-PER", "O", "B-PER", "I-PER", "O",
                         "B-LOC", "I-LOC", "O"]
    assert out[2][2] == ["B-LOC", "I-LOC", "O", "O"]  # the last sentence, with no end mark, and fresh after one


def test_the_ner_split_holds_whole_paragraphs_test_from_the_end(monkeypatch):
    from torchbert.apps import samples

    sentences = [(p, [f"{p}.{k}"], ["O"]) for p in range(10) for k in range(2)]  # paragraph p: two sentences
    monkeypatch.setattr(samples, "peoples_daily_ner", lambda: sentences)
    monkeypatch.setattr(samples, "NER_HELD", 3)
    monkeypatch.setattr(samples, "NER_TRAIN", 5)
    split = samples.ner_split()
    words = {s: [w for ws, _ in x for w in ws] for s, x in split.items()}
    assert words["test"] == ["9.0", "9.1", "8.0"] and words["dev"] == ["7.0", "7.1", "6.0"]  # cut to NER_HELD
    assert len(words["train"]) == 5 and {w.split(".")[0] for w in words["train"]} <= set("012345")
    assert words["train"] != ["5.0", "5.1", "4.0", "4.1", "3.0"]  # shuffled, not in the paragraphs' order
    assert words["train"] == [w for ws, _ in samples.ner_split()["train"] for w in ws]  # the same every time


def test_the_inverse_cloze_task_on_paragraphs_by_hand():
    from torchbert.apps.samples import inverse_cloze, sentences_of

    paragraphs = ["他说：“好。”我们走吧！明天见？", "只有一句。", "甲。乙！", "一。二。三。四。五。六。七。八。"]
    pairs = inverse_cloze(paragraphs, seed=1)
    assert len(pairs) == 2  # fewer than 3 sentences: no pair
    first = next(p for p in pairs if "明天见？" in p["query"] + p["positive"])
    assert first["query"] in ("他说：“好。”", "我们走吧！", "明天见？")  # a whole sentence, closing quote kept
    assert sorted(first["positive"] + first["query"]) == sorted(paragraphs[0]) and first["query"] not in first["positive"]
    many = [f"第{i}句。第{i}句又一句。第{i}句的最后一句。" for i in range(8)]
    order = [next(i for i in range(8) if f"第{i}句" in p["positive"]) for p in inverse_cloze(many, seed=1)]
    assert sorted(order) == list(range(8)) and order != list(range(8))  # each paragraph once, shuffled
    assert inverse_cloze(paragraphs, seed=1) == pairs  # the same for the same seed
    rows = inverse_cloze(["一二三四。五六七八。九十。"], seed=0)
    assert sorted(sentences_of(rows)) == ["一二三四。", "五六七八。"]  # "九十。" is under 4 characters


def test_squad_as_retrieval_leaves_out_unanswerable_questions(tmp_path):
    import json

    from torchbert.apps.samples import jsonl_text, squad_retrieval

    squad = {"data": [{"paragraphs": [{"context": "Paris is in France.", "qas": [
        {"question": "Where is Paris?"}, {"question": "Where is Atlantis?", "is_impossible": True}]}]}]}
    (tmp_path / "dev.json").write_text(json.dumps(squad), encoding="utf-8")
    rows = squad_retrieval(tmp_path / "dev.json")
    assert rows == [{"query": "Where is Paris?", "positive": "Paris is in France."}]
    assert jsonl_text([{"query": "北京"}]) == '{"query": "北京"}\n'  # Chinese as itself, not \\u escapes


def test_help_lists_each_sample_with_its_whole_description_in_one_column():
    from torchbert.apps.samples import SAMPLES
    from torchbert.commands.samples import EPILOG

    listing = EPILOG.split("samples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    column = 4 + max(map(len, SAMPLES))
    entries: list[list[str]] = []
    for line in listing:
        assert len(line) <= 100
        if line.startswith(" " * column):
            entries[-1].append(line[column:])
        else:
            assert line[:column] == f"  {line.split()[0]:<{column - 2}}"
            entries.append([line.split()[0], line[column:]])
    assert {name: " ".join(rest) for name, *rest in entries} == SAMPLES
