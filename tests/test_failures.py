"""The failure paths of every command: bad or hostile input gets one line naming the file or argument and
an exit status (2 bad input, 1 run failed, 130 interrupted), never a traceback; no input and no earlier run
is lost; Ctrl-C or SIGTERM saves a checkpoint that resumes bit for bit; outputs appear whole or not at all.

Tiny presets and a tiny random BERT with MiniLM's vocab keep each case to seconds."""

import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import realdata
import torch
from clihelp import cli, tiny_bert, write_conll
from safetensors.torch import load_file

import torchbert.features
import torchbert.io.files
from torchbert.cli import main
from torchbert.errors import OutOfSpace
from torchbert.io.checkpoint import save_checkpoint
from torchbert.io.files import atomic_folder, atomic_write_text, umask

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
ENV.pop("TORCHBERT_DEBUG", None)


# -- helpers -----------------------------------------------------------------------------------------

def snapshot(path: Path) -> dict[str, str]:
    """Every file under path (or path itself) -> sha256: 'byte-identical afterwards' is equality."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def fails(capsys, *argv, code: int, message: str) -> str:
    """Run the command; it must exit with `code`, end on one `torchbert: error:` line holding
    `message`, print nothing to stdout and show no traceback."""
    got, out, err = cli(capsys, *argv)
    assert got == code, (got, err)
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("torchbert: error: "), err
    assert message in lines[-1], (message, err)
    assert "Traceback" not in err and "unexpected " not in err, err
    assert out == "", out
    return lines[-1]


def hidden_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.glob(f".{folder.name}*"))


def pretrain_args(data, out, *extra):
    return ["pretrain", "--data", data, "--out", out, "--config", "tiny", "--batch-size", "16", "--lr", "1e-3",
            "--warmup-steps", "2", "--log-every", "2", "--quiet", *extra]


def start(argv):
    return subprocess.Popen([sys.executable, "-m", "torchbert", *map(str, argv)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc, lines: int = 1, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not (path.is_file() and path.read_text().count("\n") >= lines):
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be signalled"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def ft(minilm_dir, tmp_path_factory):
    """A tiny BERT, WNUT-16 train/dev files, and a short NER run fine-tuned from it."""
    root = tmp_path_factory.mktemp("failures")
    tiny_bert(root / "tiny", minilm_dir)
    sents = list(realdata.wnut_sentences())
    random.Random(5).shuffle(sents)
    train = sents[:96]
    known = {t for _, tags in train for t in tags}
    write_conll(root / "train.conll", train)
    write_conll(root / "dev.conll", [s for s in sents[96:] if set(s[1]) <= known][:24])
    assert main(map(str, finetune_args(root, root / "ner", "--epochs", "1"))) == 0
    return root


def finetune_args(root, out, *extra):
    return ["finetune", "--task", "token", "--model", root / "tiny", "--train", root / "train.conll", "--dev",
            root / "dev.conll", "--out", out, "--batch-size", "8", "--max-length", "32", "--lr", "1e-3", "--quiet",
            *extra]


# -- data loss: --out against the inputs, --overwrite ------------------------------------------------

def test_pretrain_out_may_not_be_hold_or_sit_inside_its_data(prepared, capsys):
    data = prepared / "data"
    before = snapshot(data)
    fails(capsys, *pretrain_args(data, data, "--overwrite"), code=2, message=f"--out {data} is the input --data")
    fails(capsys, *pretrain_args(data, data / "run", "--overwrite"), code=2, message="sits inside the input --data")
    fails(capsys, *pretrain_args(data, prepared, "--overwrite"), code=2, message="holds the input --data")
    assert snapshot(data) == before


def test_finetune_out_may_not_hold_its_train_and_dev_files(ft, tmp_path, capsys):
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("train.conll", "dev.conll"):
        shutil.copyfile(ft / name, proj / name)
    before = snapshot(proj)
    fails(capsys, "finetune", "--task", "token", "--model", ft / "tiny", "--train", proj / "train.conll", "--dev",
          proj / "dev.conll", "--out", proj, "--overwrite", "--quiet", code=2, message="holds the input --train")
    assert snapshot(proj) == before


def test_pretrain_init_may_not_be_its_own_out(prepared, tmp_path, capsys):
    ph = tmp_path / "ph"
    assert cli(capsys, *pretrain_args(prepared / "data", ph, "--steps", "2"))[0] == 0
    before = snapshot(ph)
    fails(capsys, *pretrain_args(prepared / "data", ph, "--init", ph, "--steps", "2", "--overwrite"), code=2,
          message="is the input --init")
    assert snapshot(ph) == before


def test_overwrite_with_a_bad_config_or_bad_weights_keeps_the_previous_run(prepared, ft, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))[0] == 0
    before = snapshot(run)
    fails(capsys, *pretrain_args(prepared / "data", run, "--steps", "2", "--overwrite", "--config", "tinyy"),
          code=2, message="--config tinyy: neither a preset")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    fails(capsys, *pretrain_args(prepared / "data", run, "--steps", "2", "--overwrite", "--config", bad), code=2,
          message=f"{bad}: not valid JSON")
    assert snapshot(run) == before

    broken = tmp_path / "broken"
    shutil.copytree(ft / "tiny", broken)
    weights = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    before = snapshot(ft / "ner")
    argv = finetune_args(ft, ft / "ner", "--overwrite")
    argv[argv.index("--model") + 1] = broken
    fails(capsys, *argv, code=2, message=str(broken / "model.safetensors"))
    assert snapshot(ft / "ner") == before and not hidden_leftovers(ft / "ner")


@pytest.mark.e2e
def test_a_failed_overwrite_puts_the_previous_run_back(prepared, tmp_path, capsys):
    """The run is replaced only once the new one has a checkpoint: a new run that dies before its
    first leaves the old one as it was (here the loss diverges at once)."""
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))[0] == 0
    before = snapshot(run)
    err = fails(capsys, *pretrain_args(prepared / "data", run, "--steps", "30", "--overwrite", "--lr", "1e30",
                                       "--schedule", "constant", "--warmup-steps", "0"), code=1, message="NaN or inf")
    assert "Lower --lr" in err
    assert snapshot(run) == before and not hidden_leftovers(run)


def test_overwrite_replaces_the_run_once_the_new_one_has_a_checkpoint(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))[0] == 0
    (run / "notes.txt").write_text("from the earlier run")
    code, _, err = cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "3", "--overwrite"))
    assert code == 0, err
    assert "the earlier run is kept in" in err
    assert not (run / "notes.txt").exists() and not hidden_leftovers(run)
    assert json.loads((run / "metrics.json").read_text())["steps"] == 3


@pytest.mark.e2e
def test_a_run_killed_mid_overwrite_leaves_the_earlier_run_aside_and_says_so(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))[0] == 0
    before = snapshot(run)
    proc = start(pretrain_args(prepared / "data", run, "--steps", "400", "--overwrite"))
    deadline = time.time() + 300
    moved = lambda: any(".replaced-" in x for x in hidden_leftovers(run))  # noqa: E731
    while not (moved() and (run / "metrics.jsonl").is_file()):  # the new run is training
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=60)
    assert ".run.lock" in hidden_leftovers(run)  # the killed run's lock file: it must not block (below)
    aside = tmp_path / next(x for x in hidden_leftovers(run) if ".replaced-" in x) / "run"
    assert snapshot(aside) == before
    code, _, err = cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2", "--overwrite"))
    assert code == 0 and f"{aside.parent} holds an earlier run" in err
    assert ".run.lock" not in hidden_leftovers(run)


# -- one writer per folder ---------------------------------------------------------------------------

def hold_in_another_process(folder: Path, what: str = "torchbert finetune --out X") -> subprocess.Popen:
    """A process that holds `folder` (io/files.hold) until it is killed; returned once it holds it."""
    code = ("import sys, time\nfrom torchbert.io.files import hold\n"
            f"with hold({str(folder)!r}, {what!r}):\n    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_every_command_that_writes_a_folder_is_refused_while_another_process_holds_it(tmp_path, capsys):
    """Issue 37: two commands on one --out must not both run. The lock is taken before anything is
    read, so even a command whose inputs do not exist is refused for the lock, and nothing is written."""
    from torchbert.cli import commands, writes_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("the holder's")
    x = tmp_path / "missing"
    argvs = {"vocab": ["--corpus", x, "--vocab-size", "40"], "prepare": ["--corpus", x, "--tokenizer", x], "pretrain": ["--data", x],
             "finetune": ["--task", "classification", "--model", x, "--train", x], "export": ["--model", x],
             "distill": ["--teacher", x, "--train", x, "--student-layers", "1"],
             "convert": ["--tf-checkpoint", x],
             "samples": ["wnut16"], "demo": [], "compare": [], "benchmark": ["local", "--model", x]}
    assert set(argvs) == set(filter(writes_folder, commands()))  # a new command that writes a folder is tested here too
    holder = hold_in_another_process(out)
    try:
        before = snapshot(out)
        for command, argv in argvs.items():
            line = fails(capsys, command, *argv, "--out", out, "--overwrite", code=2, message=f"--out {out}: in use by "
                         f"process {holder.pid} on ")
            assert "(torchbert finetune --out X, since " in line and "one writer at a time" in line, line
        assert snapshot(out) == before and hidden_leftovers(out) == [".out.lock"]
        # --resume too: two `pretrain --resume` on one run would log every step twice
        fails(capsys, "pretrain", "--data", x, "--out", out, "--resume", code=2, message="in use by process")
    finally:
        holder.kill()
        holder.wait(timeout=60)


def test_a_lock_left_by_a_killed_process_never_blocks_and_a_finished_command_leaves_none(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("中文的句子\n第二个句子\n\nanother document here\n", encoding="utf-8")
    out = tmp_path / "deeper" / "vocab"
    holder = hold_in_another_process(out)
    holder.kill()  # SIGKILL: no cleanup ran, the lock file stays behind
    holder.wait(timeout=60)
    assert (tmp_path / "deeper" / ".vocab.lock").read_text().startswith(f"process {holder.pid} on ")
    code, _, err = cli(capsys, "vocab", "--corpus", corpus, "--vocab-size", "40", "--out", out)
    assert code == 0, err
    assert (out / "vocab.txt").is_file() and hidden_leftovers(out) == []
    # a command refused for its own mistakes leaves no lock file and no folders made for it
    fails(capsys, "vocab", "--corpus", tmp_path / "none.txt", "--vocab-size", "40", "--out", tmp_path / "a" / "b",
          code=2, message="none.txt")
    assert not (tmp_path / "a").exists()


def test_the_lock_is_one_per_folder_even_within_a_process_and_is_released_after(tmp_path):
    from torchbert.errors import UserError
    from torchbert.io.files import hold, lock_path

    folder = tmp_path / "run"
    with hold(folder, "first"):
        assert lock_path(folder).read_text().startswith(f"process {os.getpid()} on ")
        with pytest.raises(UserError, match=f"in use by process {os.getpid()} .*first"):
            with hold(folder, "second"):
                pass
        with hold(tmp_path / "other", "another folder"):  # other folders are not held
            pass
    assert not lock_path(folder).exists()
    with hold(folder, "again"):
        pass


def test_a_refusal_in_the_moment_before_the_holder_wrote_its_line_still_names_the_holder(tmp_path):
    """CI caught a second run refused as 'another process': it read the lock file between the
    holder's flock and its line. The refused side waits a moment for the line."""
    import fcntl
    import threading

    from torchbert.errors import UserError
    from torchbert.io.files import hold, lock_path

    folder = tmp_path / "run"
    path = lock_path(folder)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)  # locked, nothing written yet
    later = threading.Timer(0.3, os.pwrite, (fd, b"process 4242 on host (torchbert finetune, since now)\n", 0))
    later.start()
    try:
        with pytest.raises(UserError, match=r"in use by process 4242 on host \(torchbert finetune"):
            with hold(folder, "second"):
                pass
    finally:
        later.join()
        os.close(fd)
    assert not folder.exists()


