"""Task families (families.py): every task type has one, and each family's parts fit together.

The end-to-end behaviour of each family (read -> encode -> train -> predict -> score) is held by the
fine-tuning CLI tests (train/test_finetune.py) and the step parity with transformers (train/test_training_parity.py);
here: the table itself, what each family scores, and how its batches carry targets."""

import numpy as np
import pytest
import torch

from torchbert.heads import BertForSequenceClassification
from torchbert.tokenizer import BertTokenizer
from torchbert.tasks import formats, hub
from torchbert.tasks.batches import TaskData
from torchbert.losses import IGNORE
from torchbert.tasks.choice import ChoiceExample
from torchbert.tasks.encode import Encoded
from torchbert.tasks.examples import LabelMap
from torchbert.tasks.families import FAMILIES, TaskSettings, family, layouts, task_settings
from torchbert.tasks.qa import Answer, QAExample
from torchbert.tasks.tagging import TokenExample
from torchbert.tasks.text import TextExample

TASK_TYPES = ("classification", "pair", "regression", "token", "qa", "qa-v2", "multiple-choice")  # the paper's


def test_every_task_type_has_a_family_that_the_hub_can_write_and_the_readers_read():
    assert tuple(FAMILIES) == (*TASK_TYPES, "embedding", "reranker")  # in the order --help lists them
    for t in TASK_TYPES:
        fam = family(t)
        assert fam.type == t and fam.metrics
        assert fam.file_format in hub.FORMATS, t
        assert set(fam.layouts) <= set(layouts()) and "auto" in fam.layouts, t
    assert family("regression").heads["bert"] is BertForSequenceClassification
    assert [t for t in TASK_TYPES if family(t).label_set] == ["classification", "pair", "token"]
    with pytest.raises(ValueError, match="unknown task type 'ner'"):
        family("ner")
    with pytest.raises(ValueError, match="embedding tasks read no hub splits"):  # a family without hub files
        family("embedding").read("hf:some/pairs:train")


def example_records():
    """Per task type: (examples, records as predict writes them, label map)."""
    classes = LabelMap(["neg", "pos"])
    text = [TextExample("0", "good", None, "pos"), TextExample("1", "bad", None, "neg")]
    qa = [QAExample("q1", "where?", "in Paris", [Answer("Paris", 3)]), QAExample("q2", "who?", "in Paris", [],
                                                                               is_impossible=True)]
    return {
        "classification": (text, [{"id": "0", "label": "pos"}, {"id": "1", "label": "pos"}], classes),
        "pair": ([TextExample("0", "a", "b", "pos"), TextExample("1", "a", "c", "neg")],
                 [{"id": "0", "label": "pos"}, {"id": "1", "label": "neg"}], classes),
        "regression": ([TextExample(str(i), "a", "b", y) for i, y in enumerate((1.0, 3.0, 2.0))],
                       [{"score": 1.5}, {"score": 2.5}, {"score": 2.0}], None),
        "token": ([TokenExample("0", ["EU", "rejects", "it"], ["B-ORG", "O", "O"])],
                  [{"id": "0", "tags": ["B-ORG", "O", "B-ORG"]}], LabelMap(["B-ORG", "O"])),
        "qa": (qa[:1], [{"id": "q1", "answer": "Paris"}], None),
        "qa-v2": (qa, [{"id": "q1", "answer": "Paris", "span": "Paris", "null_score": 0.0, "span_score": 2.0},
                       {"id": "q2", "answer": "", "span": "in", "null_score": 1.0, "span_score": 0.5}], None),
        "multiple-choice": ([ChoiceExample("0", "She", "opens", ["a door.", "a cat."], 0),
                             ChoiceExample("1", "He", "eats", ["soup.", "rocks."], 0)],
                            [{"choice": 0}, {"choice": 1}], None),
    }


def test_each_family_scores_what_it_reports():
    """Every name in a family's metrics is a key its score() returns, with the value expected."""
    expected = {"classification": ("accuracy", 0.5), "pair": ("accuracy", 1.0), "regression": ("pearson", 1.0),
                "token": ("f1", 2 / 3), "qa": ("f1", 1.0), "qa-v2": ("f1", 1.0), "multiple-choice": ("accuracy", 0.5)}
    for t, (examples, records, label_map) in example_records().items():
        scores = family(t).score(records, examples, label_map)
        assert set(family(t).metrics) <= set(scores), t
        name, value = expected[t]
        assert family(t).best_metric(label_map, None) == name == family(t).metrics[0]
        assert scores[name] == pytest.approx(value), t


