"""The one training loop, written out: pretraining and fine-tuning both train through `train()`.

Per optimizer step:
  1. take `grad_accum` micro-batches from the data stream;
  2. count each loss part's targets over all of them (masked tokens for MLM, sequences for NSP),
     so the loss of the accumulated batch is normalized exactly as one big batch would be;
  3. forward and backward each micro-batch (autocast in bf16 when asked);
  4. skip the step if the loss is NaN or inf (counted; too many in a row stops the run);
  5. clip the gradient norm, step the optimizer and the schedule (in one process the embeddings'
     gradients arrive as rows and are added into dense buffers kept across steps: fast.SparseRows);
     a NaN or inf gradient norm skips the step like a NaN loss;
  6. log, evaluate and checkpoint on their cadences;
  7. after SIGINT or SIGTERM (Ctrl-C, a scheduler's stop): checkpoint and raise Interrupted. The
     signal is only noted when it comes; the step in flight finishes, and under torchrun the
     processes agree on it through the all-reduce each step makes anyway. A second signal abandons
     the step at once (KeyboardInterrupt) and keeps the checkpoints already written.
With TrainConfig.fast (the default) the model trains with torchbert.fast's pieces swapped in
(fast.training), and is put back as it was when train() returns.

Host syncs. On CPU: one per optimizer step, reading whether the step's loss and gradient norm are
finite (under torchrun a second, whether a process was signalled). On a GPU, where each such read
stalls the device, none in the step (deferred reads): a non-finite step is skipped on the device
by the fused AdamW (clipped_step(defer=True)), its figures left out of the window on the device,
and the verdicts of the steps since the last read are read together at the log cadence, where
skipped steps are counted, logged and held to max_bad_steps; a skipped step still counts as a step
(its batches are used and the schedule moves on). Under torchrun the signal flag that rides on the
step's all-reduce is read one step late, when the device has long passed it. The loss parts,
correct predictions and token counts add up on the device and are read at the log cadence; the
ids of each micro-batch are range-checked on the host before they move. The seconds reported are
training's alone: evaluation's are counted apart (eval_seconds).

The model is known only through its objective (train/objectives.py: what a batch's loss parts
are) and its `config` (what ids fit it: config.check_ids). A run's position is a TrainState, which
saves itself into each checkpoint and is read back on resume; `forward_backward` is one
micro-batch, `skip_step` a step whose loss or gradient was not finite.

The data source gives `batches(batch_size, epoch=, start=)`, where `start` counts the global
batches of that epoch already used: resuming skips straight there.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from torch import Tensor, nn

from .. import fast
from ..fast import threads
from ..config import check_ids
from ..errors import Interrupted, RunFailed, UserError, interrupt_raised
from ..hardware import peak_resident_bytes, resident_bytes
from ..io.checkpoint import (PREFIX, latest_checkpoint, list_checkpoints, load_checkpoint, no_checkpoint,
                             remove_leftovers, save_checkpoint)
from ..settings import Checked, seed_setting, setting
from .distributed import Dist, full_optimizer_state, full_state_dict, load_full_state, unwrap
from .metrics import Scalars, Window, append_jsonl, postfix, progress_bar, truncate_metrics
from .objectives import Objective
from .optim import OPTIMIZERS, SCHEDULES, clipped_step, make_optimizer, make_scheduler


class TrainingError(RunFailed):
    """The run cannot go on (e.g. the loss stayed NaN); the last good checkpoint is kept."""


PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainConfig(Checked):
    """How the loop trains: every field is a flag of `pretrain` (and, but for those fine-tuning derives
    from its epochs, of `finetune`), declared here once with its default, help and bounds."""

    steps: int = setting(1000, "optimizer steps", low=1)
    batch_size: int = setting(32, "sequences per micro-batch on each process (under torchrun the global batch "
                                  "is batch-size x processes x grad-accum)", low=1)
    grad_accum: int = setting(1, "micro-batches per optimizer step", low=1)
    lr: float = setting(1e-4, "peak learning rate (default: 1e-4, as BERT)", above=0)
    warmup_steps: int = setting(100, "linear warmup steps", low=0)
    schedule: str = setting("linear", "the learning rate after warmup: constant, constant_with_warmup, linear, cosine, "
                                      "cosine_with_restarts or polynomial", choices=SCHEDULES, metavar="NAME")
    weight_decay: float = setting(0.01, "AdamW/LAMB decay, not on biases and LayerNorm", low=0)
    optimizer: str = setting("adamw", "adamw, or lamb for large batches", choices=OPTIMIZERS)
    max_grad_norm: float = setting(1.0, "gradient clipping; 0 turns it off", low=0)
    seed: int = seed_setting(0, "the seed of the weights, the data order and dropout")
    save_every: int = setting(0, "checkpoint every N steps; 0 (the default): only at the end", low=0)
    keep: int = setting(2, "checkpoints to keep", low=1)
    log_every: int = setting(10, "a metrics.jsonl line every N steps", low=1)
    log_to: str = setting("tensorboard", "tensorboard: each metrics.jsonl line also as TensorBoard scalars in "
                                         "RUN/tensorboard (`tensorboard --logdir RUN`); none: metrics.jsonl only",
                          choices=("tensorboard", "none"))
    eval_every: int = setting(0, "held-out evaluation every N steps; 0 (the default): only at the end", low=0)
    precision: str = setting("fp32", "bf16: the forward and backward in bfloat16, the optimizer and the saved "
                                     "weights in fp32. In one CPU process the weights are held in bf16 for each step "
                                     "(fast/bf16.py; a CPU with AMX or AVX512-BF16 multiplies bf16 2.7-4x faster "
                                     "than fp32, `torchbert env` says); under torchrun, on a GPU or with --no-fast, "
                                     "torch.autocast, and on a GPU attention over the packed batch runs "
                                     "FlashAttention's varlen kernel", choices=PRECISIONS)
    max_bad_steps: int = setting(20, "consecutive steps with a non-finite loss before the run stops", low=1,
                                 cli=False)
    progress: bool = setting(True, "a progress bar (the command line's --quiet turns it off)", cli=False)
    fast: bool = setting(True, "train the plain model: without torchbert.fast's CPU pieces (dropout masks, "
                               "attention, the fused MLM loss, embedding gradients as rows, the allocator kept "
                               "warm); slower, for comparing against the plain path", flag="--no-fast")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return contextlib.nullcontext()


class Stream:
    """Batches across epochs from a position (epoch, global batches used in it), tracking it."""

    def __init__(self, data, batch_size: int, epoch: int = 0, start: int = 0):
        self.data, self.batch_size, self.epoch, self.start = data, batch_size, epoch, start
        self._it: Iterator | None = None

    def next(self):
        while True:
            if self._it is None:
                self._it = iter(self.data.batches(self.batch_size, epoch=self.epoch, start=self.start))
            batch = next(self._it, None)
            if batch is not None:
                self.start += 1
                return batch
            if self.start == 0:
                raise UserError("the training data yields no batch: fewer instances than one global batch")
            self.epoch, self.start, self._it = self.epoch + 1, 0, None

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "start": self.start}


SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class StopSignals:
    """While open, SIGINT and SIGTERM are noted (`caught`) instead of stopping the process; a second
    one raises KeyboardInterrupt. Only the main thread can take signals: elsewhere it does nothing."""

    def __init__(self, log: Callable[[str], None]):
        self.log, self.caught, self.signum, self._old = log, None, None, {}

    def _handle(self, signum, frame) -> None:
        if self.caught is not None:
            interrupt_raised()
            raise KeyboardInterrupt
        self.caught, self.signum = SIGNALS[signum], signum
        self.log(f"{self.caught}: stopping after this step and saving a checkpoint (again to stop at once, "
                 "keeping only the checkpoints already written)")

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


def pass_on(signum: int) -> None:
    """Deliver a signal that was held to the handler now in place, at once: Python's (a KeyboardInterrupt)
    or the process's own, called here rather than raised again (a raised signal's Python handler runs at
    some later instruction, where a finalizer running then swallows its KeyboardInterrupt)."""
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


@dataclass
class TrainState:
    """Where a run is: the steps taken, the data stream's position (epoch, global batches used in it),
    the tokens and seconds so far (training's apart from evaluation's) and the steps skipped. Saved
    in every checkpoint beside the weights, the optimizer, the schedule, the RNG states and the log
    window in progress; `resume` reads all of them back."""

    step: int = 0
    epoch: int = 0
    start: int = 0
    tokens: int = 0
    seconds: float = 0.0
    eval_seconds: float = 0.0
    skipped_steps: int = 0
    # the CPU thread counts its steps computed with, in order of first use: PyTorch splits sums among its
    # threads, so a run whose count changed (other torchbert jobs came and went, fast/threads.py)
    # cannot be repeated bit for bit by a run at one count
    threads: list[int] = field(default_factory=list)

    def moved_to(self, stream: Stream) -> None:
        self.epoch, self.start = stream.epoch, stream.start

    def save(self, run_dir: Path, model: nn.Module, optimizer, scheduler, window: Window, keep: int,
             dist: Dist) -> Path | None:
        """A checkpoint of the run (checkpoints/step-N, written atomically; the newest `keep` kept).
        Every process takes part (FSDP gathers shards; RNG states travel to process 0), one writes;
        returns its folder in process 0."""
        import torch.distributed as torch_dist

        window_sums = window.saved()
        model_state = full_state_dict(model, dist)
        optim_state = full_optimizer_state(model, optimizer, dist)
        extra_rng = {}
        if dist.enabled:
            states = [None] * dist.world_size
            torch_dist.all_gather_object(states, torch.get_rng_state())
            extra_rng = {f"torch_rank{r}": s for r, s in enumerate(states)}
        folder = None
        if dist.is_main and not all(bool(torch.isfinite(t).all()) for t in model_state.values()
                                    if t.is_floating_point()):
            warnings.warn(f"step {self.step}: the weights hold NaN or inf; no checkpoint saved (the last good one "
                          "stays the newest)", stacklevel=2)
            dist.barrier()
            return latest_checkpoint(run_dir)
        if dist.is_main:
            counters = asdict(self)
            step = counters.pop("step")
            folder = save_checkpoint(run_dir, step, model_state, optim_state, scheduler.state_dict(),
                                     {**counters, "window": window_sums}, keep, extra_rng)
        dist.barrier()
        return folder

    @classmethod
    def resume(cls, run_dir: Path, model: nn.Module, optimizer, scheduler,
               dist: Dist) -> tuple[TrainState, list[float] | dict | None, Path]:
        """The newest checkpoint's state, with the model, optimizer, schedule and RNG states restored
        from it; also the log window it saved, and its folder."""
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise no_checkpoint(run_dir)
        saved = load_checkpoint(ckpt)
        load_full_state(model, optimizer, saved.model, saved.optimizer, dist)
        scheduler.load_state_dict(saved.scheduler)
        saved.restore_rng(dist.rank)
        known = {f.name for f in fields(cls)}  # checkpoints before eval_seconds lack it
        state = cls(**{k: v for k, v in saved.state.items() if k in known})
        return state, saved.state.get("window"), ckpt


class BadSteps:
    """Steps whose loss or gradient norm was NaN or inf: each is skipped and counted in the state;
    `max_bad` of them in a row stop the run (TrainingError, the last good checkpoint kept)."""

    def __init__(self, state: TrainState, max_bad: int, run_dir: Path, dist: Dist):
        self.state, self.max_bad, self.run_dir, self.dist = state, max_bad, run_dir, dist
        self.in_a_row = 0

    def verdict(self, ok: bool) -> None:
        """A step was taken (ok) or skipped."""
        if ok:
            self.in_a_row = 0
            return
        self.state.skipped_steps += 1
        self.in_a_row += 1

    def check(self, at: int) -> None:
        """Raises at step `at` when too many steps in a row were skipped. The weights of the steps
        skipped are those of the last step taken (a skipped step changes none): a checkpoint of that
        step gives NaN again on every resume, so it is set aside (checkpoints/diverged-step-N), and
        the last good checkpoint is the one before it."""
        if self.in_a_row < self.max_bad:
            return
        aside = []
        if self.dist.is_main:
            for folder in list_checkpoints(self.run_dir):
                if int(folder.name[len(PREFIX):]) >= self.state.step:
                    aside.append(folder.with_name(f"diverged-{folder.name}"))
                    folder.rename(aside[-1])
        last = latest_checkpoint(self.run_dir) if self.dist.is_main else None
        raise TrainingError(f"the loss or its gradient was NaN or inf for {self.in_a_row} steps in a row "
                            f"at step {at}; stopping" + (f" (the last good checkpoint, {last}, is kept)" if last else "")
                            + (f"; {', '.join(p.name for p in aside)} set aside: its weights give NaN" if aside else "")
                            + ". Lower --lr, use fp32, or check the data")


def step_totals(objective: Objective, micro: list, dist: Dist, device: torch.device,
                deferred: bool) -> dict[str, Any]:
    """The targets of a step per loss part (at least 1): the objective's fixed average, or this
    global batch's own count, summed over processes (on the devices when reads are deferred)."""
    if objective.per_step is not None:
        return {p: max(n, 1) for p, n in objective.per_step.items()}
    local = [sum(objective.counts(b)[p] for b in micro) for p in objective.parts]
    if deferred and dist.enabled:  # summed on the devices, never read on the host
        summed = dist.all_reduce_tensor(torch.tensor(local, dtype=torch.float32).to(device, non_blocking=True))
        return dict(zip(objective.parts, summed.clamp(min=1).unbind()))
    return {p: max(n, 1) for p, n in zip(objective.parts, dist.all_reduce(local, device))}


