"""The training loop: learning, exact gradient accumulation, exact resume, bad steps, checkpoints."""

import json
import math
import time
import warnings

import numpy as np
import pytest
import torch
from parity import assert_parity
from tinyloop import NaNTask, RepeatData, V, cfg, tiny_model

from torchbert import fast
from torchbert.cli import main
from torchbert.errors import OutOfSpace, UserError
from torchbert.io.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from torchbert.train.loop import TrainingError, train
from torchbert.train.objectives import PretrainingTask


def killed(run, fail_after: int, **settings) -> None:
    """A run of the tiny model that a KeyboardInterrupt stops once `fail_after` batches were served
    (during step fail_after + 1), keeping the checkpoints it saved before."""
    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(), RepeatData(fail_after=fail_after), PretrainingTask(), cfg(**settings), run,
              log=lambda s: None)


def test_loss_falls_and_metrics_are_logged(tmp_path):
    model = tiny_model()
    summary = train(model, RepeatData(n=1024), PretrainingTask(),
                    cfg(steps=120, log_every=20, lr=1e-3, warmup_steps=5, schedule="constant_with_warmup"),
                    tmp_path, log=lambda s: None)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [20, 40, 60, 80, 100, 120]
    for key in ("step", "tokens", "loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "lr", "seconds"):
        assert key in lines[0], key
    assert lines[-1]["loss"] < 0.6 * lines[0]["loss"]
    assert lines[-1]["mlm_accuracy"] > lines[0]["mlm_accuracy"]
    assert lines[-1]["tokens"] > lines[0]["tokens"] > 0
    assert summary["steps"] == 120 and summary["tokens"] == lines[-1]["tokens"] and summary["tokens_per_second"] > 0


def test_the_run_reports_its_memory_each_log_and_its_peak_and_growth_at_the_end(tmp_path, monkeypatch):
    from torchbert.train import loop

    held = iter(range(1, 100))  # the resident memory at each read, in GB: 1, 2, 3, ... (one read a log, one at the end)
    monkeypatch.setattr(loop, "resident_bytes", lambda: next(held) * 10**9)
    peaks = iter([10**9])  # the process's peak: 1 GB as the run starts, 7.25 GB at its end
    monkeypatch.setattr(loop, "peak_resident_bytes", lambda: next(peaks, 7_250_000_000))
    summary = train(tiny_model(), RepeatData(n=256), PretrainingTask(), cfg(steps=60, log_every=10), tmp_path,
                    log=lambda s: None)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["memory_gb"] for r in lines] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # from the first log past a tenth of the steps (6): step 10 (1 GB); the end's read comes after the last log (7 GB)
    assert (summary["peak_memory_gb"], summary["memory_growth_gb"]) == (7.25, 6.0)
    monkeypatch.setattr(loop, "resident_bytes", lambda: None)  # where it cannot be read: no figure, no error
    summary = train(tiny_model(), RepeatData(n=256), PretrainingTask(), cfg(steps=20, log_every=10), tmp_path / "b",
                    log=lambda s: None)
    assert "memory_growth_gb" not in summary and summary["peak_memory_gb"] == 7.25
    assert "memory_gb" not in json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[0])
    # the process's peak came before the run (a study's earlier stage, a notebook's earlier run): the run's own
    held = iter([3, 2, 4, 3, 2])
    monkeypatch.setattr(loop, "resident_bytes", lambda: next(held) * 10**9)
    monkeypatch.setattr(loop, "peak_resident_bytes", lambda: 9 * 10**9)
    summary = train(tiny_model(), RepeatData(n=256), PretrainingTask(), cfg(steps=40, log_every=10), tmp_path / "c",
                    log=lambda s: None)
    assert summary["peak_memory_gb"] == 4.0


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    a, b = tiny_model(dropout=0.0), tiny_model(dropout=0.0)
    train(a, RepeatData(), PretrainingTask(), cfg(steps=3, batch_size=8, grad_accum=1), tmp_path / "a", log=lambda s: None)
    train(b, RepeatData(), PretrainingTask(), cfg(steps=3, batch_size=4, grad_accum=2), tmp_path / "b", log=lambda s: None)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert_parity(q, p, name)
    # and it is not trivially so: one micro-batch of 4 per step gives other weights
    c = tiny_model(dropout=0.0)
    train(c, RepeatData(), PretrainingTask(), cfg(steps=3, batch_size=4), tmp_path / "c", log=lambda s: None)
    assert any(not torch.allclose(p, q, atol=1e-4) for p, q in zip(a.parameters(), c.parameters()))


