"""Distillation (train/distill.py, `torchbert distill`): the student's layers are the teacher's, the
soft-target loss is the KL divergence computed by hand and its gradient the closed form, the teacher's
outputs kept a row at a time are what the teacher gives on any batch, and every family that distils
goes through the command line into an ordinary run folder."""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import realdata
from parity import assert_parity
from test_failures import fails
from torchbert import BertConfig
from torchbert.cli import main as cli
from torchbert.heads import BertForSequenceClassification
from torchbert.io.record import read_record
from torchbert.model import BertModel
from torchbert.tasks.batches import TaskData
from torchbert.tasks.families import FAMILIES, TaskSettings, task_settings
from torchbert.tokenizer import BertTokenizer
from torchbert.train.distill import DistillSettings, DistillTask, distill_texts, student_of, taken_layers, teacher_outputs
from torchbert.train.distill_losses import SOFT_TARGETS, soft_kl
from torchbert.train.objectives import FinetuneTask

DISTILLED = [t for t, fam in FAMILIES.items() if fam.soft_targets is not None]


def test_the_layers_taken_spread_from_first_to_last_as_distilbert_took_them():
    assert taken_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # DistilBERT's, from BERT-base
    assert taken_layers(6, 2) == [0, 5]
    assert taken_layers(6, 3) == [0, 2, 5]
    assert taken_layers(6, 6) == list(range(6))
    assert taken_layers(6, 1) == [0]
    with pytest.raises(ValueError, match="--student-layers 7: the teacher has 6 layers"):
        taken_layers(6, 7)


def tiny(layers=4, labels=3):
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32,
                        extra={"id2label": {str(i): f"c{i}" for i in range(labels)}})
    torch.manual_seed(0)
    return BertForSequenceClassification(config).eval()


def test_a_student_is_the_teacher_run_with_the_layers_it_took():
    teacher = tiny(layers=4)
    student = student_of(teacher, 2).eval()
    assert student.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4
    for i, j in enumerate([0, 3]):
        for (name, a), (_, b) in zip(student.bert.layers[i].state_dict().items(),
                                     teacher.bert.layers[j].state_dict().items()):
            assert torch.equal(a, b), name  # copied, not computed
    assert torch.equal(student.classifier.weight, teacher.classifier.weight)
    assert torch.equal(student.bert.embeddings.word.weight, teacher.bert.embeddings.word.weight)
    assert student.classifier.weight.data_ptr() != teacher.classifier.weight.data_ptr()  # its own copy
    # the reference: the teacher itself with its other layers removed
    reference = tiny(layers=4)
    reference.bert.layers = nn.ModuleList([reference.bert.layers[0], reference.bert.layers[3]])
    ids = torch.randint(1, 50, (3, 9))
    assert_parity(student(ids).logits, reference(ids).logits)
    plain = student_of(BertModel(teacher.config), 3)  # a BertModel without a head, too
    assert len(plain.layers) == 3


def kl_by_hand(s: np.ndarray, t: np.ndarray, T: float) -> float:
    total = 0.0
    for srow, trow in zip(s, t):
        p = np.exp(trow / T) / np.exp(trow / T).sum()
        q = np.exp(srow / T) / np.exp(srow / T).sum()
        total += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    return total * T * T


@pytest.mark.parametrize("T", [1.0, 2.0, 5.0])
def test_the_soft_target_loss_is_the_kl_divergence_and_its_gradient_the_closed_form(T):
    g = torch.Generator().manual_seed(1)
    s = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(5, 4, generator=g, dtype=torch.float64) * 3
    loss = soft_kl(s, t, T)
    assert loss.item() == pytest.approx(kl_by_hand(s.detach().numpy(), t.numpy(), T), rel=1e-5)
    loss.backward()
    # d/ds T^2 KL(p || softmax(s / T)) = T (softmax(s / T) - p), in float32 as soft_kl computes
    closed = T * ((s.detach() / T).softmax(-1) - (t / T).softmax(-1))
    assert_parity(s.grad.float(), closed.float())
    assert soft_kl(t, t, T).item() == pytest.approx(0.0, abs=1e-5)