@pytest.mark.e2e
def test_two_finetune_runs_started_together_on_one_out_one_runs_and_the_other_is_refused(minilm_dir, tmp_path):
    """The issue's case: two runs with different labels on one --out both exited 0 and left a folder
    that mixed them. Now one of them holds the folder, and the other exits 2 naming it."""
    runs = []
    for labels in (("pos", "neg"), ("yes", "no")):
        train = tmp_path / f"{labels[0]}.tsv"
        rows = [(f"text number {i} is {'good' if i % 2 else 'bad'}", labels[i % 2]) for i in range(16)]
        train.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
        runs.append(["finetune", "--task", "classification", "--model", minilm_dir, "--train", train, "--dev", train,
                     "--out", tmp_path / "run", "--epochs", "4", "--batch-size", "8", "--max-length", "16",
                     "--quiet"])
    procs = [start(argv) for argv in runs]
    done = [(p.pid, *p.communicate(timeout=600), p.returncode) for p in procs]
    codes = sorted(code for *_, code in done)
    assert codes == [0, 2], done
    winner = next(i for i, d in enumerate(done) if d[3] == 0)
    loser = done[1 - winner]
    assert f"--out {tmp_path / 'run'}: in use by process {done[winner][0]} on " in loser[2], loser
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert set(config["label2id"]) == ({"pos", "neg"} if winner == 0 else {"yes", "no"})
    steps = [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # one run's log: no step twice
    assert hidden_leftovers(tmp_path / "run") == []


# -- interrupts ---------------------------------------------------------------------------------------

def resume_from_message(err: str) -> list[str]:
    """The command the interrupt message prints, as argv for `python -m torchbert`."""
    line = err.strip().splitlines()[-1]
    assert "continue with: torchbert " in line, err
    argv = shlex.split(line.split("continue with: ", 1)[1])
    assert argv[0] == "torchbert" and argv[-1] == "--resume" and "--overwrite" not in argv
    return argv[1:]


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_a_checkpoint_and_the_printed_resume_is_bit_identical(prepared, tmp_path, sig):
    args = ["--steps", "40", "--save-every", "100"]  # signalled by step 6: 34 steps to spare, on any host
    ref = start(pretrain_args(prepared / "data", tmp_path / "ref", *args))
    assert ref.wait(timeout=600) == 0, ref.stderr.read()

    run = tmp_path / "run"
    victim = start(pretrain_args(prepared / "data", run, *args, "--overwrite"))
    wait_for(run / "metrics.jsonl", victim, lines=random.choice([1, 2, 3]))
    victim.send_signal(sig)
    assert victim.wait(timeout=120) == 130
    err = victim.stderr.read()
    assert "Traceback" not in err and f"{sig.name}: stopped at step" in err, err
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert len(saved) == 1 and f"saved {saved[0]}" in err  # no --save-every checkpoint came before it
    assert not (run / "metrics.json").exists()

    resumed = start(resume_from_message(err))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def losses(r):  # the log lines, the one in progress at the signal included
        return [(x["step"], x["loss"], x["tokens"]) for x in map(json.loads, (r / "metrics.jsonl").open())]

    assert losses(run) == losses(tmp_path / "ref")


@pytest.mark.e2e
def test_sigterm_in_finetuning_resumes_bit_identically(ft, tmp_path):
    args = ["--epochs", "2", "--log-every", "2"]
    ref = start(finetune_args(ft, tmp_path / "ref", *args))
    assert ref.wait(timeout=600) == 0, ref.stderr.read()
    run = tmp_path / "run"
    victim = start(finetune_args(ft, run, *args))
    wait_for(run / "metrics.jsonl", victim, lines=2)
    victim.send_signal(signal.SIGTERM)
    assert victim.wait(timeout=120) == 130
    err = victim.stderr.read()
    resumed = start(resume_from_message(err))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(run / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    best = [json.loads((r / "metrics.json").read_text())["history"] for r in (tmp_path / "ref", run)]
    assert best[0] == best[1]


def test_ctrl_c_before_the_first_checkpoint_is_one_line_and_loses_nothing(prepared, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the data loads: no run folder appears. A second Ctrl-C (which abandons the step)
    before the new run's first checkpoint: the run it was replacing comes back."""
    import torchbert.train.pretrain as pretrain
    from torchbert.data.shards import PretrainingData

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(pretrain, "open_data", ctrl_c)
        code, out, err = cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))
    assert code == 130 and err == f"torchbert: interrupted before the first checkpoint; {run} is as it was before " \
                                  "this run\n" and not run.exists()

    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))[0] == 0
    before = snapshot(run)
    real = PretrainingData.batches

    def batches(self, *a, **k):
        for i, b in enumerate(real(self, *a, **k)):
            if i == 3:
                raise KeyboardInterrupt
            yield b

    monkeypatch.setattr(PretrainingData, "batches", batches)
    code, out, err = cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "10", "--overwrite"))
    assert code == 130 and err.strip().splitlines()[-1].startswith("torchbert: interrupted before the first"), err
    assert snapshot(run) == before and not hidden_leftovers(run)


# -- resume --------------------------------------------------------------------------------------------

def test_resume_takes_the_config_from_the_run(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    data = prepared / "data"
    assert cli(capsys, *pretrain_args(data, run, "--steps", "4", "--save-every", "2"))[0] == 0
    resume = ["pretrain", "--data", data, "--out", run, "--steps", "6", "--resume", "--quiet"]
    code, _, err = cli(capsys, *resume)  # the README's resume example: no --config
    assert code == 0, err
    assert json.loads((run / "metrics.json").read_text())["steps"] == 6
    fails(capsys, *resume, "--steps", "8", "--config", "small", code=2,
          message=f"--config small differs from the config the run in {run} started with")


def test_resume_without_a_whole_checkpoint_is_one_line(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("no run here")
    fails(capsys, *pretrain_args(prepared / "data", run, "--resume"), code=2, message="holds no whole checkpoint")
    shutil.rmtree(run)
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "4", "--save-every", "2"))[0] == 0
    for ckpt in (run / "checkpoints").glob("step-*"):
        (ckpt / "model.safetensors").write_bytes(b"damaged")
    before = snapshot(run)
    code, _, err = cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "6", "--resume"))
    assert code == 2 and "Traceback" not in err
    *warnings, last = err.strip().splitlines()
    assert last.startswith("torchbert: error: --resume: ") and "(2 damaged, see the warnings above)" in last
    assert len(warnings) == 2 and all(w.startswith("torchbert: warning: ") and "damaged checkpoint" in w
                                      for w in warnings), err
    assert snapshot(run) == before


