"""The reranker family (issue 50): pairs and labelled pairs read with file:line errors, negatives sampled
from other queries, the listwise and pointwise losses, and a run folder that sentence-transformers'
CrossEncoder loads with the same scores; `finetune --task reranker` end to end."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchbert.tasks.reranker import RerankExample, read_reranking, with_sampled_negatives


def test_pairs_and_labelled_pairs_are_read(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text('{"query": "q1", "positive": "p1", "negative": ["n1", "n2"]}\n{"query": "q2", "positive": "p2"}\n')
    got = read_reranking(j)
    assert [(e.query, e.passages, e.labels) for e in got] == [("q1", ["p1", "n1", "n2"], [1, 0, 0]),
                                                            ("q2", ["p2"], [1])]
    j.write_text('{"query": "q1", "passage": "a", "label": 1}\n{"query": "q2", "passage": "b", "label": 0}\n'
                 '{"query": "q1", "passage": "c", "label": 0.5}\n')
    got = read_reranking(j)  # a query's pairs gathered, where it first appears
    assert [(e.query, e.passages, e.labels, e.where[-2:]) for e in got] == [("q1", ["a", "c"], [1, 0.5], ":1"),
                                                                          ("q2", ["b"], [0], ":2")]
    t = tmp_path / "p.tsv"
    t.write_text("query\tpassage\tlabel\nq1\ta\t1\nq1\tb\t0\n")
    assert [(e.passages, e.labels) for e in read_reranking(t)] == [(["a", "b"], [1, 0])]
    t.write_text("q1\tp1\tn1\n")  # no header: the embedding family's columns
    assert [(e.passages, e.labels) for e in read_reranking(t)] == [(["p1", "n1"], [1, 0])]
    j.write_text('{"query": "q", "documents": ["a", "b"]}\n')  # to score: no labels
    assert [(e.passages, e.labels) for e in read_reranking(j)] == [(["a", "b"], None)]


@pytest.mark.parametrize("name,text,message", [
    ("p.jsonl", '{"query": "q", "passage": "a", "label": 2}\n', r"p.jsonl:1: \"label\" is 2; expected a number from 0"),
    ("p.jsonl", '{"query": "q", "passage": "a", "label": "yes"}\n', r"p.jsonl:1: \"label\" is \"yes\""),
    ("p.jsonl", '{"query": "q", "passage": "", "label": 1}\n', r"p.jsonl:1: \"passage\" is \"\""),
    ("p.jsonl", '{"query": "q", "documents": []}\n', r"p.jsonl:1: \"documents\" is \[\]; expected a non-empty list"),
    ("p.tsv", "query\tpassage\tlabel\nq\ta\n", r"p.tsv:2: 2 columns; expected query, passage and label"),
    ("p.tsv", "query\tpassage\tlabel\n", r"p.tsv: no examples in the file"),
    ("p.jsonl", '{"query": "q", "passage": "a", "label": true}\n', r"p.jsonl:1: \"label\" is true; expected a number"),
    ("p.jsonl", '{"query": "q", "passage": "a"}\n', r"p.jsonl:1: \"label\" is missing; expected a number"),
    ("p.jsonl", '{"query": "q", "passage": "a", "label": null}\n', r"p.jsonl:1: \"label\" is null; expected a number"),
    ("p.jsonl", '{"query": "q", "passage": "a", "label": 1}\n["q", "b", 0]\n',
     r"p.jsonl:2: expected a JSON object, found list"),
    ("p.jsonl", '{"query": "q", "documents": "a b"}\n', r"p.jsonl:1: \"documents\" is \"a b\"; expected a non-empty list"),
    ("p.tsv", "query\tpassage\tlabel\nq\ta\t1\tx\n", r"p.tsv:2: 4 columns; expected query, passage and label"),
])
def test_bad_files_are_named_by_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_reranking(path)


def test_a_query_with_no_relevant_passage_is_an_error_for_the_listwise_loss(tmp_path, minilm_dir):
    from torchbert.tasks.families import family
    from torchbert.tasks.reranker import RerankerSettings
    from torchbert.tokenizer import BertTokenizer

    path = tmp_path / "p.jsonl"
    path.write_text('{"query": "q1", "passage": "a", "label": 1}\n{"query": "q2", "passage": "b", "label": 0}\n'
                    '{"query": "q3", "passage": "c", "label": 1}\n')
    examples = read_reranking(path)
    fam = family("reranker")
    tok = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(ValueError, match=r"p.jsonl:2: the query 'q2' has no relevant passage \(every label is 0\); "
                                         r"a listwise loss needs one"):
        fam.encode(tok, examples, RerankerSettings(type="reranker"), None, training=True)
    ts = RerankerSettings(type="reranker", rerank_loss="pointwise", sampled_negatives=1)
    enc = fam.encode(tok, examples, ts, None, training=True)
    assert enc.num_choices == [2, 2, 2] and enc.labels == [1, 0, 0, 0, 1, 0]  # each with one sampled negative


def test_sampled_negatives_come_from_other_queries_and_are_drawn_the_same_each_time():
    examples = [RerankExample(str(i), f"q{i}", [f"p{i}", f"n{i}"], [1.0, 0.0]) for i in range(20)]
    got = with_sampled_negatives(examples, 3)
    assert got == with_sampled_negatives(examples, 3)
    for ex, new in zip(examples, got):
        extra = new.passages[2:]
        assert len(extra) == 3 and len(set(extra)) == 3 and new.labels == [1, 0, 0, 0, 0]
        assert all(p.startswith("p") and p != ex.passages[0] for p in extra)  # others' positives
    assert with_sampled_negatives(examples, 0) == examples


def _reranker(minilm_dir, tmp_path, loss):
    """MiniLM's encoder under a seeded fresh score head, saved as a reranker folder."""
    from torchbert.config import BertConfig
    from torchbert.heads import BertForReranking
    from torchbert.tasks.families import family
    from torchbert.tasks.reranker import RerankerSettings
    from torchbert.tokenizer import BertTokenizer

    config = family("reranker").configure(BertConfig.load(minilm_dir), None,
                                          RerankerSettings(type="reranker", rerank_loss=loss), minilm_dir)
    torch.manual_seed(0)
    model = BertForReranking.from_pretrained(minilm_dir, config=config, loss=loss).eval()
    folder = tmp_path / "reranker"
    model.save_pretrained(folder)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(folder)
    return model, folder


