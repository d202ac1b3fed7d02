"""The reranker family: a query and candidate passages -> a relevance score for each pair, read from the
pooled [CLS] of `[CLS] query [SEP] passage [SEP]` (a cross-encoder: monoBERT, Nogueira and Cho 2019;
sentence-transformers' CrossEncoder). It reorders the top hits of a first-stage search (BM25, or a
bi-encoder from the embedding family).

Files: the embedding family's (JSON Lines {"query", "positive", "negative"}, or TSV with two or three
columns in that order, its header optional): the positive relevant (1), each negative not (0); or
labelled pairs, JSON Lines {"query", "passage", "label"} or TSV with the header `query passage label`
(a label from 0 to 1), a query's pairs gathered into one example. Prediction inputs may also be
{"query", "documents": [...]}. `sampled_negatives` passages of other examples are added to each
labelled example as negatives (drawn once, seeded: the in-batch negatives of a cross-encoder, which
sees a query and a passage together and so cannot score the batch's other passages for free).

Losses (RerankerSettings.rerank_loss): listwise, the softmax over an example's candidates against its
labels (for one positive, the cross-entropy of picking it: Localized Contrastive Estimation, Gao et
al. 2021); pointwise, binary cross-entropy of each pair's score against its label (monoBERT; the
sentence-transformers CrossEncoder's BinaryCrossEntropyLoss). Scores: each query's own candidates
ranked (candidates_ndcg@10, candidates_mrr@10, candidates_recall@1 and their mean number: how it
orders what it is given, not a search; `evaluate --first-stage` scores it as one: run_rerank_evaluate below).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..eval.retrieval import retrieval_scores
from ..heads import BertForReranking
from ..losses import choice_block
from ..io.texts import json_records
from .embedding import PairExample, _text, pair_from_record, read_pairs
from .encode import Encoded, check_room, where_of
from ..settings import setting
from .families import GroupedTask, TaskSettings, register_family
from .formats import MISSING, PathLike, existing, no_examples, shown, table_rows

LABELLED = ("query", "passage", "label")


@dataclass
class RerankExample:
    """A query and its candidate passages, each with its relevance (1 relevant, 0 not; None unlabelled)."""

    id: str
    query: str
    passages: list[str]
    labels: list[float] | None
    where: str = ""


def from_pair(pair: PairExample) -> RerankExample:
    return RerankExample(pair.id, pair.query, [pair.positive, *pair.negatives], [1.0] + [0.0] * len(pair.negatives),
                         pair.where)


def _label(value: Any, where: str) -> float:
    try:
        label = float(value)
    except (TypeError, ValueError):
        label = math.nan
    if isinstance(value, bool) or not 0.0 <= label <= 1.0:
        raise ValueError(f"{where}: \"label\" {shown(value)}; expected a number "
                         "from 0 (not relevant) to 1 (relevant)")
    return label


def example_from_record(row: Any, where: str, default_id: str) -> RerankExample:
    """One JSON object: {query, positive, negative} (labelled), or {query, documents} (to score)."""
    if isinstance(row, dict) and "documents" in row:
        docs = row["documents"]
        if not isinstance(docs, list) or not docs:
            raise ValueError(f"{where}: \"documents\" is {json.dumps(docs, ensure_ascii=False)[:60]}; expected a "
                             "non-empty list of passages")
        ident = row.get("id")
        return RerankExample(default_id if ident in (None, "") else str(ident),
                             _text(row.get("query", MISSING), "query", where),
                             [_text(d, f"documents[{i}]", where) for i, d in enumerate(docs)], None, where)
    return from_pair(pair_from_record(row, where, default_id))


class _Grouped:
    """Labelled pairs gathered by query, in the order each query first appears."""

    def __init__(self):
        self.examples: dict[str, RerankExample] = {}

    def add(self, query: str, passage: str, label: float, where: str) -> None:
        ex = self.examples.get(query)
        if ex is None:
            self.examples[query] = RerankExample(where.rsplit(":", 1)[-1], query, [passage], [label], where)
        else:
            ex.passages.append(passage)
            ex.labels.append(label)


def read_reranking(path: PathLike, labelled: bool = True) -> list[RerankExample]:
    """The examples of a JSON Lines or TSV file (see the module's doc); errors name FILE:LINE."""
    path = existing(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        records = list(json_records(path))
        if records and isinstance(records[0][1], dict) and "passage" in records[0][1]:
            grouped = _Grouped()
            for n, row in records:
                where = f"{path}:{n}"  # each row an object (json_records)
                grouped.add(_text(row.get("query", MISSING), "query", where),
                            _text(row.get("passage", MISSING), "passage", where),
                            _label(row.get("label", MISSING), where), where)
            out = list(grouped.examples.values())
        else:
            out = [example_from_record(row, f"{path}:{n}", str(n)) for n, row in records]
    else:
        rows = table_rows(path, tsv=path.suffix.lower() != ".csv")
        first = next(rows, None)
        if first is not None and [c.strip().lower() for c in first[1]] == list(LABELLED):
            grouped = _Grouped()
            for n, cells in rows:
                where = f"{path}:{n}"
                if len(cells) != 3:
                    raise ValueError(f"{where}: {len(cells)} columns; expected query, passage and label")
                grouped.add(_text(cells[0], "query", where), _text(cells[1], "passage", where),
                            _label(cells[2], where), where)
            out = list(grouped.examples.values())
        else:
            out = [from_pair(p) for p in read_pairs(path)] if first is not None else []
    if not out:
        raise no_examples(path, "query and positive pairs, or a header `query passage label` and labelled pairs")
    return out


def with_sampled_negatives(examples: list[RerankExample], k: int, seed: int = 0) -> list[RerankExample]:
    """Each labelled example with k passages of other examples added as negatives (label 0), drawn
    without its own passages; the same draw for the same examples."""
    if k == 0 or len(examples) < 2:
        return examples
    rng = np.random.default_rng(seed)
    pool = [p for ex in examples for p, y in zip(ex.passages, ex.labels) if y > 0] or \
        [p for ex in examples for p in ex.passages]
    out = []
    for ex in examples:
        own, extra = set(ex.passages), []
        for i in rng.integers(len(pool), size=8 * (k + len(ex.passages)) + 16):  # draws of its own are skipped
            if len(extra) == k:
                break
            if pool[i] not in own:
                extra.append(pool[i])
                own.add(pool[i])
        out.append(RerankExample(ex.id, ex.query, ex.passages + extra, ex.labels + [0.0] * len(extra), ex.where))
    return out


def encode_reranking(tokenizer, examples: list[RerankExample], max_length: int) -> Encoded:
    """`[CLS] query [SEP] passage [SEP]` per candidate, cut "longest_first" (CrossEncoder's order and
    cut); an example's rows in a row, num_choices of them; labels: each row's relevance."""
    check_room(max_length, pairs=True)
    firsts = [ex.query for ex in examples for _ in ex.passages]
    seconds = [p for ex in examples for p in ex.passages]
    enc = tokenizer(firsts, seconds, truncation="longest_first", max_length=max_length)
    labelled = all(ex.labels is not None for ex in examples)
    return Encoded(enc["input_ids"], enc["token_type_ids"],
                   [e for e, ex in enumerate(examples) for _ in ex.passages],
                   labels=[y for ex in examples for y in ex.labels] if labelled else None,
                   num_choices=[len(ex.passages) for ex in examples])


@dataclass
class RerankerSettings(TaskSettings):
    rerank_loss: str = setting("listwise", "listwise, a softmax over each query's passages (each query needs a "
                                           "relevant one), or pointwise, binary cross-entropy per pair",
                               choices=("listwise", "pointwise"))
    sampled_negatives: int = setting(3, "passages of other queries added to each query's as negatives (drawn once, "
                                        "seeded; 0: only the file's)", low=0)


class RerankerTask(GroupedTask):
    heads = {"bert": BertForReranking}
    gold = "labels"
    file_format = None  # no hub splits
    # over each query's own candidates (the file's passages and the sampled negatives), not a search over
    # every passage: named so, as its dev line and metrics.json print them
    metrics = ("candidates_ndcg@10", "candidates_mrr@10", "candidates_recall@1")
    Settings = RerankerSettings
    endpoints = ("rerank",)  # its encoder reads pairs: its pooled vectors of one text are no embeddings
    about = "a query + passage -> relevance  the embedding files, or {query, passage, label}; a cross-encoder"
    export_sample = "pair"
    soft_targets = 'choices'
    example_file = ("rerank.jsonl", "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in (
        {"query": "what is the capital of France?", "positive": "Paris is the capital and largest city of France.",
         "negative": "Lyon is a city in France."},
        {"query": "中国的首都是哪里？", "positive": "北京是中华人民共和国的首都。", "negative": "上海是中国最大的城市。"},
        {"query": "how do plants make food?", "positive": "Plants make sugar from light, water and CO2.",
         "negative": ["Cats sleep most of the day."]},
        {"query": "who wrote Hamlet?", "positive": "Hamlet is a tragedy written by William Shakespeare."})))

    def texts(self, example):
        return [example.query, *example.passages]

    def _read(self, path, layout, labelled, warn):
        return read_reranking(path, labelled)

    def from_record(self, record, where, default_id):
        return example_from_record(record, where, default_id)

    def configure(self, config, label_map, ts=None, model_dir=None):
        """One score per pair."""
        config.extra = {**config.extra, "id2label": {"0": "relevance"}, "label2id": {"relevance": 0}}
        config.extra.pop("problem_type", None)
        return config

    def head_arguments(self, ts):
        return {"loss": ts.rerank_loss}

    def _encode(self, tokenizer, examples, ts, label2id, training):
        labelled = all(ex.labels is not None for ex in examples)
        if labelled and ts.rerank_loss == "listwise":
            for e, ex in enumerate(examples):
                if max(ex.labels) <= 0:
                    raise ValueError(f"{where_of(ex, e)}: the query {ex.query[:40]!r} has no relevant passage (every "
                                     "label is 0); a listwise loss needs one: add its positive, or train with "
                                     "--rerank-loss pointwise")
        if labelled:
            examples = with_sampled_negatives(examples, ts.sampled_negatives)
        return encode_reranking(tokenizer, examples, ts.max_length)

    def batch_targets(self, encoded, rows, units):
        return {"labels": torch.tensor([encoded.labels[r] for r in rows], dtype=torch.float32)}

    def correct(self, out, batch):
        """Queries whose best-scored passage is a relevant one."""
        labels, _ = choice_block(batch.labels, batch.num_choices, batch.max_choices)
        return (labels.gather(1, out.logits.argmax(-1, keepdim=True)) >= 0.5).sum()

    def row_scores(self, logits):
        return logits.sigmoid()  # each candidate's relevance, as CrossEncoder gives it

    def records(self, examples, encoded, outputs, ts, id2label):
        """Each example's passages ranked by score (CrossEncoder's: the sigmoid of the logit); for a
        labelled one, the ranks of its relevant passages (label >= 0.5) among every candidate scored,
        the sampled negatives of evaluation included (rank: the best of them; 0 is first)."""
        records = []
        for ex, scores in zip(examples, outputs):
            order = np.argsort(-np.asarray(scores), kind="stable")
            own = len(ex.passages)
            record = {"id": ex.id, "scores": [round(s, 6) for s in scores[:own]],
                      "ranking": [int(i) for i in order if i < own]}
            if ex.labels is not None:
                place = np.argsort(order)  # candidate -> its rank
                ranks = sorted(int(place[i]) for i, y in enumerate(ex.labels) if y >= 0.5)
                record.update(rank=ranks[0] if ranks else None, relevant_ranks=ranks, candidates=len(scores))
            records.append(record)
        return records

    def score(self, records, examples, label_map):
        """Ranking scores over the queries with a relevant passage."""
        scored = [r for r in records if r.get("relevant_ranks")]
        if not scored:
            raise ValueError("no query has a relevant passage (label >= 0.5) to rank")
        scores = retrieval_scores([np.arange(r["candidates"]) for r in scored],
                                  [set(r["relevant_ranks"]) for r in scored], ks=(1,))
        return {**{f"candidates_{k}": v for k, v in scores.items()},
                "candidates_per_query": float(np.mean([r["candidates"] for r in scored]))}


