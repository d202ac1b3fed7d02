"""Every registered task family on every architecture it has a head for (timm's pattern: a family is
tested by being registered): its example file read, a label set, the model made from its config, one
training step that gives every trainable parameter a gradient, prediction read back into one record
per example, and the scores it says it reports. A toy family registered here runs through
`torchbert finetune`, `evaluate` and `predict` without a line changed elsewhere."""

import json
import math
from dataclasses import dataclass, replace

import pytest
import torch

import realdata
from torchbert import BertConfig
from torchbert.config import ELMoConfig, GPTConfig
from torchbert.tasks.batches import TaskData
from torchbert.architectures import ARCHITECTURES
from torchbert.settings import setting
from torchbert.tasks.families import FAMILIES, TaskSettings, register_family, task_settings
from torchbert.tasks.predict import id2label, predict
from torchbert.tokenizer import BertTokenizer


def architectures():
    return [(t, a) for t, fam in FAMILIES.items() for a in ARCHITECTURES if a in fam.heads]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained(realdata.minilm_dir())


def tiny_config(architecture: str, vocab_size: int):
    bert = BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    return {"bert": bert, "gpt": GPTConfig.like(bert), "elmo": ELMoConfig.like(bert)}[architecture]


def check_family(task_type: str, architecture: str, tokenizer, folder) -> None:
    fam = FAMILIES[task_type]
    name, text = fam.example_file
    assert name and text, f"{task_type}: no example_file"
    path = folder / name
    path.write_text(text, encoding="utf-8")
    examples = fam.read(path)
    assert len(examples) >= 2 and len({e.id for e in examples}) == len(examples)
    label_map = fam.label_map(examples)
    assert (label_map is not None) == fam.label_set
    config = fam.configure(tiny_config(architecture, tokenizer.vocab_size), label_map)
    torch.manual_seed(0)
    model = fam.model_for(config)(config).train()
    ts = task_settings(task_type, TaskSettings(type=task_type, max_length=48, doc_stride=16))  # the family's own
    data = TaskData(fam.encode(tokenizer, examples, ts, label_map, training=True), fam)
    batch = next(iter(data.all_batches(64)))
    assert fam.count(batch) > 0 and fam.total(data) >= fam.count(batch)
    out = model(**batch.model_inputs(), **fam.targets(batch))
    assert out.loss is not None and out.loss.dim() == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads), "no parameter learns"
    assert 0 <= int(fam.correct(out, batch)) <= fam.count(batch)

    encoded = fam.encode(tokenizer, examples, ts, label_map, training=False)
    records = predict(model.eval(), TaskData(encoded, fam), examples, ts, id2label(model.config), 8,
                      torch.device("cpu"))
    assert [r["id"] for r in records] == [e.id for e in examples]
    json.dumps(records)  # what predict writes
    scores = fam.score(records, examples, label_map)
    assert set(fam.metrics) <= set(scores) and all(isinstance(v, float) for v in scores.values())
    assert fam.best_metric(label_map, None) in scores
    unlabelled = fam.read(path, labelled=False)
    assert len(unlabelled) == len(examples)


@pytest.mark.parametrize("task_type,architecture", architectures(), ids=lambda x: x)
def test_every_registered_family_trains_and_predicts_on_every_architecture(task_type, architecture, tokenizer,
                                                                           tmp_path):
    check_family(task_type, architecture, tokenizer, tmp_path)


@pytest.mark.parametrize("task_type", list(FAMILIES))
def test_a_family_says_whether_it_windows_or_cuts_a_long_input(task_type, tokenizer, tmp_path):
    """`windows`, which finetune's note on what --max-length cuts reads: a family that cuts keeps its rows
    whatever the length, the longest losing its end; one that windows makes more rows of a long input."""
    fam = FAMILIES[task_type]
    name, text = fam.example_file
    (tmp_path / name).write_text(text, encoding="utf-8")
    examples = fam.read(tmp_path / name)
    label_map = fam.label_map(examples)

    def rows(max_length: int) -> list[list[int]]:
        ts = task_settings(task_type, TaskSettings(type=task_type, max_length=max_length, doc_stride=2))
        return fam.encode(tokenizer, examples, ts, label_map, training=True).input_ids

    whole = rows(512)
    limit = max(map(len, whole)) - 2
    short = rows(limit)
    assert max(map(len, short)) <= limit
    if fam.windows:
        assert len(short) > len(whole)
    else:
        assert len(short) == len(whole) and sum(map(len, short)) < sum(map(len, whole))


def test_every_family_has_a_bert_head_and_says_what_it_reads():
    assert len(FAMILIES) >= 7
    for t, fam in FAMILIES.items():
        assert "bert" in fam.heads and set(fam.heads) <= set(ARCHITECTURES), t
        assert fam.about and fam.metrics and "auto" in fam.layouts, t


