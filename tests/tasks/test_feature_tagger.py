"""The feature-based tagger (BERT paper 5.3): a frozen BERT's layers feed a BiLSTM or linear tagger.

Unit checks on a tiny random BERT (features, per-sequence BiLSTM, loss, frozen encoder, state and
files), then `torchbert finetune --frozen` on real WNUT-16 tweets with the real MiniLM."""

import json
import random
import shutil

import pytest
import realdata
import torch
import transformers
from clihelp import cli, write_conll
from parity import assert_parity
from safetensors.torch import load_file

from torchbert import BertConfig, BertModel
from torchbert.cli import main
from torchbert.features import STRATEGIES
from torchbert.losses import IGNORE
from torchbert.packing import unpad
from torchbert.tasks.feature_tagger import TAGGER_FILE, FeatureTagger, TaggerSettings
from torchbert.train.optim import make_optimizer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LABELS = ("O", "B-x", "I-x")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The test machines' few cores are shared: one intra-op thread each avoids oversubscribed spinning,
    which makes these small ops many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_config(kind: str = "bilstm", strategy: str | int = "concat_last_four", dropout: float = 0.1,
                layers: int = 4) -> tuple[BertConfig, TaggerSettings]:
    config = BertConfig.from_name("tiny", num_hidden_layers=layers, vocab_size=100)
    config.extra["id2label"] = {str(i): x for i, x in enumerate(LABELS)}
    return config, TaggerSettings(kind=kind, strategy=strategy, lstm_size=16, dropout=dropout)


