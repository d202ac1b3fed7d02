"""Count yardsticks for masked-token prediction: what tables of token counts score on the held-out masks.

A pretrained MLM is worth its compute only once it predicts masked tokens better than counting does
(issue 36: a BERT of our main job scored 0.114 held-out where a table of character triples scored
0.418). Three tables, counted over the training instances, each scored on exactly the held-out masks
the model is scored on:

  unigram     always the training data's most frequent token
  left        the most frequent token after the nearest unmasked token on its left
  neighbours  the most frequent token between the nearest unmasked tokens on its left and its right

The tables count adjacent tokens of the unmasked training instances ([CLS] and [SEP] count as
neighbours, never as answers). At a masked position the neighbours are the nearest tokens the model
can read, so a whole masked word is predicted from the tokens around the word; a token the masking
replaced at random or left unchanged (10% each) counts as masked here, and the model may do better
there. A context the training data never held backs off: neighbours -> left -> unigram.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

NAMES = ("unigram", "left", "neighbours")


class CountTables:
    """The three tables of a training set, as sorted context keys and each context's answer."""

    def __init__(self, tokens: Iterable[np.ndarray], vocab_size: int, special_ids: Iterable[int]):
        """tokens: the training instances, one int array each (or several instances packed, with a
        special token between every two: adjacent pairs never cross an instance then)."""
        self.V = int(vocab_size)
        special = np.zeros(self.V, dtype=bool)
        special[np.asarray(list(special_ids), dtype=np.int64)] = True
        unigram = np.zeros(self.V, dtype=np.int64)
        pairs, triples = [], []
        for t in tokens:
            t = np.asarray(t, dtype=np.int64)
            centre = ~special[t]
            unigram += np.bincount(t[centre], minlength=self.V)
            c = np.flatnonzero(centre[1:]) + 1                          # positions with a left neighbour
            pairs.append(t[c - 1] * self.V + t[c])
            c = c[c < len(t) - 1]                                       # and a right one
            triples.append((t[c - 1] * self.V + t[c + 1]) * self.V + t[c])
        self.top = int(unigram.argmax())
        self.left_keys, self.left_answer = _argmax_per_context(np.concatenate(pairs or [np.zeros(0, np.int64)]), self.V)
        self.both_keys, self.both_answer = _argmax_per_context(np.concatenate(triples or [np.zeros(0, np.int64)]),
                                                               self.V)

    def predict(self, left: np.ndarray, right: np.ndarray) -> dict[str, np.ndarray]:
        """Each table's answer [M] for masked tokens with these nearest unmasked neighbours [M]."""
        uni = np.full(len(left), self.top, dtype=np.int64)
        by_left = _lookup(self.left_keys, self.left_answer, left, uni)
        by_both = _lookup(self.both_keys, self.both_answer, left * self.V + right, by_left)
        return {"unigram": uni, "left": by_left, "neighbours": by_both}


def _argmax_per_context(keys: np.ndarray, V: int) -> tuple[np.ndarray, np.ndarray]:
    """keys = context * V + answer, one per occurrence -> (the contexts, sorted; each one's most frequent
    answer, the smallest id among ties)."""
    combos, counts = np.unique(keys, return_counts=True)                # sorted by context, then answer
    context = combos // V
    order = np.lexsort((-counts, context))                              # by context, the most frequent first
    first = np.r_[True, context[order][1:] != context[order][:-1]]
    best = order[first]
    return context[best], combos[best] % V


def _lookup(keys: np.ndarray, answers: np.ndarray, query: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    if not len(keys):
        return fallback.copy()
    at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[at] == query, answers[at], fallback)


def neighbours(input_ids: np.ndarray, cu_seqlens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The nearest unmasked token left and right of each masked position of a packed batch ([CLS] and
    the final [SEP] bound every instance, and are never masked). -> (left [M], right [M]) token ids."""
    N = len(input_ids)
    masked = np.zeros(N, dtype=bool)
    masked[positions] = True
    idx = np.arange(N)
    last_open = np.maximum.accumulate(np.where(masked, -1, idx))                     # nearest unmasked at or before
    next_open = np.minimum.accumulate(np.where(masked, N, idx)[::-1])[::-1]          # at or after
    left, right = last_open[positions - 1], next_open[np.minimum(positions + 1, N - 1)]
    # an instance starts with [CLS] and ends with [SEP], unmasked: neither search leaves its instance
    start = np.repeat(cu_seqlens[:-1], np.diff(cu_seqlens))
    end = np.repeat(cu_seqlens[1:], np.diff(cu_seqlens))
    if (left < start[positions]).any() or (right >= end[positions]).any():
        raise ValueError("a masked token without an unmasked token on each side in its instance")
    return input_ids[left], input_ids[right]


def score(tables: CountTables, batches: Iterable) -> dict[str, float | int]:
    """Each table's accuracy on the masked tokens of these batches (torchbert.data.shards.Batch), and
    how many there were (`masked`)."""
    correct = dict.fromkeys(NAMES, 0)
    n = 0
    for b in batches:
        ids, cu = b.input_ids.numpy(), b.cu_seqlens.numpy().astype(np.int64)
        positions, labels = b.mlm_positions.numpy(), b.mlm_labels.numpy()
        # the tokens as the model reads them; only the unmasked ones are read as neighbours
        left, right = neighbours(ids, cu, positions)
        for name, guess in tables.predict(left, right).items():
            correct[name] += int((guess == labels).sum())
        n += len(labels)
    if not n:
        raise ValueError("no masked tokens to score the count yardsticks on")
    return {**{name: correct[name] / n for name in NAMES}, "masked": n}


def yardsticks(train_data, eval_batches: Iterable) -> dict[str, float | int]:
    """The three count yardsticks of `train_data` (PretrainingData) on `eval_batches`' masks."""
    specials = train_data.manifest["special_ids"]["all"]
    return score(CountTables(train_data.token_arrays(), train_data.vocab_size, specials), eval_batches)
