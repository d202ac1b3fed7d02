"""What a retrieval user reads: each query's documents ranked by exact search, scored by nDCG@10,
MRR@10 and recall@k against the documents that answer it (binary relevance).

    queries, docs = embed(...), embed(...)               # [Q, D], [N, D] float32, normalized for cosine
    scores, ids = search(queries, docs, k=100)           # [Q, k] each, best first
    retrieval_scores(ids, relevant)                      # relevant[q]: the ids of the documents that answer q

The definitions are the usual ones (BEIR's, sentence-transformers' InformationRetrievalEvaluator's, to
which tests/eval/test_retrieval.py holds them): DCG@k = sum over ranks i < k of rel_i / log2(i + 2),
over the ideal DCG of min(|relevant|, k) relevant documents at the top; MRR@k = 1 / (rank of the first
relevant document) when it is within k, else 0; recall@k = relevant documents within k / |relevant|.
A query with no relevant document is an error (it has no score).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.texts import MISSING, json_records, not_a_file, shown

KS = (1, 10, 100)  # recall@k reported


def search(queries: np.ndarray, docs: np.ndarray, k: int, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The k best documents of each query by inner product (cosine on unit rows), best first, ties by
    the lower id: (scores [Q, k], ids [Q, k]). Exact: every document is scored; memory holds `chunk`
    queries' scores at a time ([chunk, N] float32)."""
    if queries.ndim != 2 or docs.ndim != 2 or queries.shape[1] != docs.shape[1]:
        raise ValueError(f"queries {queries.shape} and documents {docs.shape} must be [Q, D] and [N, D]")
    k = min(k, len(docs))
    scores = np.empty((len(queries), k), dtype=np.float32)
    ids = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), chunk):
        s = queries[start:start + chunk] @ docs.T  # [c, N]
        top = np.argpartition(-s, k - 1, axis=1)[:, :k] if k < s.shape[1] else np.tile(np.arange(s.shape[1]),
                                                                                         (len(s), 1))
        top_scores = np.take_along_axis(s, top, axis=1)
        order = np.lexsort((top, -top_scores), axis=1)  # by score, then by id
        ids[start:start + chunk] = np.take_along_axis(top, order, axis=1)
        scores[start:start + chunk] = np.take_along_axis(top_scores, order, axis=1)
    return scores, ids


def retrieval_scores(ranked: np.ndarray, relevant: Sequence[set[int] | Mapping[int, float]],
                     ks: Sequence[int] = KS) -> dict[str, float]:
    """nDCG@10, MRR@10 and recall@k (ks) of ranked document ids [Q, >= max k] against each query's
    relevant ids, means over the queries. A query's relevance is a set of ids (each of grade 1) or
    graded, {id: grade} (BEIR's qrels): nDCG's gain is the grade (trec_eval's, which BEIR reports),
    and a document is relevant for MRR and recall when its grade is above 0."""
    if len(ranked) != len(relevant):
        raise ValueError(f"{len(ranked)} rankings for {len(relevant)} queries")
    grades = [dict.fromkeys(r, 1.0) if isinstance(r, (set, frozenset)) else dict(r) for r in relevant]
    empty = next((q for q, g in enumerate(grades) if not any(v > 0 for v in g.values())), None)
    if empty is not None:
        raise ValueError(f"query {empty} has no relevant document")
    discount = 1.0 / np.log2(np.arange(2, 12))  # ranks 0..9
    ndcg, mrr = [], []
    recall = {k: [] for k in ks}
    for ids, grade in zip(ranked, grades):
        gains = np.fromiter((max(grade.get(int(i), 0.0), 0.0) for i in ids), dtype=np.float64, count=len(ids))
        hits = gains > 0
        best = np.sort(np.array([v for v in grade.values() if v > 0]))[::-1][:10]
        ideal = (discount[:len(best)] * best).sum()
        top10 = gains[:10]
        ndcg.append(float((discount[:len(top10)] * top10).sum() / ideal))
        first = np.flatnonzero(hits[:10])
        mrr.append(1.0 / (first[0] + 1) if len(first) else 0.0)
        for k in ks:
            recall[k].append(hits[:k].sum() / sum(v > 0 for v in grade.values()))
    out = {"ndcg@10": float(np.mean(ndcg)), "mrr@10": float(np.mean(mrr))}
    out.update({f"recall@{k}": float(np.mean(v)) for k, v in recall.items()})
    return out


def rank_scores(ranks: Sequence[int | None], ks: Sequence[int] = KS) -> dict[str, float]:
    """retrieval_scores for queries with one relevant document each, given its rank (0: first; None:
    not among those searched)."""
    r = np.array([np.inf if x is None else x for x in ranks], dtype=np.float64)
    if not len(r):
        raise ValueError("no queries to score")
    top10 = r < 10
    out = {"ndcg@10": float(np.where(top10, 1.0 / np.log2(np.where(top10, r, 0) + 2), 0.0).mean()),
           "mrr@10": float(np.where(top10, 1.0 / (np.where(top10, r, 0) + 1), 0.0).mean())}
    out.update({f"recall@{k}": float((r < k).mean()) for k in ks})
    return out


def evaluate_retrieval(queries: np.ndarray, docs: np.ndarray, relevant: Sequence[set[int]],
                       ks: Sequence[int] = KS) -> dict[str, float]:
    """Exact search of every query over every document, and its scores."""
    _, ids = search(queries, docs, max(max(ks), 10))
    return retrieval_scores(ids, relevant, ks)


@dataclass
class RetrievalSet:
    """Queries, the corpus they search (each distinct text once) and, per query, the ids of the corpus
    texts that answer it."""

    queries: list[str]
    corpus: list[str]
    relevant: list[set[int]]


def _texts(value, key: str, where: str, optional: bool = False) -> list[str]:
    if value is None and optional:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(x, str) and x.strip() for x in items):
        raise ValueError(f"{where}: \"{key}\" {shown(value, 60)}; expected a non-empty string or a list of them")
    return items


def read_retrieval_set(path: str | Path) -> RetrievalSet:
    """A JSON Lines file, one query a line: {"query": ..., "positive": text or [texts], "negative": text
    or [texts] (optional)}. The corpus is every positive and negative text, each once (the same text
    under two queries is one document); a query's relevant documents are its positives."""
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, "file")
    queries, relevant, ids = [], [], {}
    for n, row in json_records(path):
        where = f"{path}:{n}"
        (query,) = _texts(row.get("query", MISSING), "query", where)[:1]
        positives = _texts(row.get("positive", MISSING), "positive", where)
        for text in positives + _texts(row.get("negative"), "negative", where, optional=True):
            ids.setdefault(text, len(ids))
        queries.append(query)
        relevant.append({ids[x] for x in positives})
    if not queries:
        raise ValueError(f"{path}: no queries (one JSON object a line: query, positive)")
    return RetrievalSet(queries, list(ids), relevant)