def test_masked_entries_weigh_nothing_in_the_soft_target_loss():
    s, t = torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False], [True, True, True, False, False]])
    by_row = sum(soft_kl(s[i:i + 1, m], t[i:i + 1, m], 2.0) for i, m in enumerate(mask))
    junk_s, junk_t = s.masked_fill(~mask, 1e4), t.masked_fill(~mask, -1e4)
    assert_parity(soft_kl(junk_s, junk_t, 2.0, mask), by_row)


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained(realdata.minilm_dir())


def family_data(task_type, tokenizer, folder):
    fam = FAMILIES[task_type]
    name, text = fam.example_file
    (folder / name).write_text(text, encoding="utf-8")
    examples = fam.read(folder / name)
    label_map = fam.label_map(examples)
    config = fam.configure(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=3,
                                      num_attention_heads=2, intermediate_size=32, max_position_embeddings=64),
                           label_map)
    ts = task_settings(task_type, TaskSettings(type=task_type, max_length=48, doc_stride=16))
    torch.manual_seed(0)
    teacher = fam.model_for(config)(config, **fam.head_arguments(ts)).eval()
    data = TaskData(fam.encode(tokenizer, examples, ts, label_map, training=True), fam, seed=3)
    return fam, teacher, data, config


@pytest.mark.parametrize("task_type", DISTILLED)
def test_the_teachers_outputs_kept_by_row_are_what_it_gives_on_any_batch(task_type, tokenizer, tmp_path):
    fam, teacher, data, config = family_data(task_type, tokenizer, tmp_path)
    kept = teacher_outputs(teacher, data, batch_size=2, device="cpu")  # batches unlike the training ones
    assert not teacher.training  # left as it was: in eval mode
    for batch in data.batches(3, epoch=1):
        with torch.no_grad():
            direct = teacher(**batch.model_inputs(), **fam.targets(batch))
        got = kept.of(batch)
        values, _ = kept.kind.pieces(direct, batch)
        want = kept.kind.gather(values, batch)
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
            assert a.shape == b.shape
            if a.dtype == torch.bool:
                assert torch.equal(a, b)
            else:
                assert_parity(a, b)
        # the student that is the teacher learns nothing more from it: the soft loss is (close to) 0
        task = DistillTask(fam, kept, DistillSettings(student_layers=3, soft_weight=1.0), config)
        parts = task.forward(teacher, batch)
        assert abs(parts["soft"][0].item()) < 1e-4 * max(1, batch.num_targets)


@pytest.mark.parametrize("task_type", ["classification", "token", "multiple-choice"])
def test_with_no_soft_weight_the_loss_is_fine_tunings(task_type, tokenizer, tmp_path):
    fam, teacher, data, config = family_data(task_type, tokenizer, tmp_path)
    student = student_of(teacher, 1, **fam.head_arguments(task_settings(task_type))).eval()
    kept = teacher_outputs(teacher, data, batch_size=4, device="cpu")
    batch = next(data.batches(4))
    parts = DistillTask(fam, kept, DistillSettings(student_layers=1, soft_weight=0.0), config).forward(student, batch)
    plain = FinetuneTask(fam).forward(student, batch)
    assert torch.equal(parts["task"][0], plain["task"][0])  # one computation, run twice
    assert parts["soft"][0].item() > 0  # the student is not the teacher


def tiny_pretrained(folder, tokenizer):
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("task_type", DISTILLED)
def test_distill_writes_a_run_folder_of_the_teachers_task_for_every_family(task_type, tokenizer, tmp_path, capsys):
    fam = FAMILIES[task_type]
    name, text = fam.example_file
    train = tmp_path / name
    train.write_text(text, encoding="utf-8")
    base = tiny_pretrained(tmp_path / "base", tokenizer)
    common = ["--train", train, "--dev", train, "--epochs", "2", "--batch-size", "2", "--quiet"]
    assert cli([str(x) for x in ["finetune", "--task", task_type, "--model", base, "--out", tmp_path / "teacher",
                                 "--max-length", "48", *common]]) == 0
    assert cli([str(x) for x in ["distill", "--teacher", tmp_path / "teacher", "--out", tmp_path / "student",
                                 "--student-layers", "2", *common]]) == 0
    out = capsys.readouterr().out
    assert "distilled" in out and "into 2 layers (the teacher's 0 and 2 of 3)" in out
    student = tmp_path / "student"
    metrics = json.loads((student / "metrics.json").read_text())
    assert metrics["distill"]["layers"] == [0, 2] and metrics["distill"]["teacher"] == str(tmp_path / "teacher")
    assert json.loads((student / "config.json").read_text())["num_hidden_layers"] == 2
    record = read_record(student)
    assert record.made == "distill" and record.task["type"] == task_type and record.task["max_length"] == 48
    assert record.training["student_layers"] == 2 and record.training["soft_weight"] == 0.5
    assert cli(["evaluate", "--model", str(student), "--data", str(train), "--out", str(tmp_path / "e.json")]) == 0
    assert fam.best_metric(None if not fam.label_set else fam.label_map(fam.read(train)), None) in \
        json.loads((tmp_path / "e.json").read_text())