def test_token_tasks_choose_their_scoring_by_the_tags():
    entities, pos = LabelMap(["B-PER", "I-PER", "O"]), LabelMap(["n", "v", "nr"])
    fam = family("token")
    assert (fam.scoring(entities), fam.scoring(pos)) == ("entities", "tags")
    assert fam.best_metric(entities, formats.TASK_PRESETS["conll2003"]) == "f1"
    assert fam.best_metric(pos, None) == "accuracy"  # per word: no preset can ask for span F1 of POS tags
    ex = [TokenExample("0", ["他", "来", "北京"], ["nr", "v", "ns"])]
    assert fam.score([{"tags": ["nr", "n", "ns"]}], ex, LabelMap(["n", "nr", "ns", "v"]))["accuracy"] == \
        pytest.approx(2 / 3)
    assert family("pair").scoring(None) is None and family("pair").best_metric(None, formats.TASK_PRESETS["mrpc"]) == "f1"


def test_batches_carry_each_familys_targets():
    """Rows become the head's targets: class ids per sequence, floats for regression, a label per token,
    start/end per window, and for multiple choice a label and a choice count per example."""
    rows = [[101, 7, 102], [101, 8, 9, 102], [101, 5, 102]]
    types = [[0] * len(r) for r in rows]

    def batch(task_type, labels, **extra):
        data = TaskData(Encoded(rows, types, [0, 1, 2], labels=labels, **extra), family(task_type))
        (b,) = data.all_batches(8)
        return b, data

    b, _ = batch("classification", [1, 0, 1])
    assert b.labels.dtype == torch.long and b.labels.tolist() == [[1, 0, 1][r] for r in b.rows]
    assert b.rows.tolist() == [1, 0, 2] == b.units.tolist()  # longest first
    assert family("classification").count(b) == 3 == b.num_targets
    b, _ = batch("regression", [0.5, 1.5, 2.5])
    assert b.labels.dtype == torch.float32 and b.labels.tolist() == [[0.5, 1.5, 2.5][r] for r in b.rows]
    token_labels = [[IGNORE, 1, IGNORE], [IGNORE, 0, IGNORE, IGNORE], [IGNORE, 2, IGNORE]]
    b, data = batch("token", token_labels)
    assert b.labels.tolist() == [t for r in b.rows for t in token_labels[r]]
    assert family("token").count(b) == 3 == family("token").total(data) == b.num_targets
    assert family("token").targets(b)["labelled_only"] is True
    b, _ = batch("qa", [(1, 1), (0, 0), (1, 2)])
    assert b.start_positions.tolist() == [[1, 0, 1][r] for r in b.rows] and b.labels is None and b.num_targets == 3
    assert b.end_positions.tolist() == [[1, 0, 2][r] for r in b.rows]
    b, data = batch("multiple-choice", [1], num_choices=[3])
    assert len(data) == 1 and b.units.tolist() == [0] and b.rows.tolist() == [0, 1, 2]
    assert b.labels.tolist() == [1] and b.num_choices.tolist() == [3]
    assert family("multiple-choice").targets(b)["max_choices"] == 3  # known on the host: the head needs no sync
    assert family("multiple-choice").count(b) == 1 == family("multiple-choice").total(data) == b.num_targets
    assert family("classification").total(TaskData(Encoded(rows, types, [0, 1, 2], labels=[1, 0, 1]),
                                                   family("classification"))) == 3


def test_task_settings_come_back_from_the_run_record_or_an_older_config(tmp_path):
    """A fine-tuned folder's task is in its run record (torchbert.json); a folder of an older torchbert
    kept it in config.json (torchbert_task), which still reads."""
    from torchbert.config import BertConfig
    from torchbert.io.record import RunRecord, write_record

    config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16)
    config.save(tmp_path / "config.json")
    with pytest.raises(ValueError, match="not a model fine-tuned by torchbert"):
        TaskSettings.of(tmp_path)
    write_record(tmp_path, RunRecord("finetune", task={"type": "qa-v2", "max_length": 64, "unknown_later_field": 1}))
    ts = TaskSettings.of(tmp_path)
    assert (ts.type, ts.max_length, ts.doc_stride, type(ts).__name__) == ("qa-v2", 64, 21, "QASettings")
    assert np.isclose(ts.null_threshold, 0.0)
    old = tmp_path / "old"
    config.extra["torchbert_task"] = {"type": "token", "max_length": 32}
    config.save(old / "config.json")
    assert (TaskSettings.of(old).type, TaskSettings.of(old).max_length) == ("token", 32)


