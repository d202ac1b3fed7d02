"""Several prepared data folders read as one, each drawn at its weight: `pretrain --data news:0.7 wiki:0.3`.

Corpora are blended as Megatron (BlendedDataset) and MosaicML (streams with a proportion) blend them:
by sampling, not by preparing them together, so a folder is prepared once and reweighted for free.

An epoch of the blend holds as many instances as its folders together (L = n_1 + ... + n_k).
Folder i gives round(w_i * L) of them (largest remainders, so the counts add up to L), taken in
its own order (`PretrainingData.order`) and going on across its own epochs from where the blend's
last epoch left it: a folder weighted above its share of the instances is seen more than once per
blend epoch (upsampled), one weighted below it less than once, and every instance of a folder is
drawn once before any is drawn again. Which slots of the epoch a folder's draws fill is a
permutation from (seed, epoch), so every batch holds the folders at their weights on average
(without shuffling, as for held-out data, the draws are spread evenly and each folder is read in
its own order).

An instance's dynamic mask is drawn from (seed, blend epoch, key), where the key is the instance's
place in the folders end to end plus L times its own epoch: the same instance drawn twice in one
blend epoch (upsampled) is masked twice differently. The position in the blend is (epoch, global
batches done), as for one folder, so `--resume` continues exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .shards import Batch, PretrainingData

# settings that make a batch: the folders of a blend must agree on them (max_seq_len may differ)
SHARED = ("masking", "masked_lm_prob", "max_predictions", "whole_word", "mask_replace", "pairs")


def parse_data(specs: Iterable[str | Path], flag: str = "--data") -> list[tuple[Path, float | None]]:
    """[(folder, weight or None)] of `FOLDER` or `FOLDER:WEIGHT` each (a colon followed by no
    number belongs to the folder's name)."""
    out: list[tuple[Path, float | None]] = []
    for spec in specs:
        text = str(spec)
        head, sep, tail = text.rpartition(":")
        weight = None
        if sep and head:
            try:
                weight = float(tail)
            except ValueError:
                if Path(head).is_dir() and not Path(text).exists():  # prep:abc, where prep/ is the folder
                    raise ValueError(f"{flag} {text}: the weight after ':' must be a number > 0, got {tail!r}"
                                     ) from None
                head = text
            else:
                if not (math.isfinite(weight) and weight > 0):
                    raise ValueError(f"{flag} {text}: the weight after ':' must be a number > 0")
        else:
            head = text
        out.append((Path(head), weight))
    if not out:
        raise ValueError(f"{flag}: give a data folder")
    if len(out) > 1 and len({w is None for _, w in out}) > 1:
        raise ValueError(f"{flag}: give every folder a weight (FOLDER:WEIGHT) or none (each weighted by its "
                         "number of instances)")
    folders = [f.resolve() for f, _ in out]
    for i, f in enumerate(folders):
        if f in folders[:i]:
            raise ValueError(f"{flag} {out[i][0]}: given twice (one folder, one weight)")
    return out


def open_data(specs: list[tuple[Path, float | None]], **kw) -> PretrainingData | BlendedData:
    """One folder: its PretrainingData; several: their blend. `kw` go to every PretrainingData."""
    if len(specs) == 1:
        return PretrainingData(specs[0][0], **kw)
    return BlendedData([(PretrainingData(folder, **kw), weight) for folder, weight in specs])


def _draws(weights: np.ndarray, total: int) -> np.ndarray:
    """[k] whole counts adding up to `total`, as near to weights * total as can be (largest remainders)."""
    exact = weights / weights.sum() * total
    draws = np.floor(exact).astype(np.int64)
    short = int(total - draws.sum())
    draws[np.argsort(-(exact - draws), kind="stable")[:short]] += 1
    return draws


class BlendedData:
    """Folders read as one at their weights (see the module's docstring): what `train` reads of a
    PretrainingData (len, batches_per_epoch, batches, order, batch, token_arrays, ...)."""

    def __init__(self, parts: list[tuple[PretrainingData, float | None]]):
        if len(parts) < 2:
            raise ValueError("a blend needs at least two folders")
        self.parts = [p for p, _ in parts]
        first = self.parts[0]
        for other in self.parts[1:]:
            if (other.vocab_size, other.manifest["vocab_sha256"]) != (first.vocab_size, first.manifest["vocab_sha256"]):
                raise ValueError(f"--data {other.folder}: prepared with another vocabulary than {first.folder} "
                                 f"({other.vocab_size} and {first.vocab_size} tokens); a blend's folders must be "
                                 "prepared with the same tokenizer")
            a, b = first.manifest["settings"], other.manifest["settings"]
            for key in SHARED:
                if a.get(key) != b.get(key):
                    raise ValueError(f"--data {other.folder}: prepared with {key} {b.get(key)!r}, {first.folder} "
                                     f"with {a.get(key)!r}; a blend's folders must be prepared with the same "
                                     f"{', '.join(SHARED)}")
            if (other.seed, other.rank, other.world_size, other.shuffle, other.masked) != \
                    (first.seed, first.rank, first.world_size, first.shuffle, first.masked):
                raise ValueError("a blend's folders must be opened alike (seed, rank, world_size, shuffle, masked)")
        self.sizes = np.array([len(p) for p in self.parts], dtype=np.int64)
        if not self.sizes.all():
            empty = self.parts[int(np.argmin(self.sizes))].folder
            raise ValueError(f"--data {empty}: holds no instances")
        given = [w for _, w in parts]
        weights = np.array(self.sizes if given[0] is None else given, dtype=np.float64)
        weights = weights / weights.max()  # first: weights of 1e308 add up to inf
        self.weights = weights / weights.sum()
        self.starts = np.r_[0, np.cumsum(self.sizes)]  # where each folder starts, the folders end to end
        self.total = int(self.starts[-1])
        self.draws = _draws(self.weights, self.total)  # [k] each folder's instances per blend epoch
        self.seed, self.rank, self.world_size = first.seed, first.rank, first.world_size
        self.shuffle, self.masked, self.dynamic = first.shuffle, first.masked, first.dynamic
        self.vocab_size = first.vocab_size
        self.max_seq_len = max(p.max_seq_len for p in self.parts)
        self.folder = first.folder  # for messages that name the data
        self.manifest = {k: v for k, v in first.manifest.items() if k not in ("counts", "shards", "heldout")}
        self.manifest["settings"] = {**first.manifest["settings"], "max_seq_len": self.max_seq_len}
        self.manifest["blend"] = [{"folder": str(p.folder), "weight": float(w), "instances": int(n),
                                   "per_epoch": int(d)}
                                  for p, w, n, d in zip(self.parts, self.weights, self.sizes, self.draws)]

    def __len__(self) -> int:
        return self.total

    # one folder's walk through an epoch, on the blend's order: global batches, this rank's part of each
    batches_per_epoch = PretrainingData.batches_per_epoch
    batches = PretrainingData.batches

    def order(self, epoch: int) -> np.ndarray:
        """[L] the keys of epoch `epoch`'s instances in visiting order (see the module's docstring)."""
        which = np.repeat(np.arange(len(self.parts), dtype=np.int16), self.draws)  # [L] the folder of each draw
        if self.shuffle:
            which = np.random.default_rng([self.seed, epoch, len(self.parts)]).permutation(which)
        else:  # spread evenly: folder i's t-th draw at (t + 1/2) / draws_i of the way (held-out batches)
            spread = np.concatenate([(np.arange(n) + 0.5) / n for n in self.draws])
            which = which[np.argsort(spread, kind="stable")]
        keys = np.empty(self.total, dtype=np.int64)
        for i, part in enumerate(self.parts):
            n, size = int(self.draws[i]), int(self.sizes[i])
            drawn = epoch * n + np.arange(n, dtype=np.int64)  # this folder's draws since the first epoch
            own_epoch, place = np.divmod(drawn, size)
            local = np.empty(n, dtype=np.int64)
            for e in np.unique(own_epoch):
                here = own_epoch == e
                local[here] = part.order(int(e))[place[here]]
            keys[which == i] = own_epoch * self.total + self.starts[i] + local
        return keys

    def locate(self, key: int) -> tuple[int, int]:
        """(folder, instance index in it) of a key of `order`."""
        place = int(key) % self.total
        i = int(np.searchsorted(self.starts, place, side="right") - 1)
        return i, place - int(self.starts[i])

    def instance(self, key: int) -> dict[str, np.ndarray]:
        i, local = self.locate(key)
        return self.parts[i].instance(local)

    def batch(self, keys, *, epoch: int = 0) -> Batch:
        """The packed, masked batch of these keys (the blend's dynamic masks are those of `epoch`)."""
        return self.parts[0].assemble([self.instance(k) for k in keys], keys, epoch=epoch)

    def token_arrays(self, limit: int | None = None) -> Iterator[np.ndarray]:
        """Each folder's unmasked tokens; with `limit`, that many in all, shared by the weights."""
        shares = [None] * len(self.parts) if limit is None else _draws(self.weights, limit)
        for part, share in zip(self.parts, shares):
            yield from part.token_arrays(None if share is None else int(share))

    def check_vocab(self, tokenizer_or_vocab_path) -> None:
        self.parts[0].check_vocab(tokenizer_or_vocab_path)  # the folders share it (checked when opened)
