"""The retrieval suite: BEIR's datasets (Thakur et al. 2021) searched with each model's own sentence
embeddings, as published; nothing is fine-tuned.

A dataset is a folder in BEIR's layout:

    corpus.jsonl    {"_id", "title", "text"} a line: the documents (title and text, joined by a space)
    queries.jsonl   {"_id", "text"} a line
    qrels/test.tsv  query-id, corpus-id, score (a header line): the judged documents and their grades
                    (qrels/dev.tsv where a dataset has no test split)

The queries scored are those of the qrels with a document graded above 0. Each is searched over
the whole corpus by cosine similarity (exact search, eval/retrieval.py) with the model's pooling
(its sentence-transformers files) and its max_seq_length; a document whose id is the query's own is
left out of its ranking (BEIR's default: ArguAna's and Quora's queries are documents too). Scores:
nDCG@10 with the qrels' grades (trec_eval's, which BEIR reports), MRR@10, recall@100.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..io.texts import json_records, lines

QRELS = ("test", "dev")  # the split scored: test where the dataset has one


@dataclass
class BeirSet:
    doc_ids: list[str]
    docs: list[str]
    query_ids: list[str]  # the queries scored, in the file's order
    queries: list[str]
    relevant: list[dict[int, float]]  # per query: document index -> grade (unknown documents: negative indices)
    split: str
    left_out: int  # queries of the qrels with no document graded above 0


def qrels_file(folder: Path) -> Path | None:
    return next((folder / "qrels" / f"{s}.tsv" for s in QRELS if (folder / "qrels" / f"{s}.tsv").is_file()), None)


def is_beir(folder: Path) -> bool:
    return (folder / "corpus.jsonl").is_file() and (folder / "queries.jsonl").is_file() and \
        qrels_file(folder) is not None


def _text(record: dict, key: str, where: str, optional: bool = False) -> str:
    value = record.get(key, "" if optional else None)
    if not isinstance(value, str) and not (optional and value is None):
        raise ValueError(f"{where}: {key!r} is {json.dumps(value)[:40]}; expected a string")
    return value or ""


def _ids(path: Path, what: str, text: Callable[[dict, str], str]) -> tuple[list[str], list[str]]:
    ids, texts, seen = [], [], {}
    for n, record in json_records(path):
        where = f"{path}:{n}"
        ident = record.get("_id")
        if not isinstance(ident, (str, int)) or ident == "":
            raise ValueError(f"{where}: no \"_id\"; a {what} line is {{\"_id\", ...}}")
        ident = str(ident)
        if ident in seen:
            raise ValueError(f"{where}: _id {ident!r} again (first on line {seen[ident]})")
        seen[ident] = n
        ids.append(ident)
        texts.append(text(record, where))
    if not ids:
        raise ValueError(f"{path}: no {what} lines")
    return ids, texts


def read_beir(folder: Path) -> BeirSet:
    """A BEIR dataset folder; every line checked (ValueError naming FILE:LINE)."""
    doc_ids, docs = _ids(folder / "corpus.jsonl", "corpus",
                         lambda r, w: (_text(r, "title", w, optional=True) + " " + _text(r, "text", w)).strip())
    query_ids, queries = _ids(folder / "queries.jsonl", "queries", lambda r, w: _text(r, "text", w))
    path = qrels_file(folder)
    doc_index = {d: i for i, d in enumerate(doc_ids)}
    query_index = {q: i for i, q in enumerate(query_ids)}
    unknown: dict[str, int] = {}  # judged documents the corpus lacks: never found, still counted
    graded: dict[int, dict[int, float]] = {}
    for n, line in lines(path):
        cols = line.rstrip("\r\n").split("\t")
        if n == 1 and not cols[-1].strip().lstrip("-").isdigit():
            continue  # the header: query-id, corpus-id, score
        if not line.strip():
            continue
        if len(cols) not in (3, 4):
            raise ValueError(f"{path}:{n}: {len(cols)} columns; expected query-id, corpus-id, score (tab-separated)")
        q, d, score = cols[0], cols[-2], cols[-1].strip()
        try:
            grade = float(score)
        except ValueError:
            raise ValueError(f"{path}:{n}: score {score!r} is not a number") from None
        if q not in query_index:
            raise ValueError(f"{path}:{n}: query {q!r} is not in queries.jsonl")
        doc = doc_index.get(d)
        if doc is None:
            doc = unknown.setdefault(d, -1 - len(unknown))
        graded.setdefault(query_index[q], {})[doc] = grade
    kept = [q for q in sorted(graded) if any(v > 0 for v in graded[q].values())]
    if not kept:
        raise ValueError(f"{path}: no query has a document graded above 0")
    return BeirSet(doc_ids, docs, [query_ids[q] for q in kept], [queries[q] for q in kept],
                   [graded[q] for q in kept], path.stem, len(graded) - len(kept))


def search_dataset(model_dir: Path, data: BeirSet, device: str = "cpu", batch_size: int = 64,
                   log=print) -> dict[str, Any]:
    """The model's scores on one dataset: its queries searched over its corpus."""
    import torch

    from ..eval.retrieval import KS, retrieval_scores, search
    from ..features import embed
    from ..io.hf import folder_max_length, folder_pooling
    from ..model import BertModel
    from ..tokenizer import BertTokenizer

    pooling = folder_pooling(model_dir)
    length = folder_max_length(model_dir)
    model = BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval().to(torch.device(device))
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    kw = dict(pooling=pooling, normalize=True, batch_size=batch_size, max_length=length)
    docs = embed(model, tokenizer, data.docs, **kw)
    queries = embed(model, tokenizer, data.queries, **kw)
    k = max(KS) + 1  # one more: a query's own document is left out
    _, ranked = search(queries, docs, k)
    own = {d: i for i, d in enumerate(data.doc_ids)}
    rows = []
    for q, ids in zip(data.query_ids, ranked):
        same = own.get(q)
        rows.append([i for i in ids if i != same][:k - 1])
    width = min(len(r) for r in rows)
    scores = retrieval_scores(np.array([r[:width] for r in rows]), data.relevant, KS)
    return {"scores": scores, "pooling": pooling, "max_length": length, "queries": len(data.queries),
            "documents": len(data.docs), "split": data.split}


def find_datasets(data: Path) -> list[Path]:
    """BEIR dataset folders: `data` itself, or its subfolders (sorted by name)."""
    if is_beir(data):
        return [data]
    return sorted(p for p in data.iterdir() if p.is_dir() and is_beir(p))


def check(folder: Path) -> BeirSet:
    try:
        return read_beir(folder)
    except ValueError as e:
        raise UserError(str(e)) from None
