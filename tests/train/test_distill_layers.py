"""The layer losses of distillation (train/distill.py: --hidden-weight, TinyBERT's hidden states, and
--relation-weight, MiniLMv2's self-attention relations): each against a reference written sequence by
sequence without packing or padding (values and gradients by autograd), zero for a student that is its
teacher, and through the command line into a run whose log has their losses and no accuracy."""

import json
import math

import pytest
import torch

from parity import assert_parity
from test_distill import DISTILLED, classification_files, family_data, tokenizer  # noqa: F401 (a fixture)
from test_failures import fails
from torchbert.cli import main as cli
from torchbert.tasks.families import task_settings
from torchbert.train.distill import DistillSettings, DistillTask, student_of, teacher_outputs
from torchbert.train.distill_losses import hidden_loss, layer_map, relation_loss
from torchbert.train.metrics import Window


def test_the_hidden_states_are_paired_as_tinybert_maps_its_layers():
    assert layer_map(6, 2) == [(0, 0), (1, 3), (2, 6)]  # the embeddings, then layer i of K with round(i L / K)
    assert layer_map(12, 4) == [(0, 0), (1, 3), (2, 6), (3, 9), (4, 12)]
    assert layer_map(6, 6) == [(i, i) for i in range(7)]
    assert layer_map(6, 1) == [(0, 0), (1, 6)]


def packed(lengths, width, generator, grad=False):
    x = torch.randn(sum(lengths), width, generator=generator, dtype=torch.float32)
    return x.requires_grad_(grad)


def test_the_hidden_state_loss_is_the_squared_error_of_the_paired_states_sequence_by_sequence():
    g = torch.Generator().manual_seed(0)
    lengths = [3, 7, 1]
    cu = torch.tensor([0, 3, 10, 11])
    student = tuple(packed(lengths, 8, g, grad=True) for _ in range(3))  # embeddings and 2 layers
    teacher = tuple(packed(lengths, 8, g) for _ in range(5))  # embeddings and 4 layers
    pairs = layer_map(4, 2)
    loss = hidden_loss(student, teacher, pairs, cu)
    reference = 0.0
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):  # per sequence: the mean over its tokens and features
        reference = reference + sum(((student[i][a:b] - teacher[j][a:b]) ** 2).mean() for i, j in pairs)
    assert_parity(loss, reference)
    got = torch.autograd.grad(loss, student)
    want = torch.autograd.grad(reference, student)
    for a, b in zip(got, want):
        assert_parity(a, b)
    assert hidden_loss(teacher, teacher, layer_map(4, 4), cu).item() == 0.0


def relations_by_hand(x, heads):
    """One sequence's x [T, H]: each head's softmax(x_a x_a^T / sqrt(d)) [A, T, T]."""
    T, H = x.shape
    d = H // heads
    parts = x.view(T, heads, d).transpose(0, 1)  # [A, T, d]
    return (parts @ parts.transpose(1, 2) / math.sqrt(d)).softmax(-1)


def test_the_relation_loss_is_minilmv2s_kl_of_the_relations_sequence_by_sequence():
    g = torch.Generator().manual_seed(1)
    lengths, heads = [4, 6, 2], 2
    cu = torch.tensor([0, 4, 10, 12])
    student = packed(lengths, 3 * 8, g, grad=True)  # stacked q, k, v: [N, 3H], H 8
    teacher = packed(lengths, 3 * 12, g) * 2  # a wider teacher: relations are T x T whatever the width
    loss = relation_loss(student, teacher, cu, max(lengths), heads)
    reference = 0.0
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        for s, t in zip(student[a:b].chunk(3, -1), teacher[a:b].chunk(3, -1)):  # query, key, value
            p, q = relations_by_hand(t, heads), relations_by_hand(s, heads)
            kl = (p * (p.log() - q.log())).sum(-1)  # [A, T]: KL(teacher || student) of each token's relations
            reference = reference + kl.mean()
    assert_parity(loss, reference)
    assert_parity(torch.autograd.grad(loss, student)[0], torch.autograd.grad(reference, student)[0])
    same = relation_loss(teacher, teacher, cu, max(lengths), heads)
    assert abs(same.item()) < 1e-5
    # padding to a longer block changes nothing: the keys past a sequence's end weigh nothing
    assert_parity(relation_loss(student, teacher, cu, max(lengths) + 5, heads), loss)