def classification_files(folder, tokenizer):
    """The classification family's example file, and a tiny pretrained BERT to fine-tune a teacher from."""
    name, text = FAMILIES["classification"].example_file
    (folder / name).write_text(text, encoding="utf-8")
    return folder / name, tiny_pretrained(folder / "base", tokenizer)


def test_a_resumed_distillation_keeps_its_settings(tokenizer, tmp_path, capsys):
    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", train, "--epochs", "1", "--batch-size", "2", "--quiet"]
    assert cli([str(x) for x in ["finetune", "--task", "classification", "--model", base, "--out",
                                 tmp_path / "teacher", "--max-length", "48", *args]]) == 0
    distill = ["distill", "--teacher", tmp_path / "teacher", "--out", tmp_path / "s", "--student-layers", "1", *args]
    assert cli([str(x) for x in distill]) == 0
    capsys.readouterr()
    fails(capsys, *map(str, distill), "--resume", "--temperature", "3", code=2,
          message="--temperature 3.0: the run in")


def test_distill_refuses_what_it_cannot_distil(tokenizer, tmp_path, capsys):
    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", str(train), "--epochs", "1", "--batch-size", "2", "--quiet"]
    fails(capsys, "distill", "--teacher", str(base), "--out", str(tmp_path / "s"), "--student-layers", "1", *args,
          code=2, message="not a model fine-tuned by torchbert")
    fails(capsys, "distill", "--teacher", str(tmp_path / "nothing"), "--out", str(tmp_path / "s"),
          "--student-layers", "1", *args, code=2, message="--teacher")
    assert cli(["finetune", "--task", "classification", "--model", str(base), "--out", str(tmp_path / "teacher"),
                "--max-length", "48", *args]) == 0
    capsys.readouterr()
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "s"),
          "--student-layers", "4", *args, code=2, message="--student-layers 4: the teacher has 3 layers")
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "s"),
          "--student-layers", "0", *args, code=2, message="--student-layers must be >= 1")
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "s"),
          "--student-layers", "1", "--soft-weight", "1.5", *args, code=2, message="--soft-weight must be in [0, 1], got 1.5")
    other = tmp_path / "other.tsv"
    other.write_text("sentence\tlabel\na new thing\tsurprise\n", encoding="utf-8")
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "s"),
          "--student-layers", "1", "--train", str(other), "--epochs", "1", code=2, message="surprise")
    assert not (tmp_path / "s").exists()


# -- texts without labels that the teacher labels (--unlabeled) ---------------------------------------