def test_interrupted_run_resumes_bit_identically(tmp_path):
    reference = tiny_model()
    train(reference, RepeatData(), PretrainingTask(), cfg(steps=10, save_every=3), tmp_path / "ref", log=lambda s: None)
    assert [p.name for p in list_checkpoints(tmp_path / "ref")] == ["step-00000006", "step-00000009", "step-00000010"]  # keep=3

    run = tmp_path / "run"
    killed(run, 7, steps=10, save_every=3)  # during step 8, after the checkpoint of step 6
    assert [p.name for p in list_checkpoints(run)] == ["step-00000003", "step-00000006"]
    resumed = tiny_model(seed=123)  # a different init: everything must come from the checkpoint
    train(resumed, RepeatData(), PretrainingTask(), cfg(steps=10, save_every=3), run, resume=True, log=lambda s: None)
    for (name, p), q in zip(reference.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    ref_log = (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()
    run_log = (run / "metrics.jsonl").read_text().splitlines()
    strip = lambda lines: [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "memory_gb")} for x in lines]  # noqa: E731
    assert strip(ref_log) == strip(run_log)


def scalars(run) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars of a run folder, as TensorBoard itself reads them (purged steps gone)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_every_metrics_line_is_also_a_tensorboard_scalar_and_a_resume_purges_the_killed_steps(tmp_path):
    run = tmp_path / "run"
    killed(run, 7, steps=10, save_every=3)  # logged steps 1-7, then resumed from the checkpoint of step 6
    before = scalars(run)
    assert [s for s, _ in before["lr"]] == list(range(1, 8))
    # TensorBoard reads a folder's event files in name order: the second the writer opened, then a count
    # of the writers this process opened. A resume is a later process; in one process within one second,
    # writer 10 would sort before writer 9
    time.sleep(1.05 - time.time() % 1)
    train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=10, save_every=3), run, resume=True,
          log=lambda s: None)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    got = scalars(run)
    assert {"mlm_loss", "lr", "tokens", "tokens_per_second"} <= set(got)
    for key in ("mlm_loss", "lr", "tokens"):  # steps 1-10 once each: 7 of the killed run purged, resumed at 6
        assert got[key] == [(x["step"], pytest.approx(x[key], rel=1e-6)) for x in lines], key
    off = tmp_path / "off"
    train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=2, log_to="none"), off, log=lambda s: None)
    assert (off / "metrics.jsonl").is_file() and not (off / "tensorboard").exists()


