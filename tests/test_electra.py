"""ELECTRA (electra.py): parity of both halves with transformers' ELECTRA, packed against padded, every
parameter trained, and `pretrain --objective electra` end to end (a BERT folder every command reads)."""

import json

import pytest
import torch
import transformers
from clihelp import cli
from parity import assert_parity

from torchbert.config import BertConfig
from torchbert.electra import RTD_WEIGHT, ElectraForPreTraining, generator_config
from torchbert.heads import BertForSequenceClassification
from torchbert.model import BertModel
from torchbert.packing import unpad

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def tiny(vocab=300, dropout=0.0, **kw) -> BertConfig:
    return BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=256, max_position_embeddings=64, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout, **kw)


def masked_batch(vocab=300, B=3, T=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 14:] = 0
    mask[2, 9:] = 0
    ids[mask == 0] = 0
    ids[:, 0] = 2
    chosen = (torch.rand(B, T, generator=g) < 0.25) & mask.bool()
    chosen[:, 0] = False
    labels = torch.where(chosen, ids, -100)
    inputs = torch.where(chosen, 4, ids)
    types = (torch.arange(T) >= 6).long().expand(B, T) * mask
    return inputs, mask, types, labels


def test_generator_is_a_quarter_wide_with_heads_of_the_same_size():
    g = generator_config(BertConfig.from_name("base"), 0.25)
    assert (g.hidden_size, g.num_attention_heads, g.intermediate_size, g.num_hidden_layers) == (192, 3, 768, 12)
    g = generator_config(BertConfig.from_name("tiny"), 0.25)  # 2 heads of 64: one head at least
    assert (g.hidden_size, g.num_attention_heads) == (64, 1)


def test_both_halves_equal_transformers_electra():
    torch.manual_seed(0)
    ours = ElectraForPreTraining(tiny(), generator_size=0.5).eval()
    inputs, mask, types, labels = masked_batch()
    out = ours(inputs, mask, types, labels=labels, generator=torch.Generator().manual_seed(1))
    disc_state, disc_cfg, gen_state, gen_cfg = ours.to_hf()
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**disc_cfg)).eval()
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**gen_cfg)).eval()
    for model, state in ((disc, disc_state), (gen, gen_state)):
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and all(k.endswith("position_ids") or k.endswith("token_type_ids")
                                      or k == "generator_lm_head.weight" for k in missing), (missing, unexpected)
    gen.tie_weights()
    with torch.no_grad():
        theirs_mlm = gen(input_ids=inputs, attention_mask=mask, token_type_ids=types).logits  # [B, T, V]
        at = labels != -100
        assert_parity(out.mlm_logits, theirs_mlm[at], "generator MLM logits")
        theirs_rtd = disc(input_ids=out.corrupted, attention_mask=mask, token_type_ids=types).logits  # [B, T]
        assert_parity(out.rtd_logits[mask.bool()], theirs_rtd[mask.bool()], "discriminator logits")
    # the corrupted input holds the generator's samples where masked, the input elsewhere
    assert torch.equal(out.corrupted[~at], inputs[~at]) and not (out.corrupted[at] == 4).any()
    assert torch.equal(out.rtd_labels[at], (out.corrupted[at] != labels[at]).float())
    assert out.rtd_labels[~at].sum() == 0


def test_packed_equals_padded_with_the_same_samples():
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny()).eval()
    inputs, mask, types, labels = masked_batch()
    padded = model(inputs, mask, types, labels=labels, generator=torch.Generator().manual_seed(3))
    flat_ids, flat_types, flat_labels, cu_seqlens, max_seqlen = unpad(inputs, mask, types, labels)
    positions = (flat_labels != -100).nonzero().squeeze(1)
    packed = model(flat_ids, token_type_ids=flat_types, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                   mlm_positions=positions, mlm_labels=flat_labels[positions], generator=torch.Generator().manual_seed(3))
    assert_parity(packed.mlm_logits, padded.mlm_logits, "generator logits")
    assert torch.equal(packed.corrupted, padded.corrupted[mask.bool()])
    assert_parity(packed.rtd_logits, padded.rtd_logits[mask.bool()], "discriminator logits")
    assert_parity(packed.loss, padded.loss, "loss")
    assert torch.isclose(padded.loss, padded.mlm_loss + RTD_WEIGHT * padded.rtd_loss)


def test_every_parameter_gets_a_gradient_and_the_embeddings_are_shared():
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny(dropout=0.1)).train()
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.startswith("generator.embeddings.shared") for n in names)  # one copy of the embeddings
    assert "generator.embeddings.project.weight" in names
    inputs, mask, types, labels = masked_batch()
    out = model(inputs, mask, types, labels=labels)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_save_pretrained_writes_the_discriminator_as_a_bert(tmp_path):
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny(), generator_size=0.5).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "bert" and not any(k.startswith("torchbert_") for k in config)  # the model alone
    inputs, mask, types, _ = masked_batch()
    with torch.no_grad():
        want = model.bert(inputs, mask, types).last_hidden_state
        assert_parity(BertModel.from_pretrained(tmp_path).eval()(inputs, mask, types).last_hidden_state, want)
        theirs = transformers.BertModel.from_pretrained(tmp_path, add_pooling_layer=False).eval()
        assert_parity(theirs(input_ids=inputs, attention_mask=mask, token_type_ids=types).last_hidden_state, want)
    BertForSequenceClassification.from_pretrained(tmp_path, labels=["a", "b"])  # a task head on it, fresh pooler


