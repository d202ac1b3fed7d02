"""vocab -> prepare -> pretrain through the command line on People's Daily text; exact resume after SIGKILL."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import realdata
import torch
import transformers
from clihelp import cli
from safetensors.torch import load_file

from torchbert.cli import main


def pretrain_args(root, out, *extra):
    return ["pretrain", "--data", root / "data", "--out", out, "--config", "tiny", "--batch-size", "16",
            "--lr", "1e-3", "--warmup-steps", "5", "--log-every", "5", "--quiet", *extra]


@pytest.mark.e2e
def test_pretrain_end_to_end(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "40", "--eval-data", prepared / "eval",
                                                "--eval-every", "20", "--save-every", "20"))
    assert code == 0, err
    assert "pretrained 40 steps" in out and "held-out: MLM loss" in out
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "metrics.jsonl",
                 "metrics.json", "loss.png", "accuracy.png"):
        assert (run / name).is_file(), name
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5  # a falling loss curve
    assert "eval_mlm_accuracy" in rows[3] and "eval_nsp_accuracy" in rows[-1]
    summary = json.loads((run / "metrics.json").read_text())
    for key in ("steps", "tokens", "train_seconds", "tokens_per_second"):
        assert summary[key] > 0, key
    assert set(summary["eval"]) == {"mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"}
    # the run folder is a Hugging Face checkpoint
    hf = transformers.BertForPreTraining.from_pretrained(run)
    assert hf.config.vocab_size == json.loads((prepared / "data" / "manifest.json").read_text())["vocab_size"]
    tok = transformers.AutoTokenizer.from_pretrained(run)
    assert tok.tokenize("人民日报") == ["人", "民", "日", "报"]

    # phase two: longer sequences, starting from this run
    code, out, err = cli(capsys, "pretrain", "--data", prepared / "data128", "--out", tmp_path / "phase2", "--init", run,
                         "--steps", "5", "--batch-size", "8", "--quiet")
    assert code == 0, err


@pytest.mark.e2e
def test_mlm_objective_trains_a_masked_lm_without_dropout_and_resumes_as_one(prepared, tmp_path, capsys):
    """--objective mlm: BertForMaskedLM (no pooler, no NSP), a held-out MLM score alone; --dropout 0 reaches
    the config; --resume takes the run's objective and refuses another."""
    run = tmp_path / "run"
    code, out, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "10", "--objective", "mlm", "--dropout", "0",
                                                "--eval-data", prepared / "eval", "--save-every", "5"))
    assert code == 0, err
    assert "held-out: MLM loss" in out and "NSP" not in out
    config = json.loads((run / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    assert config["hidden_dropout_prob"] == config["attention_probs_dropout_prob"] == 0
    assert set(json.loads((run / "metrics.json").read_text())["eval"]) == {"mlm_loss", "mlm_accuracy"}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "nsp_loss" not in rows[0] and rows[-1]["mlm_loss"] < rows[0]["mlm_loss"]
    assert not any(k.startswith(("cls.seq_relationship", "bert.pooler")) for k in load_file(run / "model.safetensors"))
    hf = transformers.BertForMaskedLM.from_pretrained(run)  # transformers reads it as what it is
    assert hf.config.hidden_dropout_prob == 0
    code, _, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "15", "--resume", "--objective", "mlm+nsp"))
    assert code == 2 and "pretrains mlm; leave --objective out" in err
    code, _, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "15", "--resume", "--dropout", "0.1"))
    assert code == 2 and "--dropout 0.1 differs from the dropout the run" in err
    # the command that started the run, with --resume
    code, _, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "15", "--objective", "mlm", "--dropout", "0",
                                              "--resume"))
    assert code == 0, err
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()][-1] == 15
    from torchbert.apps.demo import checkpoint_model  # a masked LM's checkpoint as a model folder (demo, compare)
    step = int(sorted((run / "checkpoints").glob("step-*"))[0].name.removeprefix("step-"))
    checkpoint_model(run, step, tmp_path / "early")
    assert json.loads((tmp_path / "early" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert transformers.BertForMaskedLM.from_pretrained(tmp_path / "early").config.hidden_dropout_prob == 0
    code, _, err = cli(capsys, *pretrain_args(prepared, tmp_path / "gpt", "--steps", "1", "--model", "gpt",
                                              "--objective", "mlm"))
    assert code == 2 and "--objective is BERT's" in err


def test_existing_run_folder_is_refused(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared, run, "--steps", "5"))[0] == 0
    code, _, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "5"))
    assert code == 2 and "exists and is not empty; pass --resume" in err
    code, _, err = cli(capsys, *pretrain_args(prepared, run, "--steps", "5", "--overwrite"))
    assert code == 0, err
    code, _, err = cli(capsys, *pretrain_args(prepared, tmp_path / "none", "--steps", "5", "--resume"))
    assert code == 2 and "nothing to resume" in err