def test_a_signal_in_the_last_step_still_stops_the_process_once_the_run_is_saved(tmp_path):
    import signal

    from torchbert.errors import Interrupted

    # in an earlier step: a checkpoint of that step, then Interrupted
    with pytest.raises(Interrupted):
        train(tiny_model(), RepeatData(signal_at=(signal.SIGINT, 2)), PretrainingTask(), cfg(steps=3),
              tmp_path / "early", log=lambda s: None)
    assert [p.name for p in list_checkpoints(tmp_path / "early")] == ["step-00000002"]
    # in the last: the whole run saved, and the signal still reaches the process (it was swallowed: a demo
    # stopped by SIGTERM in a short pretraining went on to its next stage). Python's own SIGINT handler in
    # place, whatever an earlier test of the session left there (in CI's order, one left another)
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            train(tiny_model(), RepeatData(signal_at=(signal.SIGINT, 3)), PretrainingTask(), cfg(steps=3),
                  tmp_path / "last", log=lambda s: None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler before is back
    finally:
        signal.signal(signal.SIGINT, found)
    assert [p.name for p in list_checkpoints(tmp_path / "last")] == ["step-00000003"]


def test_a_run_whose_thread_count_changed_says_it_cannot_be_repeated_bit_for_bit(tmp_path):
    before = torch.get_num_threads()
    lines = []
    try:
        torch.set_num_threads(2)
        first = train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=2, save_every=2), tmp_path,
                      log=lines.append)
        assert first["threads"] == [2] and first["repeatable"] and not any("bit for bit" in x for x in lines)
        torch.set_num_threads(1)  # as the governor does when another job starts (fast/threads.py)
        resumed = train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=4, save_every=2), tmp_path,
                        resume=True, log=lines.append)
    finally:
        torch.set_num_threads(before)
    assert resumed["threads"] == [2, 1] and not resumed["repeatable"]  # the earlier steps' count kept
    assert any("computed with 2 then 1 CPU threads" in x and "--threads N" in x for x in lines), lines


def test_damaged_checkpoint_falls_back_with_a_warning(tmp_path):
    train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=6, save_every=2), tmp_path, log=lambda s: None)
    newest = list_checkpoints(tmp_path)[-1]
    data = (newest / "model.safetensors").read_bytes()
    (newest / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.warns(UserWarning, match="damaged checkpoint.*model.safetensors does not match its hash"):
        found = latest_checkpoint(tmp_path)
    assert found.name == "step-00000004"
    (found / "manifest.json").unlink()
    with pytest.warns(UserWarning, match="no readable manifest"):
        assert latest_checkpoint(tmp_path).name == "step-00000002"


def test_failed_checkpoint_write_keeps_the_previous(tmp_path, monkeypatch):
    train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=2), tmp_path, log=lambda s: None)
    import torchbert.io.checkpoint as ck

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "save_file", disk_full)
    with pytest.raises(OutOfSpace, match="no space left on .*checkpoints"):
        train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=4, save_every=2), tmp_path, resume=True,
              log=lambda s: None)
    names = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    assert names == ["step-00000002"]  # no partial folder left, the old one intact
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert latest_checkpoint(tmp_path).name == "step-00000002"


def test_nan_steps_are_skipped_and_counted(tmp_path):
    logs = []
    summary = train(tiny_model(), RepeatData(), NaNTask({2, 3}), cfg(steps=4), tmp_path, log=logs.append)
    assert summary["skipped_steps"] == 2 and summary["steps"] == 4
    assert sum("step skipped" in line for line in logs) == 2
    for p in tiny_model().parameters():
        assert torch.isfinite(p).all()
    with pytest.raises(TrainingError, match="NaN or inf for 3 steps in a row"):
        train(tiny_model(), RepeatData(), NaNTask(set(range(100))), cfg(steps=4, max_bad_steps=3), tmp_path / "x",
              log=lambda s: None)


@pytest.fixture
def deferred(monkeypatch):
    """The loop's deferred reads (its GPU mode) on CPU: the verdicts stay tensors until the log cadence."""
    import torchbert.train.loop as loop

    monkeypatch.setattr(loop, "_deferred_reads", lambda device: True)


def test_deferred_reads_train_exactly_as_the_step_by_step_reads(tmp_path, monkeypatch):
    import torchbert.train.loop as loop

    runs = {}
    for mode in (False, True):
        monkeypatch.setattr(loop, "_deferred_reads", lambda device, mode=mode: mode)
        model = tiny_model()
        summary = train(model, RepeatData(), PretrainingTask(), cfg(steps=6, log_every=4), tmp_path / str(mode),
                        log=lambda s: None)
        lines = [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "memory_gb")}
                 for x in (tmp_path / str(mode) / "metrics.jsonl").read_text().splitlines()]
        runs[mode] = (model, summary, lines)
    for (name, p), q in zip(runs[False][0].named_parameters(), runs[True][0].parameters()):
        assert torch.equal(p, q), name
    assert runs[False][2] == runs[True][2] and len(runs[True][2]) == 2
    assert runs[False][1]["tokens"] == runs[True][1]["tokens"]


