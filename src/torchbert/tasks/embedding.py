"""The embedding family: a query and the passage that answers it (and, where the file has them, hard
negatives) -> one vector per text, a query close to its own passage (Sentence-BERT's bi-encoder,
Reimers and Gurevych 2019; trained with in-batch negatives, heads.BertForEmbedding).

Files: JSON Lines {"query", "positive", "negative" (optional: a text or a list)}, or TSV with two or
three columns in that order (query, positive, negative), its header optional; an NLI file (columns
sentence1, sentence2, label) as premise -> entailed hypothesis, contradictions the hard negatives
(Sentence-BERT's recipe); or raw text, one text a line (.txt), for unsupervised SimCSE. Scored pairs
(sentence1, sentence2, score: STS) are evaluated by Spearman's correlation of their cosine. Model rows: each text
alone, `[CLS] text [SEP]`; an example's rows stay together in a batch (query, positive, negatives),
and every other example's passages in the batch are its negatives. Dev scores: each dev query
searched over every passage of the dev file (eval/retrieval.py): nDCG@10, MRR@10, recall@k.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..eval import metrics
from ..eval.retrieval import rank_scores, search
from ..heads import TEMPERATURE, BertForEmbedding
from ..io.hf import read_sentence_transformers
from ..io.texts import json_records, lines
from .encode import Encoded, check_room
from ..settings import setting
from .families import TaskFamily, TaskSettings, register_family
from .formats import MISSING, PathLike, existing, no_examples, shown, table_rows

COLUMNS = ("query", "positive", "negative")


@dataclass
class PairExample:
    """A query, the passage that answers it, and passages that do not (hard negatives, maybe none); or a
    text alone (positive None: distillation's, whose target is the teacher's vector of it)."""

    id: str
    query: str
    positive: str | None
    negatives: list[str]
    where: str = ""
    score: float | None = None  # a scored pair's similarity (STS: sentence1, sentence2, score), for evaluation


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: \"{key}\" {shown(value, 60)}; expected a non-empty string")
    return value


def pair_from_record(row: Any, where: str, default_id: str) -> PairExample:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object with \"query\" and \"positive\"")
    negatives = row.get("negative")
    negatives = [] if negatives is None else [negatives] if isinstance(negatives, str) else negatives
    if not isinstance(negatives, list):
        raise ValueError(f"{where}: \"negative\" is {json.dumps(negatives)[:60]}; expected a string or a list")
    ident = row.get("id")
    return PairExample(default_id if ident is None or ident == "" else str(ident),
                       _text(row.get("query", MISSING), "query", where),
                       _text(row.get("positive", MISSING), "positive", where),
                       [_text(x, "negative", where) for x in negatives], where)


def read_pairs(path: PathLike) -> list[PairExample]:
    """The (query, positive[, negatives]) examples of a JSON Lines or TSV file, of an NLI file, or of
    raw text (.txt); errors name FILE:LINE."""
    path = existing(path)
    if path.suffix.lower() == ".txt":
        return simcse_pairs(path)
    if is_nli(path):
        return nli_triplets(path)
    if is_nli(path, label=("score",)):
        return scored_pairs(path)
    out = []
    if path.suffix.lower() in (".jsonl", ".json"):
        for n, row in json_records(path):
            out.append(pair_from_record(row, f"{path}:{n}", str(n)))
    else:
        for n, cells in table_rows(path, tsv=path.suffix.lower() != ".csv"):
            if not out and n == 1 and [c.strip().lower() for c in cells] == list(COLUMNS[:len(cells)]):
                continue  # the header
            if not 2 <= len(cells) <= 3:
                raise ValueError(f"{path}:{n}: {len(cells)} columns; expected query, positive and an optional "
                                 "negative")
            where = f"{path}:{n}"
            out.append(PairExample(str(n), _text(cells[0], "query", where), _text(cells[1], "positive", where),
                                   [_text(cells[2], "negative", where)] if len(cells) == 3 else [], where))
    if not out:
        raise no_examples(path, "query and positive pairs")
    return out


def simcse_pairs(path: Path) -> list[PairExample]:
    """Unsupervised SimCSE (Gao et al., 2021): each non-blank line of a text file both the query and
    its positive; the two encodings differ by dropout alone, and the batch's other lines are the
    negatives. Embeddings for a user who has only a corpus."""
    out = [PairExample(str(n), text.strip(), text.strip(), [], f"{path}:{n}") for n, text in lines(path)
           if text.strip()]
    if not out:
        raise no_examples(path, "one text a line (unsupervised SimCSE)")
    return out


NLI_LABELS = ("entailment", "neutral", "contradiction")


def is_nli(path: Path, label: tuple[str, ...] = ("label", "gold_label")) -> bool:
    """A sentence-pair file with NLI labels (columns or fields sentence1, sentence2, label or gold_label),
    or with another `label` column (STS: score)."""
    first = next((text for _, text in lines(path) if text.strip()), "")
    if path.suffix.lower() in (".jsonl", ".json"):
        try:
            keys = set(json.loads(first))
        except (ValueError, TypeError):
            return False
    else:
        keys = {c.strip().lower() for c in first.split("\t" if path.suffix.lower() != ".csv" else ",")}
    return {"sentence1", "sentence2"} <= keys and bool(keys & set(label))


def nli_triplets(path: Path) -> list[PairExample]:
    """An NLI file as Sentence-BERT trains on it: each premise the query, each hypothesis it entails a
    positive, the hypotheses that contradict it its hard negatives (neutral ones are left out, as is a
    premise that entails nothing). Read by the pair family's reader (TSV or CSV with a header, SNLI /
    MultiNLI JSON Lines)."""
    from .families import family

    premises: dict[str, dict[str, list]] = {}
    for ex in family("pair").read(path):
        label = str(ex.label).strip().lower()
        if label not in NLI_LABELS:
            raise ValueError(f"{ex.where}: label {ex.label!r}; an NLI file's labels are {', '.join(NLI_LABELS)}")
        p = premises.setdefault(ex.text_a, {"entailment": [], "contradiction": [], "where": ex.where})
        if label != "neutral":
            p[label].append(ex.text_b)
    out = [PairExample(f"{p['where'].rsplit(':', 1)[-1]}.{k}", premise, positive, p["contradiction"], p["where"])
           for premise, p in premises.items() for k, positive in enumerate(p["entailment"])]
    if not out:
        raise no_examples(path, "premises with an entailed hypothesis (NLI labels entailment, contradiction)")
    return out


def scored_pairs(path: Path) -> list[PairExample]:
    """Sentence pairs with a similarity score (STS: columns or fields sentence1, sentence2, score), for
    evaluation: Spearman's correlation of their cosine with the score."""
    def example(n: int, a: Any, b: Any, score: Any) -> PairExample:
        where = f"{path}:{n}"
        try:
            value = float(score)
        except (TypeError, ValueError):
            value = float("nan")
        if isinstance(score, bool) or value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where}: \"score\" is {json.dumps(score, ensure_ascii=False)[:40]}; expected a number")
        return PairExample(str(n), _text(a, "sentence1", where), _text(b, "sentence2", where), [], where, score=value)

    if path.suffix.lower() in (".jsonl", ".json"):
        out = [example(n, row.get("sentence1"), row.get("sentence2"), row.get("score")) if isinstance(row, dict)
               else example(n, None, None, None) for n, row in json_records(path)]
    else:
        rows = table_rows(path, tsv=path.suffix.lower() != ".csv")
        _, header = next(rows)
        at = {c.strip().lower(): i for i, c in enumerate(header)}
        cols = [at["sentence1"], at["sentence2"], at["score"]]
        out = []
        for n, cells in rows:
            if len(cells) <= max(cols):
                raise ValueError(f"{path}:{n}: {len(cells)} columns; the header names {len(header)}")
            out.append(example(n, *(cells[i] for i in cols)))
    if not out:
        raise no_examples(path, "sentence pairs with a score")
    return out