@pytest.mark.parametrize("task_type", [t for t in DISTILLED if t != "embedding"])
def test_a_student_that_is_its_teacher_has_no_layer_loss_and_a_smaller_one_has(task_type, tokenizer, tmp_path):
    fam, teacher, data, config = family_data(task_type, tokenizer, tmp_path)
    kept = teacher_outputs(teacher, data, batch_size=4, device="cpu")
    s = DistillSettings(student_layers=3, hidden_weight=2.0, relation_weight=0.5)
    batch = next(data.batches(4))
    same = DistillTask(fam, kept, s, config, teacher_model=teacher).forward(teacher, batch)
    assert abs(same["hidden"][0].item()) < 1e-5 and abs(same["relation"][0].item()) < 1e-5
    student = student_of(teacher, 1, **fam.head_arguments(task_settings(task_type))).eval()
    task = DistillTask(fam, kept, s, student.config, per_step=8.0, teacher_model=teacher, rows_per_step=4.0)
    parts = task.forward(student, batch)
    assert parts["hidden"][0].item() > 0 and parts["relation"][0].item() > 0
    assert parts["hidden"][0].requires_grad and parts["relation"][0].requires_grad
    assert task.weights["hidden"] == 2.0 and task.weights["relation"] == 0.5 and task.per_step["hidden"] == 4.0
    assert task.counts(batch)["hidden"] == len(batch.rows)  # summed over the sequences
    assert not teacher.training  # the teacher runs without dropout


def test_the_layer_losses_need_a_task_student_with_its_teacher(tokenizer, tmp_path):
    fam, teacher, data, config = family_data("classification", tokenizer, tmp_path)
    kept = teacher_outputs(teacher, data, batch_size=4, device="cpu")
    with pytest.raises(ValueError, match="need the teacher model"):
        DistillTask(fam, kept, DistillSettings(student_layers=1, hidden_weight=1.0), config)
    plain = DistillTask(fam, kept, DistillSettings(student_layers=1), config)
    assert plain.parts == ("task", "soft")  # without the layer weights, the teacher is not kept


def test_a_part_without_accuracy_is_logged_with_its_loss_alone():
    from torchbert.train.distributed import Dist
    from torchbert.train.loop import TrainState

    w = Window(("task", "hidden"), Dist(), torch.device("cpu"), unscored=("hidden",))
    w.add({"task": (torch.tensor(2.0), torch.tensor(3)), "hidden": (torch.tensor(1.5), torch.tensor(0))},
          {"task": 4, "hidden": 3}, tokens=10)
    w.commit()
    figures = w.flush(TrainState())
    assert figures["task_accuracy"] == 0.75 and figures["hidden_loss"] == 0.5
    assert "hidden_accuracy" not in figures and figures["loss"] == 0.5 + 0.5


def test_distill_with_the_layer_losses_writes_a_run_that_logs_them(tokenizer, tmp_path, capsys):
    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", train, "--dev", train, "--epochs", "2", "--batch-size", "2", "--quiet"]
    assert cli([str(x) for x in ["finetune", "--task", "classification", "--model", base, "--out",
                                 tmp_path / "teacher", "--max-length", "48", *args]]) == 0
    assert cli([str(x) for x in ["distill", "--teacher", tmp_path / "teacher", "--out", tmp_path / "s",
                                 "--student-layers", "2", "--hidden-weight", "1", "--relation-weight", "2",
                                 *args]]) == 0
    rows = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "hidden_loss" in r]
    assert logged and all(r["hidden_loss"] > 0 and r["relation_loss"] > 0 for r in logged)
    assert not any("hidden_accuracy" in r or "relation_accuracy" in r for r in rows)
    metrics = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert metrics["distill"]["hidden_weight"] == 1.0 and metrics["distill"]["relation_weight"] == 2.0
    capsys.readouterr()
    texts = tmp_path / "texts.txt"
    texts.write_text("a text\nanother text\n", encoding="utf-8")
    fails(capsys, "distill", "--teacher", str(base), "--task", "embedding", "--train", str(texts), "--out",
          str(tmp_path / "e"), "--student-layers", "1", "--hidden-weight", "1", "--quiet", code=2,
          message="--hidden-weight: an embedding student learns the teacher's vectors")
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "n"),
          "--student-layers", "1", "--relation-weight", "-1", *map(str, args), code=2,
          message="--relation-weight must be")


# -- a pretrained student of the user's own (--student) ---------------------------------------------