def test_deferred_reads_skip_nan_steps_on_the_device_and_count_them_at_the_log(tmp_path, deferred):
    logs = []
    model = tiny_model()
    summary = train(model, RepeatData(), NaNTask({2, 3}), cfg(steps=5, log_every=5), tmp_path, log=logs.append)
    # deferred, a skipped step still counts as a step (its batch is used, the schedule moves on)
    assert summary["skipped_steps"] == 2 and summary["steps"] == 5
    assert [line for line in logs if "skipped" in line] == [
        "steps 2, 3: the loss or its gradient norm was NaN or inf; skipped on the device (2 so far)"]
    saved = load_checkpoint(latest_checkpoint(tmp_path))
    assert {float(s["step"]) for s in saved.optimizer["state"].values()} == {3.0}  # AdamW took 3 of the 5
    assert saved.state["skipped_steps"] == 2
    for p in model.parameters():
        assert torch.isfinite(p).all()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert np.isfinite(record["loss"]) and record["tokens"] > 0
    with pytest.raises(TrainingError, match="NaN or inf for 3 steps in a row at step 3"):
        train(tiny_model(), RepeatData(), NaNTask(set(range(100))), cfg(steps=4, max_bad_steps=3, log_every=2),
              tmp_path / "x", log=lambda s: None)


def test_only_the_cli_keeps_freed_memory(tmp_path, monkeypatch, prepared):
    """The allocator setting changes the whole process: train(), a library call, never makes it; the
    CLI's training commands do, unless --no-fast."""
    calls = []
    monkeypatch.setattr(fast, "keep_freed_memory", lambda: calls.append(True))
    train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=1), tmp_path / "lib", log=lambda s: None)
    assert calls == []
    common = ["pretrain", "--data", str(prepared / "data"), "--config", "tiny", "--steps", "1", "--batch-size", "4", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "plain"), "--no-fast"]) == 0
    assert calls == []
    assert main([*common, "--out", str(tmp_path / "fast")]) == 0
    assert calls == [True]


def test_a_training_command_says_its_peak_memory_and_when_its_heap_fragmented(tmp_path, monkeypatch, capsys,
                                                                              prepared):
    from torchbert.fast import memory
    from torchbert.train import loop

    monkeypatch.setattr(memory, "_done", True)  # glibc keeping freed memory
    monkeypatch.setattr(memory, "allocator", lambda library=None: "glibc")
    monkeypatch.setattr(fast, "keep_freed_memory", lambda: True)
    peaks = iter([10**9])  # 1 GB as the first run starts (it reached the peak itself)
    monkeypatch.setattr(loop, "peak_resident_bytes", lambda: next(peaks, 6 * 10**9))
    held = iter([2, 3, 3, 4])  # a log a step; growth counts from step 3 (the first steps allocate)
    monkeypatch.setattr(loop, "resident_bytes", lambda: next(held, 5) * 10**9)
    common = ["pretrain", "--data", str(prepared / "data"), "--config", "tiny", "--steps", "4", "--batch-size", "4",
              "--log-every", "1", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "grew")]) == 0
    out, err = capsys.readouterr()
    assert "peak memory 6.0 GB) ->" in out
    assert "note: this process's memory grew by 2.0 GB after the run's first tenth (peak 6.0 GB)" in err
    assert json.loads((tmp_path / "grew" / "metrics.json").read_text())["memory_growth_gb"] == 2.0
    monkeypatch.setattr(loop, "resident_bytes", lambda: 5 * 10**9)  # level
    assert main([*common, "--out", str(tmp_path / "level")]) == 0
    err = capsys.readouterr().err
    assert "grew by" not in err and "jemalloc" not in err
    monkeypatch.setattr(memory, "allocator", lambda library=None: "jemalloc")  # its pages decaying, as by default
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    assert main([*common, "--out", str(tmp_path / "jemalloc")]) == 0
    assert "note: jemalloc's pages decay (its default): it hands freed memory back" in capsys.readouterr().err


