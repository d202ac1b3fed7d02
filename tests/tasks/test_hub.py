"""hf:NAME[:CONFIG]:SPLIT task data: rows as `datasets` yields them become files our readers read.

The `datasets` library and a network are optional and never needed here: rows shaped like the hub's
(GLUE, MNLI, CoNLL-2003, SQuAD v2, SWAG) go through the writer, and a stand-in `datasets` module
checks the path from `read_examples`."""

import json
import sys
import types

import pytest

from torchbert.tasks import hub
from torchbert.tasks.families import read_examples


class ClassLabel:
    def __init__(self, *names):
        self.names = list(names)


class Sequence:
    def __init__(self, feature):
        self.feature = feature


class Value:
    pass


def test_parse():
    assert hub.parse("hf:nyu-mll/glue:sst2:train") == ("nyu-mll/glue", "sst2", "train")
    assert hub.parse("hf:conll2003:validation") == ("conll2003", None, "validation")
    for bad in ("hf:glue", "hf:a:b:c:d", "hf::train"):
        with pytest.raises(ValueError, match="hf:NAME:SPLIT"):
            hub.parse(bad)


def test_sentence_and_pair_rows(tmp_path):
    rows = [{"sentence": "a fine film", "label": 1, "idx": 0}, {"sentence": "dull", "label": 0, "idx": 1}]
    path = hub.write_rows(rows, {"label": ["negative", "positive"]}, "text", tmp_path / "sst2.jsonl")
    ex = read_examples(path, "classification")
    assert [(e.text_a, e.label) for e in ex] == [("a fine film", "positive"), ("dull", "negative")]
    mnli = [{"premise": "A man sleeps.", "hypothesis": "A man is awake.", "label": 2, "idx": 0},
            {"premise": "It rains.", "hypothesis": "It is wet.", "label": -1, "idx": 1}]  # -1: a hidden test label
    path = hub.write_rows(mnli, {"label": ["entailment", "neutral", "contradiction"]}, "text", tmp_path / "m.jsonl")
    ex = read_examples(path, "pair", labelled=False)
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [("A man sleeps.", "A man is awake.", "contradiction"),
                                                           ("It rains.", "It is wet.", None)]
    with pytest.raises(ValueError, match="no text columns"):
        hub.write_rows([{"review": "x", "label": 0}], {}, "text", tmp_path / "x.jsonl", source="hf:r:train")


def test_token_rows(tmp_path):
    rows = [{"id": "0", "tokens": ["EU", "rejects", "German", "call"], "ner_tags": [3, 0, 7, 0]},
            {"id": "1", "tokens": [], "ner_tags": []}]  # empty sentences are dropped
    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    path = hub.write_rows(rows, {"ner_tags": names}, "conll", tmp_path / "c.conll")
    ex = read_examples(path, "token")
    assert [(e.words, e.tags) for e in ex] == [(["EU", "rejects", "German", "call"], ["B-ORG", "O", "B-MISC", "O"])]


def test_squad_v2_rows(tmp_path):
    context = "Normandy is a region in France."
    rows = [{"id": "q1", "title": "Normandy", "context": context, "question": "Where is Normandy?",
             "answers": {"text": ["France"], "answer_start": [24]}},
            {"id": "q2", "title": "Normandy", "context": context, "question": "Who ate it?",
             "answers": {"text": [], "answer_start": []}}]
    path = hub.write_rows(rows, {}, "squad-v2", tmp_path / "s.json")
    ex = read_examples(path, "qa-v2")
    assert [(e.id, [(a.text, a.start) for a in e.answers], e.is_impossible) for e in ex] == [
        ("q1", [("France", 24)], False), ("q2", [], True)]


def test_swag_rows(tmp_path):
    rows = [{"video-id": "v", "sent1": "She opens the door.", "sent2": "She", "ending0": "walks in.",
             "ending1": "eats the door.", "ending2": "flies.", "ending3": "sings a door.", "label": 0}]
    path = hub.write_rows(rows, {}, "swag", tmp_path / "w.jsonl")
    (e,) = read_examples(path, "multiple-choice")
    assert (e.context, e.question, e.choices[0], len(e.choices), e.label) == (
        "She opens the door.", "She", "walks in.", 4, 0)


def test_read_examples_goes_through_datasets(monkeypatch):
    calls = []

    class Split(list):
        features = {"sentence": Value(), "label": ClassLabel("unacceptable", "acceptable")}

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        if split == "nope":
            raise KeyError("Unknown split \"nope\"")
        return Split([{"sentence": "The book was read.", "label": 1}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    (e,) = read_examples("hf:nyu-mll/glue:cola:train", "classification", layout="glue-cola")
    assert (e.text_a, e.label) == ("The book was read.", "acceptable") and calls == [("nyu-mll/glue", "cola", "train")]
    with pytest.raises(ValueError, match=r"hf:glue:cola:nope: could not load it with datasets \(KeyError"):
        read_examples("hf:glue:cola:nope", "classification")
    tags = types.SimpleNamespace(features={"tokens": Sequence(Value()), "ner_tags": Sequence(ClassLabel("O", "B-X"))})
    assert hub._class_names(tags.features["ner_tags"]) == ["O", "B-X"] and hub._class_names(Value()) is None


def test_without_datasets_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ValueError, match="pip install datasets"):
        read_examples("hf:glue:sst2:train", "classification")


def test_a_split_with_hidden_labels_reads_as_prediction_input(monkeypatch):
    """GLUE's test splits label every row -1: they are written unlabelled, which predict reads
    (labelled=False) and training refuses, naming the split by the name it was given."""

    class Split(list):
        features = {"sentence": Value(), "label": ClassLabel("negative", "positive")}

    rows = Split([{"sentence": "a fine film", "label": -1}])
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, split: rows))
    (e,) = read_examples("hf:nyu-mll/glue:sst2:test", "classification", labelled=False)
    assert (e.text_a, e.label) == ("a fine film", None)
    with pytest.raises(ValueError, match=r"^hf:nyu-mll/glue:sst2:test:1: no label column"):  # not a temporary file
        read_examples("hf:nyu-mll/glue:sst2:test", "classification")


