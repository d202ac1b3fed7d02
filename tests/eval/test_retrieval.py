"""Retrieval scores (eval/retrieval.py): by hand, exact search against a full sort, and parity with
sentence-transformers' InformationRetrievalEvaluator on real embeddings and real Chinese queries."""

import json
import math

import numpy as np
import pytest

from torchbert.eval.retrieval import evaluate_retrieval, rank_scores, read_retrieval_set, retrieval_scores, search


def test_scores_by_hand():
    ranked = np.array([[5, 1, 2], [0, 3, 4], [7, 8, 9]])
    relevant = [{1}, {0, 4}, {6}]
    s = retrieval_scores(ranked, relevant, ks=(1, 3))
    ndcg = [1 / math.log2(3), (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3)), 0.0]
    assert s["ndcg@10"] == pytest.approx(sum(ndcg) / 3)
    assert s["mrr@10"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert s["recall@1"] == pytest.approx((0 + 0.5 + 0) / 3) and s["recall@3"] == pytest.approx((1 + 1 + 0) / 3)
    with pytest.raises(ValueError, match="query 1 has no relevant document"):
        retrieval_scores(ranked, [{1}, set(), {6}])
    with pytest.raises(ValueError, match="query 0 has no relevant document"):  # judged, but none relevant
        retrieval_scores(ranked[:1], [{5: 0.0, 1: -1.0}])
    with pytest.raises(ValueError, match="3 rankings for 2 queries"):
        retrieval_scores(ranked, [{1}, {0}])


def test_graded_scores_equal_scikit_learn_ndcg():
    """Graded relevance ({id: grade}, BEIR's qrels): nDCG@10 with the grade as gain is scikit-learn's
    ndcg_score (linear gains, log2 discount) over every document; a negative grade gains nothing, as 0;
    recall and MRR count the documents graded above 0."""
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(1)
    n = 40
    for _ in range(30):
        grades = {int(i): float(g) for i, g in zip(rng.choice(n, 14, replace=False), rng.integers(-1, 4, 14))}
        if not any(g > 0 for g in grades.values()):
            grades[0] = 2.0
        scores = rng.permutation(n).astype(np.float64)  # distinct: no ties for scikit-learn to average
        ranked = np.argsort(-scores)[None]
        got = retrieval_scores(ranked, [grades], ks=(5, 40))
        true = np.zeros(n)
        for i, g in grades.items():
            true[i] = max(g, 0.0)
        assert got["ndcg@10"] == pytest.approx(ndcg_score(true[None], scores[None], k=10))
        relevant = {i for i, g in grades.items() if g > 0}
        hits = [int(i) in relevant for i in ranked[0]]
        assert got["recall@5"] == pytest.approx(sum(hits[:5]) / len(relevant)) and got["recall@40"] == 1.0
        first = hits.index(True)
        assert got["mrr@10"] == pytest.approx(1 / (first + 1) if first < 10 else 0.0)


def test_rank_scores_equal_retrieval_scores_with_the_one_relevant_document_at_that_rank():
    """rank_scores (the embedding and reranker tasks' scores) is retrieval_scores for queries with one
    relevant document, given its rank: the same figures for every rank, the cut-offs included (rank 9
    is in the top 10, rank 10 is not; rank k - 1 counts for recall@k, rank k does not)."""
    ranks = [0, 1, 2, 8, 9, 10, 11, 99, 100, 101, None]
    ranked = np.tile(np.arange(1000, 1200), (len(ranks), 1))  # 200 documents that answer nothing
    relevant = []
    for q, r in enumerate(ranks):
        if r is not None:
            ranked[q, r] = q
        relevant.append({q})
    want = retrieval_scores(ranked, relevant)
    got = rank_scores(ranks)
    assert got.keys() == want.keys() and {"recall@1", "recall@10", "recall@100"} <= got.keys()
    assert got == pytest.approx(want)
    assert got["recall@10"] == pytest.approx(5 / 11) and got["recall@100"] == pytest.approx(8 / 11)


def test_exact_search_is_a_full_sort_with_ties_to_the_lower_id():
    rng = np.random.default_rng(0)
    q, d = rng.standard_normal((50, 8)).astype(np.float32), rng.standard_normal((300, 8)).astype(np.float32)
    scores, ids = search(q, d, k=20, chunk=7)
    full = q @ d.T
    for i in range(len(q)):
        want = np.lexsort((np.arange(300), -full[i]))[:20]
        assert ids[i].tolist() == want.tolist() and np.allclose(scores[i], full[i][want])
    tied = np.ones((3, 2), dtype=np.float32)
    assert search(np.ones((1, 2), dtype=np.float32), tied, k=3)[1].tolist() == [[0, 1, 2]]
    assert search(q, d[:5], k=10)[1].shape == (50, 5)  # k beyond the corpus: all of it
    with pytest.raises(ValueError, match=r"queries \(50, 8\) and documents \(300, 4\) must be"):
        search(q, d[:, :4], k=3)
    with pytest.raises(ValueError, match=r"queries \(8,\) and documents"):
        search(q[0], d, k=3)
    with pytest.raises(ValueError, match="no queries to score"):
        rank_scores([])


def test_evaluate_retrieval_ranks_ten_for_ndcg_whatever_the_recall_cutoffs():
    q = np.eye(1, 20, dtype=np.float32)
    d = np.linspace(1, 0, 20, dtype=np.float32)[:, None] * np.eye(1, 20, dtype=np.float32)  # doc i scores 1 - i/19
    s = evaluate_retrieval(q, d, [{7}], ks=(1,))
    assert s["recall@1"] == 0.0 and s["ndcg@10"] == pytest.approx(1 / math.log2(9)) and s["mrr@10"] == pytest.approx(1 / 8)


def test_a_retrieval_file_is_read_with_one_document_per_text(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [{"query": "q1", "positive": "a", "negative": ["b", "c"]}, {"query": "q2", "positive": ["c", "d"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    r = read_retrieval_set(path)
    assert r.queries == ["q1", "q2"] and r.corpus == ["a", "b", "c", "d"] and r.relevant == [{0}, {2, 3}]
    for bad, message in (('{"query": "q", "positive": ""}', r"r.jsonl:2: \"positive\" is \"\""),
                         ('{"query": "q", "positive": " "}', r"r.jsonl:2: \"positive\" is \" \""),
                         ('{"query": "q", "positive": []}', r"r.jsonl:2: \"positive\" is \[\]"),
                         ('{"query": "q", "positive": "a", "negative": [2]}', r"r.jsonl:2: \"negative\" is \[2\]"),
                         ('{"query": "q"}', r"r.jsonl:2: \"positive\" is missing"),
                         ('[1]', r"r.jsonl:2: expected a JSON object"), ('{"query": ', r"r.jsonl:2: not valid JSON")):
        path.write_text(json.dumps(rows[0]) + "\n" + bad + "\n")
        with pytest.raises(ValueError, match=message):
            read_retrieval_set(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no queries"):
        read_retrieval_set(path)
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such file"):
        read_retrieval_set(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="is a folder, not a regular file"):
        read_retrieval_set(tmp_path)


def test_scores_equal_sentence_transformers_on_real_queries(minilm_dir, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from torchbert.apps.samples import inverse_cloze, peoples_daily_paragraphs
    from torchbert.features import embed
    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer

    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)[:50]
    path = tmp_path / "pd.jsonl"
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")
    r = read_retrieval_set(path)
    model, tok = BertModel.from_pretrained(minilm_dir).eval(), BertTokenizer.from_pretrained(minilm_dir)
    ours = evaluate_retrieval(embed(model, tok, r.queries, normalize=True, max_length=128),
                              embed(model, tok, r.corpus, normalize=True, max_length=128), r.relevant)
    st = SentenceTransformer(str(minilm_dir), device="cpu")
    st.max_seq_length = 128
    evaluator = InformationRetrievalEvaluator(
        {f"{i:04d}": q for i, q in enumerate(r.queries)}, {f"{i:04d}": d for i, d in enumerate(r.corpus)},
        {f"{i:04d}": {f"{j:04d}" for j in rel} for i, rel in enumerate(r.relevant)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100], map_at_k=[10],
        show_progress_bar=False)
    theirs = evaluator(st)
    for name in ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100"):
        assert ours[name] == pytest.approx(theirs[f"cosine_{name}"], abs=1e-9), name
    assert 0.2 < ours["ndcg@10"] < 1  # MiniLM, an English model, finds some Chinese passages by their characters
