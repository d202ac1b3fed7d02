"""A model folder's run record, `torchbert.json`: how torchbert made the model beside it.

config.json and model.safetensors are the checkpoint, for torchbert and transformers alike; what
only torchbert needs to know of the folder is here, written once (atomically) when the folder is
made, and read in one place (`read_record`):

    made        pretrain, finetune or convert
    objective   a pretraining objective's name (train/objectives.py PRETRAINING): what --resume trains
    task        a fine-tuned model's task settings (TaskSettings' fields), and "tagger" (TaggerSettings'
                fields) for a feature-based tagger: what evaluate, predict, serve and export read
    command     the command line that made it, when a command did
    versions    torchbert's, torch's and Python's

A folder of an older torchbert has no torchbert.json: its config.json carried the objective and
the task under `torchbert_objective` and `torchbert_task`, and read_record reads them from there.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .texts import json_loads

RECORD_FILE = "torchbert.json"
MADE = ("pretrain", "finetune", "convert")


@dataclass
class RunRecord:
    made: str
    objective: str | None = None
    # the objective's settings that shape its model but not the saved one (ELECTRA: generator_size)
    settings: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] | None = None
    command: str | None = None
    versions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.made not in MADE:
            raise ValueError(f"made must be one of {', '.join(MADE)}, got {self.made!r}")
        if self.task is not None and not isinstance(self.task, dict):
            raise ValueError(f"task must be a JSON object, got {type(self.task).__name__}")

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


def read_record(folder: str | Path) -> RunRecord | None:
    """The record of the model in `folder`: its torchbert.json, or what an older torchbert kept in its
    config.json; None for a model torchbert did not make (a Hugging Face checkpoint)."""
    folder = Path(folder)
    path = folder / RECORD_FILE
    if path.is_file():
        try:
            saved = json_loads(path.read_text(encoding="utf-8"))
            if not isinstance(saved, dict):
                raise ValueError("not a JSON object")
            return RunRecord(**{k: v for k, v in saved.items() if k in {f.name for f in fields(RunRecord)}})
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"{path}: not the run record torchbert writes ({e})") from None
    config = folder / "config.json"
    try:
        saved = json_loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # whoever reads the config says what is wrong with it
    if not isinstance(saved, dict):
        return None
    if isinstance(saved.get("torchbert_task"), dict):
        return RunRecord("finetune", task=saved["torchbert_task"])
    if isinstance(saved.get("torchbert_objective"), str):
        return RunRecord("pretrain", objective=saved["torchbert_objective"])
    return None
