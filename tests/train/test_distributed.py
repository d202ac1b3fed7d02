"""torchrun on CPU with gloo: 2 processes take the same steps as 1 on the same global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch
from parity import assert_parity

from torchbert import BertConfig

pytestmark = pytest.mark.e2e  # whole commands end to end: `bash scripts/test.sh --fast` leaves them out


def launch(nproc, args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: a rendezvous on a free local port, so parallel runs cannot collide
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "torchbert", *map(str, args)]
    if nproc == 1:  # a single process needs no launcher
        cmd = [sys.executable, "-m", "torchbert", *map(str, args)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def losses(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def no_dropout_config(prepared, tmp_path_factory):
    vocab = json.loads((prepared / "data" / "manifest.json").read_text())["vocab_size"]
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    BertConfig.from_name("tiny", vocab_size=vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save(path)
    return path


def args(prepared, config, out, batch, *extra):
    return ["pretrain", "--data", prepared / "data", "--out", out, "--config", config, "--batch-size", batch,
            "--lr", "1e-3", "--warmup-steps", "2", "--log-every", "1", "--quiet", *extra]


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_two_processes_match_one(prepared, no_dropout_config, tmp_path, fsdp):
    launch(1, args(prepared, no_dropout_config, tmp_path / "one", 16, "--steps", "4"))
    extra = ["--fsdp"] if fsdp else []
    launch(2, args(prepared, no_dropout_config, tmp_path / "two", 8, "--steps", "4", "--save-every", "2", *extra))
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    for a, b in zip(one, two):
        assert a["tokens"] == b["tokens"]  # the same global batches
        assert a["mlm_accuracy"] == b["mlm_accuracy"]
    for key in ("loss", "mlm_loss", "nsp_loss"):  # fp32 numbers, read back from JSON
        assert_parity(torch.tensor([b[key] for b in two]), torch.tensor([a[key] for a in one]), key)
    assert (tmp_path / "two" / "model.safetensors").is_file()

    # a checkpoint written by 2 processes resumes on 1 (same global batch: 16 per step)
    launch(1, args(prepared, no_dropout_config, tmp_path / "two", 16, "--steps", "6", "--resume"))
    assert [r["step"] for r in losses(tmp_path / "two")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("ends", ["finished", "failed"])
@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_every_process_leaves_the_process_group_however_its_run_ends(command, ends, monkeypatch, tmp_path):
    """A process that exits with Gloo's threads still running can abort in the interpreter's
    finalization ("terminate called without an active exception"): on a busy host a process that had
    finished its part of a DDP run did (issue 34), and one of an FSDP2 run whose worker thread still
    held a finished all-gather (a CI run). Each command leaves the group itself, always, and after
    a run that finished, only once every process has finished (a barrier first)."""
    import torch.distributed as torch_dist

    from torchbert.cli import main
    from torchbert.train import distributed, finetune, pretrain

    left = []
    monkeypatch.setattr(distributed, "init_distributed",
                        lambda *a, **k: (distributed.Dist(rank=1, world_size=2), torch.device("cpu")))
    monkeypatch.setattr(torch_dist, "is_initialized", lambda: True)
    monkeypatch.setattr(torch_dist, "destroy_process_group", lambda: left.append("destroy"))
    monkeypatch.setattr(torch_dist, "barrier", lambda: left.append("barrier"))

    def run(*a, **k):
        if ends == "failed":
            raise RuntimeError("a collective failed")
        return {}

    monkeypatch.setattr(*((pretrain, "run_pretraining") if command == "pretrain" else (finetune, "run_finetuning")), run)
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a", "label": "x"}\n')
    (tmp_path / "config.json").write_text("{}")  # --model: a model folder (the run itself is replaced)
    argv = (["pretrain", "--data", tmp_path, "--out", tmp_path / "out", "--config", "tiny"] if command == "pretrain" else
            ["finetune", "--task", "classification", "--model", tmp_path, "--train", data, "--out", tmp_path / "out"])
    code = main([str(a) for a in argv])
    assert code == (0 if ends == "finished" else 1)
    assert left == (["barrier", "destroy"] if ends == "finished" else ["destroy"])