def test_a_task_per_step_count_divides_each_step_instead_of_its_own_count(tmp_path):
    """task.per_step (fine-tuning: the average over the data) replaces each step's own target count."""
    class Fixed(PretrainingTask):
        per_step = {"mlm": 5.0, "nsp": 3.0}  # a batch of 8 holds 16 masked tokens and 8 NSP labels

    grads = {}
    for name, task in (("fixed", Fixed()), ("own", PretrainingTask())):
        model = tiny_model(dropout=0.0)
        model.nsp.weight.register_hook(lambda g, name=name: grads.setdefault(name, g.clone()))
        train(model, RepeatData(), task, cfg(steps=1), tmp_path / name, log=lambda s: None)
    ref = tiny_model(dropout=0.0)
    parts = PretrainingTask().forward(ref, next(RepeatData().batches(8)))
    (parts["mlm"][0] / 5.0 + parts["nsp"][0] / 3.0).backward()
    assert_parity(grads["fixed"], ref.nsp.weight.grad)
    assert_parity(grads["own"], ref.nsp.weight.grad * 3.0 / 8.0)


def test_finetuning_divides_by_the_average_step_count():
    """Token tasks: the labelled tokens of an average step, so a token of a short sentence in a
    length-sorted batch weighs what one of a long sentence does."""
    from types import SimpleNamespace

    from torchbert.losses import IGNORE
    from torchbert.tasks.families import family
    from torchbert.train.finetune import targets_per_step

    labels = [[IGNORE, 1, 2, IGNORE], [IGNORE, 0, IGNORE], [IGNORE, 1, 1, 1, 2, IGNORE]]  # 2 + 1 + 4 labelled

    class Data:
        encoded = SimpleNamespace(labels=labels, input_ids=labels)

        def __init__(self, task_type):
            self.family = family(task_type)

        def __len__(self):
            return 3

    assert targets_per_step(Data("token"), 2) == pytest.approx(7 * 2 / 3)
    assert targets_per_step(Data("token"), 32) == 7  # a step larger than the data: all of it
    assert targets_per_step(Data("classification"), 2) == 2


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(UserError, match="holds no whole checkpoint"):
        train(tiny_model(), RepeatData(), PretrainingTask(), cfg(), tmp_path, resume=True, log=lambda s: None)


def _compiled_matches_eager(backend: str) -> None:
    eager, compiled = tiny_model(dropout=0.0), tiny_model(dropout=0.0)
    compiled.compile(dynamic=True, backend=backend)
    task = PretrainingTask()
    for batch in list(RepeatData(n=32).batches(8))[:2]:
        a, c = task.forward(eager, batch), task.forward(compiled, batch)
        for part in task.parts:
            assert_parity(c[part][0], a[part][0], part)
        sum(v[0] for v in a.values()).backward()
        sum(v[0] for v in c.values()).backward()
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        assert_parity(q.grad, p.grad, name)
    assert list(dict(compiled.named_parameters())) == list(dict(eager.named_parameters()))


@pytest.mark.e2e
def test_compiled_model_traces():
    """`pretrain --compile`: the compiler traces the model (its autograd functions included) over
    two batches of other lengths, with the plain model's losses and gradients. The aot_eager backend
    runs the traced graphs without generating code, so this is quick."""
    _compiled_matches_eager("aot_eager")


@pytest.mark.slow
def test_compiled_model_matches_eager():
    """torch.compile's default backend (generated C++ kernels): the plain model's numbers (~1.5 min)."""
    _compiled_matches_eager("inductor")


