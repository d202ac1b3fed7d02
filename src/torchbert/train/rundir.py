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
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import Interrupted, UserError
from ..io.files import check_apart
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
            return
        if self.existed and any(self.out.iterdir()):  # --overwrite, checked in __init__
            self.aside = Path(tempfile.mkdtemp(prefix=f".{self.out.name}{ASIDE}", dir=self.out.parent))
            os.rename(self.out, self.aside / self.out.name)
            self.log(f"replacing {self.out}: the earlier run is kept in {self.aside} until the new one "
                     f"{self.kept_until}")
            self.existed = False
        self.out.mkdir(parents=True, exist_ok=True)

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