def tiny_batch(seed: int = 0):
    """Three right-padded sequences of 9, 6 and 3 tokens, as [B, T] ids and mask, and packed."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (3, 9), generator=g)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for b, n in enumerate((9, 6, 3)):
        mask[b, :n] = 1
    ids = ids * mask
    flat, cu, T = unpad(ids, mask)
    return ids, mask, flat, cu, T


# -- the model ---------------------------------------------------------------------------------------

def test_settings_check_the_tagger_and_the_strategy():
    with pytest.raises(ValueError, match="bilstm, linear"):
        TaggerSettings(kind="crf")
    with pytest.raises(ValueError, match="sum_last_four, concat_last_four"):
        TaggerSettings(strategy="top_four")
    assert TaggerSettings(strategy="-2").strategy == -2
    config, _ = tiny_config()  # 4 layers of H = 128
    widths = {"embeddings": 128, "last": 128, "sum_all": 128, "concat_last_four": 512, 3: 128}
    for strategy, width in widths.items():
        assert TaggerSettings(strategy=strategy).feature_size(config) == width
    with pytest.raises(ValueError, match="out of range"):
        TaggerSettings(strategy=9).feature_size(config)
    with pytest.raises(ValueError, match="at least 4 layers"):
        FeatureTagger(*tiny_config(layers=2))


# The strategies written out by hand over the 6 hidden states of a 5-layer BERT (embeddings first), as in Table 7.
BY_HAND = {
    "embeddings": lambda hs: hs[0],
    "last": lambda hs: hs[5],
    "second_to_last": lambda hs: hs[4],
    "sum_all": lambda hs: hs[1] + hs[2] + hs[3] + hs[4] + hs[5],
    "sum_last_four": lambda hs: hs[2] + hs[3] + hs[4] + hs[5],
    "concat_last_four": lambda hs: torch.cat([hs[2], hs[3], hs[4], hs[5]], -1),
    -3: lambda hs: hs[3],
}


@pytest.mark.parametrize("strategy", list(BY_HAND))
@torch.no_grad()
def test_the_linear_tagger_reads_the_chosen_layers(strategy):
    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config("linear", strategy, layers=5)).eval()
    _, mask, flat, cu, T = tiny_batch()
    hs = model.bert(flat, cu_seqlens=cu, max_seqlen=T, output_hidden_states=True).hidden_states
    expected = BY_HAND[strategy](hs) @ model.classifier.weight.T + model.classifier.bias  # [N, L]
    got = model(flat, cu_seqlens=cu, max_seqlen=T).logits
    assert got.shape == (int(mask.sum()), len(LABELS))
    assert_parity(got, expected)
    assert set(STRATEGIES) <= set(BY_HAND)


@torch.no_grad()
def test_the_bilstm_reads_each_sequence_alone_packed_or_padded():
    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config("bilstm")).eval()
    ids, mask, flat, cu, T = tiny_batch()
    packed = model(flat, cu_seqlens=cu, max_seqlen=T).logits  # [N, L]
    padded = model(ids, attention_mask=mask).logits  # [B, T, L]
    assert_parity(padded[mask.bool()], packed)
    # a plain nn.LSTM call on one sequence's features, no packing: what each sequence must get
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        one = ids[b, : end - start][None]  # [1, T_b]
        hs = model.bert(one, output_hidden_states=True).hidden_states
        y = model.lstm(torch.cat(hs[-4:], -1))[0]  # [1, T_b, 2R]
        assert_parity(packed[start:end], model.classifier(y[0]))


def test_the_loss_is_the_mean_cross_entropy_of_labelled_tokens():
    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config("bilstm")).eval()
    _, _, flat, cu, T = tiny_batch()
    labels = torch.randint(0, len(LABELS), flat.shape, generator=torch.Generator().manual_seed(1))
    labels[::3] = IGNORE
    out = model(flat, cu_seqlens=cu, max_seqlen=T, labels=labels)
    keep = labels != IGNORE
    logp = out.logits.log_softmax(-1)[keep]
    by_hand = -logp[torch.arange(int(keep.sum())), labels[keep]].mean()
    assert_parity(out.loss, by_hand)


@pytest.mark.parametrize("kind", ["bilstm", "linear"])
def test_the_encoder_is_frozen_and_only_the_tagger_learns(kind):
    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config(kind, dropout=0.0))
    model.train()
    assert model.training and not any(m.training for m in model.bert.modules())
    _, _, flat, cu, T = tiny_batch()
    labels = torch.randint(0, len(LABELS), flat.shape, generator=torch.Generator().manual_seed(1))
    # BERT's own dropout is 0.1: equal outputs in train mode show it is off
    first = model(flat, cu_seqlens=cu, max_seqlen=T, labels=labels)
    assert_parity(model(flat, cu_seqlens=cu, max_seqlen=T).logits, first.logits)
    first.loss.backward()
    tagger = {n: p for n, p in model.named_parameters() if not n.startswith("bert.")}
    assert tagger and all(p.grad is not None and p.grad.abs().sum() > 0 for p in tagger.values())
    assert all(not p.requires_grad and p.grad is None for p in model.bert.parameters())
    optimizer = make_optimizer(model, lr=1e-2)
    given = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert given == {id(p) for p in tagger.values()}
    before = {k: v.clone() for k, v in model.bert.state_dict().items()}
    old = {n: p.detach().clone() for n, p in tagger.items()}
    optimizer.step()
    assert all(torch.equal(v, model.bert.state_dict()[k]) for k, v in before.items())
    assert all(not torch.equal(old[n], p) for n, p in tagger.items() if n.endswith("weight"))


@torch.no_grad()
def test_the_state_dict_is_the_tagger_and_loads_back_onto_the_same_encoder():
    torch.manual_seed(0)
    a = FeatureTagger(*tiny_config()).eval()
    torch.manual_seed(1)
    b = FeatureTagger(*tiny_config()).eval()
    b.bert.load_state_dict(a.bert.state_dict())
    state = a.state_dict()
    assert set(state) == {n for n, _ in a.named_parameters() if not n.startswith("bert.")}
    encoder = {k: v.clone() for k, v in b.bert.state_dict().items()}
    b.load_state_dict(state)  # strict: the encoder's absence is not an error
    assert all(torch.equal(v, b.bert.state_dict()[k]) for k, v in encoder.items())
    _, _, flat, cu, T = tiny_batch()
    assert torch.equal(a(flat, cu_seqlens=cu, max_seqlen=T).logits, b(flat, cu_seqlens=cu, max_seqlen=T).logits)
    torch.manual_seed(2)
    c = FeatureTagger(*tiny_config()).eval()
    c.load_state_dict({**state, **{f"bert.{k}": v for k, v in a.bert.state_dict().items()}})  # an encoder given: read
    assert torch.equal(a(flat, cu_seqlens=cu, max_seqlen=T).logits, c(flat, cu_seqlens=cu, max_seqlen=T).logits)


@torch.no_grad()
def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config("bilstm", "sum_last_four")).eval()
    model.save_pretrained(tmp_path)
    assert set(load_file(tmp_path / TAGGER_FILE)) == set(model.state_dict())
    assert not any(k.startswith(("bert.", "pooler.")) for k in load_file(tmp_path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]
    assert "torchbert_task" not in config and TaggerSettings.of(tmp_path).strategy == "sum_last_four"  # beside its weights
    loaded = FeatureTagger.from_pretrained(tmp_path).eval()
    _, _, flat, cu, T = tiny_batch()
    assert torch.equal(loaded(flat, cu_seqlens=cu, max_seqlen=T).logits, model(flat, cu_seqlens=cu, max_seqlen=T).logits)
    # a tagger that does not fit the settings (here: more labels) is refused, naming the file
    config["id2label"]["3"] = "B-y"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{TAGGER_FILE}: does not fit .*size mismatch for classifier.weight"):
        FeatureTagger.from_pretrained(tmp_path)
    (tmp_path / TAGGER_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="no feature-based tagger"):
        FeatureTagger.from_pretrained(tmp_path)


@torch.no_grad()
def test_a_new_tagger_starts_as_bert_heads_do_on_an_encoder_in_eval_mode():
    """The classifier starts as BERT's heads (normal weights of std initializer_range, zero bias); the
    encoder is in eval mode from the start; dropout runs between LSTM layers only when there are two."""
    torch.manual_seed(0)
    config, settings = tiny_config("linear")
    config.initializer_range = 0.5
    model = FeatureTagger(config, settings)
    assert not model.bert.training
    assert 0.4 < float(model.classifier.weight.std()) < 0.6 and not model.classifier.bias.any()
    assert FeatureTagger(*tiny_config("bilstm", dropout=0.3)).lstm.dropout == pytest.approx(0.3)
    config, settings = tiny_config("bilstm", dropout=0.3)
    settings.lstm_layers = 1
    assert FeatureTagger(config, settings).lstm.dropout == 0.0  # (nn.LSTM would warn that it does nothing)


def test_dropout_falls_on_the_features_and_on_the_tagger_s_output_in_training():
    """Dropout (the tagger's rate) on the frozen features before the BiLSTM, and before the classifier."""
    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config("bilstm", dropout=0.5)).train()
    seen = {}
    model.lstm.register_forward_pre_hook(lambda m, args: seen.__setitem__("lstm", args[0].data))
    model.classifier.register_forward_pre_hook(lambda m, args: seen.__setitem__("classifier", args[0]))
    _, _, flat, cu, T = tiny_batch()
    model(flat, cu_seqlens=cu, max_seqlen=T)
    for name, x in seen.items():
        assert 0.4 < float((x == 0).float().mean()) < 0.6, name
    model.eval()
    model(flat, cu_seqlens=cu, max_seqlen=T)
    assert all(float((x == 0).float().mean()) < 0.01 for x in seen.values())