EXAMPLES = [RerankExample("1", "what is the capital of France?", ["Paris is the capital of France.",
                                                                  "Lyon is a French city.", "Cats sleep a lot."],
                          [1.0, 0.0, 0.0]),
            RerankExample("2", "中国的首都是哪里？", ["上海是中国最大的城市。", "北京是中国的首都。"], [0.0, 1.0]),
            RerankExample("3", "who wrote Hamlet?", ["Hamlet was written by Shakespeare."], [1.0])]


def test_a_reranker_is_a_cross_encoder_with_the_same_scores_and_losses(minilm_dir, tmp_path):
    """Saved as BertForSequenceClassification with one label: CrossEncoder(folder).predict gives the
    sigmoid of our scores; the pointwise loss equals its BinaryCrossEntropyLoss; the listwise loss is
    the cross-entropy of each query's softmax over its candidates."""
    from sentence_transformers.cross_encoder import CrossEncoder
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    from torchbert.tasks.batches import TaskData
    from torchbert.tasks.families import family
    from torchbert.tasks.reranker import RerankerSettings
    from torchbert.tasks.reranker import encode_reranking
    from torchbert.tokenizer import BertTokenizer

    model, folder = _reranker(minilm_dir, tmp_path, "pointwise")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    fam = family("reranker")
    data = TaskData(encode_reranking(BertTokenizer.from_pretrained(folder), EXAMPLES, 128), fam)
    (batch,) = data.all_batches(16)
    with torch.no_grad():
        out = model(**batch.model_inputs(), **fam.targets(batch))
    ce = CrossEncoder(str(folder), device="cpu")
    pairs = [(e.query, p) for e in EXAMPLES for p in e.passages]
    theirs = ce.predict(pairs, convert_to_numpy=True)
    records = fam.records(EXAMPLES, data.encoded, [o for _, o in sorted(fam.outputs(out, batch, {}))],
                          RerankerSettings(type="reranker"), None)
    ours = np.array([s for r in records for s in r["scores"]])
    assert abs(ours - theirs).max() < 1e-5
    labels = torch.tensor([y for e in EXAMPLES for y in e.labels])
    ce.model.eval()
    with torch.no_grad():  # their loss, on their own forward of the same pairs
        want = BinaryCrossEntropyLoss(ce)([[q for q, _ in pairs], [p for _, p in pairs]], labels)
    assert out.loss.item() == pytest.approx(want.item(), abs=1e-5)
    assert [r["rank"] for r in records] == [sorted(np.argsort(np.argsort(-np.array(r["scores"]), kind="stable"))[
        [i for i, y in enumerate(e.labels) if y == 1.0]])[0] for r, e in zip(records, EXAMPLES)]
    listwise, _ = _reranker(minilm_dir, tmp_path / "l", "listwise")
    with torch.no_grad():
        lout = listwise(**batch.model_inputs(), **fam.targets(batch))
    starts = np.cumsum([0] + [len(e.passages) for e in EXAMPLES])
    flat = torch.tensor(theirs).logit().double()  # the same weights: their scores, as logits
    want = np.mean([-torch.log_softmax(flat[a:b], 0)[e.labels.index(1.0)].item()
                    for e, a, b in zip(EXAMPLES, starts[:-1], starts[1:])])
    assert lout.loss.item() == pytest.approx(want, abs=1e-4)


