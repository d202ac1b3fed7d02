"""The embedding family (issue 50): pairs read with file:line errors, the in-batch-negatives loss equal to
sentence-transformers' MultipleNegativesRankingLoss on real weights, and `finetune --task embedding`
end to end, scored by retrieval over its dev file."""

import json

import pytest
import torch
import torch.nn.functional as F

from torchbert.tasks.embedding import PairExample, encode_pairs, read_pairs


def test_pairs_are_read_from_json_lines_and_tsv(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text('{"query": "q1", "positive": "p1"}\n\n{"id": "x", "query": "q2", "positive": "p2", '
                 '"negative": ["n1", "n2"]}\n{"query": "q3", "positive": "p3", "negative": "n3"}\n')
    got = read_pairs(j)
    assert [(e.id, e.query, e.positive, e.negatives) for e in got] == [
        ("1", "q1", "p1", []), ("x", "q2", "p2", ["n1", "n2"]), ("4", "q3", "p3", ["n3"])]
    t = tmp_path / "p.tsv"
    t.write_text("query\tpositive\tnegative\nq1\tp1\tn1\nq2\tp2\tn2\n")
    assert [(e.query, e.negatives) for e in read_pairs(t)] == [("q1", ["n1"]), ("q2", ["n2"])]
    t.write_text("q1\tp1\nq2\tp2\n")  # no header: every row is a pair
    assert [e.where.rsplit(":", 1)[1] for e in read_pairs(t)] == ["1", "2"]


@pytest.mark.parametrize("text,message", [
    ('{"query": "q", "positive": ""}\n', r"p.jsonl:1: \"positive\" is \"\"; expected a non-empty string"),
    ('{"query": "q"}\n', r"p.jsonl:1: \"positive\" is null"),
    ('{"query": "q", "positive": "p", "negative": 3}\n', r"p.jsonl:1: \"negative\" is 3"),
    ('["q", "p"]\n', r"p.jsonl:1: expected a JSON object"),
    ('{"query": \n', r"p.jsonl:1: not valid JSON"),
    ("\n", r"p.jsonl: no examples in the file; expected query and positive pairs"),
])
def test_bad_pairs_are_named_by_file_and_line(tmp_path, text, message):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_pairs(path)


def test_a_tsv_row_of_one_or_four_columns_is_an_error(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("q1\tp1\nq2\n")
    with pytest.raises(ValueError, match=r"p.tsv:2: 1 columns; expected query, positive and an optional negative"):
        read_pairs(path)


def test_the_loss_is_sentence_transformers_multiple_negatives_ranking_loss(minilm_dir):
    """Our packed forward and loss against the anchor's: its embeddings of the same texts (mean pooling),
    the loss MultipleNegativesRankingLoss computes from them (cosine x 20, each anchor's own positive
    among all positives and negatives of the batch)."""
    from sentence_transformers import SentenceTransformer

    from torchbert.config import BertConfig
    from torchbert.heads import BertForEmbedding
    from torchbert.tasks.batches import TaskData
    from torchbert.tasks.families import family
    from torchbert.tokenizer import BertTokenizer

    examples = [PairExample("1", "what is the capital of France?", "Paris is the capital of France.", []),
                PairExample("2", "中国的首都是哪里？", "北京是中国的首都。", ["上海是中国最大的城市。"]),
                PairExample("3", "who wrote Hamlet?", "Hamlet was written by Shakespeare.", ["A play in five acts."]),
                PairExample("4", "how do plants eat?", "Plants make sugar from light.", [])]
    config = BertConfig.load(minilm_dir)
    model = BertForEmbedding.from_pretrained(minilm_dir, config=config).eval()
    tok = BertTokenizer.from_pretrained(minilm_dir)
    fam = family("embedding")
    data = TaskData(encode_pairs(tok, examples, 128), fam)
    (batch,) = data.all_batches(16)
    out = model(**batch.model_inputs(), **fam.targets(batch))
    st = SentenceTransformer(str(minilm_dir), device="cpu").eval()
    with torch.no_grad():
        anchors = st.encode([e.query for e in examples], convert_to_tensor=True)
        candidates = st.encode([e.positive for e in examples] + [n for e in examples for n in e.negatives],
                               convert_to_tensor=True)
    scores = 20 * F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T
    want = F.cross_entropy(scores, torch.arange(len(examples)))
    assert out.loss.item() == pytest.approx(want.item(), abs=1e-5)
    # each query's best score, in the batch's order of examples (longest first)
    assert torch.allclose(out.scores.max(-1).values, scores.max(-1).values[batch.units], atol=1e-4)
    assert out.embeddings.shape == (sum(2 + len(e.negatives) for e in examples), config.hidden_size)


@pytest.mark.e2e
def test_finetune_an_embedding_model_and_score_its_retrieval(minilm_dir, tmp_path, capsys):
    from torchbert.apps.samples import inverse_cloze, jsonl_text, peoples_daily_paragraphs
    from torchbert.cli import main

    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)
    (tmp_path / "train.jsonl").write_text(jsonl_text(pairs[:48]), encoding="utf-8")
    (tmp_path / "dev.jsonl").write_text(jsonl_text(pairs[48:80]), encoding="utf-8")
    run = tmp_path / "run"
    assert main(["finetune", "--task", "embedding", "--model", str(minilm_dir), "--train", str(tmp_path / "train.jsonl"),
                 "--dev", str(tmp_path / "dev.jsonl"), "--out", str(run), "--epochs", "1", "--batch-size", "16",
                 "--max-length", "64", "--quiet"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100"} <= set(metrics)
    assert json.loads((run / "config.json").read_text())["pooling"] == "mean"
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--data", str(tmp_path / "dev.jsonl"), "--quiet"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["ndcg@10"] == pytest.approx(metrics["ndcg@10"], abs=1e-6)  # the best epoch's weights
    out = tmp_path / "ranks.jsonl"
    assert main(["predict", "--model", str(run), "--input", str(tmp_path / "dev.jsonl"), "--out", str(out),
                 "--quiet"]) == 0
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) == 32 and all(r["rank"] is None or 0 <= r["rank"] < 100 for r in records)
    import transformers
    from sentence_transformers import SentenceTransformer

    from torchbert.features import embed
    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer

    transformers.BertModel.from_pretrained(run)  # the encoder is a BERT checkpoint
    # and a sentence-transformers model with the same embeddings
    texts = [p["query"] for p in pairs[80:90]] + ["a short one", "English and 中文 together"]
    ours = embed(BertModel.from_pretrained(run).eval(), BertTokenizer.from_pretrained(run), texts, pooling="mean")
    theirs = SentenceTransformer(str(run), device="cpu").encode(texts, convert_to_numpy=True)
    assert abs(ours - theirs).max() < 1e-5