def forward_backward(model: nn.Module, objective: Objective, batch, totals: dict[str, Any], precision: str,
                     device: torch.device, dist: Dist, sync: bool) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]]]:
    """One micro-batch: its loss (each part's sum over the step's targets, weighted), backward; returns
    the detached loss and the parts. DDP synchronizes gradients only when `sync` (the step's last)."""
    with (contextlib.nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()), \
            autocast(precision, device):
        parts = objective.forward(model, batch)
        weights = getattr(objective, "weights", {})
        loss = sum(weights.get(p, 1.0) * parts[p][0] / totals[p] for p in objective.parts)
    (loss * dist.world_size).backward()  # gradients are averaged over processes: scaled so that they sum
    return loss.detach(), parts


def skip_step(why: str, state: TrainState, bad: BadSteps, optimizer, window: Window, stream: Stream,
              log: Callable[[str], None]) -> None:
    """A step with a NaN or inf loss or gradient norm is not taken: its gradients and logged figures
    are dropped, its batches stay used (as in a run that goes on), the schedule waits."""
    optimizer.zero_grad(set_to_none=True)
    window.discard()
    state.moved_to(stream)
    bad.verdict(False)
    log(f"step {state.step + 1}: {why}; step skipped ({state.skipped_steps} so far)")
    bad.check(state.step + 1)


