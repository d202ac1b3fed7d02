"""Pretraining objectives are a registry (train/objectives.py PRETRAINING): `pretrain` asks an
objective's spec what it needs and never which objective it has, so that one registered here, in a
test, is a whole objective: a flag value, a model, a loss, a held-out line and a resumable run."""

import json

import pytest
import torch
from clihelp import cli

from dataclasses import dataclass

from torchbert.cli import build_parser
from torchbert.config import POSITIONS, BertConfig
from torchbert.heads import BertForMaskedLM
from torchbert.settings import Checked, setting
from torchbert.train import objectives
from torchbert.train.objectives import PRETRAINING, MaskedLMTask, PretrainingObjective, pretraining_objective


@dataclass
class ScaledSettings(Checked):
    mlm_weight: float = setting(0.5, "the weight of the MLM loss", above=0)


class ScaledMLM(MaskedLMTask):
    """A loss-only objective with a setting of its own: MLM with its loss scaled (the same model, another loss)."""

    def __init__(self, mlm_weight: float):
        self.mlm_weight = mlm_weight

    def forward(self, model, batch):
        loss, correct = super().forward(model, batch)["mlm"]
        return {"mlm": (loss * self.mlm_weight, correct)}


@pytest.fixture
def toy():
    yield objectives.register_objective(PretrainingObjective(
        "halved-mlm", "bert", BertForMaskedLM, BertConfig, ScaledMLM, positions=POSITIONS, about="MLM at half weight",
        held_out=lambda ev: f"held-out (halved): MLM accuracy {ev['mlm_accuracy']:.3f}", settings=ScaledSettings))
    del PRETRAINING["halved-mlm"]  # the registry as it was


def test_every_family_has_a_default_and_every_objective_its_flag():
    assert pretraining_objective("bert").name == "mlm+nsp" and pretraining_objective("gpt").flag == "--model gpt"
    assert pretraining_objective("bert", "electra").flag == "--objective electra"
    with pytest.raises(ValueError, match="--objective is BERT's; elmo has its own"):
        pretraining_objective("elmo", "mlm")
    with pytest.raises(ValueError, match="--model t5: expected one of bert, gpt, elmo"):
        pretraining_objective("t5")
    with pytest.raises(ValueError, match="registered already"):
        objectives.register_objective(PRETRAINING["mlm"])


