"""Task file readers: every format and layout, read from small files, and one test per kind of bad input.

Real text where it is easy: People's Daily sentences (Chinese) and WNUT-16 tweets; the real WNUT-16 CoNLL
file must read into the same sentences, tokens and tags as the independent parser in realdata.py.
"""

from __future__ import annotations

import csv
import json
import re

import pytest
import realdata

from torchbert.tasks.choice import read_choices
from torchbert.tasks.examples import LabelMap
from torchbert.tasks.families import FAMILIES, read_examples, resolve_task
from torchbert.tasks.formats import TASK_PRESETS as PRESETS
from torchbert.tasks.qa import Answer, read_squad
from torchbert.tasks.tagging import read_conll
from torchbert.tasks.text import TextExample, read_text_examples


def write(path, text: str):
    path.write_bytes(text.encode("utf-8"))
    return path


def at(path, line: int | None = None) -> str:
    """A regex for the start of an error message: FILE:LINE or FILE."""
    return "^" + re.escape(f"{path}:{line}" if line else str(path))


def tsv(*rows) -> str:
    return "".join("\t".join(row) + "\n" for row in rows)


@pytest.fixture(scope="module")
def zh():
    """Eight real Chinese sentences without tabs, commas or quotes (so they can go into any file)."""
    out = [s for s in realdata.peoples_daily_sentences() if not any(c in s for c in '\t,"')]
    return out[:8]


# ----------------------------------------------------------------------------------------------
# presets


def test_resolve_task():
    for t in FAMILIES:
        assert resolve_task(t) == (t, None)
    assert resolve_task("mrpc") == ("pair", PRESETS["mrpc"])
    assert resolve_task("STSB") == ("regression", PRESETS["stsb"])
    assert resolve_task("squad_v2")[0] == "qa-v2"
    for p in PRESETS.values():
        assert p.type in FAMILIES and p.layout in FAMILIES[p.type].layouts
    with pytest.raises(ValueError, match=r"unknown task 'mrcp'.*classification.*mrpc.*swag"):
        resolve_task("mrcp")


# ----------------------------------------------------------------------------------------------
# text tasks, layout auto


def test_tsv_single_sentence(tmp_path, zh):
    path = write(tmp_path / "train.tsv", tsv(["sentence", "label"], [zh[0], "pos"], [zh[1], "neg"], [zh[2], "1"]))
    ex = read_examples(path, "classification")
    assert [e.text_a for e in ex] == zh[:3]
    assert [e.label for e in ex] == ["pos", "neg", "1"]
    assert all(e.text_b is None for e in ex)
    assert [e.id for e in ex] == ["2", "3", "4"]  # no id column: the line number
    assert [e.where for e in ex] == [f"{path}:{n}" for n in (2, 3, 4)]


def test_csv_pair_with_quoted_fields(tmp_path):
    """RFC 4180 quoting: commas, doubled quotes and a newline inside a field; `where` is the row's first line."""
    rows = [["id", "sentence1", "sentence2", "label"],
            ["a", 'He said "hi", then left.', "He left.", "entailment"],
            ["b", "Two\nlines", "One line, with a comma", "neutral"],
            ["c", "plain", "text", "contradiction"]]
    path = tmp_path / "dev.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    ex = read_examples(path, "pair")
    assert [(e.id, e.text_a, e.text_b, e.label) for e in ex] == [tuple(r) for r in rows[1:]]
    assert [e.where for e in ex] == [f"{path}:2", f"{path}:3", f"{path}:5"]


@pytest.mark.parametrize("a, b", [("text_a", "text_b"), ("premise", "hypothesis"), ("question", "sentence")])
def test_pair_aliases(tmp_path, zh, a, b):
    path = write(tmp_path / "train.tsv", tsv(["idx", a, b, "gold_label"], ["7", zh[0], zh[1], "x"]))
    (e,) = read_text_examples(path, pair=True, regression=False)
    assert (e.id, e.text_a, e.text_b, e.label) == ("7", zh[0], zh[1], "x")


def test_jsonl(tmp_path, zh):
    """JSON integers become strings; `text` stands for sentence; blank lines are skipped; a BOM is dropped."""
    lines = [json.dumps({"text": zh[0], "label": 1, "id": 10}, ensure_ascii=False), "",
             json.dumps({"text": zh[1], "label": "spam"}, ensure_ascii=False)]
    path = write(tmp_path / "train.jsonl", "\ufeff" + "\n".join(lines) + "\n")
    ex = read_examples(path, "classification")
    assert [(e.id, e.text_a, e.label, e.where) for e in ex] == [
        ("10", zh[0], "1", f"{path}:1"), ("3", zh[1], "spam", f"{path}:3")]


def test_bom_header(tmp_path):
    path = write(tmp_path / "train.tsv", "\ufeff" + tsv(["sentence", "label"], ["a b", "0"]))
    assert read_examples(path, "classification")[0].label == "0"