@torch.no_grad()
def test_labelled_only_logits_are_those_at_the_given_positions():
    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config("linear")).eval()
    _, _, flat, cu, T = tiny_batch()
    labels = torch.full(flat.shape, IGNORE)
    labels[[0, 4, 7, 9]] = torch.tensor([0, 1, 2, 1])
    every = model(flat, cu_seqlens=cu, max_seqlen=T).logits
    out = model(flat, cu_seqlens=cu, max_seqlen=T, labels=labels, labelled_only=True)
    # the classifier's product over 4 rows, not over every token: the same numbers up to its rounding
    # (a CPU's kernels for two shapes may differ in the last bits)
    assert_parity(out.logits, every[[0, 4, 7, 9]])
    some = model(flat, cu_seqlens=cu, max_seqlen=T, labels=labels, labelled_only=True,
                 label_positions=torch.tensor([4, 9]))  # the host's count of the labelled tokens, when given
    assert_parity(some.logits, every[[4, 9]])


def test_settings_of_an_older_tagger_come_from_its_run_record(tmp_path):
    """A tagger.safetensors without settings in its metadata (an older torchbert's): they are in the run
    record's task; settings this torchbert does not know are left out; none at all is an error."""
    from safetensors.torch import save_file
    from torchbert.io.record import RunRecord, write_record

    torch.manual_seed(0)
    model = FeatureTagger(*tiny_config("linear", "sum_last_four")).eval()
    model.save_pretrained(tmp_path)
    save_file(load_file(tmp_path / TAGGER_FILE), tmp_path / TAGGER_FILE, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"{TAGGER_FILE}: names no tagger settings"):
        TaggerSettings.of(tmp_path)
    write_record(tmp_path, RunRecord("finetune", task={"type": "token", "tagger": "linear"}))
    with pytest.raises(ValueError, match="names no tagger settings"):
        TaggerSettings.of(tmp_path)
    tagger = {"kind": "linear", "strategy": "sum_last_four", "lstm_size": 16, "crf": False}  # crf: a later field
    write_record(tmp_path, RunRecord("finetune", task={"type": "token", "tagger": tagger}))
    assert TaggerSettings.of(tmp_path) == TaggerSettings(kind="linear", strategy="sum_last_four", lstm_size=16)
    _, _, flat, cu, T = tiny_batch()
    loaded = FeatureTagger.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(flat, cu_seqlens=cu, max_seqlen=T).logits,
                           model(flat, cu_seqlens=cu, max_seqlen=T).logits)
    state = load_file(tmp_path / TAGGER_FILE)
    del state["classifier.bias"]
    save_file(state, tmp_path / TAGGER_FILE, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f'{TAGGER_FILE}: does not fit .*Missing key.*"classifier.bias"'):
        FeatureTagger.from_pretrained(tmp_path)