@pytest.mark.e2e
def test_resumed_finetuning_with_other_labels_is_one_line(ft, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *finetune_args(ft, run, "--epochs", "1", "--save-every", "2"))[0] == 0
    relabelled = tmp_path / "relabelled.conll"
    write_conll(relabelled, [(("hello", "world", "again"), ("B-thing", "O", "O"))] * 16)
    argv = finetune_args(ft, run, "--epochs", "1", "--resume")
    argv[argv.index("--train") + 1] = relabelled
    # issue 46: the training file's sha256 is recorded, so any change to it is named, labels or not
    fails(capsys, *argv, code=2, message=f"--train {relabelled}: not the file the run in {run} started with")
    record = json.loads((run / "torchbert.json").read_text())
    (run / "torchbert.json").write_text(json.dumps({**record, "training": {}}))  # a run recorded without its
    # training settings (an older torchbert's): its labels are still checked
    argv.remove("--dev")
    argv.remove(ft / "dev.conll")
    fails(capsys, *argv, code=2, message=f"the run in {run} was started with the labels")


def test_leftover_checkpoint_temporaries_are_cleaned(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))[0] == 0
    left = run / "checkpoints" / ".step-00000004.x1y2.tmp"
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"half")
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "4", "--resume"))[0] == 0
    assert not left.exists()


# -- the run fails: NaN, non-finite gradients, a full disk --------------------------------------------

def test_nonfinite_gradient_with_a_finite_loss_is_skipped(monkeypatch, tmp_path):
    """The clip's scale test is False for NaN: without the check the exploded weights would be stepped
    into and saved. With and without clipping, the step is skipped and counted, the weights stay."""
    from tinyloop import RepeatData, cfg, tiny_model

    from torchbert.train.loop import TrainingError, train
    from torchbert.train.objectives import PretrainingTask

    for max_norm in (1.0, 0.0):
        model = tiny_model()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        weight = next(p for n, p in model.named_parameters() if n.endswith("down.weight"))
        hook = weight.register_hook(lambda g: g * float("inf"))
        with pytest.raises(TrainingError, match="NaN or inf for 3 steps in a row"):
            train(model, RepeatData(), PretrainingTask(), cfg(steps=5, max_grad_norm=max_norm, max_bad_steps=3),
                  tmp_path / str(max_norm), log=lambda s: None)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        hook.remove()


def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(prepared, tmp_path, capsys, monkeypatch):
    """torch.save reports a full disk as '[enforce fail at inline_container.cc:672] unexpected pos'."""
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared / "data", run, "--steps", "2"))[0] == 0

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(torch, "save", full)
    # the disk is full while the partial checkpoint is there, and has room again once it is removed
    monkeypatch.setattr(torchbert.io.files, "_nearly_full",
                        lambda folder: any(p.name.startswith(".step-") for p in Path(folder).iterdir()))
    fails(capsys, *pretrain_args(prepared / "data", run, "--steps", "4", "--resume", "--save-every", "1"), code=1,
          message=f"no space left on {run / 'checkpoints'}")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002"]


def test_vocab_on_a_full_disk_writes_no_folder(prepared, tmp_path, capsys, monkeypatch):
    from torchbert.tokenizer import BertTokenizer

    real = BertTokenizer.save_pretrained

    def half(self, path):
        real(self, path)
        raise OSError(28, "No space left on device", str(Path(path) / "tokenizer.json"))

    monkeypatch.setattr(BertTokenizer, "save_pretrained", half)
    out = tmp_path / "tok"
    fails(capsys, "vocab", "--corpus", prepared / "train.txt", "--vocab-size", "500", "--out", out, "--quiet",
          code=1, message=f"no space left on {tmp_path}")
    assert not out.exists() and not hidden_leftovers(out)
    fails(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", out, "--out", tmp_path / "d",
          code=2, message=f"--tokenizer {out}: not a folder")


def _tmpfs_available() -> bool:
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.e2e
@pytest.mark.skipif(not _tmpfs_available(), reason="needs user namespaces to mount a small tmpfs")
def test_a_really_full_disk(prepared, tmp_path):
    """On a 400 kB tmpfs: pretrain fails with one line naming the folder, and vocab leaves nothing."""
    disk = tmp_path / "disk"
    disk.mkdir()
    py, where = shlex.quote(sys.executable), shlex.quote(str(disk))
    pretrain = shlex.join(map(str, pretrain_args(prepared / "data", disk / "run", "--steps", "2")))
    vocab = shlex.join(["vocab", "--corpus", str(prepared / "train.txt"), "--vocab-size", "3000", "--out",
                        str(disk / "tok"), "--quiet"])
    script = (f"mount -t tmpfs -o size=400k none {where} || exit 99; "
              f"{py} -m torchbert {pretrain}; echo RC=$?; ls -A {where}; echo LS; "
              f"head -c 390k /dev/zero > {where}/filler; {py} -m torchbert {vocab}; echo RC=$?; ls -A {where}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=ENV, capture_output=True, text=True,
                          timeout=600)
    out, err = done.stdout, done.stderr
    assert "Traceback" not in err, err
    first, second = out.split("LS\n")
    assert first.split() == ["RC=1"], (out, err)  # no run folder left: it had no checkpoint
    assert second.split() == ["RC=1", "filler"], (out, err)  # no vocab folder, whole or partial
    errors = [line for line in err.splitlines() if line.startswith("torchbert: error: ")]
    assert len(errors) == 2 and all(f"no space left on {disk}" in line for line in errors), err


# -- outputs: checked first, written whole, readable -------------------------------------------------

def test_embed_checks_its_output_before_any_work(minilm_dir, tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("a line\n")
    (tmp_path / "file").write_text("x")

    def never(*a, **k):
        raise AssertionError("embedded before checking --out")

    monkeypatch.setattr(torchbert.features, "embed", never)
    fails(capsys, "embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "file" / "e.npy", code=2,
          message=f"{tmp_path / 'file'} is a file")
    (tmp_path / "dir.npy").mkdir()
    fails(capsys, "embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "dir.npy", code=2,
          message="is a folder")


def test_evaluate_prints_only_json_on_stdout(minilm_dir, tmp_path, capsys):
    rows = [("a man plays a guitar", "a person makes music", "entailment"),
            ("a dog runs in a park", "a cat sleeps indoors", "contradiction"),
            ("two kids play football", "children are outside", "neutral")] * 6
    lines = [json.dumps({"sentence1": a, "sentence2": b, "gold_label": g}) for a, b, g in rows]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "dev.jsonl").write_text("\n".join(lines[:6] + [json.dumps(
        {"sentence1": "x", "sentence2": "y", "gold_label": "-"})]) + "\n")
    tiny_bert(tmp_path / "tiny", minilm_dir)
    code, _, err = cli(capsys, "finetune", "--task", "snli", "--model", tmp_path / "tiny", "--train",
                       tmp_path / "train.jsonl", "--out", tmp_path / "run", "--epochs", "1", "--batch-size", "4",
                       "--quiet")
    assert code == 0, err
    code, out, err = cli(capsys, "evaluate", "--model", tmp_path / "run", "--data", tmp_path / "dev.jsonl", "--quiet")
    assert code == 0 and "dropped 1 pairs whose gold_label is '-'" in err
    assert set(json.loads(out)) >= {"accuracy"}  # stdout is the JSON alone


def test_outputs_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        assert umask() == 0o022
        atomic_write_text(tmp_path / "a.txt", "x")
        with atomic_folder(tmp_path / "folder") as tmp:
            (tmp / "f").write_text("y")
        assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
        assert (tmp_path / "folder").stat().st_mode & 0o777 == 0o755
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.txt", "x")
        assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_a_folder_saved_again_is_replaced_whole_or_kept(tmp_path, monkeypatch):
    """atomic_folder over an existing folder: the new one whole, or (on failure) the old one untouched;
    a checkpoint saved again at the same step is not deleted before its replacement is complete."""
    state = {"w": torch.ones(3)}
    save_checkpoint(tmp_path, 2, state, {}, {}, {"epoch": 0})
    before = snapshot(tmp_path / "checkpoints")
    import torchbert.io.checkpoint as ck

    monkeypatch.setattr(ck, "save_file", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(OutOfSpace):
        save_checkpoint(tmp_path, 2, {"w": torch.zeros(3)}, {}, {}, {"epoch": 0})
    assert snapshot(tmp_path / "checkpoints") == before
    monkeypatch.undo()
    save_checkpoint(tmp_path, 2, {"w": torch.zeros(3)}, {}, {}, {"epoch": 0})
    assert torch.equal(load_file(tmp_path / "checkpoints" / "step-00000002" / "model.safetensors")["w"],
                       torch.zeros(3))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]