def test_a_checkpoint_inside_a_log_window_resumes_to_the_same_log_lines(tmp_path):
    settings = dict(steps=10, save_every=3, log_every=4)
    train(tiny_model(), RepeatData(), PretrainingTask(), cfg(**settings), tmp_path / "ref", log=lambda s: None)
    run = tmp_path / "run"
    killed(run, 7, **settings)  # during step 8: the checkpoint of step 6 holds half a window
    summary = train(tiny_model(seed=5), RepeatData(), PretrainingTask(), cfg(**settings), run, resume=True,
                    log=lambda s: None)
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "memory_gb")}  # noqa: E731
                          for x in path.read_text().splitlines()]
    ref = strip(tmp_path / "ref" / "metrics.jsonl")
    assert [r["step"] for r in ref] == [4, 8, 10]
    assert strip(run / "metrics.jsonl") == ref
    assert summary["tokens"] == ref[-1]["tokens"] > 0


def test_evaluation_time_is_counted_apart_from_training(tmp_path):
    import time

    def evaluate(model):
        time.sleep(0.4)
        return {"x": 1.0}

    start = time.perf_counter()
    summary = train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=4, eval_every=2), tmp_path,
                    evaluate=evaluate, log=lambda s: None)
    wall = time.perf_counter() - start
    assert summary["eval_seconds"] >= 0.8  # after steps 2 and 4
    assert summary["train_seconds"] + summary["eval_seconds"] <= wall
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["seconds"] <= summary["train_seconds"] + 1e-3


def test_the_loop_checks_each_batch_s_ids_on_the_host_before_it_moves(tmp_path, monkeypatch):
    """The check runs once per micro-batch, in the loop on the host tensors; the model never checks."""
    import torchbert.train.loop as loop_module

    seen = []
    plain = loop_module.check_ids
    monkeypatch.setattr(loop_module, "check_ids",
                        lambda config, ids, *a: seen.append((config.vocab_size, ids.device.type)) or plain(config, ids, *a))
    train(tiny_model(), RepeatData(), PretrainingTask(), cfg(steps=3, grad_accum=2), tmp_path / "a", log=lambda s: None)
    assert seen == [(V, "cpu")] * 6

    class OutOfVocab(RepeatData):
        def batch(self, indices, epoch):
            b = super().batch(indices, epoch)
            b.input_ids[3] = V + 7
            return b

    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"input_ids out of range: values in \[\d+, {V + 7}\] but vocab_size is {V}"):
        train(model, OutOfVocab(), PretrainingTask(), cfg(steps=2), tmp_path / "b", log=lambda s: None)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # refused before any step


def test_a_torn_last_log_line_is_dropped_at_every_byte_and_a_damaged_earlier_one_is_named(tmp_path):
    """A kill in the middle of an append leaves any prefix of metrics.jsonl's last line: each one is
    dropped with a note (or kept whole when only its newline is missing); a bad line before the last
    stops the resume with its file and line."""
    from torchbert.train.metrics import truncate_metrics

    records = [{"step": s, "loss": 1.0 / s, "note": "损失"} for s in (1, 2, 3, 4)]
    lines = [json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records]
    head, last = b"".join(lines[:3]), lines[3]
    path = tmp_path / "metrics.jsonl"
    for cut in range(len(last)):  # the last line's first `cut` bytes (0: nothing of it yet)
        path.write_bytes(head + last[:cut])
        notes = []
        truncate_metrics(path, 3, notes.append)
        assert [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()] == records[:3], cut
        torn = 0 < cut < len(last) - 1
        assert len(notes) == torn and (not torn or "metrics.jsonl:4: dropped a torn last line" in notes[0]), cut
    path.write_bytes(head + last[:-1])  # whole but for its newline: kept when the checkpoint is past it
    truncate_metrics(path, 4, lambda s: None)
    assert [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()] == records
    path.write_bytes(lines[0] + b'{"step": 2, "lo\n' + lines[2])
    with pytest.raises(UserError, match=r"metrics.jsonl:2: not a JSON record"):
        truncate_metrics(path, 3, lambda s: None)
    path.write_bytes(lines[0] + b'[2]\n' + lines[2])  # JSON, but no record
    with pytest.raises(UserError, match=r"metrics.jsonl:2: not a JSON record \(not a JSON object\)"):
        truncate_metrics(path, 3, lambda s: None)


