"""A run folder's one record, `torchbert.json`: how torchbert made the model beside it, and what a
`--resume` of the run keeps.

config.json and model.safetensors are the checkpoint, for torchbert and transformers alike; what
only torchbert needs to know of the folder is here, written (atomically, by process 0) when the run
starts, and read in one place (`read_record`):

    version     of this layout (VERSION); a newer one than this torchbert knows is refused
    made        pretrain, finetune, distill or convert
    objective   a pretraining objective's name (train/objectives.py PRETRAINING): what --resume trains
    settings    the objective's own settings (its spec's settings class, train/objectives.py: ELECTRA's
                generator_size)
    task        a fine-tuned model's task settings (its family's TaskSettings class), and "tagger"
                (TaggerSettings' fields) for a feature-based tagger: what evaluate, predict, serve and
                export read
    training    the training settings the run keeps on --resume (train/rundir.py: steps, batch, lr,
                seed, ..., the input files' sha256); a resumed run writes its own once it has saved
    command     the command line that made it, when a command did
    versions    torchbert's, torch's and Python's

Older layouts still read (and so still resume): version 1 kept the training settings apart, in
`training.json`; before it, a folder had no torchbert.json, its config.json carrying the objective
and the task under `torchbert_objective` and `torchbert_task`.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .texts import json_loads

RECORD_FILE = "torchbert.json"
TRAINING_FILE = "training.json"  # version 1's training settings, read for the runs it wrote
VERSION = 2
MADE = ("pretrain", "finetune", "distill", "convert")


@dataclass
class RunRecord:
    made: str
    objective: str | None = None
    # the objective's own settings (ELECTRA: generator_size), what --resume trains with
    settings: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] | None = None
    training: dict[str, Any] = field(default_factory=dict)
    command: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    version: int = VERSION

    def __post_init__(self) -> None:
        if self.made not in MADE:
            raise ValueError(f"made must be one of {', '.join(MADE)}, got {self.made!r}")
        for name in ("task", "training", "settings"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
        if not isinstance(self.version, int) or isinstance(self.version, bool):
            raise ValueError(f"version must be a whole number, got {self.version!r}")
        if self.version > VERSION:
            raise ValueError(f"version {self.version!r}: written by a newer torchbert (this one reads up to "
                             f"{VERSION}); upgrade torchbert")

    @property
    def fine_tuned(self) -> bool:
        return self.task is not None


def versions() -> dict[str, str]:
    import torch

    from .. import __version__

    return {"torchbert": __version__, "torch": torch.__version__, "python": platform.python_version()}


def write_record(folder: str | Path, record: RunRecord) -> None:
    """The record into `folder`, whole or not at all; versions filled in when not given."""
    if not record.versions:
        record = RunRecord(**{**asdict(record), "versions": versions()})
    atomic_write_text(Path(folder) / RECORD_FILE, json.dumps(asdict(record), indent=2, sort_keys=True) + "\n")


def with_training(folder: str | Path, training: dict[str, Any], made: str) -> None:
    """The record of the run in `folder` with these training settings (a resumed run's, once it has
    saved a checkpoint trained with them); the rest as the run began (a run that left no record at
    all, from the oldest torchbert, gets one that says only what `made` it)."""
    record = read_record(folder) or RunRecord(made)
    write_record(folder, replace(record, training=training, version=VERSION))


def read_record(folder: str | Path) -> RunRecord | None:
    """The record of the run in `folder`: its torchbert.json (with version 1's training.json), or what
    an older torchbert kept in its config.json; None for a model torchbert did not make (a Hugging Face
    checkpoint)."""
    folder = Path(folder)
    path = folder / RECORD_FILE
    if path.is_file():
        saved = _json_object(path, "the run record torchbert writes")
        try:
            record = RunRecord(**{k: v for k, v in saved.items() if k in {f.name for f in fields(RunRecord)}},
                               **({} if "version" in saved else {"version": 1}))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: not the run record torchbert writes ({e})") from None
    else:
        record = _from_config(folder / "config.json")
    if record is not None and record.version < 2 and (folder / TRAINING_FILE).is_file():
        record.training = _json_object(folder / TRAINING_FILE, "the training settings torchbert writes")
    return record


def _json_object(path: Path, what: str) -> dict:
    try:
        saved = json_loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not {what} ({e})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: not {what} (not a JSON object)")
    return saved


def _from_config(config: Path) -> RunRecord | None:
    """What a folder of the oldest layout kept in its config.json (version 0)."""
    try:
        saved = json_loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # whoever reads the config says what is wrong with it
    if not isinstance(saved, dict):
        return None
    if isinstance(saved.get("torchbert_task"), dict):
        return RunRecord("finetune", task=saved["torchbert_task"], version=0)
    if isinstance(saved.get("torchbert_objective"), str):
        return RunRecord("pretrain", objective=saved["torchbert_objective"], version=0)
    return None