def encode_pairs(tokenizer, examples: list[PairExample], max_length: int) -> Encoded:
    """Each text alone, `[CLS] text [SEP]` cut to max_length; an example's rows in order: its query, its
    positive, its negatives (num_choices holds how many; a text alone is one row)."""
    check_room(max_length, pairs=False)
    texts = [t for ex in examples for t in (ex.query, ex.positive, *ex.negatives) if t is not None]
    ids = tokenizer.encode_ids(texts, max_length=max_length, truncation=True)
    counts = [1 + (ex.positive is not None) + len(ex.negatives) for ex in examples]
    return Encoded(ids, [[0] * len(r) for r in ids], [i for i, c in enumerate(counts) for _ in range(c)],
                   labels=[0] * len(examples), num_choices=counts)


@dataclass
class EmbeddingSettings(TaskSettings):
    pooling: str | None = setting(None, "how a text's tokens become its vector (default: the model folder's own, as "
                                        "its sentence-transformers files say, else mean); saved with the model",
                                  choices=("mean", "cls"))
    temperature: float = setting(TEMPERATURE, "the softmax temperature of in-batch negatives over cosine "
                                              "similarities (0.05: sentence-transformers' scale 20)", above=0, high=1)
    learn_temperature: bool = setting(False, "learn the temperature with the model (CLIP's logit scale), starting "
                                             "at --temperature")
    matryoshka: list[int] | None = setting(None, "also train each vector's first D dimensions as an embedding of "
                                                 "its own, for each D given (Matryoshka representation learning; "
                                                 "`serve` then honours `dimensions`)", low=1, metavar="D")
    mini_batch: int | None = setting(None, "encode a training batch this many texts at a time and keep only each "
                                           "one's inputs, recomputing its activations in the backward (GradCache's "
                                           "memory: in-batch negatives over a batch of any size in the memory of MINI "
                                           "texts; MiniLM at batch 256 with 32: 5.4 GB, where batch 128 alone took "
                                           "9.8)", low=1, metavar="MINI")