# -- torchbert finetune --frozen on real data ------------------------------------------------------------



@pytest.fixture(scope="module")
def wnut(tmp_path_factory):
    """A small fixed split of WNUT-16 tweets: 48 to train on, 32 to score (with no tag unseen in training)."""
    sents = list(realdata.wnut_sentences())
    random.Random(0).shuffle(sents)
    train = sents[:48]
    seen = {t for _, tags in train for t in tags}
    dev = [s for s in sents[48:] if set(s[1]) <= seen][:32]
    root = tmp_path_factory.mktemp("wnut")
    write_conll(root / "train.conll", train)
    write_conll(root / "dev.conll", dev)
    return root, train, dev


STEPS_PER_EPOCH = 3  # 48 tweets (none longer than 64 tokens) in batches of 16


LINEAR = ("--tagger", "linear", "--features", "sum_last_four", "--lr", "1e-2", "--save-every", STEPS_PER_EPOCH)


def frozen_args(root, minilm_dir, out, *extra):
    return ["finetune", "--task", "token", "--model", minilm_dir, "--train", root / "train.conll", "--dev",
            root / "dev.conll", "--out", out, "--epochs", "2", "--batch-size", "16", "--max-length", "64",
            "--log-every", "1", "--quiet", "--frozen", *extra]


@pytest.fixture(scope="module")
def runs(wnut, minilm_dir, tmp_path_factory):
    """A BiLSTM on the default features (concat_last_four) at the default lr, and a linear tagger on
    sum_last_four that also checkpoints after the first epoch (for the resume test)."""
    root = wnut[0]
    base = tmp_path_factory.mktemp("frozen")
    out = {"bilstm": base / "bilstm", "linear": base / "linear"}
    assert main([str(a) for a in frozen_args(root, minilm_dir, out["bilstm"])]) == 0
    assert main([str(a) for a in frozen_args(root, minilm_dir, out["linear"], *LINEAR)]) == 0
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["bilstm", "linear"])
def test_a_frozen_run_trains_its_tagger(runs, wnut, kind):
    run = runs[kind]
    for name in ("config.json", "model.safetensors", TAGGER_FILE, "vocab.txt", "metrics.json", "metrics.jsonl",
                 "dev_predictions.jsonl", "loss.png", "dev.png"):
        assert (run / name).is_file(), name
    m = json.loads((run / "metrics.json").read_text())
    assert m["steps"] == 2 * STEPS_PER_EPOCH and len(m["history"]) == 2
    assert m["token_accuracy"] > 0.8
    assert m["tagger"]["kind"] == kind
    assert m["config"]["lr"] == (1e-3 if kind == "bilstm" else 1e-2)  # 1e-3: the default with --frozen
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"]
    config = json.loads((run / "config.json").read_text())
    task = json.loads((run / "torchbert.json").read_text())["task"]
    assert task["type"] == "token" and "torchbert_task" not in config
    assert task["tagger"]["strategy"] == ("concat_last_four" if kind == "bilstm" else "sum_last_four")
    assert sorted(config["id2label"].values()) == sorted({t for _, tags in wnut[1] for t in tags})
    # checkpoints hold what training changes: the tagger, not the encoder
    tagger_keys = set(load_file(run / TAGGER_FILE))
    for ckpt in (run / "checkpoints").iterdir():
        assert set(load_file(ckpt / "model.safetensors")) == tagger_keys


