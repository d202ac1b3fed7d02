"""Fine-tuning shares the pretraining loop: exact resume after SIGKILL, and torchrun with 2 processes
taking the same steps as 1. A tiny random BERT with MiniLM's vocab keeps it fast."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import realdata
import torch
from clihelp import tiny_bert
from parity import assert_parity
from safetensors.torch import load_file

pytestmark = pytest.mark.e2e  # whole commands end to end: `bash scripts/test.sh --fast` leaves them out


@pytest.fixture(scope="module")
def setup(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    sents = list(realdata.wnut_sentences())
    random.Random(3).shuffle(sents)
    train = sents[:160]
    known = {t for _, tags in train for t in tags}
    dev = [s for s in sents[160:] if set(s[1]) <= known][:40]  # dev labels must be seen in training
    for name, part in (("train", train), ("dev", dev)):
        (root / f"{name}.conll").write_text(
            "".join("".join(f"{w}\t{t}\n" for w, t in zip(*s)) + "\n" for s in part), encoding="utf-8")
    for name, dropout in (("tiny", 0.1), ("tiny-nodrop", 0.0)):
        tiny_bert(root / name, minilm_dir, dropout)
    return root


def finetune_args(root, model, out, *extra):
    return ["finetune", "--task", "token", "--model", root / model, "--train", root / "train.conll",
            "--dev", root / "dev.conll", "--out", out, "--batch-size", "8", "--max-length", "32",
            "--lr", "1e-3", "--quiet", *extra]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def start(args, nproc=1):
    cmd = [sys.executable, "-m", "torchbert", *map(str, args)]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *cmd[1:]]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]


def newest_checkpoint(run) -> int:
    names = [p.name.removeprefix("step-") for p in (run / "checkpoints").glob("step-*")]
    return max((int(n) for n in names if n.isdigit()), default=0)


def test_sigkill_and_resume_is_bit_identical(setup, tmp_path):
    args = ["--epochs", "3", "--save-every", "5", "--log-every", "5"]
    finish(start(finetune_args(setup, "tiny", tmp_path / "ref", *args)))
    ref = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    per_epoch = ref["history"][0]["step"]
    step_seconds = ref["train_seconds"] / ref["steps"]  # this host's pace now: the kill comes within 3 steps
    assert ref["steps"] == 3 * per_epoch and len(ref["history"]) == 3

    run = tmp_path / "run"
    victim = start(finetune_args(setup, "tiny", run, *args))
    target = random.Random().choice([max(5, per_epoch // 5 * 5), per_epoch + 5])  # around the first evaluation
    deadline = time.time() + 300
    while newest_checkpoint(run) < target:  # older checkpoints are deleted (keep 2): compare, not look up
        assert victim.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    time.sleep(random.random() * 3 * step_seconds)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=60)
    assert not (run / "metrics.json").exists()

    finish(start(finetune_args(setup, "tiny", run, *args, "--resume")))
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    got = json.loads((run / "metrics.json").read_text())
    assert got["history"] == ref["history"]  # each epoch's dev scores once, as in the run that never stopped
    assert got["best_epoch"] == ref["best_epoch"] and got["f1"] == ref["f1"]


def test_two_processes_take_the_same_steps_as_one(setup, tmp_path):
    # a constant rate: one process takes one more (partial) batch per epoch, so schedules over the
    # epoch's steps would differ
    args = ["--epochs", "1", "--log-every", "1", "--schedule", "constant", "--warmup-ratio", "0"]
    finish(start(finetune_args(setup, "tiny-nodrop", tmp_path / "one", *args)))
    two = finetune_args(setup, "tiny-nodrop", tmp_path / "two", *args)
    two[two.index("--batch-size") + 1] = "4"  # 2 x 4: the same global batch of 8
    finish(start(two, nproc=2))
    one = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    # every full global batch is the same; one process also takes the last partial batch, two drop it
    pairs = list(zip(one, rows))[:10]
    for a, b in pairs:
        assert a["step"] == b["step"] and a["tokens"] == b["tokens"]
    assert_parity(torch.tensor([b["loss"] for _, b in pairs]), torch.tensor([a["loss"] for a, _ in pairs]), "losses")
    assert (tmp_path / "two" / "model.safetensors").is_file()