def pretrain_args(root, out, *extra):
    return ["pretrain", "--data", root / "data", "--out", out, "--config", "tiny", "--batch-size", "8", "--lr", "1e-3",
            "--warmup-steps", "2", "--log-every", "2", "--quiet", "--objective", "electra", *extra]


@pytest.mark.e2e
def test_pretrain_electra_end_to_end_and_resume_is_bit_identical(prepared, tmp_path, capsys):
    ref = tmp_path / "ref"
    code, out, err = cli(capsys, *pretrain_args(prepared, ref, "--steps", "12", "--eval-data", prepared / "eval",
                                                "--eval-every", "6", "--generator-size", "0.5"))
    assert code == 0, err
    assert "replaced-token detection accuracy" in out
    rows = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    assert {"mlm_loss", "rtd_loss", "rtd_accuracy", "eval_rtd_accuracy"} <= set(rows[-1])
    assert rows[-1]["rtd_loss"] < rows[0]["rtd_loss"]
    config = json.loads((ref / "config.json").read_text())
    assert not any(k.startswith("torchbert_") for k in config)  # the model alone; the run is the record's
    record = json.loads((ref / "torchbert.json").read_text())
    assert record["objective"] == "electra" and record["settings"] == {"generator_size": 0.5}
    transformers.BertModel.from_pretrained(ref)  # the run folder is a BERT

    # the same run with a checkpoint at step 6, cut back to it (as a kill after step 6 would leave it),
    # then resumed: the generator's samples come from the restored random state
    import shutil

    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared, run, "--steps", "12", "--generator-size", "0.5", "--eval-data",
                                      prepared / "eval", "--eval-every", "6", "--save-every", "6"))[0] == 0
    shutil.rmtree(run / "checkpoints" / "step-00000012")
    code, _, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "12", "--resume", "--generator-size", "0.25"))
    assert code == 2 and "--generator-size 0.25 differs from the run's 0.5" in err
    code, _, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "12", "--resume"))
    assert code == 0, err
    from safetensors.torch import load_file
    a, b = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    code, _, err = cli(capsys, "pretrain", "--data", prepared / "data", "--out", tmp_path / "x", "--config", "tiny",
                       "--generator-size", "0.5", "--steps", "1", "--quiet")
    assert code == 2 and "--generator-size: a setting of --objective electra; --objective mlm+nsp does not read it" in err


def test_a_runs_generator_size_is_read_from_its_record_or_an_older_config(tmp_path):
    from torchbert.io.record import RunRecord, write_record
    from torchbert.train.objectives import PRETRAINING, ElectraSettings
    from torchbert.train.pretrain import run_settings

    spec, config = PRETRAINING["electra"], tiny()
    assert run_settings(tmp_path, config, spec) == ElectraSettings(0.25)  # nothing said: the default
    config.extra = {"torchbert_generator_size": 0.5}  # a run of an older torchbert
    assert run_settings(tmp_path, config, spec) == ElectraSettings(0.5)
    write_record(tmp_path, RunRecord("pretrain", objective="electra", settings={"generator_size": 0.75}))
    assert run_settings(tmp_path, config, spec) == ElectraSettings(0.75)  # the record's first
    assert run_settings(tmp_path, config, PRETRAINING["mlm"]) is None
    assert spec.model(tiny(), run_settings(tmp_path, config, spec)).generator_size == 0.75


def test_the_discriminator_is_scored_on_what_the_generators_samples_changed():
    """Replaced-token detection as the paper defines it: the generator's samples (drawn, not its
    argmax) replace the masked tokens; a token is "replaced" where the sample differs from the original
    (a sample that draws the original token counts as original); the loss is over the real tokens
    only. A vocabulary of 12 makes the generator draw the original often; a discriminator head with
    weights far from 0 makes each token's loss differ, so which tokens are scored shows."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny(vocab=12)).eval()
    with torch.no_grad():
        for p in model.rtd.parameters():
            p.normal_(0, 1)
    inputs, mask, types, labels = masked_batch(vocab=12)
    chosen = labels != -100
    original = torch.where(chosen, labels, inputs)
    outs = [model(inputs, mask, types, labels=labels, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    for out in outs:
        assert torch.equal(out.corrupted[~chosen], inputs[~chosen])
        replaced = (chosen & (out.corrupted != original)).float()
        assert torch.equal(out.rtd_labels, replaced)
        losses = F.binary_cross_entropy_with_logits(out.rtd_logits, replaced, reduction="none")
        assert_parity(out.rtd_loss, losses[mask.bool()].mean())
        assert abs(out.rtd_loss - losses.mean()) > 1e-3  # the padding would change it
    assert any((chosen & (out.corrupted == original)).any() for out in outs)  # originals drawn
    assert any((chosen & (out.corrupted != original)).any() for out in outs)
    assert not all(torch.equal(outs[0].corrupted, out.corrupted) for out in outs[1:])  # drawn anew
