"""The embedding family (issue 50): pairs read with file:line errors, the in-batch-negatives loss equal to
sentence-transformers' MultipleNegativesRankingLoss on real weights, and `finetune --task embedding`
end to end, scored by retrieval over its dev file."""

import json

import numpy as np
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
    ('{"query": "q"}\n', r"p.jsonl:1: \"positive\" is missing"),
    ('{"query": "q", "positive": null}\n', r"p.jsonl:1: \"positive\" is null"),
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
                 "--max-length", "64", "--matryoshka", "64", "--learn-temperature", "--quiet"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "ndcg@10_d64"} <= set(metrics)
    config = json.loads((run / "config.json").read_text())  # what defines the vectors; how it trained is in the record
    assert (config["pooling"], config["matryoshka"]) == ("mean", [64]) and "learn_temperature" not in config
    assert json.loads((run / "torchbert.json").read_text())["task"]["learn_temperature"] is True
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
    long = "".join(p["positive"] for p in pairs[90:93])  # past the 64 tokens the run was trained at
    texts = [p["query"] for p in pairs[80:90]] + ["a short one", "English and 中文 together", long]
    model, tok = BertModel.from_pretrained(run).eval(), BertTokenizer.from_pretrained(run)
    assert len(tok.encode_ids([long])[0]) > 128
    ours = embed(model, tok, texts, pooling="mean", max_length=64)
    st = SentenceTransformer(str(run), device="cpu")
    assert st.max_seq_length == 64  # one length per folder: the one it was trained with (its --max-length)
    theirs = st.encode(texts, convert_to_numpy=True)
    assert abs(ours - theirs).max() < 1e-5
    # and every command embeds at it unless told otherwise: embed, serve's embeddings, evaluate (above)
    from torchbert.apps.endpoints import Embedder
    from torchbert.io.hf import folder_max_length

    assert folder_max_length(run) == 64 and Embedder(run, name="run", load=False).max_length == 64
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    for extra in ([], ["--max-length", "512"]):
        assert main(["embed", "--model", str(run), "--input", str(tmp_path / "texts.txt"), "--out",
                     str(tmp_path / "e.npy"), "--precision", "fp32", "--quiet", *extra]) == 0
        got = np.load(tmp_path / "e.npy")
        assert (abs(got - ours).max() < 1e-5) == (extra == []), extra  # texts cut at 64, or not
    assert abs(got[-1] - ours[-1]).max() > 1e-2  # --max-length 512: the long text whole


def _minilm_batch(minilm_dir, given, negatives=True):
    from torchbert.config import BertConfig
    from torchbert.heads import BertForEmbedding
    from torchbert.tasks.batches import TaskData
    from torchbert.tasks.families import family
    from torchbert.tokenizer import BertTokenizer

    examples = [PairExample("1", "what is the capital of France?", "Paris is the capital of France.", []),
                PairExample("2", "中国的首都是哪里？", "北京是中国的首都。", ["上海是中国最大的城市。"] if negatives else []),
                PairExample("3", "who wrote Hamlet?", "Hamlet was written by Shakespeare.", [])]
    config = BertConfig.load(minilm_dir)
    config.extra.update({k: v for k, v in given.items() if k == "matryoshka"})  # the head's arguments: the rest
    model = BertForEmbedding.from_pretrained(minilm_dir, config=config,
                                             **{k: v for k, v in given.items() if k != "matryoshka"}).eval()
    data = TaskData(encode_pairs(BertTokenizer.from_pretrained(minilm_dir), examples, 128), family("embedding"))
    (batch,) = data.all_batches(16)
    return model, batch, examples