@pytest.mark.parametrize("task_type", ["classification", "token"])
def test_texts_without_labels_add_to_the_soft_loss_alone_and_the_task_loss_is_over_the_labelled_targets(
        task_type, tokenizer, tmp_path):
    from torchbert.losses import IGNORE
    from torchbert.train.distill import UNLABELLED, mark_unlabelled

    fam, teacher, data, config = family_data(task_type, tokenizer, tmp_path)
    examples = max(data.encoded.example_index) + 1
    gold = [list(x) if isinstance(x, list) else x for x in data.encoded.labels]
    first = mark_unlabelled(data.encoded, examples // 2)  # the second half: texts without labels
    assert first == data.encoded.example_index.index(examples // 2)
    for r, labels in enumerate(data.encoded.labels):  # each target of theirs UNLABELLED, nothing else changed
        want = gold[r] if r < first else ([UNLABELLED if t != IGNORE else IGNORE for t in gold[r]]
                                          if isinstance(gold[r], list) else UNLABELLED)
        assert labels == want
    kept = teacher_outputs(teacher, data, batch_size=3, device="cpu")
    student = student_of(teacher, 1, **fam.head_arguments(task_settings(task_type))).eval()
    with torch.no_grad():
        student.classifier.weight.mul_(300)  # outputs far from the teacher's: losses well above rounding
    task = DistillTask(fam, kept, DistillSettings(student_layers=1, temperature=2.0), config, per_step=8.0,
                       labelled_rows=first)

    def targets(r):  # a row's gold targets, in order
        return [t for t in gold[r] if t != IGNORE] if isinstance(gold[r], list) else [gold[r]]

    labelled_targets = sum(len(targets(r)) for r in range(first))
    assert task.per_step == pytest.approx({"task": 8.0 * labelled_targets / kept.starts[-1], "soft": 8.0})
    seen = set()
    for batch in data.batches(2, epoch=1):
        rows = batch.rows.tolist()
        parts = task.forward(student, batch)
        with torch.no_grad():
            at_targets = {"labels": torch.zeros_like(batch.labels), "labelled_only": True,  # the targets' logits
                          "label_positions": batch.label_positions} if task_type == "token" else {}
            logits = student(**batch.model_inputs(), **at_targets).logits
        per_row = [len(targets(r)) for r in rows]
        assert task.counts(batch) == {"task": sum(n for n, r in zip(per_row, rows) if r < first),
                                      "soft": sum(per_row)}
        at, hard = 0, 0.0
        for n, r in zip(per_row, rows):  # the cross-entropy of each labelled target, by hand
            if r < first:
                hard += sum(-torch.log_softmax(logits[at + k], -1)[t] for k, t in enumerate(targets(r)))
            at += n
        assert parts["task"][0].item() == pytest.approx(float(hard), rel=1e-5, abs=1e-6)
        soft = kl_by_hand(logits.numpy(), kept.of(batch).numpy(), 2.0)
        assert soft > 0.1 and parts["soft"][0].item() == pytest.approx(soft, rel=1e-4)  # every target
        assert parts["soft"][1].item() == (logits.argmax(-1) == kept.of(batch).argmax(-1)).sum().item()
        seen.add(any(r < first for r in rows) + 2 * any(r >= first for r in rows))
    assert {1, 2} <= seen or 3 in seen  # batches of labelled and of unlabelled rows were both checked


def test_distill_learns_the_teachers_outputs_on_unlabelled_texts(tokenizer, tmp_path, capsys):
    import gzip

    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", str(train), "--dev", str(train), "--epochs", "1", "--batch-size", "2", "--quiet"]
    assert cli(["finetune", "--task", "classification", "--model", str(base), "--out", str(tmp_path / "teacher"),
                "--max-length", "48", *args]) == 0
    corpus = tmp_path / "more.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        f.write("a text with no label\n\nanother one\na text with no label\n")
    capsys.readouterr()
    distill = ["distill", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "s"), "--student-layers",
               "1", "--unlabeled", str(corpus), *args[:-1]]
    assert cli(distill) == 0
    err = capsys.readouterr().err
    examples = len(FAMILIES["classification"].read(train))
    assert f"{examples + 2} sequences (2 of them {corpus}'s texts, without labels)" in err  # each text once
    metrics = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert metrics["distill"]["unlabeled"] == str(corpus) and metrics["distill"]["unlabeled_examples"] == 2
    assert metrics["train_examples"] == examples
    record = read_record(tmp_path / "s")
    assert record.training["unlabeled"] == str(corpus) and len(record.training["unlabeled_sha256"]) == 64
    corpus.write_bytes(gzip.compress(b"changed\n"))
    fails(capsys, *distill, "--resume", code=2, message="unlabeled")  # another file than the run's


def test_a_tagging_student_learns_the_teachers_tags_of_sentences_cut_into_words(tokenizer, tmp_path, capsys):
    from torchbert.train.distill import unlabeled_examples

    name, text = FAMILIES["token"].example_file
    train = tmp_path / name
    train.write_text(text, encoding="utf-8")
    corpus = tmp_path / "more.jsonl"
    corpus.write_text('{"text": "北京欢迎你"}\n{"text": "John visits Paris."}\n', encoding="utf-8")
    got = unlabeled_examples(FAMILIES["token"], corpus, "auto")
    assert [e.words for e in got] == [["北", "京", "欢", "迎", "你"], ["John", "visits", "Paris", "."]]
    assert all(e.tags is None for e in got)
    conll = tmp_path / "more.conll"  # a CoNLL file: its words, its tags unread
    conll.write_text("Anna B-PER\nsings O\n", encoding="utf-8")
    assert [(e.words, e.tags) for e in unlabeled_examples(FAMILIES["token"], conll, "auto")] == [(["Anna", "sings"], None)]
    metrics = distilled_with_unlabeled("token", train, corpus, tokenizer, tmp_path, capsys)
    assert metrics["distill"]["unlabeled_examples"] == 2 and metrics["train_examples"] == len(FAMILIES["token"].read(train))


def distilled_with_unlabeled(task_type, train, more, tokenizer, folder, capsys) -> dict:
    """A teacher of `task_type` fine-tuned one epoch from a tiny BERT on `train`, then a 1-layer student
    distilled on `train` and `more` (--unlabeled): the student's metrics.json."""
    base = tiny_pretrained(folder / "base", tokenizer)
    args = ["--train", str(train), "--dev", str(train), "--epochs", "1", "--batch-size", "2", "--quiet"]
    assert cli(["finetune", "--task", task_type, "--model", str(base), "--out", str(folder / "teacher"),
                "--max-length", "48", *args]) == 0
    capsys.readouterr()
    assert cli(["distill", "--teacher", str(folder / "teacher"), "--out", str(folder / "s"), "--student-layers",
                "1", "--unlabeled", str(more), *args]) == 0
    return json.loads((folder / "s" / "metrics.json").read_text())


def test_unlabelled_texts_are_refused_where_they_do_not_fit(tokenizer, tmp_path, capsys):
    from torchbert.train.distill import unlabeled_examples

    texts = tmp_path / "texts.txt"
    texts.write_text("one text\n", encoding="utf-8")
    for other in ("regression", "reranker"):
        with pytest.raises(ValueError, match=rf"--unlabeled .*texts.txt: a {other} student learns from its labelled"):
            unlabeled_examples(FAMILIES[other], texts, "auto")
    with pytest.raises(ValueError, match=r"texts.txt: this model reads two texts an example"):
        unlabeled_examples(FAMILIES["pair"], texts, "auto")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"blank.txt: no text in it; the teacher labels texts"):
        unlabeled_examples(FAMILIES["classification"], blank, "auto")
    with pytest.raises(ValueError, match=r"--unlabeled .*none.txt: no such file"):
        unlabeled_examples(FAMILIES["classification"], tmp_path / "none.txt", "auto")
    pairs = tmp_path / "pairs.jsonl"  # a pair task's file in its layout: labels, if any, are not read
    pairs.write_text('{"sentence1": "a", "sentence2": "b", "label": "x"}\n{"sentence1": "c", "sentence2": "d"}\n',
                     encoding="utf-8")
    got = unlabeled_examples(FAMILIES["pair"], pairs, "auto")
    assert [(e.text_a, e.text_b, e.label) for e in got] == [("a", "b", None), ("c", "d", None)]
    base = tiny_pretrained(tmp_path / "base", tokenizer)
    fails(capsys, "distill", "--teacher", str(base), "--task", "embedding", "--train", str(texts), "--out",
          str(tmp_path / "e"), "--student-layers", "1", "--unlabeled", str(texts), code=2,
          message="an embedding student learns from texts without labels already")