@pytest.mark.e2e  # runs whole finetune --frozen commands (the runs fixture)
@pytest.mark.parametrize("kind", ["bilstm", "linear"])
def test_the_run_folder_holds_minilm_bit_for_bit(runs, minilm_dir, kind):
    ours = load_file(runs[kind] / "model.safetensors")
    theirs = load_file(minilm_dir / "model.safetensors")
    unused = {k for k in theirs if k.startswith("pooler.") or k == "embeddings.position_ids"}
    assert set(ours) == set(theirs) - unused
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.e2e  # runs whole finetune --frozen commands (the runs fixture)
@torch.no_grad()
def test_transformers_reads_the_encoder_of_a_run(runs):
    run = runs["bilstm"]
    theirs = transformers.BertModel.from_pretrained(run, add_pooling_layer=False).eval()
    ours = BertModel.from_pretrained(run, add_pooling_layer=False).eval()
    x = torch.tensor([[101, 7592, 2088, 999, 102]])
    assert_parity(ours(x).last_hidden_state, theirs(x).last_hidden_state)


@pytest.mark.e2e  # runs whole finetune --frozen commands (the runs fixture)
@pytest.mark.parametrize("kind", ["bilstm", "linear"])
def test_evaluate_and_predict_read_the_run_folder(runs, wnut, tmp_path, capsys, kind):
    root, _, dev = wnut
    run = runs[kind]
    code, out, err = cli(capsys, "evaluate", "--model", run, "--data", root / "dev.conll", "--quiet",
                         "--precision", "fp32")
    assert code == 0, err
    best = json.loads((run / "metrics.json").read_text())
    assert json.loads(out)["f1"] == pytest.approx(best["f1"], abs=1e-9)
    assert json.loads(out)["token_accuracy"] == pytest.approx(best["token_accuracy"], abs=1e-9)
    (tmp_path / "words.txt").write_text("".join("\n".join(w) + "\n\n" for w, _ in dev), encoding="utf-8")
    code, _, err = cli(capsys, "predict", "--model", run, "--input", tmp_path / "words.txt", "--out",
                       tmp_path / "p.jsonl", "--quiet", "--precision", "fp32")
    assert code == 0, err
    preds = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    reference = [json.loads(x) for x in (run / "dev_predictions.jsonl").read_text().splitlines()]
    assert [p["words"] for p in preds] == [list(w) for w, _ in dev]
    assert [p["tags"] for p in preds] == [r["tags"] for r in reference]


@pytest.mark.e2e  # runs whole finetune --frozen commands (the runs fixture)
def test_resume_from_a_tagger_only_checkpoint_ends_where_the_full_run_did(runs, wnut, minilm_dir, tmp_path, capsys):
    full = runs["linear"]
    run = tmp_path / "linear"
    shutil.copytree(full, run)
    last = f"step-{2 * STEPS_PER_EPOCH:08d}"
    shutil.rmtree(run / "checkpoints" / last)
    code, _, err = cli(capsys, *frozen_args(wnut[0], minilm_dir, run, *LINEAR, "--resume"))
    assert code == 0, err
    assert f"step-{STEPS_PER_EPOCH:08d} at step {STEPS_PER_EPOCH}" in err
    again = load_file(run / "checkpoints" / last / "model.safetensors")
    before = load_file(full / "checkpoints" / last / "model.safetensors")
    assert set(again) == set(before) and all(torch.equal(again[k], before[k]) for k in before)


def test_frozen_needs_a_token_task(wnut, minilm_dir, tmp_path, capsys):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\tpos\nbad\tneg\n", encoding="utf-8")
    code, _, err = cli(capsys, "finetune", "--task", "classification", "--model", minilm_dir, "--train",
                       tmp_path / "train.tsv", "--out", tmp_path / "run", "--frozen", "--quiet")
    assert code == 2
    assert "--frozen" in err and "token task" in err and "classification" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra, message", [
    (("--frozen", "--features", "top_four"), "last, second_to_last, sum_all, sum_last_four, concat_last_four"),
    (("--frozen", "--features", "9"), "layer 9 out of range for a model with 6 layers"),
    (("--features", "last"), "add --frozen"),
])
def test_bad_tagger_options_are_one_line_errors(wnut, minilm_dir, tmp_path, capsys, extra, message):
    root = wnut[0]
    code, _, err = cli(capsys, "finetune", "--task", "token", "--model", minilm_dir, "--train", root / "train.conll",
                       "--out", tmp_path / "run", "--quiet", *extra)
    assert code == 2
    assert message in err and "--features" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_an_unknown_tagger_is_refused_in_one_line(wnut, minilm_dir, tmp_path, capsys):
    root = wnut[0]
    code = main(["finetune", "--task", "token", "--model", str(minilm_dir), "--train", str(root / "train.conll"),
                 "--out", str(tmp_path / "run"), "--frozen", "--tagger", "crf"])
    err = capsys.readouterr().err
    assert code == 2 and "--tagger must be one of bilstm, linear, got 'crf'" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
