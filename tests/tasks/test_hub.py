"""hf:NAME[:CONFIG]:SPLIT task data: rows as `datasets` yields them become files our readers read.

The `datasets` library and a network are optional and never needed here: rows shaped like the hub's
(GLUE, MNLI, CoNLL-2003, SQuAD v2, SWAG) go through the writer, and a stand-in `datasets` module
checks the path from `read_examples`."""

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
