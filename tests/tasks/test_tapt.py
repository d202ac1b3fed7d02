"""Task-adaptive pretraining: a fine-tuning file's texts, labels left out, as the corpus of `pretrain --tapt`."""

import json
import shutil

import pytest
import torch

from clihelp import cli
from torchbert.config import BertConfig
from torchbert.heads import BertForPreTraining
from torchbert.tasks.families import family
from torchbert.tasks.tapt import task_documents

BUILT_IN = ("classification", "pair", "regression", "token", "qa", "qa-v2", "multiple-choice", "embedding", "reranker")


@pytest.mark.parametrize("task_type", BUILT_IN)
def test_every_family_gives_its_examples_texts_and_never_a_label(task_type, tmp_path):
    fam = family(task_type)
    name, text = fam.example_file
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    examples = fam.read(path, labelled=False, warn=lambda _: None)
    labelled = fam.read(path, warn=lambda _: None)
    texts = [t for ex in examples for t in fam.texts(ex)]
    assert texts and all(isinstance(t, str) and t.strip() for t in texts)
    flat = " ".join(text.split())
    for t in texts:  # each is the file's own text (a sentence's words as they stand in it)
        assert all(word in flat for word in t.split()), (t, flat)
    golds = {str(g) for ex in labelled for g in (getattr(ex, fam.gold or "", None) or [],) if isinstance(g, str)}
    assert not golds & set(texts), golds & set(texts)


def test_a_files_layout_names_the_family_it_is_read_as(tmp_path):
    single = tmp_path / "s.tsv"
    single.write_text("sentence\tlabel\nA fine film.\tpos\nDull.\tneg\nA fine film.\tpos\n", encoding="utf-8")
    assert task_documents(single) == ("classification", [["A fine film."], ["Dull."]])  # a text seen before: once
    pairs = tmp_path / "p.tsv"
    pairs.write_text("sentence1\tsentence2\tlabel\nIt rains.\tThe ground is wet.\tentailment\n", encoding="utf-8")
    assert task_documents(pairs) == ("pair", [["It rains.", "The ground is wet."]])
    conll = tmp_path / "n.conll"
    conll.write_text("江\tB-PER\n泽\tI-PER\n民\tI-PER\n\nMary\tB-PER\nleft\tO\n", encoding="utf-8")
    assert task_documents(conll) == ("token", [["江 泽 民"], ["Mary left"]])
    squad = tmp_path / "q.json"
    context = "Paris is the capital of France."
    squad.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "a", "question": "What is the capital?", "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "b", "question": "Of what?", "answers": [], "is_impossible": True}]}]}]}), encoding="utf-8")
    assert task_documents(squad) == ("qa-v2", [[context, "What is the capital?"], ["Of what?"]])
    choices = tmp_path / "c.jsonl"
    choices.write_text(json.dumps({"id": "1", "context": "To boil an egg", "question": "", "choices": ["heat water",
                                                                                                      "freeze it"],
                                   "label": 0}) + "\n", encoding="utf-8")
    assert task_documents(choices) == ("multiple-choice", [["To boil an egg", "heat water", "freeze it"]])
    for wrong, message in ((tmp_path / "none.tsv", "no such file"), (tmp_path / "x.docx", "ends in")):
        if wrong.suffix == ".docx":
            wrong.write_text("x", encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            task_documents(wrong)


def test_pretrain_tapt_continues_a_checkpoint_on_a_task_files_text_prepared_once(prepared, tmp_path, capsys,
                                                                                 monkeypatch):
    monkeypatch.setenv("TORCHBERT_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    start = tmp_path / "start"
    vocab = (prepared / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    BertForPreTraining(BertConfig.from_name("tiny", vocab_size=len(vocab))).save_pretrained(start)
    shutil.copyfile(prepared / "tok" / "vocab.txt", start / "vocab.txt")
    lines = (prepared / "train.txt").read_text(encoding="utf-8").split()
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"{line}\t{'ab'[k % 2]}\n" for k, line in enumerate(lines[:200])),
                     encoding="utf-8")
    args = ["pretrain", "--init", start, "--tapt", train, "--recipe", "continue", "--steps", "2", "--batch-size", "4",
            "--eval-batches", "1", "--quiet"]
    code, out, err = cli(capsys, *args, "--out", tmp_path / "run")
    assert code == 0, err
    assert "read as a classification task's file, 200 documents (20 held out)" in out + err
    assert "before the first step, held-out: MLM loss" in out
    prepared_folders = list((tmp_path / "cache" / "tapt").iterdir())
    assert len(prepared_folders) == 1 and (prepared_folders[0] / "heldout" / "manifest.json").is_file()
    manifest = json.loads((prepared_folders[0] / "manifest.json").read_text())
    assert manifest["settings"]["pairs"] == "none" and manifest["settings"]["masking"] == "dynamic"
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["data"] == str(prepared_folders[0])
    # a second run on the same file reads the same folder
    code, out, err = cli(capsys, *args, "--out", tmp_path / "run2", "--lr", "1e-4")
    assert code == 0 and "as prepared before" in out + err, err
    assert list((tmp_path / "cache" / "tapt").iterdir()) == prepared_folders
    code, _, err = cli(capsys, *args, "--data", prepared / "data", "--out", tmp_path / "bad")
    assert code == 2 and "give it or --data, not both" in err, err
    code, _, err = cli(capsys, "pretrain", "--tapt", train, "--out", tmp_path / "bad", "--quiet")
    assert code == 2 and "--tapt continues a checkpoint on a task's text: give the checkpoint as --init" in err
    code, _, err = cli(capsys, "pretrain", "--init", start, "--out", tmp_path / "bad", "--quiet")
    assert code == 2 and "give --data" in err and "or --tapt" in err
    few = tmp_path / "few.tsv"
    few.write_text("sentence\tlabel\n一\ta\n二\tb\n", encoding="utf-8")
    code, _, err = cli(capsys, "pretrain", "--init", start, "--tapt", few, "--out", tmp_path / "bad", "--quiet")
    assert code == 2 and "2 text(s) in it" in err and not (tmp_path / "bad").exists()