def test_matryoshka_and_temperature_equal_sentence_transformers_losses(minilm_dir):
    """--matryoshka 128 32 --temperature 0.1: our loss equals MatryoshkaLoss(MultipleNegativesRankingLoss(scale
    10), [384, 128, 32]) computed by sentence-transformers on its own forward of MiniLM."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

    model, batch, examples = _minilm_batch(minilm_dir, {"matryoshka": [32, 128], "temperature": 0.1}, negatives=False)
    with torch.no_grad():
        ours = model(**batch.model_inputs(), num_choices=batch.num_choices, max_choices=batch.max_choices)
    st = SentenceTransformer(str(minilm_dir), device="cpu").eval()
    del st[2]  # no Normalize module: the loss takes the pooled vectors, as ours does
    features = [st.tokenize([e.query for e in examples]), st.tokenize([e.positive for e in examples])]
    with torch.no_grad():
        theirs = MatryoshkaLoss(st, MultipleNegativesRankingLoss(st, scale=10.0), [384, 128, 32])(features, None)
        full = MultipleNegativesRankingLoss(st, scale=10.0)(features, None)
    assert ours.loss.item() == pytest.approx(theirs.item(), abs=1e-4)
    assert ours.loss.item() > full.item() + 1e-3  # the shorter vectors' losses are in it


def test_a_learned_temperature_trains_and_is_saved(minilm_dir, tmp_path):
    from torchbert.config import BertConfig
    from torchbert.heads import BertForEmbedding

    model, batch, _ = _minilm_batch(minilm_dir, {"learn_temperature": True, "temperature": 0.05})
    assert model.logit_scale.requires_grad and model.logit_scale.item() == pytest.approx(2.995732, abs=1e-5)
    model.train()
    out = model(**batch.model_inputs(), num_choices=batch.num_choices, max_choices=batch.max_choices)
    out.loss.backward()
    assert model.logit_scale.grad is not None and model.logit_scale.grad.abs().item() > 0
    with torch.no_grad():
        model.logit_scale.fill_(3.5)
    model.save_pretrained(tmp_path / "m")
    again = BertForEmbedding.from_pretrained(tmp_path / "m", config=BertConfig.load(tmp_path / "m"),
                                             learn_temperature=True)  # as the run's record says it trained
    assert again.logit_scale.item() == pytest.approx(3.5) and "learn_temperature" not in again.config.extra
    fixed, _, _ = _minilm_batch(minilm_dir, {"temperature": 0.05})
    assert "logit_scale" not in dict(fixed.named_parameters()) and "logit_scale" not in fixed.state_dict()


def test_the_pooling_is_the_model_folders_own_unless_given(minilm_dir, tmp_path):
    """MiniLM's sentence-transformers files say mean; a folder whose files say cls trains with cls;
    --pooling overrides; a pipeline torchbert cannot reproduce is refused, naming the file."""
    import shutil

    from torchbert.config import BertConfig
    from torchbert.io.hf import read_sentence_transformers
    from torchbert.tasks.embedding import EmbeddingSettings
    from torchbert.tasks.families import family

    fam = family("embedding")
    ts = EmbeddingSettings(type="embedding")
    assert fam.configure(BertConfig.load(minilm_dir), None, ts, minilm_dir).extra["pooling"] == "mean"
    folder = tmp_path / "cls"
    shutil.copytree(minilm_dir, folder)
    pool = json.loads((folder / "1_Pooling/config.json").read_text())
    pool.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    (folder / "1_Pooling/config.json").write_text(json.dumps(pool))
    assert read_sentence_transformers(folder) == {"pooling": "cls", "normalize": True}
    assert fam.configure(BertConfig.load(folder), None, ts, folder).extra["pooling"] == "cls"
    given = EmbeddingSettings(type="embedding", pooling="mean")
    assert fam.configure(BertConfig.load(folder), None, given, folder).extra["pooling"] == "mean"
    pool.update(pooling_mode_cls_token=False, pooling_mode_mean_sqrt_len_tokens=True)
    (folder / "1_Pooling/config.json").write_text(json.dumps(pool))
    with pytest.raises(ValueError, match=r"1_Pooling/config.json: pooling pooling_mode_mean_sqrt_len_tokens; "
                                         r"torchbert pools by one of"):
        read_sentence_transformers(folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"modules.json: the modules Transformer -> Pooling -> Dense -> Normalize; "
                                         r"torchbert runs"):
        read_sentence_transformers(folder)
    with pytest.raises(ValueError, match=r"--matryoshka 384: the model's vectors have 384 dimensions"):
        fam.configure(BertConfig.load(minilm_dir), None, EmbeddingSettings(type="embedding", matryoshka=[384, 64]),
                      minilm_dir)
    with pytest.raises(ValueError, match=r"--matryoshka 64 32 64: 64 given twice"):
        fam.configure(BertConfig.load(minilm_dir), None, EmbeddingSettings(type="embedding", matryoshka=[64, 32, 64]),
                      minilm_dir)


def test_an_embedding_setting_for_another_task_is_an_error(tmp_path, capsys):
    from torchbert.cli import main
    from torchbert.tasks.embedding import EmbeddingSettings
    from torchbert.tasks.families import TaskSettings, task_settings

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert main(["finetune", "--task", "sst2", "--model", str(tmp_path / "m"), "--train", "t.tsv", "--out",
                 str(tmp_path / "o"), "--pooling", "cls"]) == 2
    assert "--pooling is a setting of embedding tasks; a classification task does not read it" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"the settings of embedding tasks \(EmbeddingSettings\) do not fit a "
                                         r"classification task; give a TaskSettings"):
        task_settings("classification", EmbeddingSettings(type="embedding", pooling="cls"))
    with pytest.raises(ValueError, match="matryoshka must be >= 1, got 0"):
        EmbeddingSettings(type="embedding", matryoshka=[64, 0])
    ts = task_settings("embedding", TaskSettings(type="embedding", max_length=64))  # the shared ones given
    assert type(ts) is EmbeddingSettings and (ts.max_length, ts.doc_stride, ts.temperature) == (64, 21, 0.05)
    assert not (tmp_path / "o").exists()


def test_length_groups_are_the_least_padded_attention_work():
    """Against every way of cutting the sorted lengths into at most 3 groups, on random batches."""
    import itertools
    import random

    from torchbert.packing import length_groups

    rng = random.Random(0)
    for _ in range(30):
        lengths = [rng.choice([rng.randint(3, 20), rng.randint(60, 256)]) for _ in range(rng.randint(1, 9))]
        groups = length_groups(lengths, most=3)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths))) and len(groups) <= 3
        work = sum(len(g) * max(lengths[i] for i in g) ** 2 for g in groups)
        s = sorted(lengths)
        best = min(sum((b - a) * s[b - 1] ** 2 for a, b in zip((0, *cuts), (*cuts, len(s))))
                   for k in range(3) for cuts in itertools.combinations(range(1, len(s)), k))
        assert work == best


def test_grouped_encoding_equals_one_pass_in_values_and_gradients(minilm_dir):
    """The packed forward encodes the queries and the passages in groups of similar length: the same
    embeddings, loss and gradients as one pass over the whole batch (eval mode: no dropout)."""
    model, batch, _ = _minilm_batch(minilm_dir, {})
    inputs, targets = batch.model_inputs(), {"num_choices": batch.num_choices, "max_choices": batch.max_choices}
    grouped = model(**inputs, **targets)
    grouped.loss.backward()
    g1 = model.bert.layers[0].attention.qkv.weight.grad.clone()
    model.zero_grad()
    whole = model(**inputs, **targets, output_hidden_states=True)  # this path runs one pass
    whole.loss.backward()
    g2 = model.bert.layers[0].attention.qkv.weight.grad
    assert torch.allclose(grouped.embeddings, whole.embeddings, atol=1e-5)
    assert grouped.loss.item() == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(g1, g2, atol=1e-6, rtol=1e-4)


def test_raw_text_is_read_for_unsupervised_simcse(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("第一句话。\n\n  second line \n")
    got = read_pairs(path)
    assert [(e.query, e.positive, e.negatives, e.where.rsplit(":", 1)[1]) for e in got] == [
        ("第一句话。", "第一句话。", [], "1"), ("second line", "second line", [], "3")]
    path.write_text("\n \n")
    with pytest.raises(ValueError, match=r"corpus.txt: no examples in the file; expected one text a line"):
        read_pairs(path)


def test_an_nli_file_becomes_premise_entailment_contradiction_triplets(tmp_path):
    """Sentence-BERT's recipe: the premise the query, each entailed hypothesis a positive, the
    contradicted ones its hard negatives; neutral pairs and premises that entail nothing left out."""
    path = tmp_path / "nli.tsv"
    path.write_text("sentence1\tsentence2\tlabel\n"
                    "A man plays a guitar.\tA man makes music.\tentailment\n"
                    "A man plays a guitar.\tNobody is playing.\tcontradiction\n"
                    "A man plays a guitar.\tThe man is famous.\tneutral\n"
                    "Two dogs run.\tAnimals are asleep.\tcontradiction\n"
                    "A man plays a guitar.\tSomeone plays an instrument.\tentailment\n")
    got = read_pairs(path)
    assert [(e.query, e.positive, e.negatives) for e in got] == [
        ("A man plays a guitar.", "A man makes music.", ["Nobody is playing."]),
        ("A man plays a guitar.", "Someone plays an instrument.", ["Nobody is playing."])]
    assert got[0].where.endswith("nli.tsv:2") and got[0].id != got[1].id
    path.write_text("sentence1\tsentence2\tlabel\nA\tB\tyes\n")
    with pytest.raises(ValueError, match=r"nli.tsv:2: label 'yes'; an NLI file's labels are entailment, neutral, "
                                         r"contradiction"):
        read_pairs(path)
    j = tmp_path / "snli.jsonl"
    j.write_text(json.dumps({"sentence1": "P", "sentence2": "H", "gold_label": "entailment"}) + "\n")
    assert [(e.query, e.positive) for e in read_pairs(j)] == [("P", "H")]


@pytest.mark.e2e
def test_simcse_on_raw_text_trains_an_embedding_run(minilm_dir, tmp_path):
    """finetune --task embedding --train corpus.txt: a tiny BERT trained on raw sentences alone, scored
    on retrieval pairs; the run is an embedding run like any other."""
    from clihelp import tiny_bert

    from torchbert.apps.samples import SENTENCE, inverse_cloze, jsonl_text, peoples_daily_paragraphs
    from torchbert.cli import main

    base = tiny_bert(tmp_path / "base", minilm_dir)
    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)
    sentences = [s for p in pairs[100:140] for s in SENTENCE.findall(p["positive"])]
    (tmp_path / "corpus.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    (tmp_path / "dev.jsonl").write_text(jsonl_text(pairs[:32]), encoding="utf-8")
    run = tmp_path / "run"
    assert main(["finetune", "--task", "embedding", "--model", str(base), "--train", str(tmp_path / "corpus.txt"),
                 "--dev", str(tmp_path / "dev.jsonl"), "--out", str(run), "--epochs", "1", "--batch-size", "16",
                 "--max-length", "32", "--quiet"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train_examples"] == len(sentences) and 0 <= metrics["ndcg@10"] <= 1
    assert metrics["steps"] == -(-len(sentences) // 16)


@pytest.mark.parametrize("fast", [False, True])
def test_mini_batches_recompute_the_same_activations_and_gradients(minilm_dir, monkeypatch, fast):
    """--mini-batch 2 in training: each chunk's activations are recomputed in the backward, dropout
    masks included (torch's and torchbert.fast's, both drawn from torch's saved random state): the
    loss and gradients equal the same chunks kept in memory; without dropout, equal to one pass."""
    import contextlib

    import torchbert.heads as heads
    from torchbert import fast as fast_pieces

    model, batch, _ = _minilm_batch(minilm_dir, {"mini_batch": 2})
    model.train()
    inputs, targets = batch.model_inputs(), {"num_choices": batch.num_choices, "max_choices": batch.max_choices}

    def step():
        model.zero_grad()
        torch.manual_seed(0)
        with fast_pieces.training(model) if fast else contextlib.nullcontext():
            out = model(**inputs, **targets)
            out.loss.backward()
        return out.loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    loss1, grads1 = step()
    with monkeypatch.context() as m:  # the same chunks, kept in memory
        m.setattr(heads, "checkpoint", lambda f, *a, use_reentrant: f(*a))
        loss2, grads2 = step()
    assert loss1 == pytest.approx(loss2, abs=1e-6) and len(grads1) == len(grads2) > 50
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(grads1, grads2))
    for module in model.modules():  # no dropout: the chunks' gradients are one pass's
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):  # attention's
            module.dropout_p = 0.0
    loss3, grads3 = step()
    model.mini_batch = None
    loss4, grads4 = step()
    assert loss3 == pytest.approx(loss4, rel=1e-4)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-3) for a, b in zip(grads3, grads4))


@pytest.mark.e2e
def test_scored_pairs_are_evaluated_by_spearman_as_sentence_transformers_does(minilm_dir, tmp_path, capsys):
    """STS's layout (sentence1, sentence2, score): `evaluate` gives the Spearman correlation of the
    pairs' cosine with their scores, equal to sentence-transformers' EmbeddingSimilarityEvaluator on the
    same model; a scored file cannot train (it holds no positives), and as --dev it picks epochs by it."""
    import realdata
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator

    from torchbert.apps.samples import inverse_cloze, jsonl_text, peoples_daily_paragraphs
    from torchbert.cli import main

    en = list(realdata.english_texts()[:24])
    rows = [(a, b, float(i % 6)) for i, (a, b) in enumerate(zip(en, en[1:] + en[:1]))]
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)[:32]
    (tmp_path / "train.jsonl").write_text(jsonl_text(pairs), encoding="utf-8")
    run = tmp_path / "run"
    args = ["finetune", "--task", "embedding", "--model", str(minilm_dir), "--out", str(run), "--epochs", "1",
            "--batch-size", "16", "--max-length", "64", "--quiet"]
    assert main(args + ["--train", str(sts)]) == 2
    assert "sts.tsv:2: scored pairs (sentence1, sentence2, score) are for evaluation" in capsys.readouterr().err
    assert main(args + ["--train", str(tmp_path / "train.jsonl"), "--dev", str(sts)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics) >= {"spearman", "pearson"} and "ndcg@10" not in metrics
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--data", str(sts), "--quiet"]) == 0
    ours = json.loads(capsys.readouterr().out)["spearman"]
    st = SentenceTransformer(str(run), device="cpu")  # at the run's --max-length, 64: its sentence_bert_config.json
    theirs = EmbeddingSimilarityEvaluator([a for a, _, _ in rows], [b for _, b, _ in rows], [y for *_, y in rows],
                                          main_similarity="cosine")(st)
    assert ours == pytest.approx(next(v for k, v in theirs.items() if k.endswith("spearman_cosine")), abs=1e-6)


def test_scored_pairs_are_read_with_file_and_line_errors(tmp_path):
    path = tmp_path / "sts.tsv"
    path.write_text("id\tsentence1\tsentence2\tscore\n7\tA cat.\tA dog.\t1.5\n")
    (got,) = read_pairs(path)
    assert (got.query, got.positive, got.score, got.where[-2:]) == ("A cat.", "A dog.", 1.5, ":2")
    path.write_text("sentence1\tsentence2\tscore\nA\tB\thigh\n")
    with pytest.raises(ValueError, match=r"sts.tsv:2: \"score\" is \"high\"; expected a number"):
        read_pairs(path)
    j = tmp_path / "sts.jsonl"
    j.write_text(json.dumps({"sentence1": "A", "sentence2": "", "score": 2}) + "\n")
    with pytest.raises(ValueError, match=r"sts.jsonl:1: \"sentence2\" is \"\""):
        read_pairs(j)


@pytest.mark.parametrize("name, text, want", [
    ("p.json", '{"query": "q1", "positive": "p1", "id": ""}\n', [("1", "q1", "p1", [])]),  # an empty id: its line
    ("p.JSONL", '{"query": "q1", "positive": "p1", "negative": "n1"}\n', [("1", "q1", "p1", ["n1"])]),
    ("p.csv", "query,positive,negative\nq1,\"p1, with a comma\",n1\n", [("2", "q1", "p1, with a comma", ["n1"])]),
    ("c.TXT", "one line\n", [("1", "one line", "one line", [])]),
])
def test_pair_files_are_read_by_their_suffix_in_any_case(tmp_path, name, text, want):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert [(e.id, e.query, e.positive, e.negatives) for e in read_pairs(path)] == want


@pytest.mark.parametrize("name, text, message", [
    ("p.jsonl", '{"query": "  ", "positive": "p"}\n', r"p.jsonl:1: \"query\" is \"  \"; expected a non-empty string"),
    ("p.tsv", "q1\tp1\tn1\tx\n", r"p.tsv:1: 4 columns; expected query, positive and an optional negative"),
    ("p.tsv", "q1\tp1\t \n", r"p.tsv:1: \"negative\" is \" \""),
    ("sts.jsonl", '{"sentence1": "A", "sentence2": "B", "score": true}\n', r"sts.jsonl:1: \"score\" is true; expected a number"),
    ("sts.tsv", "sentence1\tsentence2\tscore\nA\tB\tinf\n", r"sts.tsv:2: \"score\" is \"inf\"; expected a number"),
    ("sts.tsv", "sentence1\tsentence2\tscore\nA\tB\tnan\n", r"sts.tsv:2: \"score\" is \"nan\"; expected a number"),
    ("sts.tsv", "sentence1\tsentence2\tscore\nA\tB\n", r"sts.tsv:2: 2 columns; the header names 3"),
])
def test_a_blank_text_a_fourth_column_and_a_score_not_finite_are_named_by_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_pairs(path)


def test_nli_and_scored_pairs_are_read_from_csv_and_labels_in_any_case(tmp_path):
    nli = tmp_path / "nli.csv"
    nli.write_text("sentence1,sentence2,label\nA man plays.,Music is made.,Entailment\nA man plays.,Nobody plays.,"
                   "CONTRADICTION\n", encoding="utf-8")
    assert [(e.query, e.positive, e.negatives) for e in read_pairs(nli)] == [
        ("A man plays.", "Music is made.", ["Nobody plays."])]
    sts = tmp_path / "sts.csv"
    sts.write_text("sentence1,sentence2,score\nA cat.,A dog.,1.5\n", encoding="utf-8")
    assert [(e.query, e.positive, e.score) for e in read_pairs(sts)] == [("A cat.", "A dog.", 1.5)]


def test_dev_records_rank_each_querys_own_passage_by_cosine_among_the_distinct_passages():
    """records() against a search written out here: every distinct passage of the file once (a passage
    that is one query's negative and another's positive is one passage), cosine of the full vectors
    and of each Matryoshka prefix made unit length on its own, ranks past 100 None; scored pairs
    (STS) get their cosine."""
    import numpy as np

    from torchbert.eval.retrieval import rank_scores
    from torchbert.tasks.embedding import EmbeddingSettings
    from torchbert.tasks.families import family

    fam = family("embedding")
    rng = np.random.default_rng(0)
    n = 150  # past 100 passages: some own passages rank beyond the search's depth
    positives = [f"p{i}" for i in range(n)]
    examples = [PairExample(str(i), f"q{i}", positives[i], [positives[(i + 1) % n]] if i % 3 == 0 else [])
                for i in range(n)]
    vectors = {t: rng.normal(size=8) * rng.uniform(0.1, 10) for t in positives}  # rows of any length
    queries = [vectors[ex.positive] * 0.3 + rng.normal(size=8) * rng.uniform(0.1, 10) for ex in examples]
    outputs = [np.stack([q, *(vectors[t] for t in (ex.positive, *ex.negatives))]) for q, ex in zip(queries, examples)]
    ts = EmbeddingSettings(type="embedding", matryoshka=[3])
    records = fam.records(examples, None, outputs, ts, None)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    docs = np.stack([vectors[t] for t in positives])
    for d in (8, 3):
        sims = unit(np.stack(queries)[:, :d]) @ unit(docs[:, :d]).T
        ranks = [int((row > row[i]).sum()) for i, row in enumerate(sims)]
        want = [r if r < 100 else None for r in ranks]
        got = [r["rank"] if d == 8 else r["ranks"]["3"] for r in records]
        assert got == want, d
        if d == 8:
            assert None in want and 0 in want
            assert [r["score"] for r in records] == pytest.approx([sims[i, i] for i in range(n)], abs=1e-5)
    scores = fam.score(records, examples, None)
    assert scores["ndcg@10"] == rank_scores([r["rank"] for r in records])["ndcg@10"]
    assert scores["ndcg@10_d3"] == rank_scores([r["ranks"]["3"] for r in records])["ndcg@10"]
    # scored pairs: each pair's cosine, and the run picks its epoch by Spearman's correlation
    sts = [PairExample(str(i), "a", "b", [], score=float(i)) for i in range(3)]
    pairs = [np.stack([rng.normal(size=8) * 5, rng.normal(size=8) * 0.2]) for _ in sts]
    got = fam.records(sts, None, pairs, EmbeddingSettings(type="embedding"), None)
    assert [r["cosine"] for r in got] == pytest.approx([float(unit(a) @ unit(b)) for a, b in pairs], abs=1e-6)
    assert fam.best_metric(None, None, dev=sts) == "spearman" and fam.best_metric(None, None, dev=examples) == "ndcg@10"


def test_the_head_gets_the_embedding_settings_and_scored_pairs_do_not_train(minilm_dir, tmp_path):
    import shutil

    from clihelp import tiny_bert

    from torchbert.config import BertConfig
    from torchbert.tasks.embedding import EmbeddingSettings
    from torchbert.tasks.families import family
    from torchbert.tokenizer import BertTokenizer

    fam = family("embedding")
    ts = EmbeddingSettings(type="embedding", temperature=0.1, learn_temperature=True, mini_batch=4)
    assert fam.head_arguments(ts) == {"temperature": 0.1, "learn_temperature": True, "mini_batch": 4}
    sts = [PairExample("1", "a", "b", [], "sts.tsv:2", score=1.0)]
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(ValueError, match=r"sts.tsv:2: scored pairs \(sentence1, sentence2, score\) are for evaluation"):
        fam.encode(tokenizer, sts, ts, None, training=True)
    assert fam.encode(tokenizer, sts, ts, None, training=False).num_choices == [2]
    # the pooling: the folder's sentence-transformers files before its config.json, else mean
    plain = tiny_bert(tmp_path / "plain", minilm_dir)
    assert fam.configure(BertConfig.load(plain), None, EmbeddingSettings(type="embedding"), plain).extra["pooling"] \
        == "mean"
    folder = tmp_path / "st"
    shutil.copytree(minilm_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pooling": "cls"}))
    assert fam.configure(BertConfig.load(folder), None, EmbeddingSettings(type="embedding"), folder).extra[
        "pooling"] == "mean"  # MiniLM's 1_Pooling says mean
