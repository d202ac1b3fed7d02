"""Fine-tuning batches: every example once per epoch, length-sorted within windows, reproducible."""

import numpy as np

from torchbert.tasks import batches
from torchbert.tasks.batches import TaskData
from torchbert.tasks.encode import Encoded
from torchbert.tasks.families import family


def data(lengths, seed=0, **kw):
    rows = [[7] * n for n in lengths]
    enc = Encoded(input_ids=rows, token_type_ids=[[0] * n for n in lengths], example_index=list(range(len(rows))),
                  labels=[i % 2 for i in range(len(rows))])
    return TaskData(enc, family("classification"), seed=seed, **kw)


LENGTHS = np.random.default_rng(0).integers(5, 120, size=1000).tolist()


def test_every_example_once_per_epoch_in_a_fresh_order():
    d = data(LENGTHS)
    epochs = [np.concatenate(d.order(32, epoch)) for epoch in (0, 1)]
    for units in epochs:
        assert sorted(units.tolist()) == list(range(len(LENGTHS)))
    assert not np.array_equal(epochs[0], epochs[1])
    assert all(np.array_equal(a, b) for a, b in zip(d.order(32, 0), data(LENGTHS).order(32, 0)))  # by seed
    sizes = [len(g) for g in d.order(32, 0)]
    assert sizes[:-1] == [32] * (len(sizes) - 1) and sizes[-1] == len(LENGTHS) % 32  # the partial one last


def test_the_default_batches_are_a_plain_shuffle():
    d = data(LENGTHS)
    order = np.random.default_rng([d.seed, 0]).permutation(len(LENGTHS))
    for i, g in enumerate(d.order(32, 0)):
        assert sorted(g.tolist()) == sorted(order[32 * i:32 * (i + 1)].tolist())


def test_batches_are_sorted_within_windows_and_pad_less_than_random_ones(monkeypatch):
    monkeypatch.setattr(batches, "SORT_WINDOW", 4)
    lengths = np.asarray(LENGTHS)
    units = data(LENGTHS).order(32, 0)
    assert all(np.all(np.diff(-lengths[g]) >= 0) for g in units)  # each batch longest first
    # padding inside attention: over the batches, B * the longest - the real tokens
    padding = sum(len(g) * lengths[g].max() - lengths[g].sum() for g in units)
    shuffled = np.random.default_rng(1).permutation(len(lengths))
    random_batches = [lengths[shuffled[i:i + 32]] for i in range(0, len(lengths), 32)]
    random_padding = sum(len(b) * b.max() - b.sum() for b in random_batches)
    assert padding < 0.6 * random_padding


def test_processes_split_each_global_batch():
    one = data(LENGTHS).order(16, 0)
    ranks = [data(LENGTHS, rank=r, world_size=2) for r in (0, 1)]
    batches = [list(r.batches(8)) for r in ranks]
    assert len(batches[0]) == len(batches[1]) == len(LENGTHS) // 16  # the partial batch is dropped
    two = data(LENGTHS, world_size=2).order(8, 0)
    assert len(two) == len(LENGTHS) // 16 and len(one) == -(-len(LENGTHS) // 16)
    for g, b0, b1 in zip(two, *batches):
        assert np.array_equal(np.concatenate([b0.rows, b1.rows]), g)