# -- an embedding student, from texts alone ----------------------------------------------------------

def test_the_embedding_loss_is_the_squared_error_with_each_matryoshka_prefix():
    from types import SimpleNamespace

    kind = SOFT_TARGETS["embeddings"]
    torch.manual_seed(1)
    s, t = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6)
    config = SimpleNamespace(extra={"matryoshka": [2]})
    got = kind.loss(SimpleNamespace(embeddings=s), t, None, 2.0, config)
    a, b = s.detach().numpy(), t.numpy()
    want = sum(((a[i, :d] - b[i, :d]) ** 2).sum() / d for i in range(4) for d in (6, 2))
    assert abs(got.item() - want) < 1e-5 * want
    got.backward()  # the gradient of the full vector's mean squared error and of its first 2 dimensions'
    by_hand = 2 * (a - b) / 6
    by_hand[:, :2] += 2 * (a - b)[:, :2] / 2
    assert_parity(s.grad, torch.from_numpy(by_hand))
    assert kind.loss(SimpleNamespace(embeddings=t), t, None, 2.0, SimpleNamespace(extra={})).item() == 0
    # its accuracy: the texts whose vector is nearest their own teacher's among the batch's
    assert kind.correct(SimpleNamespace(embeddings=t), t).item() == 4
    assert kind.correct(SimpleNamespace(embeddings=t), -t).item() == 0