def train(model: nn.Module, data, task: Objective, cfg: TrainConfig, run_dir: str | os.PathLike, *,
          evaluate: Callable[[nn.Module], dict[str, float]] | None = None, resume: bool = False,
          device: torch.device | None = None, log: Callable[[str], None] = print,
          dist: Dist | None = None, on_checkpoint: Callable[[Path], None] | None = None,
          evaluate_first: bool = False) -> dict[str, Any]:
    """Train `model` (wrapped for DDP/FSDP when `dist` says so) on `task` (an objective of
    train/objectives.py) for cfg.steps optimizer steps; returns the summary written to metrics.json.
    `evaluate_first`: a fresh run evaluates before its first step too (a checkpoint continued: what it
    knew before this corpus), as metrics.jsonl's step 0 and the summary's "eval_first".
    `on_checkpoint(folder)` is called (in process 0) after each checkpoint is written. Raises
    Interrupted after SIGINT/SIGTERM, once a checkpoint of the last whole step is saved."""
    run_dir, dist = Path(run_dir), dist or Dist()
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        remove_leftovers(run_dir)  # a killed run's half-written checkpoint
    else:
        log = lambda _: None  # noqa: E731  (one process speaks)
    device = device or next(model.parameters()).device
    config = unwrap(model).config  # what ids fit the model
    seed_everything(cfg.seed)
    optimizer = make_optimizer(model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.schedule, cfg.warmup_steps, cfg.steps)
    metrics_path = run_dir / "metrics.jsonl"
    window = Window(task.parts, dist, device, getattr(task, "unscored", ()))
    state, saved_at = TrainState(), None
    if resume:
        state, window_sums, ckpt = TrainState.resume(run_dir, model, optimizer, scheduler, dist)
        if window_sums is not None:  # the log line in progress when the checkpoint was saved
            window.load(window_sums)
        saved_at = state.step
        dist.barrier()  # every process has read the checkpoint before process 0 writes anything
        if dist.is_main:
            truncate_metrics(metrics_path, state.step, log)
        log(f"resumed from {ckpt} at step {state.step} (epoch {state.epoch}, batch {state.start})")
    elif metrics_path.exists() and dist.is_main:
        metrics_path.unlink()
    stream = Stream(data, cfg.batch_size, state.epoch, state.start)
    bad = BadSteps(state, cfg.max_bad_steps, run_dir, dist)
    model.train()
    bar = progress_bar(cfg, state.step) if dist.is_main else None
    last_eval = None
    started = time.perf_counter() - state.seconds - state.eval_seconds
    # memory_growth_gb counts from the log at a tenth of the steps (the third at least), when the first steps'
    # allocations are made: a run on batches of one length stays within 6% of its peak from there
    warm, memory_then = state.step + max(3, (cfg.steps - state.step) // 10), None
    memory_high, peak_before = 0, peak_resident_bytes()  # the run's own peak where the process's came before it
    # embeddings' gradients come as rows (fast.SparseRows) in one plain CPU process: DDP and FSDP
    # reduce dense gradients, the compiler traces dense ones, and on a GPU their norm's unique() syncs
    plain = not dist.enabled and getattr(model, "_compiled_call_impl", None) is None and device.type == "cpu"
    rows = fast.SparseRows(model) if plain and cfg.fast else None
    # bf16 there: the weights held in bf16 for each step, fp32 for the optimizer (fast.BF16Weights)
    bf16 = fast.BF16Weights(model) if plain and cfg.fast and cfg.precision == "bf16" else None
    precision = "fp32" if bf16 is not None else cfg.precision  # what autocast is asked for
    deferred = _deferred_reads(device)
    signalled = None  # deferred under torchrun: the previous step's all-reduced signal flag, read a step late
    unsettled = state.step  # deferred: the steps after this one await their verdicts (Window.settle)

    def settle() -> None:
        """Deferred reads: the verdicts of the steps since the last settle, read in one go."""
        nonlocal unsettled
        if not deferred:
            return
        skipped = []
        for k, ok in enumerate(window.settle(), start=unsettled + 1):
            bad.verdict(ok)
            if not ok:
                skipped.append(k)
            bad.check(k)
        unsettled = state.step
        if skipped:
            log(f"step{'s' if len(skipped) > 1 else ''} {', '.join(map(str, skipped))}: the loss or its gradient "
                f"norm was NaN or inf; skipped on the device ({state.skipped_steps} so far)")

    def checkpoint() -> Path | None:
        settle()
        folder = state.save(run_dir, model, optimizer, scheduler, window, cfg.keep, dist)
        if folder is not None and on_checkpoint is not None:
            on_checkpoint(folder)
        return folder

    def interrupted(caught: str | None) -> Interrupted:
        """After SIGINT/SIGTERM here (`caught`) or in another process: the last whole step checkpointed."""
        if bar is not None:
            bar.close()
        folder = checkpoint() if saved_at != state.step else latest_checkpoint(run_dir)
        return Interrupted(caught or "a signal to another process", state.step, folder)

    with rows or contextlib.nullcontext(), fast.training(model) if cfg.fast else contextlib.nullcontext(), \
            StopSignals(log) as signals, threads.busy(), \
            Scalars(run_dir, cfg.log_to, resumed_at=saved_at, main=dist.is_main) as scalars:
        first = _first_eval(metrics_path, dist) if evaluate_first and resume else None
        if evaluate_first and evaluate is not None and not resume:
            evaluating = time.perf_counter()
            first = _evaluate(model, evaluate)
            state.eval_seconds += time.perf_counter() - evaluating
            record = {"step": 0, "tokens": 0, "seconds": 0.0, **{f"eval_{k}": v for k, v in first.items()}}
            if dist.is_main:
                append_jsonl(metrics_path, record)
                scalars.add(record)
        while state.step < cfg.steps:
            threads.tick()  # this job's share of the CPUs, when a command governs them
            micro = [stream.next() for _ in range(cfg.grad_accum)]
            for b in micro:  # the batching boundary: ids checked on the host, before they move
                check_ids(config, b.input_ids, b.token_type_ids, int(b.max_seqlen))
            micro = [b.to(device) for b in micro]  # without a host sync (non_blocking)
            totals = step_totals(task, micro, dist, device, deferred)
            step_loss = torch.zeros((), dtype=torch.float64, device=device)
            with bf16 or contextlib.nullcontext():
                for i, b in enumerate(micro):
                    loss, parts = forward_backward(model, task, b, totals, precision, device, dist,
                                                   sync=i == len(micro) - 1)
                    if bf16 is not None:
                        bf16.collect()
                    step_loss += loss
                    window.add(parts, task.counts(b), b.num_tokens)
            # the one value all processes share each step also carries whether any was signalled
            shared = torch.stack([step_loss, torch.full_like(step_loss, signals.caught is not None)])
            step_loss, stopping = dist.all_reduce_tensor(shared).unbind()
            lr = optimizer.param_groups[0]["lr"]
            if deferred:  # no host read: the verdict stays on the device until the log cadence
                window.commit(clipped_step(optimizer, model.parameters(), cfg.max_grad_norm, rows, loss=step_loss,
                                           defer=True))
                if dist.enabled:
                    stop, signalled = signalled is not None and bool(signalled), stopping
                else:
                    stop = signals.caught is not None
            else:
                ok = clipped_step(optimizer, model.parameters(), cfg.max_grad_norm, rows, loss=step_loss)
                stop = bool(stopping) if dist.enabled else signals.caught is not None
                if not ok:
                    loss_value = float(step_loss)
                    skip_step(f"loss is {loss_value}" if not math.isfinite(loss_value)
                              else f"the gradient norm is not finite (loss {loss_value:.4g})",
                              state, bad, optimizer, window, stream, log)
                    if stop:
                        raise interrupted(signals.caught)
                    continue
                bad.verdict(True)
                window.commit()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cpu" and torch.get_num_threads() not in state.threads:
                state.threads.append(torch.get_num_threads())
            state.step += 1
            state.seconds = time.perf_counter() - started - state.eval_seconds
            state.moved_to(stream)
            if bar is not None:
                bar.update(1)

            step = state.step
            do_eval = evaluate is not None and (step == cfg.steps or (cfg.eval_every and step % cfg.eval_every == 0))
            if do_eval or step % cfg.log_every == 0 or step == cfg.steps:
                settle()  # deferred: the device has caught up here, so the seconds are its too
                state.seconds = time.perf_counter() - started - state.eval_seconds
                values = window.flush(state)  # the window's figures reach the host here
                if bar is not None:
                    bar.set_postfix(postfix(values, state, lr), refresh=False)
                memory = resident_bytes()
                memory_high = max(memory_high, memory or 0)
                record = {"step": step, "tokens": state.tokens, **values, "lr": lr, "seconds": round(state.seconds, 3),
                          **({"memory_gb": round(memory / 1e9, 3)} if memory is not None else {})}
                if memory_then is None and step >= warm:
                    memory_then = memory
                if do_eval:
                    evaluating = time.perf_counter()
                    last_eval = _evaluate(model, evaluate)
                    state.eval_seconds += time.perf_counter() - evaluating
                    record.update({f"eval_{k}": v for k, v in last_eval.items()})
                if dist.is_main:
                    append_jsonl(metrics_path, record)
                    scalars.add(record)
            if cfg.save_every and step % cfg.save_every == 0 and step != cfg.steps:
                checkpoint()
                saved_at = step
            if stop and step != cfg.steps:
                settle()
                raise interrupted(signals.caught)
    if bar is not None:
        bar.close()
    if evaluate is not None and last_eval is None:  # resumed at its last step: the figures it ended with
        last_eval = _evaluate(model, evaluate)
    checkpoint()
    if signals.caught is not None:  # it came during the last step: the run is whole and saved, and still stops
        pass_on(signals.signum)
    summary = {"steps": state.step, "tokens": state.tokens, "train_seconds": round(state.seconds, 3),
               "eval_seconds": round(state.eval_seconds, 3),
               "tokens_per_second": round(state.tokens / max(state.seconds, 1e-9), 1),
               "skipped_steps": state.skipped_steps, "config": asdict(cfg), "threads": state.threads,
               "repeatable": len(state.threads) <= 1, **memory_figures(memory_then, peak_before, memory_high)}
    if len(state.threads) > 1:
        log(f"note: the steps of this run computed with {' then '.join(map(str, state.threads))} CPU threads (other "
            "torchbert jobs came and went): a run at one thread count ends a few last bits apart; --threads N "
            "fixes the count for a run that must repeat bit for bit")
    if last_eval is not None:
        summary["eval"] = last_eval
    if first:
        summary["eval_first"] = first
    return summary


def _first_eval(metrics_path: Path, dist: Dist) -> dict[str, float] | None:
    """A resumed run's evaluation before its first step, from metrics.jsonl's step 0 (process 0 reads it)."""
    if not dist.is_main or not metrics_path.is_file():
        return None
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("step") == 0:
            return {k.removeprefix("eval_"): v for k, v in row.items() if k.startswith("eval_")}
        break  # the first line is step 0 or there is none
    return None


def memory_figures(then: int | None, before: int | None = None, high: int = 0) -> dict[str, float]:
    """The run's peak resident memory, and how much its resident memory grew from `then` (bytes, read at
    the first log past a tenth of the run's steps) to now: a training step's memory is the same each
    step, so growth is the heap fragmenting (fast/memory.py). The peak is the process's, unless that
    was reached before the run began (`before`: an earlier stage of a study, or a notebook's earlier
    run in the same process); then it is the most read during the run (`high`, at its logs) or now."""
    now = resident_bytes()
    peak = peak_resident_bytes()
    if peak is not None and before is not None and peak <= before and (high or now):
        peak = high  # the process's peak is an earlier job's: this run never reached it
    peak = max(filter(None, (peak, now)), default=None)  # ru_maxrss lags the pages by a few
    figures = {"peak_memory_gb": round(peak / 1e9, 3)} if peak is not None else {}
    if then is not None and now is not None:
        figures["memory_growth_gb"] = round((now - then) / 1e9, 3)
    return figures


def _deferred_reads(device: torch.device) -> bool:
    """Whether the step leaves its verdicts on the device (see the module's docstring): on a GPU."""
    return device.type == "cuda"


def _evaluate(model: nn.Module, evaluate) -> dict[str, float]:
    model.eval()
    try:
        with torch.no_grad():
            return evaluate(model)
    finally:
        model.train()