def test_vocab_mismatch_is_refused(prepared, tmp_path, capsys):
    other = tmp_path / "other.txt"
    other.write_text("\n".join(realdata.english_texts()[:300]) + "\n")
    assert main(["vocab", "--corpus", str(other), "--vocab-size", "500", "--out", str(tmp_path / "tok")]) == 0
    assert main(["prepare", "--corpus", str(other), "--tokenizer", str(tmp_path / "tok"), "--out",
                 str(tmp_path / "data"), "--max-seq-len", "64", "--quiet"]) == 0
    run = tmp_path / "run"
    assert cli(capsys, *pretrain_args(prepared, run, "--steps", "2"))[0] == 0
    code, _, err = cli(capsys, "pretrain", "--data", tmp_path / "data", "--out", tmp_path / "x", "--init", run,
                       "--steps", "2", "--quiet")
    assert code == 2 and "vocab mismatch" in err


def run_cli(args, env):
    return subprocess.Popen([sys.executable, "-m", "torchbert.cli", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.e2e
def test_sigkill_and_resume_is_bit_identical(prepared, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    args = ["--steps", "24", "--save-every", "4", "--keep", "2"]
    ref = run_cli(pretrain_args(prepared, tmp_path / "ref", *args), env)
    assert ref.wait(timeout=600) == 0, ref.stderr.read()
    done = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    step_seconds = done["train_seconds"] / done["steps"]  # this host's pace now: the kill comes within 3 steps

    run = tmp_path / "run"
    victim = run_cli(pretrain_args(prepared, run, *args), env)
    target = random.Random().choice([4, 8, 12])  # kill somewhere after this checkpoint
    deadline = time.time() + 300
    while not (run / "checkpoints" / f"step-{target:08d}").exists():
        assert victim.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    time.sleep(random.random() * 3 * step_seconds)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    assert not (run / "metrics.json").exists()  # it really died before the end

    resumed = run_cli(pretrain_args(prepared, run, *args, "--resume"), env)
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_trains_with_bf16_weights_and_fp32_masters_and_resumes_exactly(prepared, tmp_path, capsys, monkeypatch):
    """--precision bf16 in one CPU process: each step under fast.BF16Weights (the weights in bf16, the
    gradients back in fp32); finite, sensible losses; fp32 weights saved; a resume from the step-2
    checkpoint gives the uninterrupted run's weights bit for bit."""
    from torchbert import fast

    steps = []
    enter = fast.BF16Weights.__enter__
    monkeypatch.setattr(fast.BF16Weights, "__enter__", lambda self: steps.append(1) or enter(self))
    run = tmp_path / "bf16"
    args = pretrain_args(prepared, run, "--steps", "4", "--save-every", "2", "--log-every", "1", "--precision", "bf16")
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    assert len(steps) == 4
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["loss"] == r["loss"] and r["loss"] < 20 for r in rows)  # finite, sensible
    want = load_file(run / "model.safetensors")
    assert want["bert.embeddings.word_embeddings.weight"].dtype == torch.float32
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    code, out, err = cli(capsys, *args, "--resume")
    assert code == 0, err
    got = load_file(run / "model.safetensors")
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_heldout_documents_are_prepared_apart_and_evaluated(prepared, tmp_path, capsys):
    data = tmp_path / "data"
    code, out, err = cli(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok",
                         "--out", data, "--max-seq-len", "64", "--dupe-factor", "1", "--heldout-docs", "10", "--quiet",
                         "--masking", "dynamic")
    assert code == 0, err
    assert "held out: 10 documents" in out
    main_manifest = json.loads((data / "manifest.json").read_text())
    held_manifest = json.loads((data / "heldout" / "manifest.json").read_text())
    assert main_manifest["counts"]["documents"] == 90 and held_manifest["counts"]["documents"] == 10
    assert main_manifest["heldout"]["instances"] == held_manifest["counts"]["instances"] > 0
    assert held_manifest["vocab_sha256"] == main_manifest["vocab_sha256"]
    # the held-out set is masked once, the same for every evaluation, whatever the training data's masking
    assert (main_manifest["settings"]["masking"], held_manifest["settings"]["masking"]) == ("dynamic", "static")
    # the held-out documents' text is not in the training instances
    from torchbert.data.shards import PretrainingData

    def texts(folder):
        d = PretrainingData(folder, shuffle=False)
        return {tuple(d.instance(i)["tokens"][1:9].tolist()) for i in range(len(d))}

    assert not texts(data) & texts(data / "heldout")

    run = tmp_path / "run"
    code, out, err = cli(capsys, "pretrain", "--data", data, "--out", run, "--config", "tiny", "--steps", "3",
                         "--batch-size", "8", "--quiet")
    assert code == 0, err
    assert "held-out: MLM loss" in out
    assert set(json.loads((run / "metrics.json").read_text())["eval"]) >= {"mlm_accuracy", "nsp_accuracy"}

    for k in (1, 99):  # NotNext partners need two documents on each side
        code, _, err = cli(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok",
                           "--out", tmp_path / "x", "--heldout-docs", str(k), "--quiet")
        assert code == 2 and f"cannot spare {k} for evaluation (each side needs at least 2" in err
    # another --seed draws other documents
    code, _, err = cli(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok",
                       "--out", tmp_path / "seed2", "--max-seq-len", "64", "--dupe-factor", "1", "--heldout-docs", "10",
                       "--quiet", "--seed", "2")
    assert code == 0, err
    assert texts(tmp_path / "seed2" / "heldout") & texts(data)  # some were training documents under seed 1


@pytest.mark.slow
def test_sigkill_at_random_moments_always_resumes_to_the_uninterrupted_run(prepared, tmp_path):
    """24 runs with short log and save intervals, each killed (SIGKILL) twice at random moments of
    the whole command (start-up, a step, a checkpoint being written, an append to metrics.jsonl),
    then resumed (started afresh when no checkpoint was written yet) until it finishes: every one
    ends with the uninterrupted run's log and weights."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    args = ["--steps", "16", "--save-every", "2", "--log-every", "1", "--keep", "2"]
    began = time.time()
    ref = run_cli(pretrain_args(prepared, tmp_path / "ref", *args), env)
    assert ref.wait(timeout=600) == 0, ref.stderr.read()
    whole = time.time() - began
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "memory_gb")}  # noqa: E731
                          for x in path.read_text().splitlines()]
    want_log, want = strip(tmp_path / "ref" / "metrics.jsonl"), load_file(tmp_path / "ref" / "model.safetensors")
    rng, torn = random.Random(0), 0
    for trial in range(24):
        run, extra = tmp_path / f"run{trial}", []
        for attempt in range(6):
            proc = run_cli(pretrain_args(prepared, run, *args, *extra), env)
            if attempt < 2:
                time.sleep(rng.uniform(0, whole))
                proc.send_signal(signal.SIGKILL)
            code, err = proc.wait(timeout=600), proc.stderr.read()
            if code == 0:
                break
            torn += "dropped a torn last line" in err
            # killed, or a resume with nothing whole to continue from (killed before its first checkpoint)
            assert code == -signal.SIGKILL or (code == 2 and "resume" in err), err
            extra = ["--resume"] if code == -signal.SIGKILL else ["--overwrite"]
        assert code == 0, (trial, err)
        assert strip(run / "metrics.jsonl") == want_log, trial
        got = load_file(run / "model.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), trial
    print(f"24 runs, 48 kills; {torn} resumes dropped a torn log line")