def test_regression_reads_single_or_pairs(tmp_path, zh):
    single = write(tmp_path / "s.tsv", tsv(["sentence", "label"], [zh[0], "3.8"], [zh[1], "-1"]))
    assert [(e.text_b, e.label) for e in read_examples(single, "regression")] == [(None, 3.8), (None, -1.0)]
    pairs = write(tmp_path / "p.jsonl", json.dumps({"sentence1": "a", "sentence2": "b", "label": 4}) + "\n")
    (e,) = read_examples(pairs, "regression")
    assert (e.text_a, e.text_b, e.label) == ("a", "b", 4.0) and isinstance(e.label, float)


def test_unlabelled_inputs(tmp_path):
    """Predict inputs: no label column is fine; present labels are still read; empty ones become None."""
    path = write(tmp_path / "test.tsv", tsv(["index", "sentence"], ["0", "a"], ["1", "b"]))
    assert [(e.id, e.label) for e in read_examples(path, "classification", labelled=False)] == [("0", None),
                                                                                               ("1", None)]
    path = write(tmp_path / "mixed.tsv", tsv(["sentence", "label"], ["a", "yes"], ["b", ""]))
    assert [e.label for e in read_examples(path, "classification", labelled=False)] == ["yes", None]
    with pytest.raises(ValueError, match=at(path, 3) + r": empty 'label'"):
        read_examples(path, "classification")


# ----------------------------------------------------------------------------------------------
# GLUE layouts: the official TSVs

MNLI_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
               "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "label2", "label3",
               "label4", "label5", "gold_label"]
STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
               "score"]

