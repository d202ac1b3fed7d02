"""ELMo (elmo.py): two directions that never see each other's side, the layers a task mixes, its
own checkpoint layout, and the same pretrain / finetune / evaluate / predict commands as BERT."""

import json

import pytest
import torch
from parity import assert_parity

from torchbert.baselines.elmo import (ELMoBiLM, ELMoForSequenceClassification, ELMoForTokenClassification, ELMoModel,
                                      previous_tokens, reverse_index)
from torchbert.config import BertConfig, ELMoConfig, bert_body_parameters
from torchbert.losses import IGNORE

SMALL = dict(vocab_size=50, projection_dim=8, cell_size=16, num_layers=2)


def packed_example():
    torch.manual_seed(0)
    seqs = [torch.randint(0, 50, (n,)) for n in (5, 9, 2)]
    return seqs, torch.cat(seqs), torch.tensor([0, 5, 14, 16], dtype=torch.int32)


def test_reverse_index_and_previous_tokens_stay_inside_each_sequence():
    cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    assert reverse_index(cu, 7).tolist() == [2, 1, 0, 3, 6, 5, 4]
    ids = torch.tensor([10, 11, 12, 20, 30, 31, 32])
    assert previous_tokens(ids, cu).tolist() == [IGNORE, 10, 11, IGNORE, IGNORE, 30, 31]


@torch.no_grad()
def test_each_direction_reads_one_side_only_and_packed_equals_alone():
    """Changing token k changes the forward states at k and after only, the backward states at k
    and before only; a packed batch gives each sequence's states as it alone would."""
    seqs, ids, cu = packed_example()
    model = ELMoModel(ELMoConfig(**SMALL)).eval()
    out = model(ids, cu_seqlens=cu, max_seqlen=9)
    assert len(out.layers) == 3 and all(h.shape == (16, 16) for h in out.layers)
    alone = [model(s[None]) for s in seqs]
    for j in range(3):
        assert_parity(out.layers[j], torch.cat([a.layers[j] for a in alone]))
    s = seqs[1]
    for k in (2, 4, len(s) - 2):  # not only the middle, where a token is its own mirror image
        changed = s.clone()
        changed[k] = (s[k] + 1) % 50
        a, b = model(s[None]), model(changed[None])
        fwd = (a.forward_top - b.forward_top).abs().amax(-1)
        bwd = (a.backward_top - b.backward_top).abs().amax(-1)
        assert (fwd[:k] == 0).all() and (fwd[k:] > 0).all(), k
        assert (bwd[k + 1:] == 0).all() and (bwd[:k + 1] > 0).all(), k
    assert torch.equal(out.layers[0], torch.cat([model.tokens(ids)] * 2, -1))  # layer 0: [x; x]


@torch.no_grad()
def test_bilm_loss_is_forward_plus_backward_nll_through_one_softmax():
    seqs, ids, cu = packed_example()
    model = ELMoBiLM(ELMoConfig(**SMALL)).eval()
    out = model(ids, cu_seqlens=cu, max_seqlen=9, labels=ids)
    top = model.elmo(ids, cu_seqlens=cu, max_seqlen=9)
    f = torch.nn.functional.cross_entropy(model.softmax(top.forward_top), torch.cat([s[1:] for s in seqs]).new_tensor(
        [t for s in seqs for t in [*s[1:].tolist(), IGNORE]]), ignore_index=IGNORE)
    b = torch.nn.functional.cross_entropy(model.softmax(top.backward_top), ids.new_tensor(
        [t for s in seqs for t in [IGNORE, *s[:-1].tolist()]]), ignore_index=IGNORE)
    assert_parity(out.forward_loss, f)
    assert_parity(out.backward_loss, b)
    assert_parity(out.loss, f + b)


