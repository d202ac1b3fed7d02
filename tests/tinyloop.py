"""A tiny BERT and learnable synthetic batches for the training-loop tests (train/test_loop.py,
test_failures.py, test_gpu.py): small enough to train in a second, structured enough to learn."""

import signal

import numpy as np
import torch

from torchbert import BertConfig
from torchbert.data.shards import Batch
from torchbert.heads import BertForPreTraining
from torchbert.train.loop import TrainConfig
from torchbert.train.objectives import PretrainingTask

V = 60


class RepeatData:
    """Learnable synthetic instances: [CLS]=2, then one id repeated (the masked copies are easy to
    recover from the others); the NSP label is that id's parity. Instance i of epoch e is fixed by (seed, e, i),
    like the real loader, and global batch g holds order[g*bs:(g+1)*bs]."""

    def __init__(self, n=64, seed=0, fail_after=None, signal_at=None):
        self.n, self.seed, self.fail_after, self.served = n, seed, fail_after, 0
        self.signal_at = signal_at  # (signal, batches served): the process signals itself as that batch is served

    def batches(self, batch_size, *, epoch=0, start=0):
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        for g in range(start, self.n // batch_size):
            if self.fail_after is not None and self.served >= self.fail_after:
                raise KeyboardInterrupt("simulated kill")
            self.served += 1
            if self.signal_at is not None and self.served == self.signal_at[1]:
                signal.raise_signal(self.signal_at[0])
            yield self.batch(order[g * batch_size:(g + 1) * batch_size], epoch)

    def batch(self, indices, epoch):
        ids, types, lens, pos, labels, nsp = [], [], [], [], [], []
        offset = 0
        for i in indices:
            rng = np.random.default_rng([self.seed, epoch, int(i)])
            length = int(rng.integers(6, 14))
            first = int(rng.integers(5, V))
            seq = [2] + [first] * (length - 1)
            chosen = rng.choice(np.arange(1, length), size=2, replace=False)
            masked = list(seq)
            for c in chosen:
                masked[c] = 4
            ids += masked
            types += [0] * (length // 2) + [1] * (length - length // 2)
            pos += [offset + int(c) for c in chosen]
            labels += [seq[c] for c in chosen]
            nsp.append(first % 2)
            lens.append(length)
            offset += length
        t = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
        cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)
        return Batch(t(ids), t(types), cu, max(lens), t(pos), t(labels), t(nsp))


def tiny_model(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return BertForPreTraining(BertConfig.from_name("tiny", vocab_size=V, max_position_embeddings=32,
                                                   hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))


def cfg(**kw):
    base = dict(steps=6, batch_size=8, lr=1e-3, warmup_steps=2, log_every=1, progress=False, keep=3)
    return TrainConfig(**{**base, **kw})


class NaNTask(PretrainingTask):
    def __init__(self, bad_steps):
        self.bad_steps, self.calls = bad_steps, 0

    def forward(self, model, batch):
        out = super().forward(model, batch)
        self.calls += 1
        if self.calls in self.bad_steps:
            loss, correct = out["mlm"]
            out["mlm"] = (loss * float("nan"), correct)
        return out
