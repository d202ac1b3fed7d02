"""BERT with rotary positions (config.position_embedding_type "rotary") against transformers' RoFormer.

No RoFormer weights ship with a package here, so the weights are real ones: MiniLM's (its position table
dropped), in a RoFormer that transformers builds and writes itself; the text is real. fp32, the one
parity rule of tests/parity.py.
"""

import json

import pytest
import realdata
import torch
import transformers
from parity import assert_parity

from torchbert import BertConfig, BertModel, fast
from torchbert import model as model_module
from torchbert.heads import (BertForMaskedLM, BertForMultipleChoice, BertForQuestionAnswering,
                             BertForSequenceClassification, BertForTokenClassification)
from torchbert.packing import unpad


def roformer_of_minilm(minilm_dir, out, layers: int | None = None):
    """A RoFormerForMaskedLM of MiniLM's weights (all but its position table; its first `layers`
    layers, or all), written by transformers."""
    bert = transformers.BertForMaskedLM.from_pretrained(minilm_dir)
    cfg = transformers.RoFormerConfig(**{k: v for k, v in bert.config.to_dict().items()
                                         if k not in ("model_type", "architectures", "position_embedding_type")})
    cfg.num_hidden_layers = layers or cfg.num_hidden_layers
    rof = transformers.RoFormerForMaskedLM(cfg).eval()
    state = {k.replace("bert.", "roformer.", 1): v for k, v in bert.state_dict().items()
             if "position_embeddings" not in k and not any(f"layer.{i}." in k for i in
                                                           range(cfg.num_hidden_layers, bert.config.num_hidden_layers))}
    missing, unexpected = rof.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"roformer.encoder.embed_positions.weight", "cls.predictions.decoder.weight",
                                               "cls.predictions.decoder.bias"}
    rof.tie_weights()
    rof.save_pretrained(out)
    transformers.BertTokenizerFast.from_pretrained(minilm_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def roformer_dir(minilm_dir, tmp_path_factory):
    return roformer_of_minilm(minilm_dir, tmp_path_factory.mktemp("roformer"))


@pytest.fixture(scope="module")
def batch(roformer_dir):
    tok = transformers.BertTokenizerFast.from_pretrained(roformer_dir)
    texts = list(realdata.english_texts()[:10]) + list(realdata.peoples_daily_lines()[3:9])
    return tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@torch.no_grad()
def test_rotary_encoder_matches_transformers_roformer_padded_and_packed(roformer_dir, batch, attention):
    """Our attention by either function (transformers' RoFormer has its eager one only)."""
    theirs = transformers.RoFormerModel.from_pretrained(roformer_dir).eval()
    ours = BertModel.from_pretrained(roformer_dir, add_pooling_layer=False).eval()
    for layer in ours.layers:
        layer.attention.impl = attention
    assert ours.config.rotary and ours.embeddings.position is None
    m = batch["attention_mask"].bool()
    ref = theirs(**batch).last_hidden_state
    assert_parity(ours(**batch).last_hidden_state[m], ref[m])
    ids, types, cu, max_len = unpad(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    packed = ours(ids, token_type_ids=types, cu_seqlens=cu, max_seqlen=max_len).last_hidden_state
    assert_parity(packed, ref[m])


@torch.no_grad()
def test_parity_fails_rotary_positions_turned_by_halves_or_not_at_all(roformer_dir, batch, monkeypatch):
    """The rule catches the two likely slips: rotating the first half against the second (GPT-NeoX's
    layout, not RoFormer's pairs) and no rotation at all."""
    theirs = transformers.RoFormerModel.from_pretrained(roformer_dir).eval()
    ours = BertModel.from_pretrained(roformer_dir, add_pooling_layer=False).eval()
    m = batch["attention_mask"].bool()
    ref = theirs(**batch).last_hidden_state[m]

    def by_halves(x, cos, sin):
        x0, x1 = x.chunk(2, dim=-1)
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return torch.cat([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1)

    for bug in (by_halves, lambda x, cos, sin: x):
        monkeypatch.setattr(model_module, "rotate", bug)
        with pytest.raises(AssertionError, match="not equal up to torch.float32 rounding"):
            assert_parity(ours(**batch).last_hidden_state[m], ref)


@torch.no_grad()
def test_rotary_heads_write_roformer_checkpoints_transformers_reads_alike(minilm_dir, batch, tmp_path):
    """Masked LM (from transformers' file), then each task head written by us: transformers' RoFormer
    classes load each folder and give the same logits; their config.json is a RoFormer's. Sequence
    classification and multiple choice take RoFormer's shape: the pooler (its activation the model's)
    is the first layer of RoFormerClassificationHead, or the summary of RoFormerForMultipleChoice.
    MiniLM's first two layers: what the heads add is the same on any number (the encoder's parity
    on all six is the test above)."""
    roformer_dir = roformer_of_minilm(minilm_dir, tmp_path / "roformer", layers=2)
    m = batch["attention_mask"].bool()
    mlm = BertForMaskedLM.from_pretrained(roformer_dir).eval()
    theirs = transformers.RoFormerForMaskedLM.from_pretrained(roformer_dir).eval()
    assert_parity(mlm(**batch).mlm_logits[m], theirs(**batch).logits[m])
    torch.manual_seed(0)
    B, T = batch["input_ids"].shape
    choices = {k: v[:B // 3 * 3].reshape(B // 3, 3, T) for k, v in batch.items()}  # [B/3, 3, T]
    for ours_cls, their_cls, field, inputs, rows in (
            (BertForTokenClassification, transformers.RoFormerForTokenClassification, "logits", batch, m),
            (BertForQuestionAnswering, transformers.RoFormerForQuestionAnswering, "start_logits", batch, m),
            (BertForSequenceClassification, transformers.RoFormerForSequenceClassification, "logits", batch, ...),
            (BertForMultipleChoice, transformers.RoFormerForMultipleChoice, "logits", choices, ...)):
        kwargs = {"labels": ["O", "B-X", "I-X"]} if ours_cls in (BertForTokenClassification,
                                                                 BertForSequenceClassification) else {}
        ours = ours_cls.from_pretrained(roformer_dir, **kwargs).eval()
        for p in ours.parameters():  # the new heads away from their zero biases
            p.data += 0.01 * torch.randn_like(p)
        folder = tmp_path / ours_cls.__name__
        ours.save_pretrained(folder)
        saved = json.loads((folder / "config.json").read_text())
        assert saved["model_type"] == "roformer" and "position_embedding_type" not in saved
        assert saved["architectures"] == [their_cls.__name__]
        loaded, info = their_cls.from_pretrained(folder, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info  # every tensor in its place
        loaded.eval()
        assert_parity(getattr(ours(**inputs), field)[rows], getattr(loaded(**inputs), field)[rows], ours_cls.__name__)
        again = ours_cls.from_pretrained(folder).eval()  # and back into torchbert, exactly
        assert torch.equal(getattr(again(**inputs), field), getattr(ours(**inputs), field))


def test_fast_training_turns_as_the_plain_model_does(monkeypatch):
    """Under fast.training (fp32 CPU, attention dropout) rotary positions are one complex product
    (fast.attention.RowsSelfAttention.turn): outputs and every gradient equal the plain model's, whose
    pairwise turn runs in eval (the dropout mask made all ones, hidden dropout off)."""
    torch.manual_seed(0)
    cfg = BertConfig.from_name("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.1,
                               position_embedding_type="rotary")
    m = BertModel(cfg)
    monkeypatch.setattr(fast.attention, "scaled_mask", lambda shape, p, dtype: torch.ones(shape, dtype=dtype))
    turned = []
    monkeypatch.setattr(torch, "view_as_complex", lambda x, f=torch.view_as_complex: turned.append(1) or f(x))
    ids = torch.randint(5, 300, (4, 11))
    mask = (torch.arange(11) < torch.tensor([11, 3, 7, 2])[:, None]).long()
    packed_ids, cu, max_len = unpad(ids, mask)
    w = torch.randn(int(mask.sum()), cfg.hidden_size)
    results = []
    for fast_path in (True, False):
        m.zero_grad()
        m.train(fast_path)
        with (fast.training(m) if fast_path else torch.enable_grad()):
            out = m(packed_ids, cu_seqlens=cu, max_seqlen=max_len)
            ((out.last_hidden_state * w).sum() + out.pooler_output.sum()).backward()
        results.append((out.last_hidden_state.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
        if fast_path:
            assert len(turned) == 2 * cfg.num_hidden_layers  # queries and keys of every layer, complex
    (fast_out, fast_grads), (plain_out, plain_grads) = results
    assert_parity(fast_out, plain_out)
    for n, g in plain_grads.items():
        assert_parity(fast_grads[n], g, n)
    assert len(turned) == 2 * cfg.num_hidden_layers  # the plain path never took it


def test_rotary_config_reads_and_writes_roformer_and_refuses_what_it_cannot_compute(tmp_path):
    cfg = BertConfig.from_name("tiny", vocab_size=50, position_embedding_type="rotary")
    d = cfg.to_dict()
    assert d["model_type"] == "roformer" and d["rotary_value"] is False and d["embedding_size"] == 128
    assert BertConfig.from_dict(d) == cfg
    theirs = transformers.RoFormerConfig(**{k: v for k, v in d.items() if k != "model_type"})
    assert (theirs.hidden_size, theirs.embedding_size, theirs.rotary_value) == (128, 128, False)
    for bad, says in (({"rotary_value": True}, "rotary_value"), ({"embedding_size": 64}, "embedding_size")):
        with pytest.raises(ValueError, match=says):
            BertConfig.from_dict({**d, **bad}, source="x/config.json")
    with pytest.raises(ValueError, match="relative_key"):
        BertConfig.from_dict({**d, "model_type": "bert", "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="odd"):
        BertConfig(vocab_size=50, hidden_size=12, num_hidden_layers=1, num_attention_heads=4,
                   position_embedding_type="rotary")
    # a RoFormer's weights under an absolute config.json are refused, naming the file
    m = BertModel(cfg)
    m.save_pretrained(tmp_path)
    absolute = {**json.loads((tmp_path / "config.json").read_text()), "model_type": "bert"}
    (tmp_path / "config.json").write_text(json.dumps(absolute))
    with pytest.raises(ValueError, match="RoFormer"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.e2e
def test_rotary_pretrains_resumes_and_every_command_takes_it(prepared, tmp_path, capsys):
    """pretrain --positions rotary (MLM alone) writes a RoFormer that transformers reads with the same
    logits; a cut-back run resumes bit-identically and refuses other positions; finetune, evaluate,
    predict, serve, embed and export read it and its fine-tuned classifier."""
    import random
    import shutil

    import numpy as np
    import onnxruntime
    from clihelp import assert_served_like_predict, cli
    from safetensors.torch import load_file

    def pretrain(out, *extra):
        return cli(capsys, "pretrain", "--data", prepared / "data", "--out", out, "--config", "tiny", "--batch-size",
                   "16", "--lr", "1e-3", "--warmup-steps", "2", "--log-every", "5", "--quiet", "--objective", "mlm",
                   *extra)

    ref = tmp_path / "ref"
    code, out, err = pretrain(ref, "--steps", "10", "--positions", "rotary", "--eval-data", prepared / "eval")
    assert code == 0, err
    config = json.loads((ref / "config.json").read_text())
    assert config["model_type"] == "roformer" and config["architectures"] == ["RoFormerForMaskedLM"]
    weights = load_file(ref / "model.safetensors")
    assert "roformer.embeddings.word_embeddings.weight" in weights
    assert not any("position_embeddings" in k for k in weights)
    tok = transformers.BertTokenizerFast.from_pretrained(ref)
    enc = tok(["人民日报社论", "新华社北京一月一日电"], padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = transformers.RoFormerForMaskedLM.from_pretrained(ref).eval()(**enc).logits
        ours = BertForMaskedLM.from_pretrained(ref).eval()(**enc).mlm_logits
    m = enc["attention_mask"].bool()
    assert_parity(ours[m], theirs[m])

    run = tmp_path / "run"  # --recipe rotary is --positions rotary: the same run, bit for bit
    code, _, err = pretrain(run, "--steps", "10", "--recipe", "rotary", "--positions", "absolute")
    assert code == 2 and "--positions absolute: --recipe rotary is positions rotary; give one of the two" in err
    assert pretrain(run, "--steps", "10", "--recipe", "rotary", "--save-every", "5")[0] == 0
    shutil.rmtree(run / "checkpoints" / "step-00000010")
    code, _, err = pretrain(run, "--steps", "10", "--resume", "--positions", "absolute")
    assert code == 2 and "--positions absolute differs from the run's rotary" in err
    code, _, err = pretrain(run, "--steps", "10", "--resume", "--recipe", "paper")  # the paper's: absolute
    assert code == 2 and ("--recipe paper (positions absolute) differs from the run's rotary; leave --recipe out "
                          "to resume it") in err
    code, _, err = pretrain(run, "--steps", "10", "--resume", "--recipe", "rotary")  # the command that started it
    assert code == 0, err
    a, b = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    code, _, err = cli(capsys, "pretrain", "--data", prepared / "data", "--out", tmp_path / "x", "--config", "tiny",
                       "--objective", "electra", "--positions", "rotary", "--steps", "1", "--quiet")
    assert code == 2 and "not supported with --objective electra" in err and not (tmp_path / "x").exists()

    pos, neg = (sorted(set(p.read_text(encoding="utf-8").split("\n")) - {""}) for p in realdata.sentiment_paths())
    rows = [(t[:60], "pos") for t in pos[:40]] + [(t[:60], "neg") for t in neg[:40]]
    random.Random(0).shuffle(rows)
    for name, part in (("train", rows[:60]), ("dev", rows[60:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"sentence": t, "label": y}, ensure_ascii=False)
                                                        + "\n" for t, y in part), encoding="utf-8")
    cls = tmp_path / "cls"
    code, _, err = cli(capsys, "finetune", "--task", "classification", "--model", ref, "--train",
                       tmp_path / "train.jsonl", "--dev", tmp_path / "dev.jsonl", "--out", cls, "--epochs", "1",
                       "--batch-size", "16", "--max-length", "64", "--quiet")
    assert code == 0, err
    assert "BertForSequenceClassification: a new head (classifier)" in err
    accuracy = json.loads((cls / "metrics.json").read_text())["accuracy"]
    loaded, info = transformers.RoFormerForSequenceClassification.from_pretrained(cls, output_loading_info=True)
    assert not info["missing_keys"] and loaded.config.id2label == {0: "neg", 1: "pos"}
    code, out, err = cli(capsys, "evaluate", "--model", cls, "--data", tmp_path / "dev.jsonl")
    assert code == 0, err
    assert json.loads(out)["accuracy"] == pytest.approx(accuracy)
    code, _, err = cli(capsys, "predict", "--model", cls, "--input", tmp_path / "dev.jsonl", "--out", tmp_path / "p.jsonl",
                       "--precision", "fp32")  # the library's Predictor computes in fp32 unless asked
    assert code == 0, err
    records = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 20
    assert_served_like_predict(cls, [{"sentence": t} for t, _ in rows[60:]], records)  # torchbert serve
    (tmp_path / "texts.txt").write_text("\n".join(t for t, _ in rows[:8]) + "\n", encoding="utf-8")
    code, _, err = cli(capsys, "embed", "--model", ref, "--input", tmp_path / "texts.txt", "--out", tmp_path / "e.npy")
    assert code == 0, err
    emb = np.load(tmp_path / "e.npy")
    assert emb.shape == (8, 128) and np.isfinite(emb).all()
    code, _, err = cli(capsys, "export", "--model", cls, "--out", tmp_path / "onnx")
    assert code == 0, err
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    enc = tok([t for t, _ in rows[60:]], padding=True, truncation=True, max_length=64, return_tensors="pt")
    feeds = {i.name: enc[i.name].numpy() for i in session.get_inputs()}
    with torch.no_grad():  # ONNX Runtime computes transformers' RoFormer classifier
        assert_parity(torch.from_numpy(session.run(None, feeds)[0]), loaded.eval()(**enc).logits)