def test_matched_size_and_a_task_model_learns_on_a_frozen_bilm(tmp_path):
    """ELMoConfig.like(BERT) has BERT's non-embedding parameter count within 1%; a task model
    built from a saved biLM holds its weights exactly, trains its mix and BiLSTM only, and the
    biLM never changes (no gradient, no dropout)."""
    for name in ("tiny", "mini", "small"):
        bert = BertConfig.from_name(name, vocab_size=3000)
        elmo = ELMoBiLM(ELMoConfig.like(bert)).elmo
        body = sum(p.numel() for n, p in elmo.named_parameters() if not n.startswith("tokens."))
        assert abs(body / bert_body_parameters(bert) - 1) < 0.01, name
    torch.manual_seed(1)
    bilm = ELMoBiLM(ELMoConfig(**SMALL))
    bilm.save_pretrained(tmp_path)
    config = ELMoConfig.load(tmp_path)
    config.extra.update(num_labels=3)
    with pytest.warns(UserWarning, match="unused task-head tensors softmax"):
        tagger = ELMoForTokenClassification.from_pretrained(tmp_path, config=config)
    assert all(torch.equal(v, bilm.elmo.state_dict()[k]) for k, v in tagger.elmo.state_dict().items())
    assert {"mix.scalars", "mix.gamma", "classifier.weight"} <= set(tagger.load_report["missing"])
    seqs, ids, cu = packed_example()
    labels = torch.randint(0, 3, (16,))
    labels[[0, 6]] = IGNORE
    tagger.train()
    assert not tagger.elmo.training
    before = {k: v.clone() for k, v in tagger.elmo.state_dict().items()}
    opt = torch.optim.Adam([p for p in tagger.parameters() if p.requires_grad], lr=1e-2)

    def eval_loss():
        with torch.no_grad():
            return tagger.eval()(ids, cu_seqlens=cu, max_seqlen=9, labels=labels, labelled_only=True).loss.item()

    start = eval_loss()
    tagger.train()
    for _ in range(150):
        out = tagger(ids, cu_seqlens=cu, max_seqlen=9, labels=labels, labelled_only=True)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.logits.shape == (14, 3) and eval_loss() < start / 2
    assert all(torch.equal(v, before[k]) for k, v in tagger.elmo.state_dict().items())
    assert all(p.grad is None for p in tagger.elmo.parameters()) and tagger.mix.scalars.grad is not None
    config.extra.update(num_labels=1, problem_type="regression")
    reg = ELMoForSequenceClassification(config)
    out = reg(ids, cu_seqlens=cu, max_seqlen=9, labels=torch.tensor([0.5, 1.0, 2.0]))
    assert out.logits.shape == (3, 1) and out.loss.item() > 0
    with pytest.raises(ValueError, match="packed input"):
        reg(ids[None], attention_mask=torch.ones_like(ids[None]))


@pytest.mark.e2e
def test_elmo_pretrains_resumes_exactly_and_fine_tunes_through_the_same_commands(prepared, tmp_path, capsys):
    """`pretrain --model elmo` on the same prepared instances: forward and backward losses fall,
    a resumed run ends bit-identical to an uninterrupted one; `finetune` trains a BiLSTM tagger on
    its frozen features (People's Daily names), evaluate and predict read the run folder; QA is
    refused before any work."""
    import shutil

    import realdata
    from clihelp import assert_served_like_predict, cli, write_conll
    from safetensors.torch import load_file

    args = ["pretrain", "--data", prepared / "data", "--config", "tiny", "--model", "elmo", "--batch-size", "16",
            "--lr", "3e-3", "--quiet", "--log-every", "2", "--eval-data", prepared / "eval"]
    code, _, err = cli(capsys, *args, "--out", tmp_path / "full", "--steps", "6")
    assert code == 0, err
    summary = json.loads((tmp_path / "full" / "metrics.json").read_text())
    assert summary["model"] == "elmo" and set(summary["eval"]) == {
        "forward_loss", "forward_accuracy", "backward_loss", "backward_accuracy"}
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["forward_loss"] < rows[0]["forward_loss"] and rows[-1]["backward_loss"] < rows[0]["backward_loss"]
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    assert config["model_type"] == "torchbert-elmo" and config["projection_dim"] == 64
    half = tmp_path / "half"
    assert cli(capsys, *args, "--out", half, "--steps", "6", "--save-every", "3")[0] == 0
    shutil.rmtree(half / "checkpoints" / "step-00000006")
    code, _, err = cli(capsys, *args, "--out", half, "--steps", "6", "--resume")
    assert code == 0, err
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(half / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    sentences = [(w, tuple("B-PER" if t == "nr" else "B-LOC" if t == "ns" else "O" for t in tags))
                 for w, tags in realdata.peoples_daily_tagged()[:400] if len(w) <= 30][:60]
    write_conll(tmp_path / "t.conll", sentences)
    run = tmp_path / "tok"
    code, _, err = cli(capsys, "finetune", "--task", "token", "--model", tmp_path / "full", "--train",
                       tmp_path / "t.conll", "--dev", tmp_path / "t.conll", "--out", run, "--epochs", "2", "--quiet")
    assert code == 0, err
    assert "ELMoForTokenClassification: a new head (classifier, lstm, mix)" in err
    metrics = json.loads((run / "metrics.json").read_text())
    code, out, err = cli(capsys, "evaluate", "--model", run, "--data", tmp_path / "t.conll")
    assert code == 0, err
    assert json.loads(out)["f1"] == pytest.approx(metrics["f1"])
    code, _, err = cli(capsys, "predict", "--model", run, "--input", tmp_path / "t.conll", "--out", run / "p.jsonl")
    assert code == 0, err
    records = [json.loads(x) for x in (run / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 60 and all(len(r["tags"]) == len(r["words"]) for r in records)
    assert_served_like_predict(run, [{"tokens": list(w)} for w, _ in sentences], records)  # torchbert serve
    bilm = load_file(tmp_path / "full" / "model.safetensors")
    tuned = load_file(run / "model.safetensors")
    assert all(torch.equal(tuned[k], v) for k, v in bilm.items() if k.startswith("elmo."))  # frozen
    code, _, err = cli(capsys, "finetune", "--task", "qa", "--model", tmp_path / "full", "--train",
                       tmp_path / "t.conll", "--out", tmp_path / "qa", "--quiet")
    assert code == 2 and "qa tasks have no ELMo task model" in err and not (tmp_path / "qa").exists()