register_family(RerankerTask("reranker"))


def first_stage(model_dir, queries: list[str], passages: list[str], k: int, device: torch.device,
                batch_size: int, precision: str, max_length: int | None, progress: bool) -> np.ndarray:
    """The k best passages of each query [Q, k] by cosine of an embedding model's vectors (its own
    pooling, as `embed` uses it): the first stage a reranker reorders."""
    from .. import fast
    from ..eval.retrieval import search
    from ..features import embed
    from ..io.hf import folder_pooling
    from ..model import BertModel
    from ..tokenizer import BertTokenizer

    model = BertModel.from_pretrained(model_dir, add_pooling_layer=False)  # the pooling reads the tokens
    model = fast.at_precision(model.eval().to(device), precision)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    pooling = folder_pooling(model_dir)

    def vectors(texts):
        return embed(model, tokenizer, texts, pooling=pooling, normalize=True, batch_size=batch_size,
                     max_length=max_length, progress=progress)

    return search(vectors(queries), vectors(passages), k)[1]


def run_rerank_evaluate(model_dir, data, first_stage_dir, top_k: int, device: torch.device, batch_size: int = 64,
                        progress: bool = True, precision: str = "fp32") -> dict[str, float]:
    """A reranker scored as a search: each query of an embedding-layout file (query, positive, negatives)
    searched over every distinct passage of the file by the first-stage model, its top_k candidates
    reordered by the reranker; nDCG@10, MRR@10 and recall@1/10/top_k over the whole collection, of the
    first stage alone ("first_stage_" keys) and reranked (a relevant passage outside the top_k counts as
    not found by both)."""
    from .predict import load_finetuned, predict
    from ..io.hf import folder_max_length
    from .batches import TaskData
    from .families import family

    model, tokenizer, ts, _ = load_finetuned(model_dir, None, device, precision)
    if ts.type != "reranker":
        raise ValueError(f"--first-stage reorders a first stage's candidates by a reranker; {model_dir} was "
                         f"fine-tuned for {ts.type} (evaluate it without --first-stage)")
    pairs = read_pairs(data)
    ids: dict[str, int] = {}
    for ex in pairs:
        for text in (ex.positive, *ex.negatives):
            ids.setdefault(text, len(ids))
    passages = list(ids)
    k = min(top_k, len(passages))
    relevant = [{ids[ex.positive]} for ex in pairs]
    length = folder_max_length(first_stage_dir)  # the first stage reads as it was trained to, as `embed` does
    found = first_stage(first_stage_dir, [ex.query for ex in pairs], passages, k, device, batch_size, precision,
                        length, progress)
    examples = [RerankExample(ex.id, ex.query, [passages[i] for i in top], None, ex.where)
                for ex, top in zip(pairs, found)]
    fam = family("reranker")
    encoded = fam.encode(tokenizer, examples, ts, None, training=False, use_labels=False)
    records = predict(model, TaskData(encoded, fam), examples, ts, None, batch_size, device, progress)
    reranked = np.stack([top[r["ranking"]] for top, r in zip(found, records)])
    ks = sorted({1, 10, k} & set(range(1, k + 1)))
    before, after = retrieval_scores(found, relevant, ks), retrieval_scores(reranked, relevant, ks)
    return {**after, **{f"first_stage_{name}": v for name, v in before.items()},
            "top_k": float(k), "queries": float(len(pairs)), "passages": float(len(passages))}
