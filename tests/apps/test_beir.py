"""The retrieval suite: BEIR's layout read (graded qrels, judged documents the corpus lacks, a bad
line named), and its scores equal to BEIR's own pipeline on real text: sentence-transformers'
embeddings of the same model, exact cosine search, trec_eval's measures (pytrec_eval)."""

import json
from pathlib import Path

import numpy as np
import pytest
from clihelp import cli, jsonl

from torchbert.apps.beir import BeirSet, check, find_datasets, read_beir, search_dataset
from torchbert.apps.benchmark import Plan
from torchbert.apps.benchmark_table import columns_of
from torchbert.apps.samples import inverse_cloze, peoples_daily_paragraphs
from torchbert.apps.suites import SUITES
from torchbert.errors import UserError
from torchbert.eval.retrieval import retrieval_scores
from torchbert.io.hf import folder_max_length


def beir_folder(root: Path, n: int = 40) -> Path:
    """A BEIR dataset from People's Daily: each query a sentence drawn from a paragraph, the paragraph
    without it the document graded 2, the next paragraph graded 1 for every fifth query; a judged 0;
    a judged document the corpus lacks; titles on some documents; n distractors; qrels with a header."""
    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=3)[:2 * n]
    folder = root / "beir" / "pd"
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "标题" if i % 3 == 0 else "", "text": p["positive"]} for i, p in enumerate(pairs)]
    jsonl(folder / "corpus.jsonl", docs)
    queries = [{"_id": f"q{i}", "text": p["query"]} for i, p in enumerate(pairs[:n])]
    jsonl(folder / "queries.jsonl", queries)
    rows = ["query-id\tcorpus-id\tscore"]
    for i in range(n):
        rows.append(f"q{i}\td{i}\t2")
        if i % 5 == 0:
            rows.append(f"q{i}\td{i + 1}\t1")
    rows += ["q1\td7\t0", "q2\tgone\t1"]
    (folder / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def test_beir_layout_is_read_with_its_grades(tmp_path):
    folder = beir_folder(tmp_path)
    b = read_beir(folder)
    assert len(b.docs) == 80 and len(b.queries) == 40 and b.split == "test" and b.left_out == 0
    assert b.docs[0].startswith("标题 ") and not b.docs[1].startswith(" ")  # title and text joined, stripped
    assert b.relevant[0] == {0: 2.0, 1: 1.0} and b.relevant[1] == {1: 2.0, 7: 0.0} and b.relevant[2] == {2: 2.0, -1: 1.0}
    qrels = folder / "qrels" / "test.tsv"
    text = qrels.read_text(encoding="utf-8")
    for bad, message in (("q0\td0\n", "2 columns"), ("q0\td0\thigh\n", "score 'high' is not a number"),
                         ("nobody\td0\t1\n", "query 'nobody' is not in queries.jsonl")):
        qrels.write_text(text + bad, encoding="utf-8")
        with pytest.raises(ValueError, match=f"test.tsv:{text.count(chr(10)) + 1}: {message}"):
            read_beir(folder)
    qrels.write_text(text, encoding="utf-8")
    corpus = folder / "corpus.jsonl"
    corpus.write_text(corpus.read_text(encoding="utf-8") + '{"_id": "d0", "text": "again"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"corpus.jsonl:81: _id 'd0' again \(first on line 1\)"):
        read_beir(folder)


def test_beirs_qrels_as_its_datasets_write_them(tmp_path):
    """qrels with or without a header (a first grade of -1 is data), TREC's four columns, blank lines;
    queries in the queries file's order; those with no document graded above 0 left out and counted;
    judged documents the corpus lacks each their own; _id a number or a string."""
    d = tmp_path / "set"
    jsonl(d / "corpus.jsonl", [{"_id": 1, "title": None, "text": "one"}, {"_id": "b", "text": "two"}])
    jsonl(d / "queries.jsonl", [{"_id": "q0", "text": "a"}, {"_id": "q1", "text": "b"}, {"_id": "q2", "text": "c"}])
    (d / "qrels").mkdir()
    (d / "qrels" / "test.tsv").write_text("q1\tb\t-1\n\nq1\tgone\t2\nq0\tQ0\t1\t1\nq0\tlost\t1\nq2\tb\t0\n",
                                          encoding="utf-8")
    b = read_beir(d)
    assert b.doc_ids == ["1", "b"] and b.docs == ["one", "two"] and b.split == "test"
    assert b.query_ids == ["q0", "q1"] and b.left_out == 1
    assert b.relevant == [{0: 1.0, -2: 1.0}, {1: -1.0, -1: 2.0}]
    (d / "qrels" / "dev.tsv").write_text("q0\t1\t1\n", encoding="utf-8")  # test, where there is one
    assert read_beir(d).split == "test" and find_datasets(d) == [d]
    (d / "qrels" / "test.tsv").unlink()
    assert read_beir(d).split == "dev"
    (task,) = SUITES["retrieval"].discover(tmp_path)
    assert task.name == "set" and {c.split for c in task.columns} == {"dev"}
    cols = columns_of(Plan(SUITES["retrieval"], {}, tmp_path, None, [task], tmp_path))
    assert [c["title"] for c in cols if c["averaged"]] == ["set nDCG@10"]  # BEIR averages nDCG@10 only
    (d / "qrels" / "dev.tsv").write_text("q0\t1\t0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="dev.tsv: no query has a document graded above 0"):
        read_beir(d)
    # dataset folders found in a folder: in order of name, with all three files
    for name in ("b", "a"):
        jsonl(tmp_path / "many" / name / "corpus.jsonl", [{"_id": "d", "text": "x"}])
        jsonl(tmp_path / "many" / name / "queries.jsonl", [{"_id": "q", "text": "x"}])
        (tmp_path / "many" / name / "qrels").mkdir()
        (tmp_path / "many" / name / "qrels" / "test.tsv").write_text("q\td\t1\n", encoding="utf-8")
    (tmp_path / "many" / "a" / "queries.jsonl").rename(tmp_path / "many" / "a" / "q.jsonl")
    (tmp_path / "many" / "c").mkdir()
    assert find_datasets(tmp_path / "many") == [tmp_path / "many" / "b"]
    (tmp_path / "many" / "a" / "q.jsonl").rename(tmp_path / "many" / "a" / "queries.jsonl")
    assert find_datasets(tmp_path / "many") == [tmp_path / "many" / "a", tmp_path / "many" / "b"]


@pytest.mark.parametrize("file,rows,message", [
    ("corpus.jsonl", [{"_id": "d", "text": 5}], r"corpus.jsonl:1: 'text' is 5; expected a string"),
    ("corpus.jsonl", [{"_id": "d", "title": 3, "text": "x"}], r"corpus.jsonl:1: 'title' is 3; expected a string"),
    ("corpus.jsonl", [{"_id": "", "text": "x"}], r"corpus.jsonl:1: no \"_id\""),
    ("queries.jsonl", [{"_id": None, "text": "x"}], r"queries.jsonl:1: no \"_id\""),
    ("queries.jsonl", [], r"queries.jsonl: no queries lines"),
])
def test_a_bad_beir_line_is_named(tmp_path, file, rows, message):
    d = tmp_path / "set"
    jsonl(d / "corpus.jsonl", [{"_id": "d", "text": "x"}])
    jsonl(d / "queries.jsonl", [{"_id": "q", "text": "x"}])
    (d / "qrels").mkdir()
    (d / "qrels" / "test.tsv").write_text("q\td\t1\n", encoding="utf-8")
    jsonl(d / file, rows)
    with pytest.raises(UserError, match=message):
        check(d)


def test_a_query_is_searched_over_the_corpus_without_its_own_document(tmp_path, monkeypatch, minilm_dir):
    """BEIR's default: a document with the query's own id is left out of its ranking, and the ranking
    still reaches 100 documents (recall@100); the model's own sentence embeddings, unit length, at its
    max_seq_length."""
    import torchbert.eval.retrieval as retrieval
    import torchbert.features as features

    embedded, asked = [], []
    monkeypatch.setattr(features, "embed", lambda model, tok, texts, **kw: embedded.append(kw) or
                        np.ones((len(texts), 4), dtype=np.float32))

    def search(queries, docs, k):  # every query ranks document 101 at 101st, 100 last
        asked.append(k)
        return None, np.tile(np.array([*range(100), 101, 100])[:k], (len(queries), 1))

    monkeypatch.setattr(retrieval, "search", search)
    ids = [f"d{i}" for i in range(102)]
    data = BeirSet(ids, ["x"] * len(ids), ["d0", "q1"], ["y", "y"], [{101: 1.0}, {101: 1.0}], "test", 0)
    got = search_dataset(minilm_dir, data)
    assert asked == [101] and got["scores"]["recall@100"] == 0.5  # found within 100 by d0 only: d0 left out
    assert got["max_length"] == 256 == folder_max_length(minilm_dir)  # its sentence_bert_config.json's
    assert all(kw["normalize"] and kw["max_length"] == 256 for kw in embedded) and len(embedded) == 2


def test_graded_ndcg_is_trec_evals():
    import pytrec_eval

    ranked = np.array([[3, 0, 1, 2, 4], [4, 3, 2, 1, 0]])
    relevant = [{0: 2, 1: 1, 9: 1}, {2: 1, 3: 0}]
    ours = retrieval_scores(ranked, relevant, ks=(1, 3))
    run = {f"q{q}": {f"d{d}": float(10 - r) for r, d in enumerate(ids)} for q, ids in enumerate(ranked)}
    qrels = {f"q{q}": {f"d{d}": int(g) for d, g in rel.items()} for q, rel in enumerate(relevant)}
    theirs = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.1,3", "recip_rank"}).evaluate(run)
    assert ours["ndcg@10"] == pytest.approx(np.mean([x["ndcg_cut_10"] for x in theirs.values()]), abs=1e-12)
    assert ours["recall@3"] == pytest.approx(np.mean([x["recall_3"] for x in theirs.values()]), abs=1e-12)
    assert ours["mrr@10"] == pytest.approx(np.mean([x["recip_rank"] for x in theirs.values()]), abs=1e-12)
    assert retrieval_scores(ranked, [{0, 1}, {2}]) == retrieval_scores(ranked, [{0: 1, 1: 1}, {2: 1}])


@pytest.mark.e2e
def test_the_retrieval_suite_scores_as_beirs_pipeline(tmp_path, capsys, minilm_dir):
    import pytrec_eval
    from sentence_transformers import SentenceTransformer

    folder = beir_folder(tmp_path)
    out = tmp_path / "b"
    code, stdout, err = cli(capsys, "benchmark", "retrieval", "--model", minilm_dir, "--data", folder.parent,
                            "--out", out)
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    got = s["results"][minilm_dir.name]["pd"]["columns"]
    # BEIR's pipeline: the sentence-transformers model, cosine over every document, trec_eval
    b = read_beir(folder)
    st = SentenceTransformer(str(minilm_dir), device="cpu")
    q = st.encode(b.queries, normalize_embeddings=True)
    d = st.encode(b.docs, normalize_embeddings=True)
    sims = q @ d.T
    run = {qid: {b.doc_ids[j]: float(sims[i, j]) for j in np.argsort(-sims[i])[:100]}
           for i, qid in enumerate(b.query_ids)}
    top10 = {qid: dict(sorted(docs.items(), key=lambda x: -x[1])[:10]) for qid, docs in run.items()}
    lines = (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    qrels = {}
    for line in lines:
        qid, did, grade = line.split("\t")
        qrels.setdefault(qid, {})[did] = int(grade)
    m = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    assert got["pd nDCG@10"]["value"] == pytest.approx(np.mean([x["ndcg_cut_10"] for x in m.values()]), abs=1e-6)
    assert got["pd R@100"]["value"] == pytest.approx(np.mean([x["recall_100"] for x in m.values()]), abs=1e-6)
    assert got["pd MRR@10"]["value"] == pytest.approx(np.mean([x["recip_rank"] for x in rr.values()]), abs=1e-6)
    assert 0.2 < got["pd nDCG@10"]["value"] < 1
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "| model | pd nDCG@10 | pd MRR@10 | pd R@100 | Average |" in md and "Chosen settings" not in md
    # a resume finds the cell; --protocol and --precision are refused
    code, stdout, err = cli(capsys, "benchmark", "retrieval", "--model", minilm_dir, "--data", folder.parent,
                            "--out", out, "--resume")
    assert code == 0 and "== " not in stdout
    code, _, err = cli(capsys, "benchmark", "retrieval", "--model", minilm_dir, "--data", folder.parent,
                       "--out", tmp_path / "c", "--protocol", "paper")
    assert code == 2 and "fine-tunes nothing" in err
    code, _, err = cli(capsys, "benchmark", "retrieval", "--model", minilm_dir, "--data", folder.parent,
                       "--out", tmp_path / "c", "--precision", "bf16")
    assert code == 2 and "--precision: the retrieval suite fine-tunes nothing" in err