@pytest.mark.e2e
def test_a_registered_objective_pretrains_reports_and_resumes(toy, prepared, tmp_path, capsys):
    assert "halved-mlm, MLM at half weight" in " ".join(build_parser()._subparsers._group_actions[0]
                                                        .choices["pretrain"].format_help().split())
    run = tmp_path / "run"
    args = ["pretrain", "--data", prepared / "data", "--out", run, "--config", "tiny", "--batch-size", "8", "--quiet",
            "--eval-data", prepared / "eval", "--eval-batches", "2", "--save-every", "2"]
    assert toy.objective(toy.own()).mlm_weight == 0.5  # its settings go to its loss (its model takes none)
    assert toy.objective(ScaledSettings(0.25)).mlm_weight == 0.25 and toy.model(BertConfig.from_name("tiny")) is not None
    help_text = build_parser()._subparsers._group_actions[0].choices["pretrain"].format_help()
    assert "--objective halved-mlm:\n  --mlm-weight MLM_WEIGHT" in help_text  # its own setting, under its name
    code, _, err = cli(capsys, *args, "--steps", "2", "--mlm-weight", "0.25")  # the default objective's run
    assert code == 2 and "--mlm-weight: a setting of --objective halved-mlm; --objective mlm+nsp does not" in err
    code, out, err = cli(capsys, *args, "--steps", "2", "--objective", "halved-mlm", "--mlm-weight", "0.25")
    assert code == 0, err
    assert "held-out (halved): MLM accuracy" in out
    record = json.loads((run / "torchbert.json").read_text())
    assert record["made"] == "pretrain" and record["objective"] == "halved-mlm"
    assert record["settings"] == {"mlm_weight": 0.25}  # kept for --resume
    assert record["command"].startswith("torchbert pretrain --data") and "torch" in record["versions"]
    assert json.loads((run / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    code, _, err = cli(capsys, *args, "--steps", "3", "--resume", "--objective", "mlm")
    assert code == 2 and "the run in" in err and "pretrains halved-mlm" in err
    code, _, err = cli(capsys, *args, "--steps", "3", "--resume", "--mlm-weight", "0.5")
    assert code == 2 and "--mlm-weight 0.5 differs from the run's 0.25" in err
    code, out, err = cli(capsys, *args, "--steps", "3", "--resume")  # the run's own, from its record
    assert code == 0 and "held-out (halved)" in out, err


@pytest.mark.e2e
def test_a_run_without_an_objective_in_its_record_resumes_by_its_config(prepared, tmp_path, capsys):
    """A run of an older torchbert (no torchbert.json; its config.json naming the objective, as torchbert
    wrote until issue 49) resumes with its own objective."""
    run = tmp_path / "run"
    args = ["pretrain", "--data", prepared / "data", "--out", run, "--config", "tiny", "--batch-size", "8", "--quiet",
            "--save-every", "2"]
    assert cli(capsys, *args, "--steps", "2", "--objective", "mlm")[0] == 0
    (run / "torchbert.json").unlink()
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "torchbert_objective": "mlm"}))
    code, _, err = cli(capsys, *args, "--steps", "3", "--resume", "--objective", "mlm+nsp")
    assert code == 2 and "pretrains mlm; leave --objective out" in err
    del config["architectures"]  # older still: no name at all is the paper's objective
    (run / "config.json").write_text(json.dumps(config))
    code, _, err = cli(capsys, *args, "--steps", "3", "--resume", "--objective", "mlm")
    assert code == 2 and "pretrains mlm+nsp" in err


def toy_batch(seed=0, vocab=40, lengths=(7, 5, 9), masks=(1, 2, 0)):
    """A packed Batch of random tokens: `masks[i]` masked positions inside instance i (not its ends)."""
    from torchbert.data.shards import Batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (sum(lengths),), generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    positions = torch.tensor([int(cu[i]) + 1 + j for i, m in enumerate(masks) for j in range(m)], dtype=torch.long)
    labels = ids[positions].clone()
    ids[positions] = 3
    return Batch(ids, torch.zeros_like(ids), cu, max(lengths), positions, labels,
                 torch.tensor([0, 1, 1][:len(lengths)]))


def _ce_sum(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float(), targets, reduction="sum", ignore_index=-100)


