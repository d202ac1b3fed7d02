"""The CLUE suite: every task's files in CLUE's own layout (each task's keys, CSL's keyword lists,
CLUEWSC2020's span offsets, CLUENER's entity offsets, C3's two-file JSON arrays, the "-" labels of
CMNLI and OCNLI) read from a fixture of real Chinese text, and the leaderboard's files written back."""

import json
from pathlib import Path

import pytest
import realdata
from clihelp import cli, jsonl, tiny_bert

from torchbert.apps import clue
from torchbert.apps.benchmark import PROTOCOLS, Plan, first_examples, plan_benchmark, prepared_files
from torchbert.apps.benchmark_table import columns_of
from torchbert.apps.samples import peoples_daily_ner
from torchbert.apps.suites import SUITES
from torchbert.eval.metrics import cmrc_scores, squad_scores
from torchbert.tasks.families import read_examples, task_settings


def sentences(n: int, skip: int = 0) -> list[str]:
    out = [s for s in realdata.peoples_daily_sentences() if 8 < len(s) < 60]
    return out[skip:skip + n]


def clue_folder(root: Path, n: int = 16) -> Path:
    """CLUE's task folders as its download unzips them, from People's Daily: train n, dev and test n/2
    each; test lines carry an id and no label. A pair is labelled by whether its two sentences are one."""
    a, b = sentences(4 * n), sentences(4 * n, skip=4 * n)
    c = root / "clue"
    splits = {"train": range(0, n), "dev": range(n, n + n // 2), "test": range(n + n // 2, 2 * n)}

    def put(folder: str, make, names=None) -> None:
        for split, ids in splits.items():
            rows = [make(i, split) for i in ids]
            if split == "test":
                rows = [{"id": k, **{key: v for key, v in r.items() if not key.startswith("label")}}
                        for k, r in enumerate(rows)]
            jsonl(c / folder / (names or {}).get(split, f"{split}.json"), rows)

    put("afqmc_public", lambda i, s: {"sentence1": a[i], "sentence2": a[i] if i % 2 else b[i], "label": str(i % 2)})
    put("tnews_public", lambda i, s: {"label": "102" if len(a[i]) > 30 else "101", "label_desc": "news",
                                      "sentence": a[i], "keywords": ""})
    put("iflytek_public", lambda i, s: {"label": str(i % 3), "label_des": "app", "sentence": a[i]})

    def nli(i, s):
        label = "-" if i % 7 == 3 and s != "test" else ["entailment", "neutral", "contradiction"][i % 3]
        return {"sentence1": a[i], "sentence2": a[i] if label == "entailment" else b[i], "label": label}

    put("cmnli_public", nli)
    put("ocnli_public", lambda i, s: {"level": "easy", **nli(i, s), "label0": "neutral", "genre": "news",
                                      "prem_id": f"p{i}", "id": i}, {"train": "train.50k.json"})

    def wsc(i, s):
        text = a[i]
        return {"target": {"span2_index": len(text) - 3, "span1_index": 1, "span1_text": text[1:3],
                           "span2_text": text[-3]}, "idx": i, "label": "true" if i % 2 else "false", "text": text}

    put("cluewsc2020_public", wsc)
    put("csl_public", lambda i, s: {"id": i, "abst": a[i], "keyword": [a[i][:2], b[i][:2]], "label": str(i % 2)})

    ner = [x for x in peoples_daily_ner() if any(t != "O" for t in x[2])][:2 * n]

    def cluener(i, s):
        chars, tags = list(ner[i][1]), ner[i][2]
        if i == 0:
            chars[0] = " "  # CLUENER's texts hold spaces now and then
        text = "".join(chars)
        spans = clue.entities(text, tags)
        return {"text": text, "label": spans}

    put("cluener_public", cluener)

    cmrc = c / "cmrc2018_public"
    cmrc.mkdir()
    for split, ids in splits.items():
        paragraphs = []
        for i in ids:
            qa = {"id": f"TRAIN_{i}_QUERY_0", "question": f"{a[i][:4]}之后是什么？"}
            if split != "test":
                qa["answers"] = [{"text": a[i][4:8], "answer_start": 4}]
            paragraphs.append({"id": f"P{i}", "context": a[i], "qas": [qa]})
        (cmrc / f"{split}.json").write_text(json.dumps({"version": "v1.0", "data": [
            {"id": "D0", "title": "t", "paragraphs": paragraphs}]}, ensure_ascii=False), encoding="utf-8")

    def c3(ids, labelled: bool) -> list:
        items = []
        for i in ids:
            q = {"question": f"{a[i][:3]}？", "choice": [a[i][3:6], b[i][3:6], b[i][6:9]], "answer": a[i][3:6]}
            if not labelled:
                q = {"question": q["question"], "choice": q["choice"], "id": i}
            items.append([[a[i], b[i]], [q], f"doc{i}"])
        return items

    (c / "c3_public").mkdir()
    for split, ids in splits.items():
        if split == "test":
            (c / "c3_public" / "test1.1.json").write_text(json.dumps(c3(ids, False), ensure_ascii=False), "utf-8")
            continue
        half = len(ids) // 2
        for kind, part in (("d", list(ids)[:half]), ("m", list(ids)[half:])):
            (c / "c3_public" / f"{kind}-{split}.json").write_text(json.dumps(c3(part, True), ensure_ascii=False),
                                                                 "utf-8")
    return c


def test_every_clue_task_is_read_in_its_own_layout(tmp_path):
    c = clue_folder(tmp_path)
    notes = []
    plan = plan_benchmark("clue", {"m": tmp_path}, c, tmp_path / "out", PROTOCOLS["paper"][0], log=notes.append)
    assert [t.name for t in plan.tasks] == [t.name for t in SUITES["clue"].tasks] and notes == []
    read = {}
    for t in plan.tasks:
        files = prepared_files(t, c, tmp_path / "out", log=notes.append)
        assert set(files) == {"train", "dev", "test"}
        ts = task_settings(t.task)
        read[t.name] = {split: read_examples(path, ts.type, ts.layout, labelled=split != "test")
                        for split, path in files.items()}
    sizes = {name: tuple(len(x[s]) for s in ("train", "dev", "test")) for name, x in read.items()}
    # "-" pairs (line indices 3 and 10 of train, 17 of dev) left out of CMNLI's and OCNLI's labelled splits
    assert sizes["CMNLI"] == sizes["OCNLI"] == (14, 7, 8)
    assert notes == [f"note: {c}/{d}/{f}: left out {k} pair(s) labelled '-' (the annotators did not agree), as "
                     "CLUE does" for d, f, k in (("cmnli_public", "train.json", 2), ("cmnli_public", "dev.json", 1),
                                                 ("ocnli_public", "train.50k.json", 2), ("ocnli_public", "dev.json", 1))]
    for name in ("AFQMC", "TNEWS", "IFLYTEK", "WSC", "CSL", "CLUENER", "CMRC2018", "C3"):
        assert sizes[name] == (16, 8, 8), name
    afqmc = read["AFQMC"]
    assert afqmc["train"][1].text_a == afqmc["train"][1].text_b and afqmc["train"][1].label == "1"
    assert [e.id for e in afqmc["test"]] == [str(k) for k in range(8)]  # the test file's own ids
    wsc = read["WSC"]["train"][0]
    text = sentences(1)[0]
    assert wsc.text_a == f"{text[0]}_{text[1:3]}_{text[3:-3]}[{text[-3]}]{text[-2:]}" and wsc.label == "false"
    csl = read["CSL"]["dev"][0]
    assert csl.text_a.split(" ")[0] == csl.text_b[:2]
    ner = read["CLUENER"]["train"]
    assert ner[0].words[0] == clue.SPACE  # a space of the text, as a token CoNLL can hold
    assert any(t.startswith("B-") for t in ner[1].tags) and read["CLUENER"]["test"][0].tags is None
    c3 = read["C3"]
    assert [x.id for x in c3["train"][:2]] == ["doc0-0", "doc1-0"] and c3["train"][8].id == "doc8-0"  # d-, then m-
    assert all(x.label == 0 and len(x.choices) == 3 for x in c3["train"])
    assert c3["test"][0].id == "24"


def test_clues_average_is_its_classification_score_and_the_current_files_are_read(tmp_path):
    """CLUE 1.0's score: the mean of its six classification tasks (68.77 for the paper's BERT-base); of
    C3's test files the one CLUE 1.1 scores (test1.1.json), of OCNLI's the 50k training set; a training
    file cut to its first examples (--max-train) keeps them all, converted files having no header."""
    suite = SUITES["clue"]
    cols = columns_of(Plan(suite, {}, tmp_path, None, list(suite.tasks), tmp_path))
    averaged = [c["title"] for c in cols if c["averaged"]]
    assert averaged == ["AFQMC", "TNEWS", "IFLYTEK", "CMNLI", "WSC", "CSL"]
    (published,) = suite.published
    assert round(sum(published.scores[t] for t in averaged) / 6, 2) == 68.77
    assert suite.task("CMRC2018").select == "f1"
    c = clue_folder(tmp_path)
    (c / "c3_public" / "test.json").write_text(json.dumps([[["文"], [{"question": "问？", "choice": ["a", "b"],
                                                                      "id": 0}], "old"]]), "utf-8")
    old = (c / "ocnli_public" / "train.50k.json").read_text(encoding="utf-8").splitlines(keepends=True)
    (c / "ocnli_public" / "train.json").write_text("".join(old[:4]), encoding="utf-8")
    notes = []
    for t in suite.tasks:
        ts = task_settings(t.task)
        files = prepared_files(t, c, tmp_path / "out", log=notes.append)
        sizes = {split: len(read_examples(path, ts.type, ts.layout, labelled=split != "test"))
                 for split, path in files.items()}
        assert sizes == ({"train": 14, "dev": 7, "test": 8} if t.name in ("CMNLI", "OCNLI") else
                         {"train": 16, "dev": 8, "test": 8}), t.name
        cut = tmp_path / "cut" / f"{t.name}{files['train'].suffix}"
        first_examples(files["train"], cut, 5, t.header)
        got = read_examples(cut, ts.type, ts.layout)
        assert [e.id for e in got] == [e.id for e in read_examples(files["train"], ts.type, ts.layout)][:5], t.name


def test_a_bad_clue_line_is_one_error_naming_the_file_and_line(tmp_path, capsys, minilm_dir):
    c = clue_folder(tmp_path)
    path = c / "cluewsc2020_public" / "dev.json"
    lines = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[2])
    record["target"]["span1_index"] += 5
    lines[2] = json.dumps(record, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, _, err = cli(capsys, "benchmark", "clue", "--model", minilm_dir, "--data", c, "--out", tmp_path / "b",
                       "--tasks", "WSC")
    assert code == 2 and f"{path}:3: span1_text" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b" / "runs").exists()


def test_clue_entities_and_cmrc_scoring():
    assert clue.entities("张三在北京", ["B-name", "I-name", "O", "B-address", "I-address"]) == {
        "name": {"张三": [[0, 1]]}, "address": {"北京": [[3, 4]]}}
    assert clue.entities("ab", ["I-x", "B-y"]) == {"x": {"a": [[0, 0]]}, "y": {"b": [[1, 1]]}}
    # CMRC 2018's rules: marks dropped, a character a token, F1 over the longest common run
    assert cmrc_scores(["北京大学"], "北京大学。") == (1.0, 1.0)
    assert cmrc_scores(["北京大学"], "京大学生") == (0.0, pytest.approx(0.75))
    assert cmrc_scores(["1990年"], "1990") == (0.0, pytest.approx(2 / 3))
    # English questions keep SQuAD's rules in the same call
    s = squad_scores({"a": ["北京大学"], "b": ["the cat"]}, {"a": "北京", "b": "cat"})
    assert s["exact_match"] == 0.5 and s["f1"] == pytest.approx((2 / 3 + 1) / 2)


@pytest.mark.e2e
def test_clue_writes_the_leaderboard_files(tmp_path, capsys, minilm_dir):
    c = clue_folder(tmp_path)
    tiny = tiny_bert(tmp_path / "tiny", minilm_dir)
    out = tmp_path / "b"
    proto = tmp_path / "p.json"
    proto.write_text(json.dumps({"lrs": [1e-3], "batch_sizes": [8], "epochs": 1, "max_length": 48, "seeds": 1,
                                 "restarts": 0}), encoding="utf-8")
    code, _, err = cli(capsys, "benchmark", "clue", "--model", f"tiny={tiny}", "--data", c, "--out", out,
                       "--protocol", proto, "--tasks", "TNEWS", "CLUENER", "CMRC2018", "C3", "WSC")
    assert code == 0, err
    sub = out / "submission" / "tiny"
    assert sorted(p.name for p in sub.iterdir()) == ["c311_predict.json", "cluener_predict.json",
                                                    "cluewsc11_predict.json", "cmrc2018_predict.json",
                                                    "tnews11_predict.json"]
    tnews = [json.loads(x) for x in (sub / "tnews11_predict.json").read_text(encoding="utf-8").splitlines()]
    assert [x["id"] for x in tnews] == list(range(8)) and {x["label"] for x in tnews} <= {"101", "102"}
    ner = [json.loads(x) for x in (sub / "cluener_predict.json").read_text(encoding="utf-8").splitlines()]
    texts = [json.loads(x)["text"] for x in (c / "cluener_public" / "test.json").read_text("utf-8").splitlines()]
    assert [x["id"] for x in ner] == list(range(8))
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    chosen = Path(s["results"]["tiny"]["CLUENER"]["chosen"])
    tags = [json.loads(x)["tags"] for x in (chosen / "predictions-test.jsonl").read_text("utf-8").splitlines()]
    assert [x["label"] for x in ner] == [clue.entities(text, t) for text, t in zip(texts, tags)]
    answers = json.loads((sub / "cmrc2018_predict.json").read_text(encoding="utf-8"))
    assert sorted(answers) == sorted(f"TRAIN_{i}_QUERY_0" for i in range(24, 32))
    c3 = [json.loads(x) for x in (sub / "c311_predict.json").read_text(encoding="utf-8").splitlines()]
    assert [x["id"] for x in c3] == list(range(24, 32)) and {x["label"] for x in c3} <= {0, 1, 2}
    assert [x["title"] for x in s["columns"]] == ["TNEWS", "CLUENER", "CMRC2018 EM", "CMRC2018 F1", "C3", "WSC"]
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "*BERT-base (CLUE paper)*" in md and "*56.6*" in md
    assert "Average: the mean of TNEWS, WSC." in md  # CLUE 1.0's classification tasks among those run
    # the table as the suite's own TensorBoard run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard" / "tiny"))
    events.Reload()
    tnews = s["results"]["tiny"]["TNEWS"]["columns"]["TNEWS"]["value"]
    assert [e.value for e in events.Scalars("clue/TNEWS")] == [pytest.approx(100 * tnews)]
    assert [e.value for e in events.Scalars("clue/Average")] == [pytest.approx(s["averages"]["tiny"])]


def convert(tmp_path, converter, rows, labelled=True, warn=None):
    """What a converter writes of one file of these JSON lines, as text."""
    src, dst = tmp_path / "in.json", tmp_path / "out.txt"
    jsonl(src, rows)
    converter(src, dst, labelled, warn or (lambda m: None))
    return dst.read_text(encoding="utf-8")


@pytest.mark.parametrize("converter, row, message", [
    (clue.text_converter("AFQMC", ("sentence1", "sentence2")), {"sentence1": "a", "sentence2": "b", "label": ""},
     "in.json:1: no label; a labelled AFQMC line has sentence1, sentence2, label"),
    (clue.convert_csl, {"keyword": ["a", 2], "abst": "b", "label": "1"}, "in.json:1: 'keyword' is \\[\"a\", 2\\]"),
    (clue.convert_csl, {"keyword": ["a"], "abst": "b"}, "in.json:1: no label; a labelled CSL line"),
    (clue.convert_wsc, {"text": "abc", "label": "true"}, "in.json:1: no 'target' object"),
    (clue.convert_wsc, {"text": "abcdef", "label": "true", "target": {"span1_index": 0, "span1_text": "ab",
                                                                     "span2_index": 3, "span2_text": "x"}},
     "in.json:1: span2_text 'x' is not at span2_index 3"),
    (clue.convert_wsc, {"text": "abcdef", "label": "yes", "target": {"span1_index": 0, "span1_text": "ab",
                                                                    "span2_index": 3, "span2_text": "d"}},
     "in.json:1: label 'yes'; a labelled CLUEWSC2020 line"),
    (clue.convert_cluener, {"text": "  ", "label": {}}, "in.json:1: an empty text"),
    (clue.convert_cluener, {"text": "张三来了", "label": ["name"]}, "in.json:1: 'label' is not an object"),
    (clue.convert_cluener, {"text": "张三来了", "label": {"name": {"张三": [[1, 2]]}}},
     r"in.json:1: name '张三' is not at \[1, 2\] of the text"),
])
def test_a_bad_line_of_each_layout_is_named(tmp_path, converter, row, message):
    with pytest.raises(ValueError, match=message):
        convert(tmp_path, converter, [row])


def test_each_layout_converts_as_clue_reads_it(tmp_path):
    # ids: the file's own ("id", or WSC's "idx"; an empty one is none), else the line's index from 0
    afqmc = clue.text_converter("AFQMC", ("sentence1", "sentence2"), drop_unsure=True)
    warned = []
    rows = [{"sentence1": "a", "sentence2": "b", "label": 1}, {"sentence1": "c", "sentence2": "d", "label": "-"},
            {"idx": 7, "sentence1": "e", "sentence2": "f", "label": "0"}, {"id": "", "sentence1": "g", "sentence2": "h",
                                                                          "label": "0"}]
    got = [json.loads(x) for x in convert(tmp_path, afqmc, rows, warn=warned.append).splitlines()]
    assert [(x["id"], x["label"]) for x in got] == [("0", "1"), ("7", "0"), ("3", "0")]
    assert len(warned) == 1 and "left out 1 pair(s) labelled '-'" in warned[0]
    # WSC: both spans marked at their offsets, the later one first so the earlier offsets hold
    wsc = {"text": "abcdef", "label": "true", "target": {"span2_index": 4, "span2_text": "e", "span1_index": 1,
                                                         "span1_text": "bc"}}
    assert json.loads(convert(tmp_path, clue.convert_wsc, [wsc]))["sentence"] == "a_bc_d[e]f"
    # CLUENER: an entity's last character (end included) tagged I-
    text = convert(tmp_path, clue.convert_cluener, [{"text": "在北京大学", "label": {"org": {"北京大学": [[1, 4]]}}}])
    assert text.splitlines() == ["在\tO", "北\tB-org", "京\tI-org", "大\tI-org", "学\tI-org"]


def test_c3_reads_both_files_and_checks_each_question(tmp_path):
    def item(answer="b", choices=("a", "b")):
        return [["文"], [{"question": "问？", "choice": list(choices), "answer": answer}], "d0"]

    (tmp_path / "d-dev.json").write_text(json.dumps([item()]), encoding="utf-8")
    (tmp_path / "m-dev.json").write_text(json.dumps([item("a")]), encoding="utf-8")
    dst = tmp_path / "out.jsonl"
    clue.convert_c3(tmp_path / "d-dev.json", dst, True, print)
    assert [json.loads(x)["label"] for x in dst.read_text().splitlines()] == [1, 0]  # d-, then m-
    for bad, message in ((item("c"), "the answer 'c' is not a choice"), (item("a", ("a",)), "2 or more")):
        (tmp_path / "d-dev.json").write_text(json.dumps([bad]), encoding="utf-8")
        with pytest.raises(ValueError, match=f"d-dev.json: item 0, question 0: .*{message}"):
            clue.convert_c3(tmp_path / "d-dev.json", dst, True, print)


def test_leaderboard_files_use_the_official_ids_and_entities():
    assert clue.submit_labels([{"id": "12", "label": "1"}, {"id": "x-3", "label": "0"}], Path("-")) == \
        '{"id": 12, "label": "1"}\n{"id": "x-3", "label": "0"}\n'
    # an I- tag of another type starts an entity of its own
    assert clue.entities("abcd", ["B-x", "I-y", "I-y", "O"]) == {"x": {"a": [[0, 0]]}, "y": {"bc": [[1, 2]]}}


def test_entities_are_written_back_one_line_per_test_line(tmp_path):
    src = tmp_path / "test.json"
    jsonl(src, [{"id": 0, "text": "张三"}, {"id": 1, "text": "李四"}])
    with pytest.raises(ValueError, match="test.json: 2 lines, but 1 predictions"):
        clue.submit_entities([{"tags": ["B-name", "I-name"]}], src)