class EmbeddingTask(TaskFamily):
    soft_targets = "embeddings"  # a student learns the teacher's vectors of texts alone
    heads = {"bert": BertForEmbedding}
    gold = None  # a passage is part of the example
    file_format = None  # no hub splits
    layouts = ("auto",)
    metrics = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100")
    about = "a query -> its passage  JSONL {query, positive, negative}, TSV, NLI, or raw text (SimCSE)"
    export_outputs = ("embeddings",)
    example_file = ("pairs.jsonl", "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in (
        {"query": "what is the capital of France?", "positive": "Paris is the capital and largest city of France."},
        {"query": "中国的首都是哪里？", "positive": "北京是中华人民共和国的首都。", "negative": "上海是中国最大的城市。"},
        {"query": "how do plants make food?", "positive": "Plants make sugar from light, water and CO2.",
         "negative": ["Cats sleep most of the day."]},
        {"query": "who wrote Hamlet?", "positive": "Hamlet is a tragedy written by William Shakespeare."})))

    def texts(self, example):
        return [t for t in (example.query, example.positive, *example.negatives) if t]

    def _read(self, path, layout, labelled, warn):
        return read_pairs(path)

    Settings = EmbeddingSettings
    endpoints = ("embeddings",)  # its vectors (the ranks of `predict` are a dev file's, not a request's)

    def configure(self, config, label_map, ts=None, model_dir=None):
        """What defines the model's vectors, in config.extra, saved with the model: the pooling given,
        else the model folder's own (its sentence-transformers files, or an embedding run's config),
        else mean; the Matryoshka dimensions it is trained at (serve's `dimensions`); the tokens per text
        it is trained with (sentence_bert_config.json's max_seq_length, which every command embeds with)."""
        ts = ts or EmbeddingSettings(type=self.type)
        own = read_sentence_transformers(model_dir) if model_dir is not None else None
        pooling = ts.pooling or (own or {}).get("pooling") or config.extra.get("pooling") or "mean"
        if pooling not in ("mean", "cls"):
            raise ValueError(f"--model {model_dir}: it pools by {pooling}; train it with --pooling mean or cls")
        given = list(ts.matryoshka or ())
        twice = sorted({d for d in given if given.count(d) > 1})
        if twice:
            raise ValueError(f"--matryoshka {' '.join(map(str, given))}: {', '.join(map(str, twice))} given twice; "
                             "each dimension once (each is weighted alike)")
        dims = sorted(set(given), reverse=True)
        if dims and dims[0] >= config.hidden_size:
            raise ValueError(f"--matryoshka {dims[0]}: the model's vectors have {config.hidden_size} dimensions; "
                             "give smaller ones (the full vector is always trained)")
        config.extra = {**config.extra, "pooling": pooling, "matryoshka": dims or None, "max_seq_length": ts.max_length}
        return config

    def head_arguments(self, ts):
        return {"temperature": ts.temperature, "learn_temperature": ts.learn_temperature, "mini_batch": ts.mini_batch}

    def from_record(self, record, where, default_id):
        return pair_from_record(record, where, default_id)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        if training and examples and examples[0].score is not None:
            raise ValueError(f"{examples[0].where}: scored pairs (sentence1, sentence2, score) are for evaluation "
                             "(Spearman's correlation); train on query and positive pairs, NLI or raw text")
        return encode_pairs(tokenizer, examples, ts.max_length)

    def best_metric(self, label_map, preset, dev=None):
        return "spearman" if dev and dev[0].score is not None else self.metrics[0]

    def batch_targets(self, encoded, rows, units):
        return {}  # the targets are the batch's layout (num_choices): each query's own passage

    def targets(self, batch):
        return {"num_choices": batch.num_choices, "max_choices": batch.max_choices}

    def count(self, batch):
        return int(batch.num_choices.numel())

    def total(self, data):
        return len(data)

    def correct(self, out, batch):
        return (out.scores.argmax(-1) == out.targets).sum()

    def predict_inputs(self, batch, encoded):
        return {}

    def outputs(self, out, batch, inputs):
        emb = out.embeddings.float().cpu().numpy()
        starts = np.concatenate([[0], np.cumsum(batch.num_choices.tolist())])
        return [(u, emb[a:b]) for u, a, b in zip(batch.units.tolist(), starts[:-1], starts[1:])]

    def records(self, examples, encoded, outputs, ts, id2label):
        """Each query searched over every distinct passage of the file (positives and negatives): the
        rank of its own passage (0: first; None: beyond 100) and their cosine similarity; a model
        trained with --matryoshka also ranks by each vector's first D dimensions (ranks: {D: rank}).
        Scored pairs (STS): each pair's cosine similarity."""
        if examples and examples[0].score is not None:
            return [{"id": ex.id, "cosine": round((_unit(e[:1]) @ _unit(e[1:2]).T).item(), 6)}
                    for ex, e in zip(examples, outputs)]
        ids: dict[str, int] = {}
        rows = []
        for ex, emb in zip(examples, outputs):
            for text, vec in zip((ex.positive, *ex.negatives), emb[1:]):
                if text not in ids:
                    ids[text] = len(ids)
                    rows.append(vec)
        docs, queries = np.stack(rows), np.stack([emb[0] for emb in outputs])
        own = np.array([ids[ex.positive] for ex in examples])
        records = [{"id": ex.id} for ex in examples]
        for d in (docs.shape[1], *sorted(set(ts.matryoshka or ()), reverse=True)):
            q, p = _unit(queries[:, :d]), _unit(docs[:, :d])
            _, ranked = search(q, p, 100)
            for r, top, k, vec in zip(records, ranked, own, q):
                hit = np.flatnonzero(top == k)
                rank = int(hit[0]) if len(hit) else None
                if d == docs.shape[1]:
                    r.update(rank=rank, score=round(float(vec @ p[k]), 6))
                else:
                    r.setdefault("ranks", {})[str(d)] = rank
        return records

    def score(self, records, examples, label_map):
        if examples and examples[0].score is not None:
            found = metrics.regression_scores([r["cosine"] for r in records], [ex.score for ex in examples])
            return {"spearman": found["spearman"], "pearson": found["pearson"]}
        scores = rank_scores([r["rank"] for r in records])
        for d in records[0].get("ranks", {}) if records else ():
            scores[f"ndcg@10_d{d}"] = rank_scores([r["ranks"][d] for r in records])["ndcg@10"]
        return scores


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (cosine search)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


register_family(EmbeddingTask("embedding"))
