"""Fine-tuning batches: encoded rows (tasks/encode.py) -> packed, length-sorted batches for the loop.

Every batch is unpadded: the tokens of its sequences end to end ([N]) with cu_seqlens, as the
model's packed path takes them. The batches are a seeded shuffle of the rows (SORT_WINDOW > 1 would
sort the rows of each window of batches by length first: less padding in the [B, T] block attention
works on, but measured worse dev scores).

The unit of batching is a row (one sequence), or for multiple choice an example (all its choices),
so `batch_size` counts examples there. The order is a pure function of (seed, epoch): resuming at
global batch `start` of an epoch gives exactly the batches a run that never stopped would have seen.
With several processes a global batch is batch_size * world_size units and rank r takes the r-th part.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..packing import pack
from .encode import Encoded

if TYPE_CHECKING:
    from .families import TaskFamily

# Batches whose rows are length-sorted together: 1 is a plain shuffled loop (each batch's rows then
# sorted within it, which packed batches do not notice). Wider windows pad less inside attention but
# make batches of alike lengths, and that cost entity F1 on WNUT-16: window 4 against 1, 3 seeds
# pooled, -0.011 (95% paired bootstrap [-0.021, -0.002]), for no time saved (bench/bench_batching.py,
# bench/README.md).
SORT_WINDOW = 1


@dataclass
class TaskBatch:
    input_ids: Tensor  # [N] the real tokens of the batch's sequences, end to end
    token_type_ids: Tensor  # [N]
    cu_seqlens: Tensor  # [S + 1] int32
    max_seqlen: int
    rows: np.ndarray  # [S] the encoded rows in this batch, in order (predictions map back through it)
    units: np.ndarray  # [U] the units batched: rows, or examples for multiple choice
    labels: Tensor | None = None  # [S] class ids or floats, [N] token labels, or [E] choice indices
    start_positions: Tensor | None = None  # QA: [S]
    end_positions: Tensor | None = None
    num_choices: Tensor | None = None  # multiple choice: [E], the rows of each example
    max_choices: int = 0  # multiple choice: the most rows of one example (on the host)
    label_positions: Tensor | None = None  # token labels: [M] the labelled tokens' positions (found on the host)
    num_targets: int = 0  # the loss targets (the family's count), counted on the host as the batch is made

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device) -> "TaskBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, Tensor):
                moved[k] = v.to(device, non_blocking=True)
        return TaskBatch(**moved)

    def model_inputs(self) -> dict:
        return dict(input_ids=self.input_ids, token_type_ids=self.token_type_ids, cu_seqlens=self.cu_seqlens,
                    max_seqlen=self.max_seqlen)


class TaskData:
    """Encoded rows of one split of a task, for `train/loop.py` (batches) and for prediction (all_batches)."""

    def __init__(self, encoded: Encoded, family: TaskFamily, *, seed: int = 0, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.encoded, self.family = encoded, family
        self.seed, self.rank, self.world_size = seed, rank, world_size
        lengths = np.array([len(r) for r in encoded.input_ids], dtype=np.int64)
        if encoded.num_choices is not None:  # multiple choice: an example's choices go together
            counts = np.asarray(encoded.num_choices, dtype=np.int64)
            self.unit_start = np.concatenate([[0], np.cumsum(counts)])  # rows of example e: [start[e], start[e+1])
            self.unit_length = np.add.reduceat(lengths, self.unit_start[:-1]) if len(counts) else lengths[:0]
        else:
            self.unit_start = np.arange(len(lengths) + 1)
            self.unit_length = lengths
        if len(self) == 0:
            raise ValueError("no examples to batch")

    def __len__(self) -> int:
        return len(self.unit_length)

    def batches_per_epoch(self, batch_size: int) -> int:
        """Global batches per epoch: the last partial one is kept on one process, dropped on several
        (every process must take a step together)."""
        size = batch_size * self.world_size
        return -(-len(self) // size) if self.world_size == 1 else len(self) // size

    def order(self, batch_size: int, epoch: int) -> list[np.ndarray]:
        """The global batches of `epoch`, as arrays of units."""
        rng = np.random.default_rng([self.seed, epoch])
        units = rng.permutation(len(self))
        size = batch_size * self.world_size
        out = []
        window = size * SORT_WINDOW
        for w in range(0, len(units), window):
            chunk = units[w:w + window]
            chunk = chunk[np.argsort(-self.unit_length[chunk], kind="stable")]
            groups = [chunk[i:i + size] for i in range(0, len(chunk), size)]
            out += [groups[i] for i in rng.permutation(len(groups))]
        full = [g for g in out if len(g) == size]
        partial = [g for g in out if len(g) < size]
        return full + (partial if self.world_size == 1 else [])  # a partial one last

    def batches(self, batch_size: int, *, epoch: int = 0, start: int = 0) -> Iterator[TaskBatch]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for g in self.order(batch_size, epoch)[start:]:
            yield self.batch(g[self.rank * batch_size:(self.rank + 1) * batch_size])

    def all_batches(self, batch_size: int) -> Iterator[TaskBatch]:
        """Every unit once, longest first, for prediction (every process sees all of it)."""
        units = np.argsort(-self.unit_length, kind="stable")
        for i in range(0, len(units), batch_size):
            yield self.batch(units[i:i + batch_size])

    def batch(self, units: np.ndarray) -> TaskBatch:
        e = self.encoded
        rows = np.concatenate([np.arange(self.unit_start[u], self.unit_start[u + 1]) for u in units]) \
            if len(units) else np.zeros(0, dtype=np.int64)
        input_ids, cu, longest = pack([e.input_ids[r] for r in rows])
        token_type_ids, _, _ = pack([e.token_type_ids[r] for r in rows])
        batch = TaskBatch(input_ids=input_ids, token_type_ids=token_type_ids, cu_seqlens=cu, max_seqlen=longest,
                          rows=rows, units=np.asarray(units))
        if e.labels is not None:
            for name, value in self.family.batch_targets(e, rows, units).items():
                setattr(batch, name, value)
        if e.num_choices is not None:
            batch.num_choices = torch.tensor([self.unit_start[u + 1] - self.unit_start[u] for u in units])
            batch.max_choices = int(batch.num_choices.max()) if len(units) else 0
        if e.labels is not None:
            batch.num_targets = self.family.count(batch)
        return batch