def test_a_log_window_counts_only_the_steps_taken():
    """Window: a discarded step adds nothing; a deferred step's figures count once its verdict is read
    true; flush gives per part the mean loss and accuracy (nan without targets) and their losses' sum."""
    from types import SimpleNamespace

    from torchbert.train.distributed import Dist
    from torchbert.train.metrics import Window, postfix

    def step(w, loss, correct, n, tokens=10):
        w.add({"mlm": (torch.tensor(loss), torch.tensor(correct)), "nsp": (torch.tensor(1.0), torch.tensor(1))},
              {"mlm": n, "nsp": 2}, tokens)

    w = Window(("mlm", "nsp"), Dist(), torch.device("cpu"))
    step(w, 100.0, 100, 100)
    w.discard()  # a skipped step
    step(w, 6.0, 3, 4)
    w.commit(torch.tensor(True))
    step(w, 50.0, 50, 50)
    w.commit(torch.tensor(False))  # its figures never count, nor its counts once read
    assert w.settle() == [True, False] and w.settle() == []
    step(w, 2.0, 1, 4, tokens=5)
    w.commit()
    state = SimpleNamespace(tokens=0, seconds=2.0)
    got = w.flush(state)
    assert got == {"loss": pytest.approx(8 / 8 + 2 / 4), "mlm_loss": 1.0, "mlm_accuracy": 0.5, "nsp_loss": 0.5,
                   "nsp_accuracy": 0.5}
    assert state.tokens == 15 and postfix(got, state, 1e-4)["tok/s"] == "8"
    assert math.isnan(w.flush(state)["mlm_accuracy"])  # a fresh window: no targets
    # a checkpoint's window, loaded by a second process, keeps its counts on process 0 alone
    step(w, 6.0, 3, 4)
    w.commit()
    saved = w.saved()
    other = Window(("mlm", "nsp"), Dist(rank=1, world_size=2), torch.device("cpu"))
    other.load(saved)
    assert other.counts == [0, 0, 0] and other.figures.tolist() == [[6.0, 3.0], [1.0, 1.0]]


def test_scalars_are_the_numbers_of_a_record_and_the_bar_is_quiet_in_a_log_file(tmp_path, monkeypatch):
    import sys
    from types import SimpleNamespace

    from torchbert.train.metrics import Scalars, progress_bar

    written = []
    with Scalars(tmp_path, "none") as s:
        s.writer = SimpleNamespace(add_scalar=lambda *a: written.append(a), close=lambda: None)
        s.add({"step": 3, "loss": 1.5, "skipped": True, "tag": "x", "tokens": 400, "seconds": 2.0})
    assert written == [("loss", 1.5, 3), ("tokens", 400, 3), ("seconds", 2.0, 3), ("tokens_per_second", 200.0, 3)]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)  # a log file
    bar = progress_bar(SimpleNamespace(progress=True, steps=5), 0)
    assert bar.mininterval == 10
    bar.close()
    assert progress_bar(SimpleNamespace(progress=False, steps=5), 0) is None


