"""Pretraining objectives are a registry (train/objectives.py PRETRAINING): `pretrain` asks an
objective's spec what it needs and never which objective it has, so that one registered here, in a
test, is a whole objective: a flag value, a model, a loss, a held-out line and a resumable run."""

import json

import pytest
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