def own_student(folder, tokenizer, hidden=8, layers=2):
    from torchbert import BertConfig
    from torchbert.model import BertModel

    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=64)
    torch.manual_seed(1)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_pretrained_student_of_another_width_learns_the_teachers_relations(tokenizer, tmp_path, capsys):
    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", train, "--dev", train, "--epochs", "2", "--batch-size", "2", "--quiet"]
    assert cli([str(x) for x in ["finetune", "--task", "classification", "--model", base, "--out",
                                 tmp_path / "teacher", "--max-length", "48", *args]]) == 0
    student = own_student(tmp_path / "small", tokenizer)
    capsys.readouterr()
    assert cli([str(x) for x in ["distill", "--teacher", tmp_path / "teacher", "--out", tmp_path / "s", "--student",
                                 student, "--relation-weight", "1", *args]]) == 0
    assert f"distilled {tmp_path / 'teacher'} into {student}" in capsys.readouterr().out
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["hidden_size"] == 8 and config["num_hidden_layers"] == 2  # the student's own shape
    assert config["id2label"] == json.loads((tmp_path / "teacher" / "config.json").read_text())["id2label"]
    metrics = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert metrics["distill"]["student"] == str(student) and metrics["distill"]["layers"] is None
    rows = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("relation_loss", 0) > 0 for r in rows)
    assert cli(["evaluate", "--model", str(tmp_path / "s"), "--data", str(train), "--out", str(tmp_path / "e.json")]) == 0


def test_a_pretrained_student_that_does_not_fit_is_refused(tokenizer, tmp_path, capsys):
    from torchbert.tokenizer import BertTokenizer

    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", str(train), "--epochs", "1", "--batch-size", "2", "--quiet"]
    assert cli(["finetune", "--task", "classification", "--model", str(base), "--out", str(tmp_path / "teacher"),
                "--max-length", "48", *args]) == 0
    capsys.readouterr()
    student = own_student(tmp_path / "small", tokenizer)
    distill = ["distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "s"), *args]
    fails(capsys, *distill, "--student", str(student), "--hidden-weight", "1", code=2,
          message="--hidden-weight 1: the student is 8 wide and the teacher 16")
    fails(capsys, *distill, "--student", str(student), "--student-layers", "2", code=2, message="give one of them")
    fails(capsys, *distill, code=2, message="--student-layers K, --student FOLDER or --student-config NAME")
    fails(capsys, *distill, "--student", str(tmp_path / "nowhere"), code=2, message="--student")
    other = tmp_path / "other"
    other.mkdir()
    (other / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n",
                                     encoding="utf-8")
    own_student(tmp_path / "other-vocab", BertTokenizer.from_pretrained(other))
    fails(capsys, *distill, "--student", str(tmp_path / "other-vocab"), code=2,
          message="its vocabulary is not the teacher's")
    assert not (tmp_path / "s").exists()


def test_a_fresh_student_of_a_size_takes_the_teachers_vocabulary_and_labels(tokenizer, tmp_path, capsys):
    from torchbert.config import PRESETS
    from torchbert.architectures import load_config
    from torchbert.train.distill import fresh_student_config

    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", str(train), "--epochs", "1", "--batch-size", "2", "--quiet"]
    assert cli(["finetune", "--task", "classification", "--model", str(base), "--out", str(tmp_path / "teacher"),
                "--max-length", "48", *args]) == 0
    teacher = load_config(tmp_path / "teacher")
    tiny = fresh_student_config("tiny", teacher)
    assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.num_attention_heads) == PRESETS["tiny"]
    assert tiny.intermediate_size == 4 * tiny.hidden_size and tiny.vocab_size == teacher.vocab_size
    assert tiny.extra["id2label"] == teacher.extra["id2label"]
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                                 "intermediate_size": 12, "vocab_size": 7}), encoding="utf-8")
    capsys.readouterr()
    assert cli(["distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "s"), "--student-config",
                str(shape), "--relation-weight", "1", *args]) == 0
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (8, 1, 12)
    assert config["vocab_size"] == teacher.vocab_size  # the shape's alone: the vocabulary is the teacher's
    assert f"into fresh weights of {shape}" in capsys.readouterr().out
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "n"), "--student-config",
          "huge", *args, code=2, message="--student-config huge: neither a size")
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "n"), "--student-config",
          "tiny", "--student-layers", "1", *args, code=2, message="give one of them")