def test_best_epoch_folder_is_replaced_whole(ft, tmp_path, monkeypatch):
    from torchbert.tasks.predict import load_finetuned
    from torchbert.train.distributed import Dist
    from torchbert.train.finetune import _Best

    model = load_finetuned(ft / "ner", None, torch.device("cpu"))[0]
    best = _Best(tmp_path, "f1", Dist())
    best.offer(model, {"f1": 0.1}, [{"id": "0"}], step=1, epoch=1)
    before = snapshot(tmp_path / "best")

    def half(path):
        (Path(path) / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model, "save_pretrained", half)
    with pytest.raises(OutOfSpace):
        best.offer(model, {"f1": 0.2}, [{"id": "0"}], step=2, epoch=2)
    assert snapshot(tmp_path / "best") == before and not hidden_leftovers(tmp_path / "best")


# -- the smaller cases -------------------------------------------------------------------------------------

def test_predict_on_a_model_never_fine_tuned_says_what_to_do(tmp_path, capsys):
    src = tmp_path / "in.conll"
    src.write_text("hello\tO\n\n")
    line = fails(capsys, "predict", "--model", "minilm", "--input", src, "--out", tmp_path / "p.jsonl", code=2,
                 message="not a model fine-tuned by torchbert")
    assert "--task" not in line and "torchbert finetune" in line


