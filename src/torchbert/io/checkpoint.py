"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is a folder `checkpoints/step-00001000/` holding
    model.safetensors     the model's own state dict (our parameter names)
    optimizer.pt          optimizer and scheduler state (read back with torch.load(weights_only=True))
    rng.pt                torch's RNG state (CPU and, when present, each CUDA device)
    state.json            step, data position, counters, the Python and NumPy RNG states
    manifest.json         sha256 of each file above, written last

It is written into a temporary folder beside its final name, fsynced and renamed into place
(io/files.atomic_folder), so a checkpoint folder either is complete or does not exist; one saved
again at the same step replaces the old one whole. At load time the hashes are checked;
a damaged checkpoint is skipped with a warning and the one before it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..errors import UserError
from .files import atomic_folder
from .texts import json_loads

FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "state.json")
PREFIX = "step-"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Python and NumPy states as JSON-able values; torch states as tensors."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    plain = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return plain, tensors


def set_rng_state(plain: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(run_dir: str | os.PathLike, step: int, model_state: dict[str, torch.Tensor],
                    optimizer_state: dict, scheduler_state: dict, state: dict[str, Any], keep: int = 2,
                    extra_rng: dict[str, torch.Tensor] | None = None) -> Path:
    """Write checkpoints/step-N atomically, then delete all but the newest `keep`.

    extra_rng: the torch RNG states of other processes (`torch_rank1`, ...), saved beside ours."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"{PREFIX}{step:08d}"
    with atomic_folder(final) as tmp:  # the same step saved again (a resumed run) is replaced whole
        save_file({k: v.detach().contiguous().cpu() for k, v in model_state.items()}, tmp / "model.safetensors")
        torch.save({"optimizer": optimizer_state, "scheduler": scheduler_state}, tmp / "optimizer.pt")
        plain, tensors = rng_state()
        torch.save({**tensors, **(extra_rng or {})}, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step, "rng": plain}), encoding="utf-8")
        manifest = {name: _sha256(tmp / name) for name in FILES}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def remove_leftovers(run_dir: str | os.PathLike) -> None:
    """Delete the temporary folders of checkpoints that a killed run never finished (`.step-*`)."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith("." + PREFIX) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Finished checkpoint folders, oldest first (temporary folders start with a dot and are skipped)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def verify(folder: Path) -> str | None:
    """None when the checkpoint is whole; else what is wrong with it."""
    try:
        manifest = json_loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"no readable manifest.json ({e.__class__.__name__})"
    for name in FILES:
        if not (folder / name).is_file():
            return f"{name} is missing"
        if _sha256(folder / name) != manifest.get(name):
            return f"{name} does not match its hash"
    return None


def no_checkpoint(run_dir: str | os.PathLike) -> UserError:
    """The error of a --resume with nothing whole to continue from."""
    found = len(list_checkpoints(run_dir))
    return UserError(f"--resume: {run_dir} holds no whole checkpoint to continue from"
                     + (f" ({found} damaged, see the warnings above)" if found else "")
                     + "; start again with --overwrite")


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest whole checkpoint; damaged newer ones are reported and passed over."""
    for folder in reversed(list_checkpoints(run_dir)):
        problem = verify(folder)
        if problem is None:
            return folder
        warnings.warn(f"{folder}: damaged checkpoint ({problem}); trying the one before it", stacklevel=2)
    return None


@dataclass
class Checkpoint:
    model: dict[str, torch.Tensor]
    optimizer: dict
    scheduler: dict
    state: dict[str, Any]  # step, data position, counters
    rng_plain: dict[str, Any]
    rng_tensors: dict[str, torch.Tensor]

    def restore_rng(self, rank: int = 0) -> None:
        """This process's RNG states; a process the saving run did not have takes process 0's."""
        tensors = dict(self.rng_tensors)
        tensors["torch"] = tensors.get(f"torch_rank{rank}", tensors["torch"])
        set_rng_state(self.rng_plain, tensors)


def safe_load(file: Path):
    """torch.load of tensors and plain containers only (weights_only); a pickle that holds anything
    else is refused in one line that says so, and nothing more: PyTorch's own message advises turning
    the protection off, which no file from elsewhere deserves."""
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():  # "Detected pickle protocol 4 ... please file an issue": not the user's
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{file}: refused as unsafe: it is a pickle that holds more than tensors, and torchbert "
                         "never unpickles such a file") from None


def load_checkpoint(folder: Path) -> Checkpoint:
    """Read a checkpoint (tensors through safetensors and weights-only torch.load)."""
    opt = safe_load(folder / "optimizer.pt")
    state = json_loads((folder / "state.json").read_text(encoding="utf-8"))
    plain = state.pop("rng")
    return Checkpoint(load_file(folder / "model.safetensors", device="cpu"), opt["optimizer"], opt["scheduler"],
                      state, plain, safe_load(folder / "rng.pt"))