def test_each_objective_sums_its_losses_and_counts_its_right_answers():
    """Every part: the summed loss over its targets, and how many of them the argmax gets right,
    against the model's own logits; counts known from the batch alone."""
    from torchbert.baselines.elmo import ELMoBiLM
    from torchbert.baselines.gpt import OpenAIGPTLMHeadModel
    from torchbert.config import ELMoConfig, GPTConfig
    from torchbert.electra import RTD_WEIGHT, ElectraForPreTraining
    from torchbert.heads import BertForPreTraining
    from torchbert.losses import next_tokens, previous_tokens

    torch.manual_seed(0)
    batch = toy_batch()
    bert = BertConfig.from_name("tiny", vocab_size=40)
    with torch.no_grad():
        model = BertForPreTraining(bert).eval()
        task = objectives.PretrainingTask()
        assert task.counts(batch) == {"mlm": 3, "nsp": 3}
        parts = task.forward(model, batch)
        out = model(batch.input_ids, token_type_ids=batch.token_type_ids, cu_seqlens=batch.cu_seqlens,
                    max_seqlen=batch.max_seqlen, mlm_positions=batch.mlm_positions)
        assert parts["mlm"][0].item() == pytest.approx(_ce_sum(out.mlm_logits, batch.mlm_labels).item(), rel=1e-5)
        assert parts["nsp"][0].item() == pytest.approx(_ce_sum(out.nsp_logits, batch.nsp_labels).item(), rel=1e-5)
        assert parts["mlm"][1].item() == (out.mlm_logits.argmax(-1) == batch.mlm_labels).sum().item()
        nsp_right = (out.nsp_logits.argmax(-1) == batch.nsp_labels).sum().item()
        assert parts["nsp"][1].item() == nsp_right
        assert nsp_right != (out.nsp_logits.argmax(-1) == 0).sum().item()  # the labels are not all 0's answer

        electra = ElectraForPreTraining(bert).eval()
        task = objectives.ElectraTask()
        assert task.counts(batch) == {"mlm": 3, "rtd": 21} and task.weights == {"rtd": RTD_WEIGHT} == {"rtd": 50}
        torch.manual_seed(1)
        parts = task.forward(electra, batch)
        torch.manual_seed(1)  # the generator samples the same replacements
        out = electra(batch.input_ids, token_type_ids=batch.token_type_ids, cu_seqlens=batch.cu_seqlens,
                      max_seqlen=batch.max_seqlen, mlm_positions=batch.mlm_positions, mlm_labels=batch.mlm_labels)
        assert parts["rtd"][0].item() == pytest.approx(out.rtd_loss.item() * 21, rel=1e-5)
        assert parts["rtd"][1].item() == ((out.rtd_logits > 0).float() == out.rtd_labels).sum().item()

        gpt = OpenAIGPTLMHeadModel(GPTConfig(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
        task = objectives.CausalLMTask()
        assert task.counts(batch) == {"lm": 21 - 3}
        parts = task.forward(gpt, batch)
        logits = gpt(batch.input_ids, cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen).logits
        want = next_tokens(batch.input_ids, batch.cu_seqlens)
        assert parts["lm"][0].item() == pytest.approx(_ce_sum(logits, want).item(), rel=1e-5)
        assert parts["lm"][1].item() == (logits.argmax(-1) == want).sum().item()

        elmo = ELMoBiLM(ELMoConfig(vocab_size=40, projection_dim=8, cell_size=16, num_layers=1)).eval()
        task = objectives.BiLMTask()
        assert task.counts(batch) == {"forward": 18, "backward": 18}
        parts = task.forward(elmo, batch)
        out = elmo(batch.input_ids, cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen)
        for name, logits, want in (("forward", out.forward_logits, next_tokens(batch.input_ids, batch.cu_seqlens)),
                                   ("backward", out.backward_logits, previous_tokens(batch.input_ids, batch.cu_seqlens))):
            assert parts[name][0].item() == pytest.approx(_ce_sum(logits, want).item(), rel=1e-5), name
            assert parts[name][1].item() == (logits.argmax(-1) == want).sum().item(), name
    # right answers counted against each direction's own targets: a stub that predicts the next token
    # id + 1 forward and - 1 backward is right everywhere on a rising run of ids
    from types import SimpleNamespace

    def stub(input_ids, **_):
        hot = lambda ids: torch.nn.functional.one_hot(ids.clamp(0, 39), 40).float()  # noqa: E731
        return SimpleNamespace(forward_logits=hot(input_ids + 1), backward_logits=hot(input_ids - 1),
                               forward_loss=torch.tensor(1.0), backward_loss=torch.tensor(1.0))

    rising = toy_batch(masks=(0, 0, 0))
    rising.input_ids[:] = torch.arange(10, 31)
    parts = task.forward(stub, rising)
    assert parts["forward"][1].item() == parts["backward"][1].item() == 18


def test_a_batch_without_targets_adds_a_finite_zero_that_still_reaches_the_weights():
    """A micro-batch with no masks (or sequences of one token, for the LMs) has no mean loss (nan);
    its part is 0, and backward still runs through the model (every process takes part in DDP)."""
    from torchbert.baselines.gpt import OpenAIGPTLMHeadModel
    from torchbert.config import GPTConfig
    from torchbert.heads import BertForMaskedLM, BertForPreTraining

    torch.manual_seed(0)
    bert = BertConfig.from_name("tiny", vocab_size=40)
    batch = toy_batch(masks=(0, 0, 0))
    for task, model in ((objectives.PretrainingTask(), BertForPreTraining(bert)),
                        (objectives.MaskedLMTask(), BertForMaskedLM(bert))):
        loss, correct = task.forward(model, batch)["mlm"]
        assert loss.item() == 0.0 and correct.item() == 0
        loss.backward()
    single = toy_batch(lengths=(1, 1), masks=(0, 0))
    gpt = OpenAIGPTLMHeadModel(GPTConfig(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    task = objectives.CausalLMTask()
    assert task.counts(single) == {"lm": 0}
    loss, _ = task.forward(gpt, single)["lm"]
    assert loss.item() == 0.0
    loss.backward()
    # fine-tuning: a micro-batch of token windows without a labelled token (the head's mean loss is nan)
    from types import SimpleNamespace

    import numpy as np

    from torchbert.tasks.batches import TaskBatch

    weight = torch.nn.Parameter(torch.ones(3))

    def head(input_ids, **_):
        logits = input_ids.float()[:, None] * weight
        return SimpleNamespace(logits=logits, loss=logits.sum() * float("nan"))

    family = SimpleNamespace(targets=lambda batch: {}, correct=lambda out, batch: torch.tensor(0))
    windows = TaskBatch(torch.arange(4), torch.zeros(4, dtype=torch.long), torch.tensor([0, 4], dtype=torch.int32), 4,
                        np.arange(1), np.arange(1), num_targets=0)
    loss, _ = objectives.FinetuneTask(family).forward(head, windows)["task"]
    assert loss.item() == 0.0
    loss.backward()
    assert weight.grad is not None and torch.equal(weight.grad, torch.zeros(3))


def test_an_objectives_settings_are_its_own():
    electra = PRETRAINING["electra"]
    assert electra.own() == objectives.ElectraSettings() and PRETRAINING["mlm"].own() is None
    narrow = electra.own(objectives.ElectraSettings(generator_size=0.5))
    assert electra.model(BertConfig.from_name("tiny", vocab_size=40), narrow).generator_size == 0.5
    with pytest.raises(ValueError, match="--generator-size: a setting of --objective electra; --objective mlm does not"):
        PRETRAINING["mlm"].own(objectives.ElectraSettings())
    with pytest.raises(ValueError, match="generator.size"):
        objectives.ElectraSettings(generator_size=1.5)
    # a loss's own settings reach the loss (not the model)
    spec = PretrainingObjective("scaled", "bert", BertForMaskedLM, BertConfig, ScaledMLM, held_out=str,
                                settings=ScaledSettings)
    assert spec.objective(ScaledSettings(mlm_weight=0.25)).mlm_weight == 0.25
    with pytest.raises(ValueError, match="--objective bogus: expected one of mlm\\+nsp, mlm, electra"):
        pretraining_objective("bert", "bogus")
    assert objectives.FinetuneTask(None, per_step=0).per_step is None
    assert objectives.FinetuneTask(None, per_step=2.5).per_step == {"task": 2.5}


def test_the_held_out_lines_name_every_figure():
    line = PRETRAINING["mlm+nsp"].held_out({"mlm_loss": 2.0, "mlm_accuracy": 0.25, "nsp_accuracy": 0.75})
    assert line == "held-out: MLM loss 2.000, MLM accuracy 0.250, NSP accuracy 0.750"
    line = PRETRAINING["electra"].held_out({"mlm_loss": 2.0, "mlm_accuracy": 0.25, "rtd_accuracy": 0.9})
    assert "replaced-token detection accuracy 0.900" in line and "NSP" not in line
    # a diverged run's loss still prints a perplexity (capped at e^50), not an OverflowError
    assert "perplexity 5184705528587072045056.0" in PRETRAINING["gpt"].held_out({"lm_loss": 1e4, "lm_accuracy": 0.0})
