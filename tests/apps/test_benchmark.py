"""`torchbert benchmark`: the suites' official layouts read from fixtures written in them (quirks
included), the protocol's grid, seeds and restarts, the table and the leaderboard files, the local
suite against the same runs made by hand, and a killed suite resumed without rerunning a finished run."""

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import realdata
from clihelp import cli, squad_file, tiny_bert

from torchbert.apps.benchmark import (PROTOCOLS, Bench, Plan, Protocol, first_examples, plan_benchmark,
                                      read_protocol, restarts_apply)
from torchbert.apps.benchmark_table import columns_of
from torchbert.apps.samples import ner_split, sentiment_reviews, wnut16_split
from torchbert.apps.suites import LOCAL_HELD, SUITES, Column, SuiteTask, register_suite, submit_glue, write_local
from torchbert.errors import UserError
from torchbert.tasks.families import read_examples, task_settings

MNLI_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]
STSB_HEAD = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]
MRPC_HEAD = ["#1 ID", "#2 ID", "#1 String", "#2 String"]


def texts(n: int, skip: int = 0) -> list[str]:
    out = [t for t in realdata.english_texts() if 20 < len(t) < 140 and "\t" not in t]
    return out[skip:skip + n]


def write(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def glue_folder(root: Path, n: int = 24) -> Path:
    """glue_data/ as GLUE's download script writes it, from real English text: every task folder with
    train, dev and test (test without labels), CoLA's train and dev without a header, MNLI's eleven
    and sixteen columns with gold_label last, QQP with a row cut in two by a line break, STS-B's scores,
    and diagnostic/diagnostic.tsv. A pair's label follows whether both texts are the same tweet
    (learnable); a single text's, whether it has more than eight words."""
    a, b = texts(n * 3), texts(n * 3, skip=n * 3)

    def pairs(k: int, labels: tuple[str, str]):
        rows = []
        for i in range(k):
            same = i % 2 == 0
            rows.append((a[i], a[i] if same else b[i], labels[0] if same else labels[1]))
        return rows

    def single(k: int):
        return [(a[i], "1" if len(a[i].split()) > 8 else "0") for i in range(k)]

    g = root / "glue_data"
    splits = {"train": (0, n), "dev": (n, n + n // 2), "test": (n + n // 2, 2 * n)}

    def part(rows, split):
        lo, hi = splits[split]
        return rows[lo:hi]

    cola = single(2 * n)
    for split in ("train", "dev"):
        write(g / "CoLA" / f"{split}.tsv", [["gj04", y, "" if y == "1" else "*", x] for x, y in part(cola, split)])
    tests = [[str(i), x] for i, (x, _) in enumerate(part(cola, "test"))]
    write(g / "CoLA" / "test.tsv", [["index", "sentence"], *tests])
    for split in ("train", "dev"):
        write(g / "SST-2" / f"{split}.tsv", [["sentence", "label"]] + [[x, y] for x, y in part(cola, split)])
    write(g / "SST-2" / "test.tsv", [["index", "sentence"], *tests])

    two = pairs(2 * n, ("1", "0"))
    for split in ("train", "dev"):
        write(g / "MRPC" / f"{split}.tsv", [["Quality", *MRPC_HEAD]] +
              [[y, str(100 + i), str(200 + i), x, z] for i, (x, z, y) in enumerate(part(two, split))])
    write(g / "MRPC" / "test.tsv", [["index", *MRPC_HEAD]] +
          [[str(i), str(100 + i), str(200 + i), x, z] for i, (x, z, _) in enumerate(part(two, "test"))])
    for split in ("train", "dev"):
        write(g / "STS-B" / f"{split}.tsv", [[*STSB_HEAD, "score"]] +
              [[str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", x, z,
                "5.000" if y == "1" else f"{(i % 5) * 0.2:.3f}"] for i, (x, z, y) in enumerate(part(two, split))])
    write(g / "STS-B" / "test.tsv", [STSB_HEAD] + [
        [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", x, z]
        for i, (x, z, _) in enumerate(part(two, "test"))])
    for split in ("train", "dev"):
        rows = [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]] + \
            [[str(i), str(2 * i), str(2 * i + 1), x, z, y] for i, (x, z, y) in enumerate(part(two, split))]
        if split == "train":  # a question broken over two lines: two short rows, both left out
            rows[3:3] = [["9001", "18002", "18003", "How do I"], ["learn this?", "What is it?", "0"]]
        write(g / "QQP" / f"{split}.tsv", rows)
    write(g / "QQP" / "test.tsv", [["id", "question1", "question2"]] +
          [[str(i), x, z] for i, (x, z, _) in enumerate(part(two, "test"))])

    nli = [(x, z, "entailment" if y == "1" else "contradiction" if i % 4 == 1 else "neutral")
           for i, (x, z, y) in enumerate(pairs(2 * n, ("1", "0")))]

    def mnli_row(i, x, z):
        return [str(i), str(1000 + i), f"{1000 + i}e", "fiction", "( x )", "( z )", "(ROOT x)", "(ROOT z)", x, z]

    write(g / "MNLI" / "train.tsv", [[*MNLI_HEAD, "label1", "gold_label"]] +
          [[*mnli_row(i, x, z), y, y] for i, (x, z, y) in enumerate(part(nli, "train"))])
    for name in ("dev_matched", "dev_mismatched"):
        head = [*MNLI_HEAD, "label1", "label2", "label3", "label4", "label5", "gold_label"]
        write(g / "MNLI" / f"{name}.tsv", [head] +
              [[*mnli_row(i, x, z), y, y, y, y, y, y] for i, (x, z, y) in enumerate(part(nli, "dev"))])
    for name in ("test_matched", "test_mismatched"):
        write(g / "MNLI" / f"{name}.tsv",
              [MNLI_HEAD] + [mnli_row(i, x, z) for i, (x, z, _) in enumerate(part(nli, "test"))])
    write(g / "diagnostic" / "diagnostic.tsv", [["index", "sentence1", "sentence2"]] +
          [[str(i), x, z] for i, (x, z, _) in enumerate(part(nli, "test")[:5])])

    ent = pairs(2 * n, ("entailment", "not_entailment"))
    for task, head in (("QNLI", ["index", "question", "sentence"]), ("RTE", ["index", "sentence1", "sentence2"])):
        for split in ("train", "dev"):
            write(g / task / f"{split}.tsv", [[*head, "label"]] + [[str(i), x, z, y] for i, (x, z, y) in
                                                                   enumerate(part(ent, split))])
        write(g / task / "test.tsv", [head] + [[str(i), x, z] for i, (x, z, _) in enumerate(part(ent, "test"))])
    for split in ("train", "dev"):
        write(g / "WNLI" / f"{split}.tsv", [["index", "sentence1", "sentence2", "label"]] +
              [[str(i), x, z, y] for i, (x, z, y) in enumerate(part(two, split))])
    write(g / "WNLI" / "test.tsv", [["index", "sentence1", "sentence2"]] +
          [[str(i), x, z] for i, (x, z, _) in enumerate(part(two, "test"))])
    return g


def test_every_glue_task_is_read_in_its_official_layout(tmp_path):
    g = glue_folder(tmp_path, n=24)
    notes = []
    for t in SUITES["glue"].tasks:
        ts = task_settings(t.task)
        for split, rel in t.files.items():
            examples = read_examples(g / rel, ts.type, ts.layout, labelled=split not in t.submission, warn=notes.append)
            want = {"train": 24, "test": 12}.get(split, 12)
            if t.name == "MNLI" and split == "diagnostic":
                want = 5
            assert len(examples) == want, (t.name, split)
            if split in t.submission:
                assert all(e.label is None for e in examples) and examples[0].id == "0"
    cola = read_examples(g / "CoLA/train.tsv", "classification", "glue-cola")
    assert cola[0].where.endswith(":1") and cola[0].text_a == texts(1)[0]  # the first line is data
    mnli = read_examples(g / "MNLI/dev_matched.tsv", "pair", "glue-mnli")
    assert {e.label for e in mnli} == {"entailment", "neutral", "contradiction"}
    sts = read_examples(g / "STS-B/train.tsv", "regression", "glue-stsb")
    assert sts[0].label == 5.0 and isinstance(sts[1].label, float)
    (note,) = [m for m in notes if "QQP/train.tsv" in m]
    assert "left out 2 rows" in note and "lines 4, 5" in note


def test_glues_columns_are_the_papers_table_1(tmp_path):
    """The BERT paper's Table 1: F1 for QQP and MRPC, Spearman for STS-B, MCC for CoLA, accuracy elsewhere,
    MNLI matched and mismatched apart, WNLI outside the average; the published rows average as the paper
    prints them (79.6 and 82.1)."""
    glue = SUITES["glue"]
    cols = columns_of(Plan(glue, {}, tmp_path, None, list(glue.tasks), tmp_path))
    assert {c["title"]: (c["split"], c["metric"]) for c in cols} == {
        "MNLI-m": ("dev", "accuracy"), "MNLI-mm": ("dev_mismatched", "accuracy"), "QQP": ("dev", "f1"),
        "QNLI": ("dev", "accuracy"), "SST-2": ("dev", "accuracy"), "CoLA": ("dev", "mcc"),
        "STS-B": ("dev", "spearman"), "MRPC": ("dev", "f1"), "RTE": ("dev", "accuracy"), "WNLI": ("dev", "accuracy")}
    averaged = [c["title"] for c in cols if c["averaged"]]
    assert averaged == [c["title"] for c in cols if c["title"] != "WNLI"]
    for published, printed in zip(glue.published, (79.6, 82.1)):
        assert round(statistics.fmean(published.scores[t] for t in averaged), 1) == printed, published.name
    assert glue.task("MNLI").submission == {"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv",
                                            "diagnostic": "AX.tsv"}


def test_a_task_scores_its_other_splits_after_training_and_picks_on_its_first_column():
    assert SUITES["glue"].task("MNLI").scored_splits() == ["dev_mismatched"]
    assert SUITES["glue"].task("RTE").scored_splits() == []
    t = SuiteTask("x", "pair", {}, (Column("x F1", "dev", "f1"), Column("x acc", "test", "accuracy"),
                                    Column("x MCC", "test", "mcc")))
    assert t.select == "f1" and t.scored_splits() == ["test"]
    with pytest.raises(ValueError, match="suite 'glue' is registered already"):
        register_suite(SUITES["glue"])
    # GLUE's leaderboard file: a label, or a regression's score
    records = [{"id": "0", "label": "entailment", "probability": 0.9}, {"id": "1", "score": 3.25}]
    assert submit_glue(records, Path("test.tsv")) == "index\tprediction\n0\tentailment\n1\t3.25\n"


def test_every_glue_training_file_is_cut_to_its_first_examples(tmp_path):
    """--max-train copies a training file's first examples: after the header line where the task's file
    has one (CoLA's has none)."""
    g = glue_folder(tmp_path, n=24)
    for t in SUITES["glue"].tasks:
        ts = task_settings(t.task)
        full = read_examples(g / t.files["train"], ts.type, ts.layout)
        cut = tmp_path / "cut" / f"{t.name}.tsv"
        first_examples(g / t.files["train"], cut, 5, t.header)
        got = read_examples(cut, ts.type, ts.layout)
        # QQP's lines 4 and 5 are one question broken in two, left out
        assert [e.text_a for e in got] == [e.text_a for e in full][:3 if t.name == "QQP" else 5], t.name


def test_a_bad_line_is_named_before_any_training(tmp_path, capsys, minilm_dir):
    g = glue_folder(tmp_path, n=24)
    rows = (g / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    rows[3] = "3\tonly one text\n"
    (g / "RTE" / "train.tsv").write_text("".join(rows), encoding="utf-8")
    code, out, err = cli(capsys, "benchmark", "glue", "--model", minilm_dir, "--data", g, "--out", tmp_path / "b",
                         "--tasks", "rte", "sst-2")
    assert code == 2, err
    assert f"{g / 'RTE' / 'train.tsv'}:4: 2 tab-separated fields; expected 4" in err
    assert not list((tmp_path / "b").glob("runs/*"))


def test_a_folder_without_the_layout_is_refused_with_the_layout(tmp_path, capsys, minilm_dir):
    (tmp_path / "empty").mkdir()
    code, _, err = cli(capsys, "benchmark", "glue", "--model", minilm_dir, "--data", tmp_path / "empty",
                       "--out", tmp_path / "b")
    assert code == 2 and "holds none of GLUE's tasks in its layout (expected MNLI/train.tsv and " \
        "MNLI/dev_matched.tsv, QQP/train.tsv" in err
    g = glue_folder(tmp_path)
    code, _, err = cli(capsys, "benchmark", "glue", "--model", minilm_dir, "--data", g, "--out", tmp_path / "b",
                       "--tasks", "RTE", "SQuAD")
    assert code == 2 and "--tasks SQuAD: not a task of glue" in err
    code, _, err = cli(capsys, "benchmark", "local", "--model", minilm_dir, "--data", g, "--out", tmp_path / "b")
    assert code == 2 and "writes its own files" in err


def test_protocols_by_name_and_from_a_file(tmp_path):
    assert read_protocol("paper")[0] == PROTOCOLS["paper"][0]
    assert read_protocol("paper")[0].lrs == [5e-5, 4e-5, 3e-5, 2e-5] and PROTOCOLS["paper"][0].batch_sizes == [32]
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"lrs": [3e-5], "seeds": 3}), encoding="utf-8")
    p, text = read_protocol(str(f))
    assert p == Protocol(**{**PROTOCOLS["paper"][0].__dict__, "lrs": [3e-5], "seeds": 3}) and str(f) in text
    assert text == f"{f} (over the paper's)"
    for bad, message in (({"lr": [1e-5]}, "lr is not a protocol setting"), ({"lrs": []}, "lrs must be a non-empty"),
                         ({"seeds": 0}, "seeds must be >= 1"), ({"lrs": [-1.0]}, "lrs must be > 0"),
                         # each value of the field's type: JSON's null, a bool, a float for a whole number
                         ({"lrs": 3e-5}, r"lrs must be a non-empty list of numbers, got 3e-05"),
                         ({"lrs": [None]}, r"lrs must be a non-empty list of numbers, got \[null\]"),
                         ({"batch_sizes": [16.5]}, r"batch_sizes must be a non-empty list of whole numbers"),
                         ({"batch_sizes": []}, r"batch_sizes must be a non-empty list"),
                         ({"epochs": None}, "epochs must be a number, got null"),
                         ({"seeds": True}, "seeds must be a whole number, got true"),
                         ({"statistic": "mode"}, "statistic must be one of mean, median"),
                         ({"warmup_ratio": 1.0}, r"warmup_ratio must be in \[0, 1\)"),
                         ({"max_length": 4}, "max_length must be >= 8"),
                         ([{"lrs": [1e-5]}], "expected a JSON object of protocol settings")):
        f.write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(UserError, match=f"{f}: {message}"):
            read_protocol(str(f))
    with pytest.raises(UserError, match="neither a protocol"):
        read_protocol(str(tmp_path / "nothing.json"))
    f.write_text('{"lrs": [1e-5],', encoding="utf-8")
    with pytest.raises(UserError, match=f"{f}: not JSON"):
        read_protocol(str(f))


def test_first_examples_keep_the_header_and_whole_sentences(tmp_path):
    g = glue_folder(tmp_path)
    first_examples(g / "RTE" / "train.tsv", tmp_path / "rte.tsv", 5, header=True)
    assert len(read_examples(tmp_path / "rte.tsv", "pair", "glue-rte")) == 5
    first_examples(g / "CoLA" / "train.tsv", tmp_path / "cola.tsv", 5, header=False)
    assert len(read_examples(tmp_path / "cola.tsv", "classification", "glue-cola")) == 5
    conll = tmp_path / "a.conll"
    conll.write_text("a\tO\nb\tB-PER\n\nc\tO\n\nd\tO\n", encoding="utf-8")
    first_examples(conll, tmp_path / "b.conll", 2, header=True)
    assert (tmp_path / "b.conll").read_text(encoding="utf-8") == "a\tO\nb\tB-PER\n\nc\tO\n\n"


def squad_folder(root: Path, n: int = 30) -> Path:
    """SQuAD's files as published: train-v1.1.json, dev-v1.1.json, train-v2.0.json, dev-v2.0.json."""
    items = []
    for i, t in enumerate(texts(n, skip=5)):
        words = t.split()
        answer = None if i % 4 == 3 else words[len(words) // 2]
        items.append((t, f"which word comes after {words[len(words) // 2 - 1]}?", answer))
    folder = root / "squad"
    folder.mkdir()
    for version, v2 in (("1.1", False), ("2.0", True)):
        kept = [x for x in items if v2 or x[2] is not None]
        squad_file(folder / f"train-v{version}.json", kept[:len(kept) * 2 // 3], v2=v2)
        squad_file(folder / f"dev-v{version}.json", kept[len(kept) * 2 // 3:], v2=v2, first=100)
    return folder


def test_squad_files_are_found_by_version_and_cut_by_question(tmp_path):
    folder = squad_folder(tmp_path)
    (folder / "train-v2.0.json").unlink()
    notes = []
    plan = plan_benchmark("squad", {"m": tmp_path}, folder, tmp_path / "out", PROTOCOLS["paper-squad"][0],
                          log=notes.append)
    assert [t.name for t in plan.tasks] == ["SQuAD1.1"]
    assert notes == [f"{folder}: skipping SQuAD2.0 (no train-v2.0.json)"]
    assert [c.title for c in plan.tasks[0].columns] == ["1.1 EM", "1.1 F1"] and plan.tasks[0].select == "f1"
    first_examples(folder / "train-v1.1.json", tmp_path / "cut.json", 7, header=True)
    cut = read_examples(tmp_path / "cut.json", "qa", "squad")
    assert [e.id for e in cut] == [e.id for e in read_examples(folder / "train-v1.1.json", "qa", "squad")][:7]


def test_squads_files_are_read_by_their_versions_tasks(tmp_path):
    folder = squad_folder(tmp_path)
    for t in SUITES["squad"].tasks:
        ts = task_settings(t.task)
        examples = read_examples(folder / t.files["dev"], ts.type, ts.layout)
        assert len(examples) == (10 if t.name == "SQuAD2.0" else 8)
        assert sum(not e.answers for e in examples) == (2 if t.name == "SQuAD2.0" else 0)


def test_the_local_suite_writes_the_same_files_from_the_packaged_text(tmp_path):
    """dev and test LOCAL_HELD examples each, the test set the reviews' first; train 1,000 unless
    --max-train; the same files on every run, and the held-out ones whatever --max-train."""
    write_local(tmp_path / "a", None)
    reviews = sentiment_reviews()
    kinds = {"sentiment": ("classification", "tsv"), "ner": ("token", "conll"), "wnut16": ("token", "conll")}

    def read(folder, name, split):
        kind, ext = kinds[name]
        return read_examples(folder / name / f"{split}.{ext}", kind)

    test, dev = read(tmp_path / "a", "sentiment", "test"), read(tmp_path / "a", "sentiment", "dev")
    assert [e.text_a for e in test] == [x for x, _ in reviews[:LOCAL_HELD]]
    assert [e.text_a for e in dev] == [x for x, _ in reviews[LOCAL_HELD:2 * LOCAL_HELD]]
    assert len(read(tmp_path / "a", "sentiment", "train")) == 1000
    for name, split in (("ner", ner_split()), ("wnut16", wnut16_split())):
        assert [e.words for e in read(tmp_path / "a", name, "test")] == [w for w, _ in split["test"][:LOCAL_HELD]]
        assert [e.words for e in read(tmp_path / "a", name, "dev")] == [w for w, _ in split["dev"][:LOCAL_HELD]]
        train = read(tmp_path / "a", name, "train")
        pool = {tuple(w) for w, _ in split["train"]}
        assert len(train) == 1000 and all(tuple(e.words) in pool for e in train)
    write_local(tmp_path / "b", None)
    write_local(tmp_path / "c", 40)
    for path in sorted((tmp_path / "a").rglob("*.*")):
        rel = path.relative_to(tmp_path / "a")
        assert (tmp_path / "b" / rel).read_bytes() == path.read_bytes(), rel
        if not rel.name.startswith("train"):
            assert (tmp_path / "c" / rel).read_bytes() == path.read_bytes(), rel
    assert all(len(read(tmp_path / "c", name, "train")) == 40 for name in kinds)


def protocol_file(path: Path, **changes) -> Path:
    settings = {"lrs": [2e-3, 5e-4], "batch_sizes": [8], "epochs": 1, "max_length": 32, "seeds": 1, "restarts": 0,
                **changes}
    path.write_text(json.dumps(settings), encoding="utf-8")
    return path


@pytest.mark.e2e
def test_glue_runs_the_grid_restarts_on_small_sets_and_writes_the_table_and_the_leaderboard_files(
        tmp_path, capsys, minilm_dir):
    g = glue_folder(tmp_path, n=24)
    tiny = tiny_bert(tmp_path / "tiny", minilm_dir)
    out = tmp_path / "b"
    # MNLI and STS-B hold 24 training examples: below `small` 30, so restarts; RTE's are cut to 20 too
    proto = protocol_file(tmp_path / "p.json", restarts=2, small=30, seeds=2)
    code, stdout, err = cli(capsys, "benchmark", "glue", "--model", f"tiny={tiny}", "--data", g, "--out", out,
                            "--protocol", proto, "--tasks", "MNLI", "STS-B", "RTE", "--max-train", "20")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert [c["title"] for c in s["columns"]] == ["MNLI-m", "MNLI-mm", "STS-B", "RTE"]
    for task, x in s["results"]["tiny"].items():
        grid = {k: v for k, v in x["grid_dev"].items()}
        assert x["lr"] == [2e-3, 5e-4][list(grid.values()).index(max(grid.values()))]  # the best on dev, first on a tie
        assert x["restarts"] and len(x["runs"]) == 2
        dev = {run: json.loads((Path(run) / "cell.json").read_text())["scores"]["dev"] for run in x["runs"]}
        select = {"MNLI": "accuracy", "STS-B": "spearman", "RTE": "accuracy"}[task]
        assert x["chosen"] == max(x["runs"], key=lambda r: dev[r][select])  # the restart best on dev
        first = x["columns"][next(c["title"] for c in s["columns"] if c["task"] == task)]
        assert first["value"] == dev[x["chosen"]][select]
    mm = s["results"]["tiny"]["MNLI"]["columns"]["MNLI-mm"]
    chosen = Path(s["results"]["tiny"]["MNLI"]["chosen"])
    assert mm["value"] == json.loads((chosen / "scores-dev_mismatched.json").read_text())["accuracy"]
    assert s["averages"]["tiny"] == pytest.approx(100 * sum(
        s["results"]["tiny"][c["task"]]["columns"][c["title"]]["value"] for c in s["columns"]) / 4)
    # the chosen runs' test predictions, in GLUE's submission format
    sub = out / "submission" / "tiny"
    assert sorted(p.name for p in sub.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv", "STS-B.tsv"]
    rte = (sub / "RTE.tsv").read_text(encoding="utf-8").splitlines()
    assert rte[0] == "index\tprediction" and len(rte) == 13
    assert [r.split("\t")[0] for r in rte[1:]] == [str(i) for i in range(12)]
    assert {r.split("\t")[1] for r in rte[1:]} <= {"entailment", "not_entailment"}
    scores = [float(r.split("\t")[1]) for r in (sub / "STS-B.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 12 and all(x == x for x in scores)  # numbers, none NaN
    assert len((sub / "AX.tsv").read_text().splitlines()) == 6
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "| model | MNLI-m | MNLI-mm | STS-B | RTE | Average |" in md
    # the published row, and its mean over these four columns (80.05)
    assert "| *BERT-base (paper)* | *84.6* | *83.4* | *85.8* | *66.4* | *80.0* |" in md
    assert "± " in md and (out / "scores.png").stat().st_size > 1000
    assert "Training sets cut to their first 20 examples." in md
    # every run's command line was printed, and runs the same from a shell
    assert stdout.count("== tiny RTE lr 0.002 batch 8 seed 0") == 1 and "torchbert finetune --task rte" in stdout


@pytest.mark.e2e
def test_the_local_suite_scores_what_the_same_finetune_by_hand_scores(tmp_path, capsys, minilm_dir):
    tiny = tiny_bert(tmp_path / "tiny", minilm_dir)
    out = tmp_path / "b"
    proto = protocol_file(tmp_path / "p.json", lrs=[1e-3], seeds=1)
    code, _, err = cli(capsys, "benchmark", "local", "--model", f"tiny={tiny}", "--out", out, "--protocol", proto,
                       "--max-train", "40", "--tasks", "sentiment", "ner")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for task, kind, ext, metric in (("sentiment", "classification", "tsv", "accuracy"),
                                    ("ner", "token", "conll", "f1")):
        data = out / "data" / task
        assert len(read_examples(data / f"train.{ext}", kind)) == 40
        run = tmp_path / f"hand-{task}"
        code, _, err = cli(capsys, "finetune", "--task", kind, "--model", tiny, "--train", data / f"train.{ext}",
                           "--dev", data / f"dev.{ext}", "--out", run, "--epochs", "1", "--max-length", "32",
                           "--batch-size", "8", "--lr", "1e-3", "--seed", "0", "--quiet")
        assert code == 0, err
        code, _, err = cli(capsys, "evaluate", "--model", run, "--data", data / f"test.{ext}", "--out", run / "t.json",
                           "--quiet")
        assert code == 0, err
        by_hand = json.loads((run / "t.json").read_text(encoding="utf-8"))[metric]
        assert s["results"]["tiny"][task]["columns"][task]["value"] == by_hand
    assert "wnut16" not in s["results"]["tiny"]


@pytest.mark.e2e
def test_precision_bf16_trains_every_run_as_finetune_does_in_bf16_and_is_kept_on_resume(tmp_path, capsys,
                                                                                         minilm_dir):
    tiny = tiny_bert(tmp_path / "tiny", minilm_dir)
    out = tmp_path / "b"
    proto = protocol_file(tmp_path / "p.json", lrs=[1e-3], seeds=1)
    args = ["benchmark", "local", "--model", f"tiny={tiny}", "--out", out, "--protocol", proto, "--max-train", "40",
            "--tasks", "sentiment"]
    code, _, err = cli(capsys, *args, "--precision", "bf16")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    (run,) = s["results"]["tiny"]["sentiment"]["runs"]
    assert json.loads((Path(run) / "torchbert.json").read_text())["training"]["precision"] == "bf16"
    assert s["precision"] == "bf16" and "Trained in bf16, scored in fp32." in (out / "summary.md").read_text()
    data = out / "data" / "sentiment"
    hand = tmp_path / "hand"
    code, _, err = cli(capsys, "finetune", "--task", "classification", "--model", tiny, "--train", data / "train.tsv",
                       "--dev", data / "dev.tsv", "--out", hand, "--epochs", "1", "--max-length", "32",
                       "--batch-size", "8", "--lr", "1e-3", "--seed", "0", "--precision", "bf16", "--quiet")
    assert code == 0, err
    code, _, err = cli(capsys, "evaluate", "--model", hand, "--data", data / "test.tsv", "--out", hand / "t.json",
                       "--quiet")
    assert code == 0, err
    by_hand = json.loads((hand / "t.json").read_text(encoding="utf-8"))["accuracy"]
    assert s["results"]["tiny"]["sentiment"]["columns"]["sentiment"]["value"] == by_hand
    code, _, err = cli(capsys, *args, "--resume")  # fp32 now: another benchmark's folder
    assert code == 2 and "--precision" in err


@pytest.mark.e2e
def test_a_killed_suite_resumes_without_rerunning_a_finished_run(tmp_path, minilm_dir):
    tiny = tiny_bert(tmp_path / "tiny", minilm_dir)
    proto = protocol_file(tmp_path / "p.json", lrs=[1e-3, 5e-4], seeds=2)
    args = [sys.executable, "-m", "torchbert", "benchmark", "local", "--model", f"tiny={tiny}", "--protocol",
            str(proto), "--max-train", "40", "--tasks", "sentiment"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    whole = tmp_path / "whole"
    subprocess.run([*args, "--out", str(whole)], env=env, check=True, capture_output=True, timeout=600)
    cut = tmp_path / "cut"
    victim = subprocess.Popen([*args, "--out", str(cut)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not list(cut.glob("runs/tiny/sentiment/*/cell.json")):
        assert victim.poll() is None and time.time() < deadline, "the benchmark ended before it could be killed"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    (finished,) = cut.glob("runs/tiny/sentiment/*/cell.json")
    before = finished.stat().st_mtime_ns
    done = subprocess.run([*args, "--out", str(cut), "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert finished.stat().st_mtime_ns == before  # not run again
    cell = json.loads(finished.read_text(encoding="utf-8"))
    name = f"tiny sentiment lr {cell['lr']:g} batch {cell['batch_size']} seed {cell['seed']}"
    assert f"== {name} (" in victim.stdout.read().decode() and f"== {name} (" not in done.stdout
    got = json.loads((cut / "summary.json").read_text())["results"]["tiny"]["sentiment"]
    want = json.loads((whole / "summary.json").read_text())["results"]["tiny"]["sentiment"]
    assert got["columns"] == want["columns"] and got["grid_dev"] == want["grid_dev"]


@pytest.mark.e2e
def test_jobs_run_the_same_runs_side_by_side_in_workers(tmp_path, capsys, minilm_dir):
    tiny = tiny_bert(tmp_path / "tiny", minilm_dir)
    proto = protocol_file(tmp_path / "p.json", lrs=[1e-3, 5e-4], seeds=2)
    args = ["benchmark", "local", "--model", f"tiny={tiny}", "--protocol", proto, "--max-train", "40", "--tasks",
            "sentiment", "ner", "--threads", "1"]  # one thread each: the same sums, the same scores
    code, _, err = cli(capsys, *args, "--out", tmp_path / "one")
    assert code == 0, err
    code, stdout, err = cli(capsys, *args, "--out", tmp_path / "two", "--jobs", "2")
    assert code == 0, err
    one, two = (json.loads((tmp_path / x / "summary.json").read_text())["results"]["tiny"] for x in ("one", "two"))
    for task in ("sentiment", "ner"):
        for key in ("columns", "grid_dev", "lr", "batch_size"):
            assert two[task][key] == one[task][key], (task, key)
    # each run announced here, its output in its own log; the grids first, then the seeds
    assert stdout.count("== tiny ") == 6 and "(6 of 6 runs" in stdout
    log = (tmp_path / "two" / "runs" / "tiny" / "ner" / "lr0.001-bs8-seed0.log").read_text(encoding="utf-8")
    assert "torchbert finetune --task token" in log
    lines = stdout.splitlines()
    first_seed1 = next(i for i, x in enumerate(lines) if x.startswith("== ") and "seed 1" in x)
    assert sum(x.startswith("done ") for x in lines[:first_seed1]) >= 2  # a task's grid finished before its seed
    # --resume runs nothing again
    code, stdout, err = cli(capsys, *args, "--out", tmp_path / "two", "--jobs", "2", "--resume")
    assert code == 0 and "== " not in stdout and "done " not in stdout, err


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            out.append(int(status.parent.name))
    return out


@pytest.mark.e2e
def test_a_stopped_parallel_suite_stops_its_workers_and_resumes(tmp_path, minilm_dir):
    tiny = tiny_bert(tmp_path / "tiny", minilm_dir)
    proto = protocol_file(tmp_path / "p.json", lrs=[1e-3, 5e-4], seeds=4)  # 5 runs: the stop comes mid-way
    out = tmp_path / "b"
    args = [sys.executable, "-m", "torchbert", "benchmark", "local", "--model", f"tiny={tiny}", "--protocol",
            str(proto), "--max-train", "80", "--tasks", "sentiment", "--out", str(out), "--jobs", "2"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    victim = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list(out.glob("runs/tiny/sentiment/*/cell.json")):  # a run finished: the folder is kept
        assert victim.poll() is None and time.time() < deadline, victim.communicate()
        time.sleep(0.05)
    workers = children(victim.pid)
    assert len(workers) >= 2
    victim.send_signal(signal.SIGTERM)
    stdout, stderr = victim.communicate(timeout=300)
    assert victim.returncode not in (0, 1), stderr  # interrupted, not failed
    assert "--resume" in stderr
    time.sleep(2)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]  # the workers stopped with it
    done = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    s = json.loads((out / "summary.json").read_text())["results"]["tiny"]["sentiment"]
    assert len(s["runs"]) == 4 and all((Path(r) / "cell.json").is_file() for r in s["runs"])


def test_with_several_gpus_each_worker_computes_on_one_of_its_own(monkeypatch):
    """--jobs on a machine with GPUs: each worker process, as it starts, takes the next GPU in turn
    (CUDA_VISIBLE_DEVICES), so that two runs never share one; with one GPU or none nothing is set."""
    import multiprocessing

    from torchbert.apps.benchmark_jobs import _pin_device

    counter, seen = multiprocessing.get_context("spawn").Value("i", 0), []
    # set first, so that the test's end puts back what was there: delenv of a variable that is not set
    # records nothing to put back, and the next delenv would record what _pin_device set
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for _ in range(5):
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        _pin_device(counter, 2)
        seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert seen == ["0", "1", "0", "1", "0"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _pin_device(counter, 1)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_the_table_by_hand():
    """summary.md from a summary written out by hand: a row per model (spread only over several runs,
    "–" for a missing column), the average over the averaged columns only (none when one is missing),
    published rows in italics with their own average, and what each figure means under the table."""
    from types import SimpleNamespace as NS

    from torchbert.apps.benchmark_table import averages, columns_of, summary_markdown

    col = lambda title, averaged=True: NS(title=title, split="dev", metric="accuracy", averaged=averaged)  # noqa: E731
    plan = NS(suite=NS(averaged=True), tasks=[NS(name="A", averaged=True, columns=[col("A")]),
                                              NS(name="B", averaged=True, columns=[col("B-1"), col("B-2", False)]),
                                              NS(name="C", averaged=False, columns=[col("C")])])
    cols = columns_of(plan)
    assert [(c["title"], c["averaged"]) for c in cols] == [("A", True), ("B-1", True), ("B-2", False), ("C", False)]

    def cell(*values):
        return {"value": sum(values) / len(values), "values": list(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0}

    results = {"ours": {"A": {"columns": {"A": cell(0.8, 0.9)}},
                        "B": {"columns": {"B-1": cell(0.5), "B-2": cell(0.1)}}, "C": {"columns": {"C": cell(0.3)}}},
               "half": {"A": {"columns": {"A": cell(0.7)}}, "B": {"columns": {}}, "C": {"columns": {}}}}
    avg = averages(plan, results)
    assert avg["ours"] == pytest.approx(100 * (0.85 + 0.5) / 2) and avg["half"] is None
    assert averages(NS(suite=NS(averaged=False), tasks=plan.tasks), results) == {}
    s = {"suite": "toy", "title": "a toy suite", "protocol_text": "lr on dev", "columns": cols, "results": results,
         "protocol": {"statistic": "median"}, "max_train": 1000, "precision": "bf16", "suite_averaged": True,
         "averages": avg, "seconds": 12.0,
         "published": [{"name": "BERT-base", "source": "the paper", "scores": {"A": 84.0, "B-1": 70.0, "C": 1.0}},
                       {"name": "other", "source": "elsewhere", "scores": {"A": 80.0}}]}
    for m in results.values():
        for x in m.values():
            x["submission"] = []
    md = summary_markdown(s).splitlines()
    assert "| model | A | B-1 | B-2 | C | Average |" in md and "|---|---:|---:|---:|---:|---:|" in md
    assert "| ours | 85.0 ± 7.1 | 50.0 | 10.0 | 30.0 | 67.5 |" in md
    assert "| half | 70.0 | – | – | – | – |" in md
    assert "| *BERT-base* | *84.0* | *70.0* | – | *1.0* | *77.0* |" in md
    assert "| *other* | *80.0* | – | – | – | – |" in md
    assert "Average: the mean of A, B-1." in md
    assert any("Training sets cut to their first 1,000 examples. Trained in bf16, scored in fp32." in x for x in md)
    assert "*Italic rows*: published figures, not run here (BERT-base: the paper; other: elsewhere)." in md
    s.update(suite_averaged=False, averages={}, published=[], max_train=None, precision="fp32")
    md = summary_markdown(s)
    assert "| model | A | B-1 | B-2 | C |\n|---|---:|---:|---:|---:|\n" in md and "Average" not in md
    assert "Italic" not in md
    s.update(suite_averaged=True, averages=avg, columns=[c for c in cols if c["averaged"]])
    assert "Average: the mean" not in summary_markdown(s)  # said only when some column is left out
    assert "cut to" not in md and "Trained in" not in md


def test_the_protocol_picks_the_setting_on_dev_then_runs_the_seeds_or_the_restarts_there():
    """Bench.steps driven with made-up scores: the grid with the first seed; at the setting best on dev
    (its pick metric), the other seeds (their mean or median is the score) or the restarts (the run
    best on dev is the score); the spread over those runs; a split some runs lack averages the others."""
    from types import SimpleNamespace as NS

    t = SuiteTask("T", "sst2", {"train": "t", "dev": "d"}, (Column("T", "dev", "acc"), Column("T-test", "test", "acc")),
                  pick="f1")
    dev_f1 = {(1e-4, 16): 0.5, (1e-4, 32): 0.6, (2e-4, 16): 0.9, (2e-4, 32): 0.7}

    def run(cell, acc, f1, test=None, seconds=1.0):
        scores = {"dev": {"acc": acc, "f1": f1}} | ({"test": {"acc": test}} if test is not None else {})
        return {"run": f"{cell.lr:g}-{cell.batch}-{cell.seed}", "scores": scores, "seconds": seconds}

    def drive(statistic, restarts):
        p = Protocol(lrs=[1e-4, 2e-4], batch_sizes=[16, 32], seeds=1 if restarts else 3, statistic=statistic,
                     restarts=3 if restarts else 0, seed=7)
        steps = Bench.steps(NS(plan=NS(protocol=p), restarts=lambda task: restarts), "m", t)
        grid = next(steps)
        assert [(c.lr, c.batch, c.seed) for c in grid] == [(1e-4, 16, 7), (1e-4, 32, 7), (2e-4, 16, 7), (2e-4, 32, 7)]
        # dev accuracy disagrees with dev F1 on the best setting: F1 (the pick) rules
        more = steps.send([run(c, acc=1 - dev_f1[c.lr, c.batch], f1=dev_f1[c.lr, c.batch], test=0.4) for c in grid])
        assert [(c.lr, c.batch, c.seed) for c in more] == [(2e-4, 16, 8), (2e-4, 16, 9)]
        with pytest.raises(StopIteration) as end:
            steps.send([run(more[0], acc=0.3, f1=0.95, test=0.8), run(more[1], acc=0.8, f1=0.1, seconds=2.0)])
        return end.value.value

    got = drive("median", restarts=False)
    assert got["lr"] == 2e-4 and got["batch_size"] == 16 and got["restarts"] is False
    assert got["runs"] == ["0.0002-16-7", "0.0002-16-8", "0.0002-16-9"] and got["chosen"] == "0.0002-16-8"
    dev = got["columns"]["T"]
    assert dev["values"] == pytest.approx([0.1, 0.3, 0.8]) and dev["value"] == pytest.approx(0.3)  # the median
    assert dev["std"] == pytest.approx(statistics.stdev([0.1, 0.3, 0.8]))
    assert got["columns"]["T-test"]["values"] == [0.4, 0.8] and got["columns"]["T-test"]["value"] == pytest.approx(0.6)
    assert got["grid_dev"] == {"lr 0.0001 batch 16": 0.5, "lr 0.0001 batch 32": 0.6, "lr 0.0002 batch 16": 0.9,
                               "lr 0.0002 batch 32": 0.7}
    assert got["seconds"] == 4 * 1.0 + 1.0 + 2.0
    assert drive("mean", restarts=False)["columns"]["T"]["value"] == pytest.approx(0.4)
    got = drive("mean", restarts=True)  # the run best on dev (seed 8: F1 0.95), not a mean
    assert got["restarts"] is True and got["columns"]["T"]["value"] == pytest.approx(0.3)
    assert got["columns"]["T-test"]["value"] == pytest.approx(0.8)
    # restarts replace the seeds on a task smaller than `small` training examples, when there are 2 or more
    p = Protocol(lrs=[1e-4], batch_sizes=[16], restarts=5, small=100)
    assert restarts_apply(p, 99) and not restarts_apply(p, 100)
    assert not restarts_apply(Protocol(lrs=[1e-4], batch_sizes=[16], restarts=1, small=100), 10)