def test_the_texts_to_distil_on_are_each_line_once_as_prepare_reads_a_corpus(tmp_path):
    import gzip

    plain = tmp_path / "a.txt"
    plain.write_text("first text\n\nsecond text\nfirst text\n   \nthird\n", encoding="utf-8")
    assert [ex.query for ex in distill_texts(plain)] == ["first text", "second text", "third"]
    assert all(ex.positive is None and not ex.negatives for ex in distill_texts(plain))
    packed = tmp_path / "b.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "one paragraph\nanother one"}) + "\n" + json.dumps({"text": "third"}) + "\n")
    assert [ex.query for ex in distill_texts(packed)] == ["one paragraph", "another one", "third"]
    pairs = tmp_path / "c.jsonl"  # an embedding file: its queries, passages and negatives
    pairs.write_text(json.dumps({"query": "q?", "positive": "p.", "negative": ["n.", "p."]}) + "\n", encoding="utf-8")
    assert [ex.query for ex in distill_texts(pairs)] == ["q?", "p.", "n."]
    empty = tmp_path / "d.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="d.txt: no text in it"):
        distill_texts(empty)
    deep = tmp_path / "deep.jsonl"  # a record nested beyond the parser: an error naming the line
    deep.write_text("[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="deep.jsonl:1"):
        distill_texts(deep)


def vectors(model, tokenizer, texts):
    """A BertForEmbedding's unit vectors of texts, padded [B, T] inputs (not the packed path the run trains on)."""
    ids = tokenizer.encode_ids(list(texts), max_length=256, truncation=True)
    width = max(map(len, ids))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
    with torch.no_grad():
        return torch.nn.functional.normalize(model.eval()(input_ids, attention_mask=mask).embeddings, dim=-1)


def test_an_embedding_student_learns_the_teachers_vectors_from_texts_alone(tokenizer, tmp_path, capsys):
    import gzip

    from sentence_transformers import SentenceTransformer

    from torchbert.heads import BertForEmbedding
    from torchbert.tasks.embedding import EmbeddingTask

    texts = realdata.english_texts()
    train = tmp_path / "texts.txt.gz"  # a corpus as users hold it: compressed, one text a line
    with gzip.open(train, "wt", encoding="utf-8") as f:
        f.write("\n".join(texts[:400]) + "\n")
    name, pairs = EmbeddingTask.example_file
    (tmp_path / name).write_text(pairs, encoding="utf-8")
    student = tmp_path / "student"
    assert cli([str(x) for x in ["distill", "--teacher", "minilm", "--task", "embedding", "--train", train, "--dev",
                                 tmp_path / name, "--out", student, "--student-layers", "2", "--epochs", "3",
                                 "--batch-size", "16", "--lr", "2e-4", "--quiet"]]) == 0
    assert "into 2 layers (the teacher's 0 and 5 of 6)" in capsys.readouterr().out
    record = read_record(student)
    assert record.made == "distill" and record.task["type"] == "embedding" and record.task["max_length"] == 256
    assert json.loads((student / "sentence_bert_config.json").read_text())["max_seq_length"] == 256  # the teacher's
    assert json.loads((student / "metrics.json").read_text())["distill"]["layers"] == [0, 5]
    held_out = texts[400:480]
    teacher = BertForEmbedding.from_pretrained(realdata.minilm_dir())  # mean pooling, as its own files say
    untrained = student_of(teacher, 2)
    mine = vectors(BertForEmbedding.from_pretrained(student), tokenizer, held_out)
    theirs = SentenceTransformer(str(student), device="cpu").encode(list(held_out), convert_to_tensor=True,
                                                                   normalize_embeddings=True)
    assert_parity(theirs, mine)  # sentence-transformers loads the student, with the same vectors
    want = vectors(teacher, tokenizer, held_out)
    before = (vectors(untrained, tokenizer, held_out) * want).sum(-1)
    after = (mine * want).sum(-1)
    assert after.mean() > before.mean() + 0.1, (before.mean(), after.mean())  # unseen texts


def test_an_embedding_student_refuses_what_does_not_fit(tokenizer, tmp_path, capsys):
    train, base = classification_files(tmp_path, tokenizer)
    texts = tmp_path / "texts.txt"
    texts.write_text("a text\nanother text\n", encoding="utf-8")
    args = ["--out", str(tmp_path / "s"), "--student-layers", "1", "--epochs", "1", "--batch-size", "2", "--quiet"]
    fails(capsys, "distill", "--teacher", str(base), "--train", str(texts), *args, code=2,
          message="to distil its sentence vectors, give --task embedding")
    fails(capsys, "distill", "--teacher", str(base), "--task", "embedding", "--train", str(texts), "--temperature",
          "3", *args, code=2, message="--temperature: an embedding student learns the teacher's vectors")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    fails(capsys, "distill", "--teacher", str(base), "--task", "embedding", "--train", str(empty), *args, code=2,
          message="empty.txt: no text in it")
    assert cli(["finetune", "--task", "classification", "--model", str(base), "--out", str(tmp_path / "teacher"),
                "--train", str(train), "--max-length", "48", "--epochs", "1", "--batch-size", "2", "--quiet"]) == 0
    capsys.readouterr()
    fails(capsys, "distill", "--teacher", str(tmp_path / "teacher"), "--task", "embedding", "--train", str(texts),
          *args, code=2, message="a model fine-tuned for classification tasks, not embedding")
    assert not (tmp_path / "s").exists()


def test_a_resumed_distillation_reads_the_teachers_outputs_it_saved(tokenizer, tmp_path, capsys, monkeypatch):
    import torchbert.train.finetune as finetune
    from torchbert.train.distill import TEACHER_CACHE, cached_teacher_outputs, outputs_key

    train, base = classification_files(tmp_path, tokenizer)
    args = ["--train", train, "--epochs", "1", "--batch-size", "2", "--quiet"]
    assert cli([str(x) for x in ["finetune", "--task", "classification", "--model", base, "--out",
                                 tmp_path / "teacher", "--max-length", "48", *args]]) == 0
    distill = [str(x) for x in ["distill", "--teacher", tmp_path / "teacher", "--out", tmp_path / "s",
                                "--student-layers", "1", *args]]
    real_train, seen = finetune.train, {}

    def killed_at_the_end(model, data, task, *a, **k):  # every step taken and saved, then the kill
        seen["teacher"], seen["data"] = task.teacher, data
        real_train(model, data, task, *a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune, "train", killed_at_the_end)
    assert cli(distill) == 130
    cache = tmp_path / "s" / TEACHER_CACHE
    fam, key = seen["data"].family, outputs_key(seen["data"], tmp_path / "teacher")
    kept = cached_teacher_outputs(cache, fam, key)
    assert torch.equal(kept.values, seen["teacher"].values) and np.array_equal(kept.starts, seen["teacher"].starts)
    assert cached_teacher_outputs(cache, fam, outputs_key(seen["data"], tmp_path / "other")) is None  # another teacher
    monkeypatch.setattr(finetune, "train", real_train)

    def not_again(*a, **k):
        raise AssertionError("the teacher was run again")

    monkeypatch.setattr(finetune, "teacher_outputs", not_again)
    capsys.readouterr()
    assert cli([*distill[:-1], "--resume"]) == 0  # not --quiet: the log says where the outputs came from
    assert "as this run saved them" in capsys.readouterr().err
    assert not cache.exists()  # finished: nothing left to resume
    assert json.loads((tmp_path / "s" / "metrics.json").read_text())["distill"]["layers"] == [0]


def test_teacher_outputs_cut_short_are_not_trusted(tmp_path):
    from torchbert.train.distill import TeacherOutputs, cached_teacher_outputs, save_teacher_outputs

    fam = FAMILIES["classification"]
    outputs = TeacherOutputs(torch.randn(5, 3), np.array([0, 2, 5]), SOFT_TARGETS[fam.soft_targets])
    path = tmp_path / "t.safetensors"
    save_teacher_outputs(path, outputs, "k")
    assert torch.equal(cached_teacher_outputs(path, fam, "k").values, outputs.values)
    assert cached_teacher_outputs(path, fam, "another") is None
    path.write_bytes(path.read_bytes()[:-7])
    assert cached_teacher_outputs(path, fam, "k") is None
    assert cached_teacher_outputs(tmp_path / "none", fam, "k") is None