def fake_datasets(monkeypatch, rows, features, error=None):
    """A stand-in `datasets` whose load_dataset gives `rows` with `features` (or raises `error`)."""

    class Split(list):
        pass

    found = Split(rows)
    found.features = features

    def load_dataset(name, config, split):
        if error is not None:
            raise error
        return found

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))


def test_export_names_its_file_after_the_split_and_keeps_unnamed_labels(monkeypatch, tmp_path):
    """The file is named after the spec, its slashes and colons made safe; a label column without
    class names (a plain integer) is written as it is."""
    fake_datasets(monkeypatch, [{"sentence": "a fine film", "label": 3}], {"sentence": Value(), "label": Value()})
    path = hub.export("hf:user/stars:default:train", "text", tmp_path)
    assert path == tmp_path / "user_stars_default_train.jsonl"
    assert path.read_text() == '{"sentence": "a fine film", "label": 3}\n'
    fake_datasets(monkeypatch, [], {}, error=ValueError("Bad split: nope.\nAvailable splits: ['train']"))
    with pytest.raises(ValueError, match=r"could not load it with datasets \(ValueError: Bad split: nope.\)$"):
        hub.export("hf:user/stars:nope", "text", tmp_path)


def test_what_the_writers_write_and_refuse(tmp_path):
    with pytest.raises(ValueError, match="unknown task file format 'xml'; expected one of text, conll"):
        hub.write_rows([{"sentence": "a"}], {}, "xml", tmp_path / "x")
    with pytest.raises(ValueError, match="^hf:a:train: the split is empty$"):
        hub.write_rows([], {}, "text", tmp_path / "x.jsonl", source="hf:a:train")
    # text: Chinese as it is, labels already named kept, a folder made; one of a pair's columns is not a pair
    path = hub.write_rows([{"text": "很好看", "label": "pos"}], {"label": ["neg", "pos"]}, "text",
                          tmp_path / "new" / "c.jsonl")
    assert path.read_text(encoding="utf-8") == '{"sentence": "很好看", "label": "pos"}\n'
    with pytest.raises(ValueError, match="no text columns for a sentence task; it has label, sentence1"):
        hub.write_rows([{"sentence1": "a", "label": 0}], {}, "text", tmp_path / "p.jsonl")
    # conll: no blank line for an empty sentence; words need tags
    path = hub.write_rows([{"tokens": ["a", "b"], "tags": ["O", "O"]}, {"tokens": [], "tags": []},
                           {"tokens": ["c"], "tags": ["O"]}], {}, "conll", tmp_path / "t.conll")
    assert path.read_text() == "a\tO\nb\tO\n\nc\tO\n\n"
    with pytest.raises(ValueError, match=r"a token task needs a word column \(tokens/words\) and a tag column"):
        hub.write_rows([{"tokens": ["a"], "id": "0"}], {}, "conll", tmp_path / "u.conll")
    # squad: the title and the version kept; the four columns it needs
    row = {"id": "q", "title": "T", "context": "c", "question": "q?", "answers": {"text": ["c"], "answer_start": [0]}}
    squad = json.loads(hub.write_rows([row], {}, "squad-v2", tmp_path / "s.json").read_text())
    assert (squad["version"], squad["data"][0]["title"]) == ("v2.0", "T")
    assert json.loads(hub.write_rows([row], {}, "squad", tmp_path / "s1.json").read_text())["version"] == "1.1"
    with pytest.raises(ValueError, match="needs id, context, question and answers; missing answers, question"):
        hub.write_rows([{"id": "q", "context": "c"}], {}, "squad", tmp_path / "s2.json")
    # swag: ending0..ending10 in number order, other ending* columns left out, a hidden label (-1) unlabelled
    endings = {f"ending{i}": f"e{i}" for i in range(11)}
    (line,) = hub.write_rows([{"sent1": "s", "ending_note": "x", **endings, "label": -1}], {}, "swag",
                             tmp_path / "w.jsonl").read_text().splitlines()
    assert json.loads(line) == {"id": "0", "context": "s", "question": "", "choices": [f"e{i}" for i in range(11)]}
    with pytest.raises(ValueError, match="a multiple-choice split needs SWAG's sent1"):
        hub.write_rows([{"startphrase": "s", **endings}], {}, "swag", tmp_path / "w2.jsonl")