def test_task_settings_of_a_preset_keep_its_name_and_layout_and_flags_are_the_cli_ones():
    """A preset's settings name it and read its layout (its files are GLUE's, not ours); a short
    --max-length still has a doc stride of one token or more; `flags()` is what --resume compares:
    the family's command-line settings only, not its type, preset or layout."""
    from torchbert.tasks.families import task_settings

    ts = task_settings("sst2")
    assert (ts.type, ts.preset, ts.layout) == ("classification", "sst2", "glue-sst2")
    assert (task_settings("classification").preset, task_settings("classification").layout) == (None, "auto")
    assert TaskSettings(type="token", max_length=2).doc_stride == 1
    assert set(task_settings("conll2003").flags()) == {"max_length", "doc_stride", "label_all_subtokens"}


def test_a_run_record_of_an_unknown_task_type_is_not_a_fine_tuned_model(tmp_path):
    from torchbert.io.record import RunRecord, write_record

    write_record(tmp_path, RunRecord("finetune", task={"type": "summarization", "max_length": 64}))
    with pytest.raises(ValueError, match="not a model fine-tuned by torchbert"):
        TaskSettings.of(tmp_path)


def test_a_layout_no_family_reads_or_one_of_another_family_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"sentence": "a", "label": "x"}\n')
    with pytest.raises(ValueError, match=r"unknown layout 'glue-sst3'; expected one of auto, "):
        family("classification").read(path, "glue-sst3")
    with pytest.raises(ValueError, match=r"layout 'squad' does not fit a classification task; expected auto, "
                                         r"glue-cola, .* or [a-z-]+$"):
        family("classification").read(path, "squad")


def test_only_label_set_families_keep_labels_and_predict_inputs_drop_theirs(minilm_dir):
    """Classes and tags make a label map (config.json's id2label), scores and spans none. Prediction
    inputs (use_labels=False) lose the labels the model never saw, and sentences tagged in part are
    encoded without tags rather than failing on the first untagged one."""
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    text = [TextExample("0", "good", None, "pos"), TextExample("1", "bad", None, "neg")]
    assert family("classification").label_map(text).labels == ["neg", "pos"]
    assert family("regression").label_map([TextExample("0", "a", "b", 1.0)]) is None
    qa = [QAExample("q1", "where?", "in Paris", [Answer("Paris", 3)])]
    assert family("qa").label_map(qa) is None
    ts, labels = task_settings("classification"), LabelMap(["neg", "pos"])
    fam = family("classification")
    assert fam.encode(tokenizer, text, ts, labels, training=False).labels == [1, 0]
    assert fam.encode(tokenizer, text, ts, labels, training=False, use_labels=False).labels is None
    some = [TokenExample("0", ["EU", "rejects"], None), TokenExample("1", ["it"], ["O"])]  # tagged in part
    assert family("token").encode(tokenizer, some, task_settings("token"), LabelMap(["B-ORG", "O"]),
                                  training=False).labels is None


def test_correct_counts_the_argmax_and_grouped_outputs_keep_each_examples_own_rows():
    from types import SimpleNamespace

    logits = torch.tensor([[0.1, 2.0, 0.3], [3.0, 0.0, 1.0], [0.0, 0.5, 0.2]])
    batch = SimpleNamespace(labels=torch.tensor([1, 2, 1]))
    assert int(family("classification").correct(SimpleNamespace(logits=logits), batch)) == 2
    rows = [[101, 7, 102]] * 5
    data = TaskData(Encoded(rows, [[0] * 3] * 5, [0, 0, 1, 1, 1], labels=[0, 2], num_choices=[2, 3]),
                    family("multiple-choice"))
    (b,) = data.all_batches(8)
    scores = torch.tensor([[0.0, 1.0, float("-inf")], [2.0, 0.0, 0.0]])[b.units]  # [E, max_choices]
    out = dict(family("multiple-choice").outputs(SimpleNamespace(logits=scores), b, {}))
    assert [len(out[0]), len(out[1])] == [2, 3]
    assert out[0] == pytest.approx(torch.tensor([0.0, 1.0]).softmax(-1).tolist())
    assert family("multiple-choice").total(data) == 2


def test_layouts_are_listed_once_and_unknown_task_types_name_the_file(tmp_path):
    from torchbert.tasks.families import read_examples

    assert len(layouts()) == len(set(layouts())) and layouts()[0] == "auto"
    with pytest.raises(ValueError, match=r"^x.jsonl: unknown task type 'ner'; expected one of classification, "):
        read_examples("x.jsonl", "ner")
