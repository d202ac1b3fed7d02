"""What a training run reports, apart from the loop that computes it: the window of figures between
two log lines (`Window`), the progress bar and its figures, and metrics.jsonl (appended a line per
log step; cut back to the checkpoint on resume)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError
from ..io.files import atomic_write_text
from .distributed import Dist


class Window:
    """Per part: summed loss, correct predictions and targets since the last log line, over all
    processes, and the tokens. The losses and correct predictions add up on the device ([P, 2]);
    the counts, known before the forward, on the host ([tokens, targets per part], this process's
    own until flush sums them). Both are read at flush only. A step's figures wait in `pending`
    until the step is taken (a skipped step's are discarded). `unscored`: parts that have a loss and
    no accuracy (a distilled student's hidden states)."""

    def __init__(self, parts: tuple[str, ...], dist: Dist, device: torch.device, unscored: tuple[str, ...] = ()):
        self.parts, self.dist, self.device, self.unscored = parts, dist, device, unscored
        self.figures, self.counts = self._zero()
        self.pending = self._zero()
        self.unread: list[tuple[Tensor, list[int]]] = []  # deferred: (verdict on the device, host counts) per step

    def _zero(self) -> tuple[Tensor, list[int]]:
        return torch.zeros(len(self.parts), 2, dtype=torch.float64, device=self.device), [0] * (1 + len(self.parts))

    def add(self, parts: dict[str, tuple[Tensor, Tensor]], counts: dict[str, int], tokens: int) -> None:
        figures, known = self.pending
        figures += torch.stack([torch.stack([parts[p][0].detach().double(), parts[p][1].double()])
                                for p in self.parts])
        for i, n in enumerate((tokens, *[counts[p] for p in self.parts])):
            known[i] += n

    def discard(self) -> None:
        self.pending = self._zero()

    def commit(self, verdict: Tensor | None = None) -> None:
        """Add the step's figures (the device's summed over processes now, the host's at flush).
        With a `verdict` (deferred reads: the step's bool on the device), the device's figures are
        added times the verdict, and the host's wait for `settle` to read it."""
        figures, known = self.pending
        figures = self.dist.all_reduce_tensor(figures)
        if verdict is None:
            self.figures += figures
            self.counts = [a + b for a, b in zip(self.counts, known)]
        else:
            verdict = verdict.to(self.device)
            self.figures += torch.where(verdict, figures, 0.0)  # not figures * verdict: NaN * 0 is NaN
            self.unread.append((verdict, known))
        self.pending = self._zero()

    def settle(self) -> list[bool]:
        """Deferred reads: the verdicts of the steps committed since the last settle, read in one
        host sync, in order; the host's counts of the steps taken are added."""
        if not self.unread:
            return []
        verdicts = torch.stack([v for v, _ in self.unread]).tolist()
        for ok, (_, known) in zip(verdicts, self.unread):
            if ok:
                self.counts = [a + b for a, b in zip(self.counts, known)]
        self.unread = []
        return [bool(ok) for ok in verdicts]

    def saved(self) -> list[float]:
        """The window over all processes, for a checkpoint: [tokens, (loss, correct, targets) per part]."""
        counts = self.dist.all_reduce([float(x) for x in self.counts], self.device)
        figures = self.figures.tolist()
        return [counts[0], *[x for i in range(len(self.parts)) for x in (*figures[i], counts[1 + i])]]

    def load(self, saved: list[float] | dict) -> None:
        if isinstance(saved, dict):  # checkpoints before this layout; their tokens were also in state["tokens"]
            saved = [0, *[x for p in self.parts for x in saved[p]]]
        rows = [saved[1 + 3 * i: 4 + 3 * i] for i in range(len(self.parts))]
        self.figures = torch.tensor([r[:2] for r in rows], dtype=torch.float64, device=self.device)
        # each process adds its own counts at flush: the saved totals are process 0's alone
        self.counts = [int(x) if self.dist.is_main else 0 for x in (saved[0], *[r[2] for r in rows])]

    def flush(self, state) -> dict[str, float]:
        """The window's loss and accuracy per part (and their sum); adds its tokens to state.tokens."""
        figures = self.figures.tolist()
        counts = self.dist.all_reduce([float(x) for x in self.counts], self.device)
        self.figures, self.counts = self._zero()
        state.tokens += int(counts[0])
        out = {}
        for i, p in enumerate(self.parts):
            (loss_sum, correct), n = figures[i], counts[1 + i]
            out[f"{p}_loss"] = loss_sum / n if n else float("nan")
            if p not in self.unscored:
                out[f"{p}_accuracy"] = correct / n if n else float("nan")
        return {k: round(v, 6) for k, v in {"loss": sum(out[f"{p}_loss"] for p in self.parts), **out}.items()}


def postfix(values: dict[str, float], state, lr: float) -> dict[str, str]:
    tps = state.tokens / max(state.seconds, 1e-9)
    return {"loss": f"{values['loss']:.3f}", **{f"{p.removesuffix('_accuracy')}_acc": f"{v:.3f}"
                                                 for p, v in values.items() if p.endswith("_accuracy")},
            "tok/s": f"{tps:,.0f}", "lr": f"{lr:.2e}"}


def progress_bar(cfg, step: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    # to a terminal, as often as it changes; to a log file, a line every 10 s (a study's log stays readable)
    return tqdm(total=cfg.steps, initial=step, unit="step", desc="train", dynamic_ncols=True,
                mininterval=0.1 if sys.stderr.isatty() else 10)


class Scalars:
    """The figures of each metrics.jsonl line as TensorBoard scalars, in RUN/tensorboard (torch's
    SummaryWriter), for watching a run as it goes: losses and accuracies, the learning rate, dev or
    held-out scores (eval_*) and tokens/s, by step. A resumed run (`resumed_at`: its checkpoint's step)
    writes a new event file that purges the later steps of the killed one, as metrics.jsonl is cut
    back. log_to "none": nothing."""

    def __init__(self, run_dir: Path, log_to: str, resumed_at: int | None = None, main: bool = True):
        self.folder, self.resumed_at, self.main = Path(run_dir) / "tensorboard", resumed_at, main
        self.on = main and log_to == "tensorboard"  # under torchrun, process 0 writes
        self.writer = None

    def __enter__(self) -> Scalars:
        if self.main and self.resumed_at is None and self.folder.is_dir():  # a fresh run: an earlier one's scalars go
            import shutil

            shutil.rmtree(self.folder)
        if self.on:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if self.resumed_at is None else self.resumed_at + 1
            self.writer = SummaryWriter(str(self.folder), purge_step=purge)
        return self

    def add(self, record: dict[str, Any]) -> None:
        if self.writer is None:
            return
        step = record["step"]
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        if record.get("seconds"):
            self.writer.add_scalar("tokens_per_second", record["tokens"] / record["seconds"], step)

    def __exit__(self, *exc) -> None:
        if self.writer is not None:
            self.writer.close()


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def truncate_metrics(path: Path, step: int, log: Callable[[str], None] = print) -> None:
    """On resume, drop log lines written after the checkpoint (they will be written again), and a
    torn last line (a kill or a power cut in the middle of an append leaves any prefix of it: each
    line is one JSON object, so no proper prefix of one parses). A bad line before the last is not
    a torn write: it stops the resume with its file and line. Rewritten atomically."""
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    keep = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if any(rest.strip() for rest in lines[i + 1:]):
                raise UserError(f"{path}:{i + 1}: not a JSON record ({e}); the run's log is damaged before "
                                "its last line: move it aside to resume without it") from None
            log(f"note: {path}:{i + 1}: dropped a torn last line ({len(raw)} bytes) that an interrupted write "
                "left; the steps after the checkpoint are logged again")
            break
        if record.get("step", 0) <= step:
            keep.append(raw.decode("utf-8"))
    atomic_write_text(path, "".join(line + "\n" for line in keep))