def test_a_truncated_shard_names_its_file(prepared, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(prepared / "data", data)
    shard = data / "shard-00000" / "tokens.npy"
    shard.write_bytes(shard.read_bytes()[:40])
    fails(capsys, "inspect-data", data, code=2, message=f"{shard}: damaged or missing shard file")
    fails(capsys, *pretrain_args(data, tmp_path / "run"), code=2, message=f"{shard}: damaged or missing shard file")


def test_choices_and_lengths_that_leave_nothing_to_learn(ft, tmp_path, capsys):
    swag = tmp_path / "swag.csv"
    swag.write_text("sent1,sent2,ending0,ending1,label\nA man,walks,to the car,,0\nA dog,runs,fast,slow,1\n")
    fails(capsys, "finetune", "--task", "multiple-choice", "--model", ft / "tiny", "--train", swag, "--out",
          tmp_path / "mc", "--quiet", code=2, message=f"{swag}:2: choice 1 is empty")
    tsv = tmp_path / "t.tsv"
    tsv.write_text("sentence\tlabel\n" + "good film\tpos\nbad film\tneg\n" * 8)
    fails(capsys, "finetune", "--task", "classification", "--model", ft / "tiny", "--train", tsv, "--out",
          tmp_path / "c", "--max-length", "2", "--quiet", code=2, message="--max-length 2 leaves no room for the text")


def test_debug_shows_the_traceback(tmp_path, capsys):
    with pytest.raises(FileNotFoundError):
        main(["--debug", "embed", "--model", "minilm", "--input", str(tmp_path / "none.txt"), "--out",
              str(tmp_path / "e.npy")])


# -- the sweep: every command, broken inputs of each kind --------------------------------------------------

def sweep_cases(p: Path, ft: Path, minilm: Path) -> list[tuple[str, list, int, str]]:
    """(name, argv, exit status, a piece of the message naming the culprit)."""
    missing, folder, text, empty, binary = p / "missing.txt", p / "folder", p / "text.txt", p / "empty.txt", \
        p / "latin1.txt"
    data, tok = p / "data", p / "tok"
    bad_model, broken_weights = p / "bad-model", p / "broken-weights"
    ner = ft / "ner"
    out = p / "out"
    e = ["embed", "--model", minilm, "--input", text, "--out", out / "e.npy"]
    v = ["vocab", "--corpus", text, "--vocab-size", "100", "--out", out / "tok"]
    r = ["prepare", "--corpus", text, "--tokenizer", tok, "--out", out / "data"]
    t = pretrain_args(data, out / "run", "--steps", "2")
    f = finetune_args(ft, out / "ft")
    return [
        ("embed: missing input", [*e[:4], missing, *e[5:]], 2, str(missing)),
        ("embed: input is a folder", [*e[:4], folder, *e[5:]], 2, str(folder)),
        ("embed: not UTF-8", [*e[:4], binary, *e[5:]], 2, f"{binary}:1: not valid UTF-8"),
        ("embed: empty input", [*e[:4], empty, *e[5:]], 2, str(empty)),
        ("embed: --out suffix", [*e[:-1], out / "e.txt"], 2, "--out"),
        ("embed: --out is the input", [*e[:4], p / "text.npy", "--out", p / "text.npy"], 2, "is the input --input"),
        ("embed: --out under a file", [*e[:-1], text / "e.npy"], 2, f"{text} is a file"),
        ("embed: model folder missing", [e[0], "--model", p / "nope", *e[3:]], 2, "nope"),
        ("embed: config.json not JSON", [e[0], "--model", bad_model, *e[3:]], 2, str(bad_model)),
        ("embed: truncated weights", [e[0], "--model", broken_weights, *e[3:]], 2, str(broken_weights)),
        ("embed: --batch-size 0", [*e, "--batch-size", "0"], 2, "--batch-size"),
        ("embed: --max-length 1", [*e, "--max-length", "1"], 2, "--max-length"),
        ("embed: --layers bogus", [*e, "--layers", "bogus"], 2, "bogus"),
        ("vocab: missing corpus", [v[0], "--corpus", missing, *v[3:]], 2, str(missing)),
        ("vocab: empty corpus", [v[0], "--corpus", empty, *v[3:]], 2, str(empty)),
        ("vocab: corpus not UTF-8", [v[0], "--corpus", binary, *v[3:]], 2, str(binary)),
        ("vocab: corpus is a folder", [v[0], "--corpus", folder, *v[3:]], 2, str(folder)),
        ("vocab: --vocab-size 3", [*v[:4], "3", *v[5:]], 2, "--vocab-size"),
        ("vocab: --out is the corpus", [*v[:-1], text], 2, "is the input --corpus"),
        ("vocab: --out not empty", [*v[:-1], tok], 2, "pass --overwrite"),
        ("prepare: tokenizer missing", [*r[:4], p / "nope", *r[5:]], 2, "--tokenizer"),
        ("prepare: tokenizer is a file", [*r[:4], text, *r[5:]], 2, "--tokenizer"),
        ("prepare: tokenizer folder empty", [*r[:4], folder, *r[5:]], 2, str(folder)),
        ("prepare: one document", [r[0], "--corpus", p / "one-doc.txt", *r[3:]], 2, "one-doc.txt"),
        ("prepare: --max-seq-len 3", [*r, "--max-seq-len", "3"], 2, "--max-seq-len must be >= 5, got 3"),
        ("prepare: --dupe-factor 0", [*r, "--dupe-factor", "0"], 2, "--dupe-factor must be >= 1, got 0"),
        ("prepare: --masked-lm-prob 2", [*r, "--masked-lm-prob", "2"], 2, "--masked-lm-prob must be in (0, 1), got 2"),
        ("prepare: --out is the tokenizer", [*r[:-1], tok], 2, "is the input --tokenizer"),
        ("prepare: --out holds the corpus", [*r[:-1], p], 2, "holds the input"),
        ("inspect-data: not a data folder", ["inspect-data", folder], 2, str(folder)),
        ("inspect-data: manifest not JSON", ["inspect-data", p / "bad-data"], 2, str(p / "bad-data")),
        ("pretrain: data missing", pretrain_args(p / "nope", out / "run"), 2, "nope"),
        ("pretrain: data not prepared", pretrain_args(folder, out / "run"), 2, str(folder)),
        ("pretrain: --config typo", [*t, "--config", "smal"], 2, "--config smal"),
        ("pretrain: --config not JSON", [*t, "--config", bad_model / "config.json"], 2, str(bad_model)),
        ("pretrain: --steps 0", [*t, "--steps", "0"], 2, "--steps"),
        ("pretrain: --resume, no run", [*t, "--resume"], 2, "nothing to resume"),
        ("pretrain: --resume and --overwrite", [*t, "--resume", "--overwrite"], 2, "contradict"),
        ("pretrain: --init missing", [*t, "--init", p / "nope"], 2, "nope"),
        ("pretrain: --init truncated weights", [*t, "--init", broken_weights], 2, str(broken_weights)),
        ("pretrain: --out is a file", [*t[:4], text, *t[5:]], 2, "not a folder"),
        ("pretrain: --eval-data not prepared", [*t, "--eval-data", folder], 2, str(folder)),
        ("pretrain: --optimizer bogus", [*t, "--optimizer", "sgdd"], 2, "--optimizer"),
        ("pretrain: --schedule bogus", [*t, "--schedule", "cosinus"], 2, "--schedule"),
        ("pretrain: --fsdp in one process", [*t, "--fsdp"], 2, "--fsdp needs several processes"),
        ("pretrain: --dropout with --init", [*t, "--init", ft / "tiny", "--dropout", "0"], 2,
         "--dropout sets a fresh model's dropout; an --init model keeps its config's"),
        ("pretrain: --positions with --init", [*t, "--init", ft / "tiny", "--positions", "rotary"], 2,
         "--positions sets a fresh model's; an --init model keeps its config's"),
        ("finetune: unknown task", [f[0], "--task", "nerr", *f[3:]], 2, "nerr"),
        ("finetune: train missing", [*f[:6], missing, *f[7:]], 2, str(missing)),
        ("finetune: train empty", [*f[:6], empty, *f[7:]], 2, str(empty)),
        ("finetune: train not CoNLL", [*f[:6], p / "bad.conll", *f[7:]], 2, str(p / "bad.conll")),
        ("finetune: model missing", [*f[:4], p / "nope", *f[5:]], 2, "nope"),
        ("finetune: model config not JSON", [*f[:4], bad_model, *f[5:]], 2, str(bad_model)),
        ("finetune: --epochs 0", [*f, "--epochs", "0"], 2, "--epochs"),
        ("finetune: --max-length 2", [*f, "--max-length", "2"], 2, "max_length=2"),
        ("finetune: --out is --train", [*f[:10], ft / "train.conll", *f[11:]], 2, "is the input --train"),
        ("finetune: --features without --frozen", [*f, "--features", "last"], 2, "--frozen"),
        ("finetune: --frozen on a text task", [f[0], "--task", "classification", *f[3:], "--frozen"], 2,
         "--frozen trains a tagger on a frozen BERT's token features: it needs a token task, but --task "
         "classification is classification"),
        ("finetune: --frozen on the last four of two layers", [*f, "--frozen"], 2,
         "--features concat_last_four: concat_last_four needs at least 4 layers; this model has 2"),
        ("finetune: --max-length past the positions", [*f, "--max-length", "513"], 2,
         "--max-length 513 is longer than the model's max_position_embeddings 512"),
        ("finetune: dev label never trained", [*f[:8], p / "odd.conll", *f[9:]], 2, "B-planet"),
        ("finetune: resume nothing", [*f, "--resume"], 2, "nothing to resume"),
        ("evaluate: model never fine-tuned", ["evaluate", "--model", minilm, "--data", ft / "dev.conll"], 2,
         "not a model fine-tuned by torchbert"),
        ("evaluate: data missing", ["evaluate", "--model", ner, "--data", missing], 2, str(missing)),
        ("evaluate: --out is the model's config", ["evaluate", "--model", ner, "--data", ft / "dev.conll", "--out",
                                                   ner / "config.json"], 2, f"--model {ner / 'config.json'}"),
        ("evaluate: --out is a folder", ["evaluate", "--model", ner, "--data", ft / "dev.conll", "--out", folder], 2,
         "is a folder"),
        ("evaluate: model missing", ["evaluate", "--model", p / "nope", "--data", ft / "dev.conll"], 2, "nope"),
        ("predict: model never fine-tuned", ["predict", "--model", "minilm", "--input", ft / "dev.conll", "--out",
                                             out / "p.jsonl"], 2, "not a model fine-tuned by torchbert"),
        ("predict: input missing", ["predict", "--model", ner, "--input", missing, "--out", out / "p.jsonl"], 2,
         str(missing)),
        ("predict: --out is the input", ["predict", "--model", ner, "--input", ft / "dev.conll", "--out",
                                         ft / "dev.conll"], 2, "is the input --input"),
        ("predict: --out is the model's weights", ["predict", "--model", ner, "--input", ft / "dev.conll", "--out",
                                                   ner / "model.safetensors"], 2, "is the input --model"),
        ("predict: --out is a folder", ["predict", "--model", ner, "--input", ft / "dev.conll", "--out", folder], 2,
         "is a folder"),
        ("samples: --out is a file", ["samples", "wnut16", "--out", text], 2, "not a folder"),
        # issue 37: checked up front, and what an input is when it is not a file
        ("predict: --batch-size 0", ["predict", "--model", ner, "--input", ft / "dev.conll", "--out",
                                     out / "p.jsonl", "--batch-size", "0"], 2, "--batch-size must be >= 1"),
        ("evaluate: --batch-size 0", ["evaluate", "--model", ner, "--data", ft / "dev.conll", "--batch-size", "0"], 2,
         "--batch-size must be >= 1"),
        ("predict: --device cpu:99x", ["predict", "--model", ner, "--input", ft / "dev.conll", "--out",
                                       out / "p.jsonl", "--device", "cpu:99x"], 2, "--device cpu:99x: not a device"),
        ("embed: --device mps", [*e, "--device", "mps"], 2, "--device mps: torchbert runs on cpu or cuda"),
        ("embed: input is a named pipe", [*e[:4], p / "pipe", *e[5:]], 2, "is a named pipe (FIFO), not a regular"),
        ("embed: input is /dev/zero", [*e[:4], "/dev/zero", *e[5:]], 2, "/dev/zero: is a character device"),
        ("embed: weights are a named pipe", [e[0], "--model", p / "pipe-model", *e[3:]], 2,
         "model.safetensors: is a named pipe"),
        ("vocab: corpus is a named pipe", [v[0], "--corpus", p / "pipe", *v[3:]], 2, "is a named pipe"),
        ("finetune: train is /dev/zero", [*f[:6], "/dev/zero", *f[7:]], 2, "/dev/zero: is a character device"),
        ("demo: --out holds other files", ["demo", "--out", p, "--quick"], 2, "holds no earlier demo"),
        # issue 46: config fields of every type and size, deep JSON, weights and vocab that do not match
        ("embed: hidden_size 10^9", [e[0], "--model", p / "huge-config", *e[3:]], 2,
         "hidden_size must be in [1, 65536], got 1000000000"),
        ("embed: vocab_size 10^9 (bounds as people read them)", [e[0], "--model", p / "huge-vocab", *e[3:]], 2,
         "vocab_size must be in [1, 16,777,216], got 1000000000"),
        ("embed: a config.json of 17 MB", [e[0], "--model", p / "huge-file", *e[3:]], 2,
         "huge-file/config.json: 17,0"),
        ("embed: 2.5 layers", [e[0], "--model", p / "float-layers", *e[3:]], 2,
         "num_hidden_layers must be a whole number, got 2.5"),
        ("embed: a size as a string", [e[0], "--model", p / "string-size", *e[3:]], 2,
         "hidden_size must be a whole number, got '128'"),
        ("embed: layer_norm_eps NaN", [e[0], "--model", p / "nan-eps", *e[3:]], 2,
         "layer_norm_eps must be a finite number, got nan"),
        ("embed: 1000 layers over 2 layers of weights", [e[0], "--model", p / "many-layers", *e[3:]], 2,
         "the config does not belong to these weights"),
        ("embed: NaN weights", [e[0], "--model", p / "nan-weights", *e[3:]], 2, "holds NaN or inf"),
        ("embed: config.json nested 10^6 deep", [e[0], "--model", p / "deep-config", *e[3:]], 2,
         "nested too deeply"),
        ("embed: tokenizer_config.json nested 10^6 deep", [e[0], "--model", p / "deep-tokenizer", *e[3:]], 2,
         "deep-tokenizer/tokenizer_config.json"),
        ("embed: vocab.txt longer than vocab_size", [e[0], "--model", p / "long-vocab", *e[3:]], 2,
         "more tokens than the"),
        ("export: vocab.txt longer than vocab_size", ["export", "--model", p / "long-vocab", "--out", out / "onnx"], 2,
         "long-vocab/vocab.txt: more tokens than the"),
        ("pretrain: manifest vocab_size 10^9", pretrain_args(p / "huge-data", out / "run"), 2,
         "vocab_size must be a whole number in"),
        ("vocab: --vocab-size 10^9", [*v[:4], "1000000000", *v[5:]], 2, "--vocab-size must be in [6, 1,048,576]"),
        ("evaluate: --out is a FIFO", ["evaluate", "--model", ner, "--data", ft / "dev.conll", "--out", p / "pipe"],
         2, "is a named pipe (FIFO), not a regular file"),
        ("embed: --out links to a FIFO", [*e[:-1], p / "link-to-pipe.npy"], 2, "not a regular file"),
        ("embed: --out links to its input", [*e[:-1], p / "link-to-input.npy"], 2, f"is the input --input {text}"),
        ("embed: input is a link that loops", [*e[:4], p / "loop", *e[5:]], 2, "a symbolic link that loops"),
        ("vocab: --overwrite a folder of the user's", [*v[:-1], p / "users", "--overwrite"], 2,
         "which torchbert did not write"),
    ]


def test_lines_end_at_a_lone_carriage_return_as_universal_newlines_split_them(minilm_dir, tmp_path, capsys):
    """Issue 37: a file with old Mac line endings (CR only) was read as one text."""
    from torchbert.io.texts import lines, read_texts

    f = tmp_path / "mac.txt"
    f.write_bytes(b"first\rsecond\r\nthird\nfourth\rfifth")
    assert read_texts(f) == ["first", "second", "third", "fourth", "fifth"]
    assert [x for _, x in lines(f, keepends=True)] == ["first\r", "second\r\n", "third\n", "fourth\r", "fifth"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\rstill ok\rnot \xff ok\r")
    with pytest.raises(ValueError, match=r"bad.txt:3: not valid UTF-8 \(byte b'\\xff' at column 5\)"):
        read_texts(bad)
    code, out, err = cli(capsys, "embed", "--model", minilm_dir, "--input", f, "--out", tmp_path / "e.npy")
    assert code == 0 and "wrote" in out and "5 x 384" in out, err


def test_neighbours_of_a_single_text_are_not_the_text_itself(minilm_dir, tmp_path, capsys):
    f = tmp_path / "one.txt"
    f.write_text("only one text\n")
    code, out, err = cli(capsys, "embed", "--model", minilm_dir, "--input", f, "--out", tmp_path / "e.npy",
                         "--show-neighbours", "3")
    assert code == 0 and "-inf" not in out and "->" not in out, out
    assert "--show-neighbours needs two texts or more" in err


def edited_models(p: Path, tiny: Path) -> None:
    """Copies of a tiny BERT with one thing wrong each (issue 46's classes)."""
    config = json.loads((tiny / "config.json").read_text())
    for name, change in (("huge-config", {"hidden_size": 10**9}), ("float-layers", {"num_hidden_layers": 2.5}),
                         ("string-size", {"hidden_size": "128"}), ("nan-eps", {"layer_norm_eps": float("nan")}),
                         ("many-layers", {"num_hidden_layers": 1000}), ("huge-vocab", {"vocab_size": 10**9}),
                         ("huge-file", {"padding": "x" * 17_000_000})):
        shutil.copytree(tiny, p / name)
        (p / name / "config.json").write_text(json.dumps({**config, **change}))
    shutil.copytree(tiny, p / "nan-weights")
    weights = load_file(tiny / "model.safetensors")
    first = sorted(weights)[0]
    weights[first] = torch.full_like(weights[first], float("nan"))
    from safetensors.torch import save_file

    save_file(weights, p / "nan-weights" / "model.safetensors")
    deep = "[" * 10**6 + "]" * 10**6
    shutil.copytree(tiny, p / "deep-config")
    (p / "deep-config" / "config.json").write_text(deep)
    shutil.copytree(tiny, p / "deep-tokenizer")
    (p / "deep-tokenizer" / "tokenizer_config.json").write_text(deep)
    shutil.copytree(tiny, p / "long-vocab")
    with open(p / "long-vocab" / "vocab.txt", "a") as f:
        f.write("".join(f"extra{i}\n" for i in range(50)))


def test_sweep_every_command_with_broken_inputs(prepared, ft, minilm_dir, tmp_path, capsys):
    p = tmp_path
    (p / "folder").mkdir()
    (p / "text.txt").write_text("one line of text\nanother line\n")
    (p / "text.npy").write_text("")
    (p / "empty.txt").write_text("")
    (p / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    (p / "one-doc.txt").write_text("Only one document here. It has two sentences.\n")
    shutil.copytree(prepared / "tok", p / "tok")
    shutil.copytree(prepared / "data", p / "data")
    (p / "bad-model").mkdir()
    (p / "bad-model" / "config.json").write_text("{oops")
    shutil.copytree(ft / "tiny", p / "broken-weights")
    w = p / "broken-weights" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    (p / "bad-data").mkdir()
    (p / "bad-data" / "manifest.json").write_text("{oops")
    (p / "bad.conll").write_text("word-without-a-tag\n\n")
    os.mkfifo(p / "pipe")  # read, it would block for ever
    (p / "pipe-model").mkdir()
    for name in ("config.json", "vocab.txt"):
        shutil.copyfile(ft / "tiny" / name, p / "pipe-model" / name)
    os.mkfifo(p / "pipe-model" / "model.safetensors")
    write_conll(p / "odd.conll", [(("Mars", "rover"), ("B-planet", "O"))])
    edited_models(p, ft / "tiny")
    shutil.copytree(prepared / "data", p / "huge-data")
    manifest = json.loads((p / "huge-data" / "manifest.json").read_text())
    (p / "huge-data" / "manifest.json").write_text(json.dumps({**manifest, "vocab_size": 10**9}))
    os.mkfifo(p / "fifo.npy")
    (p / "link-to-pipe.npy").symlink_to(p / "fifo.npy")
    (p / "link-to-input.npy").symlink_to(p / "text.txt")
    (p / "loop").symlink_to(p / "loop")
    (p / "users").mkdir()
    (p / "users" / "precious.txt").write_text("mine")
    inputs = snapshot(p) | snapshot(ft / "ner")

    results = {"clear": 0, "traceback": [], "unclear": []}
    cases = sweep_cases(p, ft, minilm_dir)
    for name, argv, code, culprit in cases:
        try:
            got, out, err = cli(capsys, *argv)
        except Exception as e:  # a traceback would reach the user
            capsys.readouterr()
            results["traceback"].append(f"{name}: {type(e).__name__}: {e}")
            continue
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if (got == code and last.startswith("torchbert: error: ") and culprit in last and "unexpected " not in last
                and not out):
            results["clear"] += 1
        else:
            results["unclear"].append(f"{name}: exit {got}: {err.strip()[-300:]}")
        if (p / "out").exists():
            results["unclear"].append(f"{name}: left {sorted(x.name for x in (p / 'out').rglob('*'))}")
            shutil.rmtree(p / "out")
    print(f"\n{len(cases)} cases: {results['clear']} clear one-line errors, {len(results['traceback'])} tracebacks, "
          f"{len(results['unclear'])} unclear", file=sys.__stderr__)
    assert not results["traceback"] and not results["unclear"], results
    assert (snapshot(p) | snapshot(ft / "ner")) == inputs  # no input touched, no output left
    assert not (p / "out").exists()


# -- issue 59, class 2: outputs that overflow reach no file, score or answer --------------------------

def test_outputs_that_overflow_reach_no_file_score_or_answer(minilm_dir, tmp_path, capsys):
    """A fine-tuned classifier whose weights are finite but whose outputs are not (word embeddings x
    1e30): predict and evaluate stop with the file and line and write nothing; serve answers 500 with
    a message of its own for /predict and for embeddings in every encoding."""
    from safetensors.torch import save_file
    from starlette.testclient import TestClient

    from torchbert.apps.batcher import Limits
    from torchbert.apps.endpoints import Embedder, Predictor
    from torchbert.apps.serve import NON_FINITE, create_app

    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": str(i % 2)}) + "\n"
                            for i, t in enumerate(realdata.english_texts()[:8])), encoding="utf-8")
    base = tiny_bert(tmp_path / "base", minilm_dir)
    assert cli(capsys, "finetune", "--task", "classification", "--model", base, "--train", data,
               "--out", tmp_path / "run", "--epochs", "1", "--quiet")[0] == 0
    weights = load_file(tmp_path / "run" / "model.safetensors")
    key = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[key] = weights[key] * 1e30
    assert torch.isfinite(weights[key]).all()
    save_file(weights, tmp_path / "run" / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "p.jsonl"
    for argv in (["predict", "--input", data, "--out", out], ["evaluate", "--data", data]):
        code, stdout, err = cli(capsys, argv[0], "--model", tmp_path / "run", *argv[1:], "--precision", "fp32",
                                "--quiet")
        assert code == 1 and f"{data}:1: the model's outputs hold NaN or inf" in err and err.count("\n") == 1, err
        assert stdout == ""
    assert not out.exists()
    predictor = Predictor(tmp_path / "run", name="m")
    with TestClient(create_app(predictor, Limits())) as c:
        r = c.post("/predict", json={"inputs": [{"text": "hello"}]})
    assert r.status_code == 500 and r.json()["error"]["message"] == NON_FINITE
    embedder = Embedder(None, name="m", model=predictor.model.bert, tokenizer=predictor.tokenizer)
    with TestClient(create_app(embedder, Limits())) as c:
        for encoding in ("float", "base64"):
            r = c.post("/v1/embeddings", json={"input": ["hello"], "encoding_format": encoding})
            assert r.status_code == 500 and r.json()["error"]["message"] == NON_FINITE, encoding


# -- streams with bounds: a line, a record or a document can be any length; a compressed file cut short -------

def _compressed(path: Path, kind: str) -> Path:
    """`path` as .gz or .zst beside it (several zstd frames: a cut can fall inside any)."""
    import gzip

    import zstandard

    raw = path.read_bytes()
    target = path.with_name(path.name + "." + kind)
    if kind == "gz":
        target.write_bytes(gzip.compress(raw))
    else:
        half = len(raw) // 2
        c = zstandard.ZstdCompressor()
        target.write_bytes(c.compress(raw[:half]) + c.compress(raw[half:]))
    return target


@pytest.fixture
def small_bounds(monkeypatch):
    """sources.py's bounds made small, so that a test's long line is a few hundred kB (prepare runs
    with --workers 1: in this process, where the bounds are patched)."""
    from torchbert.data import sources

    monkeypatch.setattr(sources, "LINE_BYTES", 4096)
    monkeypatch.setattr(sources, "RECORD_BYTES", 60_000)
    monkeypatch.setattr(sources, "DOCUMENT_CHARS", 50_000)
    return sources


def test_a_line_longer_than_the_bounds_is_read_in_parts_with_a_note(prepared, tmp_path, capsys, small_bounds):
    """A line of 300,000 characters among ordinary ones, plain, .gz and .zst: prepare reads it in parts
    (memory holds a part and LINE_BYTES), cuts its document every DOCUMENT_CHARS with one note naming the
    file and line, keeps the other documents whole, and writes the same shards from all three."""
    from torchbert.data.sources import Piece, piece_documents

    paragraphs = list(realdata.peoples_daily_lines()[:40])
    long_line = "".join(paragraphs) * (300_000 // len("".join(paragraphs)) + 1)
    long_line = long_line[:300_000]
    lines = paragraphs[:20] + [long_line] + paragraphs[20:]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    # the reader: every character of the long line kept, in documents of at most DOCUMENT_CHARS
    notes = []
    size = corpus.stat().st_size
    docs = [d for part, _ in piece_documents(Piece(str(corpus), "lines", 0, size, size, 1), 1 << 16,
                                             lambda t: [t] if t else [], note=notes.append) for d in part]
    assert docs[:20] == [[p] for p in paragraphs[:20]] and docs[-20:] == [[p] for p in paragraphs[20:]]
    middle = docs[20:-20]
    assert "".join(s for d in middle for s in d) == long_line
    assert len(middle) == 6 and all(sum(map(len, d)) <= 50_000 + 4096 for d in middle)
    assert max(len(s) for d in middle for s in d) <= 4096
    assert notes == [f"{corpus}:21: a document longer than 50,000 characters: cut into documents of that length"]
    # prepare, plain and compressed: the same shards, the note on stderr
    outs = []
    for source in (corpus, _compressed(corpus, "gz"), _compressed(corpus, "zst")):
        out = tmp_path / f"data-{source.suffix}"
        code, _, err = cli(capsys, "prepare", "--corpus", source, "--tokenizer", prepared / "tok", "--out", out,
                           "--max-seq-len", "64", "--workers", "1", "--quiet")
        assert code == 0, err
        assert f"note: {source}:21: a document longer than 50,000 characters" in err, err
        outs.append(out)
    shards = [{p.relative_to(o): p.read_bytes() for p in sorted(o.glob("shard-*/*.npy"))} for o in outs]
    assert shards[0] and shards[0] == shards[1] == shards[2]


def test_a_json_lines_record_past_the_bound_is_skipped_with_a_note(prepared, tmp_path, capsys, small_bounds):
    texts = list(realdata.peoples_daily_lines()[:30])
    records = [{"text": t} for t in texts]
    records.insert(10, {"text": "很长" * 40_000})  # 240 kB of UTF-8: past RECORD_BYTES (60,000)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    for source in (corpus, _compressed(corpus, "gz")):
        code, _, err = cli(capsys, "prepare", "--corpus", source, "--tokenizer", prepared / "tok", "--out",
                           tmp_path / f"d{source.suffix}", "--max-seq-len", "64", "--workers", "1", "--quiet")
        assert code == 0, err
        assert f"note: {source}:11: a JSON Lines record longer than" in err and "skipped" in err, err
        manifest = json.loads((tmp_path / f"d{source.suffix}" / "manifest.json").read_text())
        assert manifest["counts"]["documents"] == 30, manifest  # the other 30 records, every one
    # vocab reads the same files through the same reader: the note as a one-line warning
    code, _, err = cli(capsys, "vocab", "--corpus", corpus, "--vocab-size", "300",
                       "--out", tmp_path / "tok", "--quiet")
    assert code == 0 and f"{corpus}:11: a JSON Lines record longer than" in err, err


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_compressed_corpus_cut_short_is_one_line_naming_the_file_and_line(prepared, tmp_path, capsys, kind):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(realdata.peoples_daily_lines()[:400]) + "\n", encoding="utf-8")
    packed = _compressed(corpus, kind)
    cut = tmp_path / f"cut.txt.{kind}"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size * 3 // 4])
    line = fails(capsys, "prepare", "--corpus", cut, "--tokenizer", prepared / "tok", "--out", tmp_path / "d",
                 "--workers", "1", "--quiet", code=2, message=f"{cut}: the compressed text is damaged or cut short "
                                                                 "after line ")
    assert int(line.split("after line ")[1].split()[0]) > 100
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.partial").exists()
    fails(capsys, "vocab", "--corpus", cut, "--vocab-size", "300", "--out", tmp_path / "tok", "--quiet", code=2,
          message=f"{cut}: the compressed text is damaged or cut short")
    assert not (tmp_path / "tok").exists()


def test_prepare_on_a_full_disk_names_the_folder_and_keeps_its_work(prepared, tmp_path, capsys, monkeypatch):
    """numpy reports a short write in words ('1839677 requested and 1566656 written'), without errno."""
    import numpy as np

    def short(*a, **k):
        raise OSError("1839677 requested and 1566656 written")

    monkeypatch.setattr(np, "save", short)
    out = tmp_path / "d"
    fails(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok", "--out", out,
          "--workers", "1", "--quiet", code=1, message=f"no space left on {tmp_path / 'd.partial'}")
    assert (tmp_path / "d.partial").is_dir()  # kept for --resume once there is room
    monkeypatch.undo()
    assert cli(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok", "--out", out,
               "--workers", "1", "--quiet", "--resume")[0] == 0


def test_parquet_rows_without_text_are_noted(prepared, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = list(realdata.peoples_daily_lines()[:20])
    pq.write_table(pa.table({"text": texts[:5] + [None, None] + texts[5:]}), tmp_path / "c.parquet")
    code, _, err = cli(capsys, "prepare", "--corpus", tmp_path / "c.parquet", "--tokenizer", prepared / "tok",
                       "--out", tmp_path / "d", "--workers", "1", "--quiet")
    assert code == 0, err
    assert f"note: {tmp_path / 'c.parquet'}: 2 row(s) with no text (null in column 'text') skipped, the first row 6" \
        in err, err


def test_a_block_size_that_would_make_a_folder_per_few_bytes_is_refused(prepared, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    paragraphs = "\n\n".join(realdata.peoples_daily_lines()[:300]) + "\n\n"
    corpus.write_text(paragraphs * (11_000_000 // len(paragraphs.encode()) + 1), encoding="utf-8")  # 11 MB
    args = ["prepare", "--corpus", corpus, "--tokenizer", prepared / "tok", "--out", tmp_path / "d", "--quiet"]
    fails(capsys, *args, "--block-mb", "0.0001", code=2, message="--block-mb must be in [0.001, 1,048,576], got 0.0001")
    line = fails(capsys, *args, "--block-mb", "0.001", code=2, message="--block-mb 0.001: cuts this corpus")
    assert "blocks, a folder each; at most 10,000: give --block-mb 0.002 or more" in line, line
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.partial").exists()


# -- structured files through one guarded reader (issue 59, class 3) -------------------------------------------

def test_sentence_transformers_files_are_read_within_bounds_and_inside_the_folder(minilm_dir, tmp_path, capsys):
    from torchbert.io.hf import read_sentence_transformers

    def folder(name: str, modules=None, pooling=None) -> Path:
        f = tmp_path / name
        shutil.copytree(minilm_dir, f)
        if modules is not None:
            (f / "modules.json").write_text(modules if isinstance(modules, str) else json.dumps(modules))
        if pooling is not None:
            (f / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        return f

    good = json.loads((minilm_dir / "modules.json").read_text())
    cases = [
        ("deep", "[" * 10**5 + "]" * 10**5, "modules.json: not valid JSON (arrays or objects nested too deeply"),
        ("object", {"0": good[0]}, "modules.json: a sentence-transformers modules list is a list in JSON, this file "
                                   "holds an object"),
        ("types", [{"type": 7, "path": ""}], "modules.json: module 0 is not an object with a string 'type' and 'path'"),
        ("outside", [good[0], {**good[1], "path": "../../../etc"}], "modules.json: module 1's path ../../../etc leads "
                                                                     "out of the model folder"),
        ("huge", [{"type": "x" * 2_000_000}], "modules.json: 2,000,0"),
    ]
    for name, modules, message in cases:
        f = folder(name, modules)
        with pytest.raises(ValueError, match=re.escape(message)):
            read_sentence_transformers(f)
        code, _, err = cli(capsys, "embed", "--model", f, "--input", f / "vocab.txt", "--out", tmp_path / "e.npy")
        assert code == 2 and message in err.strip().splitlines()[-1] and len(err) < 600, err
    # the mode by name, as sentence-transformers 6 writes it: embeddings equal to sentence-transformers' own
    cls = folder("by-name", pooling={"embedding_dimension": 384, "pooling_mode": "cls"})
    assert read_sentence_transformers(cls) == {"pooling": "cls", "normalize": True}
    from sentence_transformers import SentenceTransformer

    texts = ["一个简单的句子。", "a second, English one"]
    code, _, err = cli(capsys, "embed", "--model", cls, "--input", _lines(tmp_path / "t.txt", texts), "--out",
                       tmp_path / "cls.npy", "--precision", "fp32", "--quiet")
    assert code == 0, err
    theirs = SentenceTransformer(str(cls), device="cpu").encode(texts)
    assert abs(np.load(tmp_path / "cls.npy") - theirs).max() < 1e-5


def test_a_tensorflow_index_entry_of_too_many_dimensions_is_refused_in_a_short_line():
    from torchbert.io.tf import CheckpointError, _entry

    def varint(n: int) -> bytes:
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out

    dim = b"\x08\x01"  # a dimension of size 1
    shape = (b"\x12" + varint(len(dim)) + dim) * 100_000
    entry = b"\x08\x01" + b"\x12" + varint(len(shape)) + shape
    with pytest.raises(CheckpointError) as e:
        _entry("bert/embeddings/word_embeddings", entry, "x.index")
    assert "more than 8 dimensions" in str(e.value) and len(str(e.value)) < 300


def test_a_tokenizer_json_far_larger_than_the_models_vocabulary_is_refused_unread(minilm_dir, tmp_path):
    from torchbert.io.vocab import VocabError
    from torchbert.tokenizer import BertTokenizer

    f = tmp_path / "m"
    f.mkdir()
    config = json.loads((minilm_dir / "config.json").read_text())
    (f / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    vocab = {f"tok{i}": i for i in range(200_000)}  # 3.6 MB: past what 100 tokens take
    (f / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": vocab}}))
    with pytest.raises(VocabError, match=r"tokenizer.json: [0-9,]+ bytes, more than a tokenizer.json holds"):
        BertTokenizer.from_pretrained(f)


def _lines(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return path


def test_a_config_too_large_for_this_machine_is_refused_before_it_is_built(prepared, tmp_path, capsys):
    from torchbert.config import BertConfig

    vocab = json.loads((prepared / "data" / "manifest.json").read_text())["vocab_size"]
    huge = {"model_type": "bert", "vocab_size": vocab, "hidden_size": 65536, "num_attention_heads": 64,
            "num_hidden_layers": 1024, "intermediate_size": 262144, "max_position_embeddings": 512}
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    line = fails(capsys, *pretrain_args(prepared / "data", tmp_path / "run", "--config", tmp_path / "huge.json"),
                 code=2, message=f"--config {tmp_path / 'huge.json'}: its sizes imply about")
    assert "GB to train in fp32, more than this machine's" in line and not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="pad_token_id 99 is not an id of the vocabulary of 50"):
        BertConfig(vocab_size=50, pad_token_id=99)


def test_a_sharded_checkpoint_reads_its_shards_and_none_outside_its_folder(minilm_dir, tmp_path):
    from safetensors.torch import save_file

    from torchbert.io.hf import read_weights

    weights = load_file(minilm_dir / "model.safetensors")
    names = sorted(weights)
    folder = tmp_path / "m"
    folder.mkdir()
    halves = {"model-1.safetensors": names[: len(names) // 2], "model-2.safetensors": names[len(names) // 2:]}
    for shard, keys in halves.items():
        save_file({k: weights[k] for k in keys}, folder / shard)
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {k: s for s, keys in halves.items() for k in keys}}))
    got = read_weights(index)
    assert got.keys() == weights.keys() and all(torch.equal(got[k], weights[k]) for k in names)
    shutil.copy(folder / "model-1.safetensors", tmp_path / "outside.safetensors")
    index.write_text(json.dumps({"weight_map": {names[0]: "../outside.safetensors"}}))
    with pytest.raises(ValueError, match=r"model.safetensors.index.json: the shard ../outside.safetensors lies outside"):
        read_weights(index)
    index.write_text(json.dumps({"weight_map": ["x"]}))
    with pytest.raises(ValueError, match="not a valid shard index"):
        read_weights(index)


def _seed_commands() -> list[str]:
    """The commands whose parser has a --seed flag."""
    from torchbert.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    return sorted(name for name, p in sub.choices.items()
                  if any("--seed" in a.option_strings for a in p._actions))


SEED_ARGV = {  # inputs that do not exist: a seed out of range is refused before any of them is read
    "compare": ["--out", "{p}/c"], "demo": ["--out", "{p}/d"], "inspect-data": ["{p}/nope"],
    "distill": ["--teacher", "{p}/nope", "--train", "{p}/a.tsv", "--out", "{p}/s", "--student-layers", "1"],
    "finetune": ["--task", "classification", "--model", "{p}/nope", "--train", "{p}/a.tsv", "--dev", "{p}/b.tsv",
                 "--out", "{p}/f"],
    "prepare": ["--corpus", "{p}/nope.txt", "--tokenizer", "{p}/nope", "--out", "{p}/o"],
    "pretrain": ["--data", "{p}/nope", "--out", "{p}/r"],
}


def test_every_seed_flag_is_one_type_checked_when_the_flags_are_read(tmp_path, capsys):
    """--seed -1 ended as numpy's 'expected non-negative integer', naming no flag, once the model was loaded:
    every command's --seed takes a whole number in [0, 2**32 - 1] and says so on the flag, at once."""
    from torchbert.settings import SEED_MAX

    assert _seed_commands() == sorted(SEED_ARGV)  # a new command's seed is held here too
    for command, argv in SEED_ARGV.items():
        argv = [command, *(a.format(p=tmp_path) for a in argv)]
        for bad in ("-1", str(SEED_MAX + 1)):
            line = fails(capsys, *argv, "--seed", bad, code=2, message="--seed must be in [0, 4,294,967,295], got ")
            assert line.endswith(f"got {int(bad):,}" if int(bad) > 0 else "got -1"), line
        assert list(tmp_path.iterdir()) == [], command  # nothing written


@pytest.mark.parametrize("flag, argv", [
    ("--epochs", ["finetune", "--task", "classification", "--model", "{p}/nope", "--train", "{p}/a.tsv", "--dev",
                  "{p}/b.tsv", "--out", "{p}/f"]),
    ("--budget", ["demo", "--out", "{p}/d"]),
    ("--budget", ["compare", "--out", "{p}/c"]),
    ("--max-wait-ms", ["serve", "--model", "{p}/nope"]),
    ("--body-timeout", ["serve", "--model", "{p}/nope"]),
])
def test_a_float_that_becomes_a_count_is_bounded_when_the_flags_are_read(flag, argv, tmp_path, capsys):
    """finetune --epochs 1e308 ran to 'unexpected OverflowError ... a bug in torchbert' after loading the model
    and tokenizing the data: each float that becomes a step count, a duration or a timer has an upper bound."""
    argv = [a.format(p=tmp_path) for a in argv]
    line = fails(capsys, *argv, flag, "1e308", code=2, message=f"{flag} must be in ")
    assert line.endswith("got 1e+308"), line
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_interval_of_0_says_what_0_means():
    from torchbert.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    helps = {a.dest: a.help for a in sub.choices["pretrain"]._actions}
    assert "0 (the default): only at the end" in helps["save_every"]
    assert "0 (the default): only at the end" in helps["eval_every"]


def test_an_optional_file_that_cannot_be_read_is_named(minilm_dir, tmp_path, capsys):
    """A malformed sentence_bert_config.json, special_tokens_map.json or torchbert.json was ignored without a
    word (exit 0, defaults used): the first two are a warning naming the file; a run record, whose defaults
    would change the vectors, an error naming it."""
    (tmp_path / "t.txt").write_text("one text\nanother\n", encoding="utf-8")
    for name in ("sentence_bert_config.json", "special_tokens_map.json", "torchbert.json"):
        model = tmp_path / name.split(".")[0]
        shutil.copytree(minilm_dir, model)
        (model / name).write_text("{not json", encoding="utf-8")
        argv = ["embed", "--model", model, "--input", tmp_path / "t.txt", "--out", tmp_path / f"{name}.npy", "--quiet"]
        if name == "torchbert.json":
            fails(capsys, *argv, code=2, message=f"{model / name}: not the run record torchbert writes")
            continue
        code, _, err = cli(capsys, *argv)
        assert code == 0 and f"{model / name}: not valid JSON" in err, err