@pytest.mark.e2e
def test_finetune_a_reranker_and_load_it_in_sentence_transformers(minilm_dir, tmp_path, capsys):
    from sentence_transformers.cross_encoder import CrossEncoder

    from torchbert.apps.samples import inverse_cloze, jsonl_text, peoples_daily_paragraphs
    from torchbert.cli import main

    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)
    (tmp_path / "train.jsonl").write_text(jsonl_text(pairs[:32]), encoding="utf-8")
    (tmp_path / "dev.jsonl").write_text(jsonl_text(pairs[32:56]), encoding="utf-8")
    run = tmp_path / "run"
    args = ["finetune", "--task", "reranker", "--model", str(minilm_dir), "--train", str(tmp_path / "train.jsonl"),
            "--dev", str(tmp_path / "dev.jsonl"), "--out", str(run), "--epochs", "1", "--batch-size", "8",
            "--max-length", "64", "--quiet"]
    assert main(args + ["--pooling", "cls"]) == 2
    assert "--pooling is a setting of embedding tasks; a reranker task does not read it" in capsys.readouterr().err
    assert main(args) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    # scores over each query's own candidates are named so, beside their number
    assert {"candidates_ndcg@10", "candidates_mrr@10", "candidates_recall@1"} <= set(metrics)
    assert 0 < metrics["candidates_mrr@10"] <= 1 and metrics["candidates_per_query"] == 4.0  # 1 + 3 sampled
    assert "dev (best epoch 1): candidates_ndcg@10 " in capsys.readouterr().out
    assert main(["evaluate", "--model", str(run), "--data", str(tmp_path / "dev.jsonl"), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["candidates_mrr@10"] == pytest.approx(metrics["candidates_mrr@10"],
                                                                                     abs=1e-6)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"query": p["query"], "documents": [p["positive"], "无关的句子。"]},
                                                          ensure_ascii=False) + "\n" for p in pairs[60:66]))
    out = tmp_path / "scores.jsonl"
    assert main(["predict", "--model", str(run), "--input", str(tmp_path / "in.jsonl"), "--out", str(out),
                 "--quiet", "--precision", "fp32"]) == 0  # fp32: at parity with sentence-transformers' fp32
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [sorted(r["ranking"]) for r in records] == [[0, 1]] * 6 and "rank" not in records[0]
    texts = [(p["query"], d) for p in pairs[60:66] for d in (p["positive"], "无关的句子。")]
    theirs = CrossEncoder(str(run), device="cpu", max_length=64).predict(texts)  # as trained: 64 tokens
    assert abs(np.array([s for r in records for s in r["scores"]]) - theirs).max() < 1e-5