def test_a_run_killed_mid_append_resumes_bit_identically(tmp_path):
    reference = tiny_model()
    train(reference, RepeatData(), PretrainingTask(), cfg(steps=6, save_every=3), tmp_path / "ref", log=lambda s: None)
    run = tmp_path / "run"
    killed(run, 4, steps=6, save_every=3)  # during step 5, after the checkpoint of step 3
    log_file = run / "metrics.jsonl"
    data = log_file.read_bytes()
    log_file.write_bytes(data[: len(data) - 40])  # the last line (step 4) cut in the middle
    notes = []
    resumed = tiny_model(seed=5)
    train(resumed, RepeatData(), PretrainingTask(), cfg(steps=6, save_every=3), run, resume=True, log=notes.append)
    assert any("metrics.jsonl:4: dropped a torn last line" in n for n in notes), notes
    for (name, p), q in zip(reference.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "memory_gb")}  # noqa: E731
                          for x in path.read_text().splitlines()]
    assert strip(log_file) == strip(tmp_path / "ref" / "metrics.jsonl")


def test_a_step_weighs_each_part_of_the_objective_over_the_steps_targets():
    """forward_backward: each part's sum over its targets, divided by the step's count of them (all
    micro-batches), times the objective's weight for it (ELECTRA's replaced-token part: 50)."""
    from torchbert.train.distributed import Dist
    from torchbert.train.loop import forward_backward

    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))

    class TwoParts:
        parts = ("mlm", "rtd")
        weights = {"rtd": 50.0}

        def forward(self, model, batch):  # sums over 4 and 2 targets
            return {"mlm": (w.sum() * 3, torch.tensor(4)), "rtd": (w.prod(), torch.tensor(2))}

    loss, parts = forward_backward(None, TwoParts(), None, {"mlm": 8, "rtd": 5}, "fp32", torch.device("cpu"),
                                   Dist(), sync=True)
    assert loss.item() == pytest.approx(3 * 3 / 8 + 50 * 2 / 5)
    assert w.grad.tolist() == pytest.approx([3 / 8 + 50 * 2 / 5, 3 / 8 + 50 * 1 / 5])


def test_each_process_takes_back_its_own_random_state():
    """A checkpoint of 2 processes holds process 1's torch RNG state beside process 0's: resumed, process
    1 takes its own (its dropout masks go on as they would have), and a process the saving run did not
    have takes process 0's."""
    from torchbert.io.checkpoint import Checkpoint, rng_state

    before = torch.get_rng_state()
    try:
        plain, tensors = rng_state()
        torch.manual_seed(1)
        one = torch.get_rng_state()
        saved = Checkpoint({}, {}, {}, {}, plain, {**tensors, "torch_rank1": one})
        for rank, want in ((0, tensors["torch"]), (1, one), (2, tensors["torch"])):
            torch.manual_seed(99)
            saved.restore_rng(rank)
            assert torch.equal(torch.get_rng_state(), want), rank
    finally:
        torch.set_rng_state(before)


def test_resume_and_overwrite_together_are_refused_before_anything_is_touched(tmp_path):
    from torchbert.errors import UserError
    from torchbert.train.rundir import RunFolder

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UserError, match=r"^--resume and --overwrite contradict each other; pick one$"):
        RunFolder(tmp_path / "run", resume=True, overwrite=True, inputs={})
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "{}\n"


def test_a_run_resumed_on_more_processes_shares_its_batch_among_them(tmp_path):
    """A run of 16 sequences a step (1 process x 16) resumed on 2 processes takes 8 each; on 3, which
    cannot share 16 evenly, it is refused."""
    import dataclasses

    from torchbert.errors import UserError
    from torchbert.io.record import with_training
    from torchbert.train.rundir import fixed, resumed_config

    run = cfg(batch_size=16)
    with_training(tmp_path, fixed(run, 1), "pretrain")
    two, _ = resumed_config(tmp_path, run, given=(), world_size=2)
    assert (two.batch_size, two.lr, two.steps) == (8, run.lr, run.steps)
    with pytest.raises(UserError, match="took 16 sequences a micro-batch, which 3 processes cannot share evenly"):
        resumed_config(tmp_path, run, given=(), world_size=3)
    # and the precision it learned in is kept: another one, given, is refused
    with pytest.raises(UserError, match=r"^--precision bf16: the run in .* started with fp32"):
        resumed_config(tmp_path, dataclasses.replace(run, precision="bf16"), given=("precision",))
