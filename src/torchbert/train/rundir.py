"""The run folder (--out) of `pretrain` and `finetune`, handled so that no earlier run and no input
is lost by accident.

- `RunFolder(...)` checks, reading only (every process, before anything is loaded): --out is not
  an input, holds none and sits inside none; a folder with files in it needs --resume (continue
  it) or --overwrite (start again); --resume needs a run to continue.
- `opened()` (process 0, once every input has loaded): with --overwrite the earlier run is moved
  aside to a hidden sibling, `.NAME.replaced-*`, not deleted, and a fresh folder takes its place.
  - When the new run writes its first checkpoint (`commit`), the earlier run is deleted.
  - When the new run fails before that, its folder is removed and the earlier run is put back as
    it was. A fresh run that failed before its first checkpoint leaves no folder behind.
  - A process killed in between leaves the earlier run in the hidden sibling; the next run
    started on the same --out names it.
- `fixed(...)`: the settings a run started with, written into its run record (torchbert.json,
  io/record.py: `training`) when it starts. `--resume` continues with them (`resumed`): a flag left
  out takes the run's value, a flag given with another value is refused (a resumed run that mixed
  two learning rates or two batch sizes, issue 46, is neither).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import Interrupted, UserError
from ..io.files import check_apart, check_replaceable, mark
from ..io.record import RECORD_FILE, read_record
from .distributed import Dist

ASIDE = ".replaced-"


class RunFolder:
    def __init__(self, out: Path, resume: bool, overwrite: bool, inputs: dict[str, str | os.PathLike | None],
                 log: Callable[[str], None] = print, kept_until: str = "has saved its first checkpoint"):
        if resume and overwrite:
            raise UserError("--resume and --overwrite contradict each other; pick one")
        self.out, self.resume, self.overwrite, self.log = Path(out), resume, overwrite, log
        self.kept_until = kept_until
        check_apart(self.out, inputs)
        if self.out.exists() and not self.out.is_dir():
            raise UserError(f"--out {self.out}: exists and is not a folder")
        holds = self.out.is_dir() and any(self.out.iterdir())
        if resume and not holds:
            raise UserError(f"--out {self.out}: nothing to resume (no such run)")
        if holds and not (resume or overwrite):
            raise UserError(f"--out {self.out}: the folder exists and is not empty; pass --resume to continue "
                            "the run in it or --overwrite to start again")
        if holds and overwrite:
            check_replaceable(self.out)
        for kept in sorted(self.out.parent.glob(f".{self.out.name}{ASIDE}*")):
            log(f"note: {kept} holds an earlier run that an interrupted --overwrite moved aside; "
                "move it back or delete it")
        self.aside: Path | None = None  # the hidden folder holding the earlier run
        self.existed = self.out.is_dir()
        self.committed = resume

    @contextlib.contextmanager
    def opened(self, dist: Dist) -> Iterator[RunFolder]:
        """The folder ready to write in; on an error before `commit`, the earlier state comes back."""
        if dist.is_main:
            self._open()
        dist.barrier()
        try:
            yield self
        except BaseException as e:
            if self.committed:
                raise
            if dist.is_main:
                self._restore()
            if isinstance(e, KeyboardInterrupt):  # the message can then say that nothing changed
                raise Interrupted("SIGINT", 0, None) from None
            raise
        if dist.is_main:
            self.commit()

    def _open(self) -> None:
        if self.resume:
            mark(self.out)
            return
        if self.existed and any(self.out.iterdir()):  # --overwrite, checked in __init__
            self.aside = Path(tempfile.mkdtemp(prefix=f".{self.out.name}{ASIDE}", dir=self.out.parent))
            os.rename(self.out, self.aside / self.out.name)
            self.log(f"replacing {self.out}: the earlier run is kept in {self.aside} until the new one "
                     f"{self.kept_until}")
            self.existed = False
        self.out.mkdir(parents=True, exist_ok=True)
        mark(self.out)

    def commit(self, *_) -> None:
        """The new run has a checkpoint (or is done): the earlier one can go."""
        self.committed = True
        if self.aside is not None:
            shutil.rmtree(self.aside)
            self.aside = None

    def _restore(self) -> None:
        if self.existed:  # an empty folder the user made: empty again
            for p in self.out.iterdir():
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        else:
            shutil.rmtree(self.out, ignore_errors=True)
        if self.aside is not None:
            os.rename(self.aside / self.out.name, self.out)
            os.rmdir(self.aside)
            self.aside = None
            self.log(f"the earlier run in {self.out} is back as it was")


# the loop's settings that shape a run's course: a resumed run keeps them (save_every, keep, log_every,
# eval_every, fast and progress may change: they decide when to write, not what is learned). --steps
# is kept when left out and may be given anew: a run is extended (or cut short) on purpose.
LONGER = ("steps", "epochs")
FIXED = ("steps", "batch_size", "grad_accum", "lr", "warmup_steps", "schedule", "weight_decay", "optimizer",
         "max_grad_norm", "seed", "precision")


def fixed(cfg, world_size: int = 1) -> dict:
    """The fields of TrainConfig `cfg` that a resumed run keeps; the batch as the sequences of a
    micro-batch over all processes (a run of 2 processes x 8 resumes on 1 process x 16)."""
    return {**{k: getattr(cfg, k) for k in FIXED if k != "batch_size"},
            "global_batch_size": cfg.batch_size * world_size}


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _flag(name: str) -> str:
    return "--batch-size x processes" if name == "global_batch_size" else "--" + name.replace("_", "-")


def resumed(out: Path, now: dict, given: tuple[str, ...] | None) -> dict:
    """`now`'s settings for a resumed run: each one the run recorded takes the recorded value when
    the user did not give it (`given`: the flags on the command line; None: the caller set every
    field) and is an error when given with another value. Files are recorded by sha256 under
    KEY_sha256 (a changed file is an error); keys the record lacks keep `now`'s value (a run of an
    older torchbert has no record: everything as given)."""
    record = read_record(out)
    saved = record.training if record is not None else {}
    merged = dict(now)
    for key, value in saved.items():
        if key.endswith("_sha256") and key[:-len("_sha256")] in now:
            name = key[:-len("_sha256")]
            if now[name] is None:
                raise UserError(f"{_flag(name)}: the run in {out} started with one (its sha256 is in {RECORD_FILE}); "
                                "resume with that file, or start again with --overwrite")
            if sha256(now[name]) != value:
                raise UserError(f"{_flag(name)} {now[name]}: not the file the run in {out} started with (its "
                                f"sha256 is in {RECORD_FILE}); resume with that file, or start again with --overwrite")
            continue
        if key not in now:
            continue
        mine = json.loads(json.dumps(now[key], default=str))
        if mine == value or (key in LONGER and (given is None or key in given)):
            merged[key] = now[key]
        elif given is None or key in given:
            started = f"without {_flag(key)}" if value is None else f"with {value}"
            raise UserError(f"{_flag(key)} {mine}: the run in {out} started {started} ({RECORD_FILE}); leave "
                            f"{_flag(key)} out to resume with the run's setting, or start again with --overwrite")
        else:
            merged[key] = value
    return merged


def resumed_config(out: Path, cfg, given: tuple[str, ...] | None, extra: dict | None = None,
                   world_size: int = 1):
    """(TrainConfig, extra settings) of a resumed run on `world_size` processes (see `resumed`)."""
    extra = extra or {}
    if given is not None and "batch_size" in given:
        given = (*given, "global_batch_size")
    merged = resumed(out, {**fixed(cfg, world_size), **extra}, given)
    batch, spread = divmod(merged["global_batch_size"], world_size)
    if spread:
        raise UserError(f"the run in {out} took {merged['global_batch_size']} sequences a micro-batch, which "
                        f"{world_size} processes cannot share evenly; resume it on a number of processes that "
                        "divides it")
    kept = {k: merged[k] for k in FIXED if k != "batch_size"}
    return dataclasses.replace(cfg, batch_size=batch, **kept), {k: merged[k] for k in extra}