@pytest.mark.e2e
def test_a_reranker_is_scored_as_a_search_over_a_first_stage_in_one_command(minilm_dir, tmp_path, capsys):
    """evaluate --first-stage: an embedding model's top k of every passage, reordered by the reranker,
    equal to sentence-transformers' bi-encoder search reordered by its CrossEncoder, scored by hand."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.cross_encoder import CrossEncoder

    from torchbert.apps.samples import inverse_cloze, jsonl_text, peoples_daily_paragraphs
    from torchbert.cli import main

    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)
    (tmp_path / "train.jsonl").write_text(jsonl_text(pairs[:24]), encoding="utf-8")
    (tmp_path / "test.jsonl").write_text(jsonl_text(pairs[100:130]), encoding="utf-8")
    run = tmp_path / "run"
    assert main(["finetune", "--task", "reranker", "--model", str(minilm_dir), "--train", str(tmp_path / "train.jsonl"),
                 "--out", str(run), "--epochs", "1", "--batch-size", "8", "--max-length", "64", "--quiet"]) == 0
    capsys.readouterr()
    evaluate = ["evaluate", "--model", str(run), "--data", str(tmp_path / "test.jsonl"), "--first-stage",
                str(minilm_dir), "--quiet", "--precision", "fp32"]
    assert main(evaluate + ["--top-k", "5"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["top_k"], got["queries"], got["passages"]) == (5, 30, 30)

    queries, passages = [p["query"] for p in pairs[100:130]], [p["positive"] for p in pairs[100:130]]
    bi = SentenceTransformer(str(minilm_dir), device="cpu")  # at its max_seq_length, 256, as evaluate reads it
    q, d = (bi.encode(t, normalize_embeddings=True, convert_to_numpy=True) for t in (queries, passages))
    top = np.argsort(-(q @ d.T), axis=1, kind="stable")[:, :5]
    cross = CrossEncoder(str(run), device="cpu", max_length=64)
    scores = cross.predict([(queries[i], passages[j]) for i in range(30) for j in top[i]]).reshape(30, 5)
    reranked = np.take_along_axis(top, np.argsort(-scores, axis=1, kind="stable"), axis=1)

    def ndcg(ranked):  # one relevant passage a query: passage i answers query i
        return np.mean([1 / np.log2(list(r).index(i) + 2) if i in r else 0.0 for i, r in enumerate(ranked)])

    assert got["first_stage_ndcg@10"] == pytest.approx(ndcg(top), abs=1e-6)
    assert got["ndcg@10"] == pytest.approx(ndcg(reranked), abs=1e-6)
    assert got["recall@5"] == got["first_stage_recall@5"]  # the same candidates, reordered
    # the whole collection reranked: its first stage is the embedding evaluation of that model
    assert main(evaluate + ["--top-k", "1000"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["evaluate", "--model", str(minilm_dir), "--task", "embedding", "--data", str(tmp_path / "test.jsonl"),
                 "--quiet"]) == 0
    embedding = json.loads(capsys.readouterr().out)
    assert whole["top_k"] == 30 and whole["first_stage_ndcg@10"] == pytest.approx(embedding["ndcg@10"], abs=1e-6)
    assert main(["evaluate", "--model", str(minilm_dir), "--data", str(tmp_path / "test.jsonl"), "--first-stage",
                 str(minilm_dir), "--quiet"]) == 2
    assert "not a model fine-tuned by torchbert" in capsys.readouterr().err  # --model must be a reranker


def test_the_listwise_loss_reads_graded_and_several_relevant_passages_as_a_distribution():
    """Each query's labels are scaled to sum to 1 and compared with the softmax over its candidates:
    two passages of relevance 1 each take half the target; grades 1 and 0.5 take 2/3 and 1/3."""
    from torchbert.config import BertConfig
    from torchbert.heads import BertForReranking

    torch.manual_seed(0)
    config = BertConfig.from_name("tiny", vocab_size=50)
    config.extra["num_labels"] = 1
    model = BertForReranking(config, loss="listwise").eval()
    lengths = [5, 7, 4, 6, 3]  # query 0: three candidates, query 1: two
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    ids = torch.randint(5, 50, (int(cu[-1]),))
    num_choices = torch.tensor([3, 2])
    for labels, target in (([1.0, 0.0, 1.0, 1.0, 0.5], [[0.5, 0.0, 0.5], [2 / 3, 1 / 3]]),
                           ([0.0, 1.0, 0.0, 0.0, 1.0], [[0.0, 1.0, 0.0], [0.0, 1.0]])):
        with torch.no_grad():
            out = model(ids, cu_seqlens=cu, max_seqlen=max(lengths), num_choices=num_choices,
                        labels=torch.tensor(labels))
        want = np.mean([-(torch.tensor(t) * F.log_softmax(out.logits[q, :len(t)], -1)).sum().item()
                        for q, t in enumerate(target)])
        assert out.loss.item() == pytest.approx(want, rel=1e-5)


def test_labelled_pairs_are_read_from_csv_a_header_in_any_case_and_ids_are_lines(tmp_path):
    c = tmp_path / "p.csv"
    c.write_text('Query,Passage,Label\nq1,"a, b",1\nq2,c,0\nq1,d,0\n', encoding="utf-8")
    got = read_reranking(c)
    assert [(e.id, e.query, e.passages, e.labels) for e in got] == [("2", "q1", ["a, b", "d"], [1, 0]),
                                                                  ("3", "q2", ["c"], [0])]
    j = tmp_path / "p.jsonl"
    j.write_text('{"id": "", "query": "q", "documents": ["a"]}\n{"id": 7, "query": "q", "documents": ["b"]}\n')
    assert [e.id for e in read_reranking(j)] == ["1", "7"]  # an empty id is its line's



def test_pairs_are_cut_longest_first_as_the_cross_encoders_tokenizer_cuts_them(minilm_dir):
    import transformers

    from torchbert.tasks.reranker import encode_reranking
    from torchbert.tokenizer import BertTokenizer

    query = "what does a very long question about the history of the city of paris ask for " * 2
    examples = [RerankExample("1", query, ["a short passage", "a passage " * 30], None),
                RerankExample("2", "short query", ["another passage " * 20], None)]
    enc = encode_reranking(BertTokenizer.from_pretrained(minilm_dir), examples, 24)
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir)(
        [query, query, "short query"], ["a short passage", "a passage " * 30, "another passage " * 20],
        truncation="longest_first", max_length=24)
    assert enc.input_ids == theirs["input_ids"] and enc.token_type_ids == theirs["token_type_ids"]
    assert enc.num_choices == [2, 1] and enc.labels is None


def test_records_rank_every_candidate_and_score_the_queries_with_a_relevant_one(minilm_dir):
    """An evaluated query's candidates include its sampled negatives: they take ranks, but its ranking
    lists its own passages only; a label of 0.5 is relevant; a query without a relevant passage is
    left out of the scores. Unlabelled examples get no sampled negatives."""
    from types import SimpleNamespace

    from torchbert.eval.retrieval import retrieval_scores
    from torchbert.tasks.families import family
    from torchbert.tasks.reranker import RerankerSettings
    from torchbert.tokenizer import BertTokenizer

    fam = family("reranker")
    ts = RerankerSettings(type="reranker")
    examples = [RerankExample("a", "q", ["p0", "p1", "p2"], [0.0, 0.5, 1.0]), RerankExample("b", "q", ["x", "y"], [0, 0])]
    outputs = [[0.9, 0.1, 0.5, 0.95], [0.3, 0.2]]  # the first with one sampled negative, scored best
    records = fam.records(examples, None, outputs, ts, None)
    assert records[0] == {"id": "a", "scores": [0.9, 0.1, 0.5], "ranking": [0, 2, 1], "rank": 2,
                          "relevant_ranks": [2, 3], "candidates": 4}
    assert records[1]["rank"] is None and records[1]["relevant_ranks"] == []
    scores = fam.score(records, examples, None)
    want = retrieval_scores([np.arange(4)], [{2, 3}], ks=(1,))
    assert scores == {**{f"candidates_{k}": v for k, v in want.items()}, "candidates_per_query": 4.0}
    # a query is right when its best-scored candidate is relevant: a label of 0.5 counts
    batch = SimpleNamespace(labels=torch.tensor([0.0, 0.5, 1.0, 0.0]), num_choices=torch.tensor([2, 2]), max_choices=2)
    assert fam.correct(SimpleNamespace(logits=torch.tensor([[0.1, 0.9], [0.2, 0.8]])), batch) == 1
    assert fam.head_arguments(RerankerSettings(type="reranker", rerank_loss="pointwise")) == {"loss": "pointwise"}
    unlabelled = [RerankExample("1", "q", ["a", "b"], None), RerankExample("2", "r", ["c"], None)]
    enc = fam.encode(BertTokenizer.from_pretrained(minilm_dir), unlabelled, ts, None, training=False)
    assert enc.num_choices == [2, 1]


def test_a_first_stage_reads_at_its_own_length_and_the_model_must_be_a_reranker(monkeypatch, tmp_path):
    """run_rerank_evaluate before any model runs: a --model fine-tuned for another task is refused; the
    first stage reads at the length its folder was trained with (else the model's own limit, as embed), its
    k clipped to the file's passages."""
    import torchbert.io.hf
    import torchbert.tasks.predict
    import torchbert.tasks.reranker as reranker
    from torchbert.tasks.families import TaskSettings
    from torchbert.tasks.reranker import RerankerSettings, run_rerank_evaluate

    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"query": f"q{i}", "positive": f"p{i}"}) + "\n" for i in range(3)))
    task = {"ts": TaskSettings(type="classification")}
    monkeypatch.setattr(torchbert.tasks.predict, "load_finetuned", lambda *a, **k: (None, None, task["ts"], None))
    with pytest.raises(ValueError, match=r"run was fine-tuned for classification \(evaluate it without --first-stage"):
        run_rerank_evaluate(tmp_path / "run", data, tmp_path / "emb", 5, torch.device("cpu"))
    task["ts"] = RerankerSettings(type="reranker")

    def folder_max_length(folder):  # the length the first stage was trained with, or none known
        return 24 if folder.name == "emb" else None

    class Stop(Exception):
        pass

    seen = []

    def first_stage(model_dir, queries, passages, k, device, batch_size, precision, max_length, progress):
        seen.append((k, max_length))
        raise Stop

    monkeypatch.setattr(torchbert.io.hf, "folder_max_length", folder_max_length)
    monkeypatch.setattr(reranker, "first_stage", first_stage)
    for folder in ("emb", "plain"):
        with pytest.raises(Stop):
            run_rerank_evaluate(tmp_path / "run", data, tmp_path / folder, 5, torch.device("cpu"))
    assert seen == [(3, 24), (3, None)]  # None: the model's own limit, as embed reads a folder that says nothing