# layout: (rows of the file, (id, text_a, text_b, label) of its one example)
GLUE_CASES = {
    "glue-cola": ([["gj04", "0", "*", "The cat purred the dog."]], ("1", "The cat purred the dog.", None, "0")),
    "glue-sst2": ([["sentence", "label"], ["a gorgeous , witty film ", "1"]],
                  ("2", "a gorgeous , witty film ", None, "1")),
    "glue-mrpc": ([["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], ["1", "702876", "702977", "He ran .",
                                                                              "He was running ."]],
                  ("2", "He ran .", "He was running .", "1")),
    "glue-stsb": ([STSB_HEADER, ["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none",
                                 "A plane is taking off.", "An air plane is taking off.", "5.000"]],
                  ("0", "A plane is taking off.", "An air plane is taking off.", 5.0)),
    "glue-qqp": ([["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                  ["133273", "213221", "213222", 'How is "the" cat?', "How's the cat?", "0"]],
                 ("133273", 'How is "the" cat?', "How's the cat?", "0")),
    "glue-mnli": ([MNLI_HEADER, ["0", "63735", "63735n", "slate", "( ( The ...", "( ( Tom ...", "(ROOT", "(ROOT",
                                 'The "new" rights are nice enough', "Everyone really likes the newest benefits ",
                                 "neutral", "entailment", "neutral", "neutral", "neutral", "neutral"]],
                  ("0", 'The "new" rights are nice enough', "Everyone really likes the newest benefits ", "neutral")),
    "glue-qnli": ([["index", "question", "sentence", "label"], ["0", "What is it?", "It is a cat.", "entailment"]],
                  ("0", "What is it?", "It is a cat.", "entailment")),
    "glue-rte": ([["index", "sentence1", "sentence2", "label"], ["0", "Dana left.", "Dana is gone.", "entailment"]],
                 ("0", "Dana left.", "Dana is gone.", "entailment")),
    "glue-wnli": ([["index", "sentence1", "sentence2", "label"], ["3", "I poured it.", "It was poured.", "1"]],
                  ("3", "I poured it.", "It was poured.", "1")),
}


@pytest.mark.parametrize("layout", list(GLUE_CASES))
def test_glue_layouts(tmp_path, layout):
    rows, expected = GLUE_CASES[layout]
    path = write(tmp_path / "train.txt", tsv(*rows))  # the layout, not the extension, decides
    task = PRESETS[layout.removeprefix("glue-")].type
    (e,) = read_examples(path, task, layout=layout)
    assert (e.id, e.text_a, e.text_b, e.label) == expected
    assert e.where == f"{path}:{len(rows)}"


def test_glue_test_files_have_no_labels(tmp_path):
    cola = write(tmp_path / "cola_test.tsv", tsv(["index", "sentence"], ["0", "Bill whistled."]))
    (e,) = read_examples(cola, "classification", layout="glue-cola", labelled=False)
    assert (e.id, e.text_a, e.label) == ("0", "Bill whistled.", None)
    mnli = write(tmp_path / "mnli_test.tsv", tsv(MNLI_HEADER[:10], ["0"] + ["x"] * 7 + ["Hi.", "Hello."]))
    (e,) = read_examples(mnli, "pair", layout="glue-mnli", labelled=False)
    assert (e.text_a, e.text_b, e.label) == ("Hi.", "Hello.", None)
    with pytest.raises(ValueError, match=at(mnli, 1) + r": no 'gold_label' column, which a glue-mnli file has"):
        read_examples(mnli, "pair", layout="glue-mnli")


def test_layout_must_fit_the_task(tmp_path):
    path = write(tmp_path / "dev.tsv", tsv(*GLUE_CASES["glue-mrpc"][0]))
    with pytest.raises(ValueError, match=r"layout 'glue-mrpc' is for pair classification tasks, "
                                         r"not single-sentence classification"):
        read_examples(path, "classification", layout="glue-mrpc")
    with pytest.raises(ValueError, match=r"layout 'squad' does not fit a token task"):
        read_examples(path, "token", layout="squad")


def test_nli_jsonl_drops_disputed_pairs(tmp_path):
    rows = [{"sentence1": "A man sleeps.", "sentence2": "A man rests.", "gold_label": "entailment", "pairID": "p1"},
            {"sentence1": "A dog runs.", "sentence2": "A cat runs.", "gold_label": "-", "pairID": "p2"},
            {"sentence1": "Kids play.", "sentence2": "Kids cry.", "gold_label": "-", "pairID": "p3"},
            {"sentence1": "It rains.", "sentence2": "It is dry.", "gold_label": "contradiction", "pairID": "p4"}]
    path = write(tmp_path / "snli.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    warnings = []
    ex = read_examples(path, "pair", layout="nli-jsonl", warn=warnings.append)
    assert [(e.id, e.label, e.where) for e in ex] == [("p1", "entailment", f"{path}:1"),
                                                      ("p4", "contradiction", f"{path}:4")]
    assert len(warnings) == 1 and "dropped 2 pairs" in warnings[0]
    warnings.clear()
    ex = read_examples(path, "pair", layout="nli-jsonl", labelled=False, warn=warnings.append)
    assert [e.label for e in ex] == ["entailment", None, None, "contradiction"] and not warnings


# ----------------------------------------------------------------------------------------------
# CoNLL


def test_conll_2003_layout(tmp_path):
    """Space-separated, four columns (tag last), -DOCSTART- and its blank line, a whitespace-only line."""
    text = ("-DOCSTART- -X- -X- O\n\n"
            "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n"
            "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n \t \n"
            "BRUSSELS NNP B-NP B-LOC\n")
    path = write(tmp_path / "train.txt", text)
    ex = read_examples(path, "token")
    assert [(e.words, e.tags, e.where) for e in ex] == [
        (["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"], f"{path}:3"),
        (["Peter", "Blackburn"], ["B-PER", "I-PER"], f"{path}:7"),
        (["BRUSSELS"], ["B-LOC"], f"{path}:10")]
    assert [e.id for e in ex] == ["3", "7", "10"]


def test_conll_real_wnut_file():
    ex = read_conll(realdata.wnut_path())
    expected = realdata.wnut_sentences()
    assert len(ex) == len(expected) > 2000
    assert [(tuple(e.words), tuple(e.tags)) for e in ex] == list(expected)


def test_conll_unlabelled_tokens(tmp_path):
    path = write(tmp_path / "predict.txt", "Empire\nState\n\t\n@paulwalk\nhi\n")
    ex = read_conll(path, labelled=False)
    assert [(e.words, e.tags) for e in ex] == [(["Empire", "State"], None), (["@paulwalk", "hi"], None)]
    tagged = write(tmp_path / "tagged.txt", "Empire\tB-facility\nState\tI-facility\n")
    assert read_conll(tagged, labelled=False)[0].tags == ["B-facility", "I-facility"]
    mixed = write(tmp_path / "mixed.txt", "Empire\tB-facility\nState\n")
    with pytest.raises(ValueError, match=at(mixed, 2) + r": 1 columns, but line 1 has a tag"):
        read_conll(mixed, labelled=False)


def test_tagging_reads_sentences_to_predict_from_json_lines_and_conll_from_any_other_file(tmp_path):
    """Each JSON line a sentence, as "tokens" or as "text" cut into BERT's words (cased as written,
    punctuation and Chinese characters apart); a .txt is CoNLL (CoNLL-2003's files are .txt)."""
    from torchbert.tasks.tagging import split_words

    path = write(tmp_path / "predict.jsonl", '{"text": "I love Paris, and   New-York!"}\n\n'
                                             '{"id": 7, "text": "江泽民在北京会见了Clinton。"}\n'
                                             '{"tokens": ["Empire", "State"], "text": "ignored"}\n')
    ex = read_examples(path, "token", labelled=False)
    assert [(e.id, e.words, e.tags, e.where) for e in ex] == [
        ("1", ["I", "love", "Paris", ",", "and", "New", "-", "York", "!"], None, f"{path}:1"),
        ("7", ["江", "泽", "民", "在", "北", "京", "会", "见", "了", "Clinton", "。"], None, f"{path}:3"),
        ("4", ["Empire", "State"], None, f"{path}:4")]
    # cased and accented as written; a symbol (°, Unicode's So) stays in its word, as in BERT's tokenizer
    assert split_words("ÉCOLE\tn°5 «a２b»") == ["ÉCOLE", "n°5", "«", "a２b", "»"]
    assert split_words("Obama访华,IBM中国公司") == ["Obama", "访", "华", ",", "IBM", "中", "国", "公", "司"]
    as_json = write(tmp_path / "predict.json", '{"text": "Obama访华"}\n')  # .json: JSON Lines too
    assert [e.words for e in read_examples(as_json, "token", labelled=False)] == [["Obama", "访", "华"]]
    assert [e.words for e in read_examples(as_json, "token", layout="conll", labelled=False)] == [
        ['{"text":']]  # the layout asked for: CoNLL, whatever the extension
    with pytest.raises(ValueError, match=at(path) + r": tagging reads tags from CoNLL .*JSON Lines are predict inputs"):
        read_examples(path, "token")
    for record, words in (('{"text": " \\t "}', r'"text" holds no words'),
                          ('{"tokens": "a b"}', r'"tokens" is "a b"; expected a non-empty list of words'),
                          ('{"sentence": "a b"}', r'"tokens" is missing; expected .* or "text", a sentence')):
        bad = write(tmp_path / "bad.jsonl", record + "\n")
        with pytest.raises(ValueError, match=at(bad, 1) + ": " + words):
            read_examples(bad, "token", labelled=False)
    with pytest.raises(ValueError, match=at(write(tmp_path / "none.jsonl", "\n")) + r": no examples in the file"):
        read_examples(tmp_path / "none.jsonl", "token", labelled=False)
    conll = write(tmp_path / "train.txt", "EU B-ORG\nrejects O\n\nPeter B-PER\n")
    assert [e.tags for e in read_examples(conll, "token")] == [["B-ORG", "O"], ["B-PER"]]
    notes: list[str] = []  # a predict input of sentences a line, given as .txt, is CoNLL: said
    for name, text, words in (("en.txt", "I love Paris\nBerlin is big\n", ["I", "Berlin"]),
                              ("zh.txt", "江泽民在北京。\n克林顿访华\n",
                               ["江泽民在北京。", "克林顿访华"])):
        lined = write(tmp_path / name, text)
        assert [e.words for e in read_examples(lined, "token", labelled=False, warn=notes.append)] == [words]
        assert notes.pop() == (f"{lined}: read as CoNLL, one sentence of 2 lines (a token a line, no blank line "
                               'between sentences); if each line is a sentence, give JSON Lines, {"text": SENTENCE} '
                               "a line")
    for text in ("EU\nrejects\n\nPeter\n", "EU\n"):  # sentences apart, or one token: nothing to say
        read_examples(write(tmp_path / "ok.txt", text), "token", labelled=False, warn=notes.append)
    read_examples(conll, "token", warn=notes.append)
    read_examples(write(tmp_path / "one.txt", "EU B-ORG\nrejects O\n"), "token", warn=notes.append)  # tagged: CoNLL
    assert notes == []


def test_conll_line_with_one_column(tmp_path, zh):
    path = write(tmp_path / "train.txt", f"{zh[0][0]}\tO\n{zh[0][1]}\n")
    with pytest.raises(ValueError, match=at(path, 2) + r": one column .*expected TOKEN ... TAG"):
        read_conll(path)


# ----------------------------------------------------------------------------------------------
# SQuAD


def squad(qas_by_context: dict[str, list[dict]]) -> str:
    paragraphs = [{"context": c, "qas": qas} for c, qas in qas_by_context.items()]
    return json.dumps({"version": "1.1", "data": [{"title": "T", "paragraphs": paragraphs}]}, ensure_ascii=False)


def test_squad_v1(tmp_path, zh):
    context = zh[0] + zh[1]
    start = len(zh[0])
    doc = squad({context: [
        {"id": "q1", "question": zh[2], "answers": [{"text": zh[1], "answer_start": start},
                                                    {"text": zh[1][:3], "answer_start": start}]},
        {"id": "q2", "question": "Where?", "answers": [{"text": zh[0][:2], "answer_start": 0}]}]})
    path = write(tmp_path / "train.json", doc)
    ex = read_examples(path, "qa")
    assert [(e.id, e.question, e.context, e.is_impossible, e.where) for e in ex] == [
        ("q1", zh[2], context, False, f"{path}: question q1"), ("q2", "Where?", context, False, f"{path}: question q2")]
    assert ex[0].answers == [Answer(zh[1], start), Answer(zh[1][:3], start)]


def test_squad_answer_not_at_answer_start(tmp_path):
    """A misplaced answer is warned, counted and dropped; a question left with none is skipped."""
    context = "The cat sat on the mat."
    doc = squad({context: [
        {"id": "ok", "question": "Who sat?", "answers": [{"text": "cat", "answer_start": 4}]},
        {"id": "half", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 15},
                                                         {"text": "mat", "answer_start": 3}]},
        {"id": "lost", "question": "What?", "answers": [{"text": "dog", "answer_start": 4}]}]})
    path = write(tmp_path / "train.json", doc)
    warnings = []
    ex = read_squad(path, v2=False, warn=warnings.append)
    assert [e.id for e in ex] == ["ok", "half"]
    assert ex[1].answers == [Answer("the mat", 15)]
    assert len(warnings) == 3
    assert warnings[0].startswith(f"{path}: question half: answer 'mat' is not at answer_start 3")
    assert warnings[1].startswith(f"{path}: question lost: answer 'dog'")
    assert warnings[2] == f"{path}: dropped 2 answers not found at their answer_start; skipped 1 questions left " \
                          "with no answer"
    assert [e.id for e in read_squad(path, v2=False, labelled=False, warn=lambda _: None)] == ["ok", "half", "lost"]


def test_squad_v2(tmp_path):
    doc = squad({"Paris is in France.": [
        {"id": "a", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}],
         "is_impossible": False},
        {"id": "b", "question": "Where is Rome?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "France", "answer_start": 12}]}]})
    path = write(tmp_path / "dev.json", doc)
    ex = read_examples(path, "qa-v2")
    assert [(e.id, e.is_impossible, e.answers) for e in ex] == [("a", False, [Answer("France", 12)]),
                                                                ("b", True, [])]
    with pytest.raises(ValueError, match=at(path) + r": question b: is_impossible is true.*use the qa-v2 task"):
        read_examples(path, "qa")


def test_squad_bad_files(tmp_path):
    dup = write(tmp_path / "dup.json", squad({"ab": [{"id": "x", "question": "?", "answers": []}] * 2}))
    with pytest.raises(ValueError, match=at(dup) + r": question x: duplicate question id"):
        read_squad(dup, v2=True, labelled=False)
    broken = write(tmp_path / "broken.json", '{"data": [\n  {"title": "T",\n}')
    with pytest.raises(ValueError, match=at(broken, 3) + r": not valid JSON"):
        read_squad(broken, v2=False)
    other = write(tmp_path / "other.json", json.dumps([{"context": "c"}]))
    with pytest.raises(ValueError, match=at(other) + r": not a SQuAD file"):
        read_squad(other, v2=False)
    no_answer = write(tmp_path / "none.json", squad({"c": [{"id": "q", "question": "?", "answers": []}]}))
    with pytest.raises(ValueError, match=at(no_answer) + r": question q: no answers"):
        read_squad(no_answer, v2=False)


# ----------------------------------------------------------------------------------------------
# multiple choice


def test_swag_csv(tmp_path):
    header = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", "ending0", "ending1",
              "ending2", "ending3", "label"]
    rows = [header, ["0", "anetv_1", "5", "Members sit. They", "Members sit.", "They", "gold", "clap.", "fly.",
                     "melt.", "sing, loudly.", "3"]]
    path = tmp_path / "val.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    (e,) = read_examples(path, "multiple-choice")
    assert (e.id, e.context, e.question, e.choices, e.label, e.where) == (
        "2", "Members sit.", "They", ["clap.", "fly.", "melt.", "sing, loudly."], 3, f"{path}:2")
    phrase = write(tmp_path / "test.csv", "startphrase,ending0,ending1\nA man,runs.,sits.\n")
    (e,) = read_choices(phrase, labelled=False)
    assert (e.context, e.question, e.choices, e.label) == ("A man", "", ["runs.", "sits."], None)


def test_choices_jsonl_with_different_numbers_of_choices(tmp_path, zh):
    rows = [{"id": "a", "context": zh[0], "question": "?", "choices": [zh[1], zh[2]], "label": 1},
            {"id": "b", "context": zh[3], "choices": [zh[4], zh[5], zh[6], zh[7]], "label": 0}]
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    ex = read_choices(path)
    assert [(e.id, e.context, e.question, e.choices, e.label) for e in ex] == [
        ("a", zh[0], "?", [zh[1], zh[2]], 1), ("b", zh[3], "", zh[4:8], 0)]


def test_choice_label_out_of_range(tmp_path):
    path = write(tmp_path / "train.jsonl", '{"context": "c", "choices": ["x", "y"], "label": 0}\n'
                                          '{"context": "c", "choices": ["x", "y", "z"], "label": 3}\n')
    with pytest.raises(ValueError, match=at(path, 2) + r": label 3 is out of range; expected 0 to 2 for 3 choices"):
        read_choices(path)
    csv_path = write(tmp_path / "train.csv", "sent1,sent2,ending0,ending1,label\na,b,c,d,2\n")
    with pytest.raises(ValueError, match=at(csv_path, 2) + r": label 2 is out of range"):
        read_choices(csv_path)


def test_too_few_choices(tmp_path):
    path = write(tmp_path / "train.jsonl", '{"context": "c", "choices": ["only"], "label": 0}\n')
    with pytest.raises(ValueError, match=at(path, 1) + r": 1 choices; .*at least 2"):
        read_choices(path)
    csv_path = write(tmp_path / "train.csv", "startphrase,ending0,label\na,b,0\n")
    with pytest.raises(ValueError, match=at(csv_path, 1) + r": 1 ending columns"):
        read_choices(csv_path)


# ----------------------------------------------------------------------------------------------
# bad text-task inputs


def test_missing_column(tmp_path):
    path = write(tmp_path / "train.tsv", "\n" + tsv(["sentence", "labels"], ["a", "1"]))
    with pytest.raises(ValueError, match=at(path, 2) + r": no label column; expected label .*found sentence, labels"):
        read_examples(path, "classification")
    with pytest.raises(ValueError, match=at(path, 2) + r": sentence2 is missing: a pair task .*found sentence, labels"):
        read_examples(path, "pair")
    pairs = write(tmp_path / "pairs.jsonl", '{"sentence1": "a", "sentence2": "b", "label": "x"}\n')
    with pytest.raises(ValueError, match=at(pairs, 1) + r": no sentence column.*use the pair task"):
        read_examples(pairs, "classification")


def test_a_single_text_is_the_one_column_besides_the_label_and_the_id_by_any_name(tmp_path):
    reviews = write(tmp_path / "reviews.csv", "Review,ID,Label\n质量很好,r1,pos\n太差了,r2,neg\n")
    assert [(e.id, e.text_a, e.text_b, e.label) for e in read_examples(reviews, "classification")] == [
        ("r1", "质量很好", None, "pos"), ("r2", "太差了", None, "neg")]
    bare = write(tmp_path / "bare.jsonl", '{"content": "a fine film"}\n{"id": 5, "body": "dull"}\n')
    assert [(e.id, e.text_a) for e in read_examples(bare, "classification", labelled=False)] == [
        ("1", "a fine film"), ("5", "dull")]
    scored = write(tmp_path / "scored.tsv", tsv(["idx", "review", "score"], ["0", "good", "4.5"]))
    with pytest.raises(ValueError, match=at(scored, 1) + r": no sentence column"):  # two besides: which is which?
        read_examples(scored, "regression")
    assert [(e.text_a, e.label) for e in read_examples(write(tmp_path / "s.tsv", tsv(["text", "label"], ["ok", "4.5"])),
                                                       "regression")] == [("ok", 4.5)]
    two = write(tmp_path / "two.tsv", tsv(["review", "stars"], ["good", "5"]))
    with pytest.raises(ValueError, match=at(two, 1) + r": no sentence column: .*or one column besides the label "
                                                       r"and the id; found review, stars$"):
        read_examples(two, "classification", labelled=False)
    with pytest.raises(ValueError, match=at(reviews, 1) + r": sentence2 is missing"):  # pairs are still by name
        read_examples(reviews, "pair")


def test_wrong_number_of_fields(tmp_path):
    path = write(tmp_path / "train.tsv", tsv(["sentence", "label"], ["a", "1"], ["b", "0", "extra"]))
    expected = r": 3 tab-separated fields; expected 2 like the header on line 1$"
    with pytest.raises(ValueError, match=at(path, 3) + expected):
        read_examples(path, "classification")
    cola = write(tmp_path / "cola.tsv", tsv(["gj04", "1", "", "Fine."], ["gj04", "1", "Fine."]))
    with pytest.raises(ValueError, match=at(cola, 2) + r": 3 tab-separated fields; expected 4"):
        read_examples(cola, "classification", layout="glue-cola")


def test_bad_regression_label(tmp_path):
    path = write(tmp_path / "train.tsv", tsv(["sentence1", "sentence2", "label"], ["a", "b", "3.2"],
                                             ["c", "d", "high"]))
    with pytest.raises(ValueError, match=at(path, 3) + r": label 'high' is not a number"):
        read_examples(path, "regression")


@pytest.mark.parametrize("name, task", [("e.tsv", "classification"), ("e.csv", "pair"), ("e.jsonl", "regression"),
                                        ("e.conll", "token"), ("e.json", "qa"), ("e.jsonl", "multiple-choice")])
def test_empty_file(tmp_path, name, task):
    path = write(tmp_path / name, "" if task != "qa" else '{"data": []}')
    with pytest.raises(ValueError, match=at(path) + r": (empty file|no examples in the file)"):
        read_examples(path, task)


def test_header_only_file(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\n\n")
    with pytest.raises(ValueError, match=at(path) + r": no examples in the file"):
        read_examples(path, "classification")


def test_non_utf8_byte(tmp_path):
    good = b"sentence\tlabel\nfine\t1\n"
    path = tmp_path / "train.tsv"
    path.write_bytes(good + b"caf\xe9\t0\n")
    with pytest.raises(ValueError, match=at(path, 3) + r": not valid UTF-8 \(byte b'\\xe9' at column 4\)"):
        read_examples(path, "classification")
    conll = tmp_path / "train.conll"
    conll.write_bytes(b"a\tO\n\nb\tO\n\xff\tO\n")
    with pytest.raises(ValueError, match=at(conll, 4) + r": not valid UTF-8"):
        read_conll(conll)
    qa = tmp_path / "train.json"
    qa.write_bytes(b'{"data": [\n"\xff"]}')
    with pytest.raises(ValueError, match=at(qa, 2) + r": not valid UTF-8"):
        read_squad(qa, v2=False)


def test_unknown_extension(tmp_path):
    path = write(tmp_path / "train.dat", tsv(["sentence", "label"], ["a", "1"]))
    with pytest.raises(ValueError, match=r"cannot tell the format from the extension '.dat'"):
        read_examples(path, "classification")
    with pytest.raises(ValueError, match=r"train.txt: a .txt file holds texts without labels, which only predict"):
        read_examples(path.rename(tmp_path / "train.txt"), "classification")  # a tab in a line is text there


# ----------------------------------------------------------------------------------------------
# labels


def test_label_map(tmp_path):
    train = [TextExample(str(i), "t", None, label) for i, label in enumerate(["10", "2", "2", "0"])]
    labels = LabelMap.from_examples(train)
    assert labels.labels == ["0", "2", "10"] and len(labels) == 3  # numeric order, not "10" < "2"
    assert labels.id2label() == {0: "0", 1: "2", 2: "10"} and labels.label2id() == {"0": 0, "2": 1, "10": 2}
    config = json.loads(json.dumps({"id2label": labels.id2label()}))  # keys become "0", "1", ...
    assert LabelMap.from_config(config["id2label"]).labels == labels.labels
    assert labels.encode("10", "x:1") == 2
    with pytest.raises(ValueError, match=r"id2label must map 0..1"):
        LabelMap.from_config({"0": "a", "2": "b"})


def test_unknown_label_in_dev(tmp_path):
    train = write(tmp_path / "train.tsv", tsv(["sentence", "label"], *[[f"s{i}", f"c{i}"] for i in range(12)]))
    dev = write(tmp_path / "dev.tsv", tsv(["sentence", "label"], ["a", "c3"], ["b", "c99"]))
    labels = LabelMap.from_examples(read_examples(train, "classification"))
    with pytest.raises(ValueError, match=at(dev, 3) + r": label 'c99' is not one of the 12 labels seen in training: "
                                         r"'c0', 'c1', 'c10', 'c11', 'c2', 'c3', 'c4', 'c5', 'c6', 'c7', \.\.\.$"):
        labels.check(read_examples(dev, "classification"))
    labels.check(read_examples(train, "classification"))


def test_unknown_tag_names_its_line(tmp_path):
    train = write(tmp_path / "train.txt", "EU B-ORG\nrejects O\n\nPeter B-PER\n")
    dev = write(tmp_path / "dev.txt", "Peter B-PER\n\nin O\nBRUSSELS B-LOC\n")
    tags = LabelMap.from_examples(read_conll(train))
    assert tags.labels == ["B-ORG", "B-PER", "O"]
    with pytest.raises(ValueError, match=at(dev, 4) + r": label 'B-LOC' is not one of the 3 labels seen in training: "
                                         r"'B-ORG', 'B-PER', 'O'$"):
        tags.check(read_conll(dev))


# ----------------------------------------------------------------------------------------------
# what each reader takes and refuses at its edges (each case failed no test before; a mutation audit)


def test_tables_skip_blank_rows_take_leading_quotes_as_text_and_find_columns_in_any_case(tmp_path):
    """A TSV row of only spaces and tabs is blank; a TSV field that starts with a quote is text (GLUE's
    are never quoted), not a quoted field running on across lines; a header's names match ignoring case
    and spaces; a .json file is read as JSON Lines."""
    path = write(tmp_path / "t.tsv", tsv([" Sentence ", "LABEL"], ['"Quoted start', "1"], [" ", "\t"], ["next", "0"]))
    ex = read_examples(path, "classification")
    assert [(e.text_a, e.label, e.where) for e in ex] == [('"Quoted start', "1", f"{path}:2"), ("next", "0", f"{path}:4")]
    lines = write(tmp_path / "t.json", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n')
    assert [e.text_a for e in read_examples(lines, "classification")] == ["a", "b"]


def test_a_csv_row_with_a_stray_quote_names_its_line(tmp_path):
    path = write(tmp_path / "t.csv", 'sentence,label\nfine,1\nx,"bad"quote\n')
    with pytest.raises(ValueError, match=at(path, 3) + r": not a valid CSV row"):
        read_examples(path, "classification")


def test_the_first_pair_of_columns_by_preference_and_labels_as_written(tmp_path):
    """sentence1 + sentence2 before question + sentence; a label's spaces are not part of it; an empty
    id is no id (the line number stands in)."""
    path = write(tmp_path / "t.jsonl", json.dumps({"question": "q", "sentence": "s", "sentence1": "a",
                                                   "sentence2": "b", "label": " yes ", "id": ""}) + "\n")
    (e,) = read_examples(path, "pair")
    assert (e.text_a, e.text_b, e.label, e.id) == ("a", "b", "yes", "1")


@pytest.mark.parametrize("task, record, words", [
    ("classification", {"text": "a", "label": "  "}, "empty 'label'; expected a label"),
    ("classification", {"text": "a", "label": True}, "label True is a bool; expected a string or an integer"),
    ("regression", {"text": "a", "label": "nan"}, "label 'nan' is not a number"),
    ("regression", {"text": "a", "label": "inf"}, "label 'inf' is not a number"),
])
def test_a_label_that_is_blank_a_boolean_or_not_finite_is_refused(tmp_path, task, record, words):
    path = write(tmp_path / "t.jsonl", json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=at(path, 1) + ": " + re.escape(words)):
        read_examples(path, task)


def test_glue_cola_with_a_header_and_qqps_rows_cut_short(tmp_path):
    """A CoLA file with a header (sentence, label) reads by it; QQP's rows with fewer fields than its
    header (a line break inside a question) are left out with a note, as GLUE's reader does."""
    cola = write(tmp_path / "cola.tsv", tsv(["sentence", "label"], ["Fine.", "1"]))
    (e,) = read_examples(cola, "classification", layout="glue-cola")
    assert (e.text_a, e.label) == ("Fine.", "1")
    header, row = GLUE_CASES["glue-qqp"][0]
    qqp = write(tmp_path / "qqp.tsv", tsv(header, row, ["1", "2", "3", "How is the"], ["cat?", "0"], row))
    notes = []
    ex = read_examples(qqp, "pair", layout="glue-qqp", warn=notes.append)
    assert [e.where for e in ex] == [f"{qqp}:2", f"{qqp}:5"]
    assert notes == [f"{qqp}: left out 2 rows whose fields are not the header's 6 (lines 3, 4), as GLUE's own "
                     "reader does"]
    other = write(tmp_path / "rte.tsv", tsv(*GLUE_CASES["glue-rte"][0], ["1", "short"]))
    with pytest.raises(ValueError, match=at(other, 3) + ": 2 tab-separated fields; expected 4"):
        read_examples(other, "pair", layout="glue-rte")


def test_a_tab_separated_conll_token_may_hold_a_space(tmp_path):
    path = write(tmp_path / "t.conll", "New York\tB-LOC\nis\tO\n")
    assert read_conll(path)[0].words == ["New York", "is"]


@pytest.mark.parametrize("qa, words", [
    ({"id": True, "question": "?", "answers": []}, 'qas[0]: expected a question object with an "id"'),
    ({"id": "q", "question": "?", "answers": [{"text": "c", "answer_start": 0}], "is_impossible": True},
     "question q: is_impossible is true but the question has 1 answers"),
    ({"id": "q", "question": "?", "answers": [{"text": "c", "answer_start": True}]},
     'question q: answer {"text": "c", "answer_start": true}; expected'),
])
def test_squad_ids_answers_and_starts_of_the_wrong_kind_are_refused(tmp_path, qa, words):
    path = write(tmp_path / "t.json", squad({"cat": [qa]}))
    with pytest.raises(ValueError, match=at(path) + ".*" + re.escape(words)):
        read_squad(path, v2=True)


def test_an_empty_squad_answer_is_dropped_with_a_note(tmp_path):
    path = write(tmp_path / "t.json", squad({"cat": [
        {"id": "q", "question": "?", "answers": [{"text": "", "answer_start": 0}, {"text": "ca", "answer_start": 0}]}]}))
    notes = []
    (e,) = read_squad(path, v2=False, warn=notes.append)
    assert e.answers == [Answer("ca", 0)] and "an answer's text is empty" in notes[0]


@pytest.mark.parametrize("label, words", [(-1, "label -1 is out of range; expected 0 to 1"),
                                          (True, "label True is not a choice index")])
def test_a_choice_label_below_zero_or_boolean_is_refused(tmp_path, label, words):
    path = write(tmp_path / "t.jsonl", json.dumps({"context": "c", "choices": ["x", "y"], "label": label}) + "\n")
    with pytest.raises(ValueError, match=at(path, 1) + ": " + re.escape(words)):
        read_choices(path)


def test_swag_endings_without_gaps_a_startphrase_beside_sent1_and_blank_endings(tmp_path):
    from torchbert.tasks.choice import encode_choices
    from torchbert.tokenizer import BertTokenizer

    gap = write(tmp_path / "gap.csv", "startphrase,ending0,ending2,label\na,b,c,0\n")
    with pytest.raises(ValueError, match=at(gap, 1) + ": ending columns must be ending0, ending1, ... without gaps"):
        read_choices(gap)
    phrase = write(tmp_path / "p.csv", "sent1,startphrase,ending0,ending1,label\nhalf,A man,runs.,sits.,0\n")
    (e,) = read_choices(phrase)
    assert (e.context, e.question) == ("A man", "")  # sent1 without sent2: the startphrase
    empty_id = write(tmp_path / "t.jsonl", json.dumps({"id": "", "context": "c", "choices": ["x", " "]}) + "\n")
    (e,) = read_choices(empty_id, labelled=False)
    assert e.id == "1"
    with pytest.raises(ValueError, match=r"choice 1 is empty"):
        encode_choices(BertTokenizer.from_pretrained(realdata.minilm_dir()), [e], 32)