# -- a toy family, registered in a test -------------------------------------------------------------

@dataclass
class LengthSettings(TaskSettings):
    lowercase: bool = setting(False, "lowercase each sentence before it is tokenized")
    max_chars: int = setting(200, "characters of a sentence read, the rest cut off", low=1)


def toy_family():
    """`length`: a text file, one sentence a line, labelled short (< 12 characters) or long by itself: a
    family with its own reader and two settings of its own, on the text family's encoder and heads."""
    from torchbert.tasks.text import TextExample, TextTask

    class LengthTask(TextTask):
        layouts = ("auto",)
        Settings = LengthSettings

        def __init__(self, task_type):
            super().__init__(task_type, pair=False)
            self.about = "a sentence -> short or long    a .txt file, one sentence a line"
            self.example_file = ("lines.txt", "今天下雨了。\nThe film was far too long for me.\nOK then.\n"
                                              "这部电影太长了，我看到一半就睡着了。\nHi there.\nA much longer sentence.\n")

        def _read(self, path, layout, labelled, warn):
            lines = [x.strip() for x in open(path, encoding="utf-8") if x.strip()]
            if not lines:
                raise ValueError(f"{path}: no sentences")
            return [TextExample(str(i), x, None, ("short" if len(x) < 12 else "long") if labelled else None,
                                f"{path}:{i + 1}") for i, x in enumerate(lines)]

        def _encode(self, tokenizer, examples, ts, label2id, training):
            examples = [replace(e, text_a=(e.text_a.lower() if ts.lowercase else e.text_a)[:ts.max_chars])
                        for e in examples]
            return super()._encode(tokenizer, examples, ts, label2id, training)

    return LengthTask("length")


@pytest.fixture
def length_family():
    fam = register_family(toy_family())
    try:
        yield fam
    finally:
        del FAMILIES["length"]
    assert "length" not in FAMILIES


def test_a_name_is_registered_once(length_family):
    with pytest.raises(ValueError, match="'length' is registered already"):
        register_family(toy_family())


@pytest.mark.parametrize("architecture", ["bert", "gpt", "elmo"])
def test_a_toy_family_registered_in_a_test_passes_the_same_checks(length_family, architecture, tokenizer, tmp_path):
    check_family("length", architecture, tokenizer, tmp_path)


def test_a_toy_familys_own_settings_reach_its_encoder_and_its_flags(length_family, tokenizer, tmp_path, capsys):
    from torchbert.cli import main
    from torchbert.tasks.text import TextExample

    examples = [TextExample("0", "The Film Was Far Too Long", None, None)]
    ts = task_settings("length", TaskSettings(type="length", max_length=32))
    assert type(ts) is LengthSettings and (ts.lowercase, ts.max_chars) == (False, 200)
    mine = length_family.encode(tokenizer, examples, replace(ts, lowercase=True, max_chars=12), None, training=False)
    assert mine.input_ids[0] == tokenizer("the film was")["input_ids"]
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    shown = capsys.readouterr().out
    assert "length tasks:\n  --lowercase " in shown and "--max-chars MAX_CHARS" in shown
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert main(["finetune", "--task", "sst2", "--model", str(tmp_path / "m"), "--train", "t.tsv", "--out",
                 str(tmp_path / "o"), "--max-chars", "40"]) == 2
    assert "--max-chars is a setting of length tasks; a classification task does not read it" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_toy_family_registered_in_a_test_runs_through_the_commands(length_family, tokenizer, tmp_path, capsys):
    from torchbert.cli import main
    from torchbert.model import BertModel

    model = tmp_path / "bert"
    BertModel(tiny_config("bert", tokenizer.vocab_size)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    data = tmp_path / "lines.txt"
    data.write_text(length_family.example_file[1], encoding="utf-8")
    run = tmp_path / "run"
    assert main(["finetune", "--task", "length", "--model", str(model), "--train", str(data), "--dev", str(data),
                 "--out", str(run), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3", "--max-length", "32",
                 "--lowercase", "--max-chars", "40", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--data", str(data), "--quiet"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert set(scores) >= {"accuracy", "f1", "mcc", "macro_f1"} and 0 <= scores["accuracy"] <= 1
    # two labels: f1 is one label's, and the JSON names it (scikit-learn's macro F1 is macro_f1)
    assert scores["f1_positive_label"] == json.loads((run / "config.json").read_text())["id2label"]["1"]
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--model", str(run), "--input", str(data), "--out", str(out), "--quiet"]) == 0
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 6 and {r["label"] for r in records} <= {"short", "long"}
    assert all(math.isclose(sum(r["probabilities"].values()), 1, abs_tol=1e-5) for r in records)
    task = json.loads((run / "torchbert.json").read_text())["task"]  # its settings, for evaluate and predict
    assert (task["type"], task["lowercase"], task["max_chars"]) == ("length", True, 40)
