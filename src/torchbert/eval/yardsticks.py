"""Count yardsticks for masked-token prediction: what tables of token counts score on the held-out masks.

A pretrained MLM is worth its compute only once it predicts masked tokens better than counting does
(issue 36: a BERT of our main job scored 0.114 held-out where a table of character triples scored
0.418 on single-character masks). Three tables, counted over the training instances, each scored on
exactly the held-out masks the model is scored on:

  unigram     always the training data's most frequent token
  left        the most frequent token d places after the nearest unmasked token on its left, d away
  neighbours  the most frequent token between the nearest unmasked tokens on its left and its right,
              at its distances from each

The distances make the tables fair to whole-word masking: in a masked word of two characters the
second is predicted from the token before the word two places back, as the model must (without them a
table keyed by the left token alone answers with the word's first character). Training counts take
every token with the token d places before it (and e places after it) within one instance, for the
distances the held-out masks hold, the tokens between them of any kind but special. [CLS] and [SEP]
count as neighbours, never as answers. A token the masking replaced at random or left unchanged (10%
each) counts as masked here, and the model may do better there. A context the training data never
held backs off: neighbours -> left -> unigram.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

NAMES = ("unigram", "left", "neighbours")
MAX_GAP = 4  # masked tokens in a longer run of masks are scored by the unigram table (few: 3.5% in the demo)
MAX_COUNTED = 20_000_000  # training tokens counted at most (the first ones): about 20 s on one core


def neighbours(input_ids: np.ndarray, cu_seqlens: np.ndarray, positions: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The nearest unmasked token left and right of each masked position of a packed batch ([CLS] and
    the final [SEP] bound every instance and are never masked). -> (left ids, right ids, their
    distances d >= 1 and e >= 1), each [M]."""
    N = len(input_ids)
    masked = np.zeros(N, dtype=bool)
    masked[positions] = True
    idx = np.arange(N)
    last_open = np.maximum.accumulate(np.where(masked, -1, idx))                     # nearest unmasked at or before
    next_open = np.minimum.accumulate(np.where(masked, N, idx)[::-1])[::-1]          # at or after
    left = np.where(positions > 0, last_open[positions - 1], -1)                     # position 0 has none
    right = next_open[np.minimum(positions + 1, N - 1)]
    start = np.repeat(cu_seqlens[:-1], np.diff(cu_seqlens))
    end = np.repeat(cu_seqlens[1:], np.diff(cu_seqlens))
    if (left < start[positions]).any() or (right >= end[positions]).any():
        raise ValueError("a masked token without an unmasked token on each side in its instance")
    return input_ids[left], input_ids[right], positions - left, right - positions


class _Table:
    """context -> its most frequent answer (the smallest id among ties), from (context, answer) pairs."""

    def __init__(self, context: np.ndarray, answer: np.ndarray, V: int):
        combos, counts = np.unique(context * V + answer, return_counts=True)   # sorted by context, then answer
        ctx = combos // V
        order = np.lexsort((-counts, ctx))                                      # by context, most frequent first
        first = np.r_[True, ctx[order][1:] != ctx[order][:-1]] if len(order) else np.zeros(0, bool)
        self.keys, self.answers = ctx[order[first]], combos[order[first]] % V

    def lookup(self, query: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        if not len(self.keys):
            return fallback.copy()
        at = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
        return np.where(self.keys[at] == query, self.answers[at], fallback)


class CountTables:
    """The three tables of a training set, for the contexts of given queries (their neighbours and
    distances): counting only what the queries can look up keeps a pass over millions of training
    tokens to a few seconds."""

    def __init__(self, tokens: Iterable[np.ndarray], vocab_size: int, special_ids: Iterable[int],
                 left: np.ndarray, right: np.ndarray, d: np.ndarray, e: np.ndarray):
        """tokens: the training instances, one int array each, or several packed end to end (specials
        bound every instance: no count crosses them). left, right, d, e [M]: the queries' nearest
        unmasked neighbours and their distances (>= 1)."""
        self.V = V = int(vocab_size)
        special = np.zeros(V, dtype=bool)
        special[np.asarray(list(special_ids), dtype=np.int64)] = True
        if (np.asarray(d) < 1).any() or (np.asarray(e) < 1).any():
            raise ValueError("distances to a neighbour are at least 1")
        # the contexts asked for: per d, the left tokens; per (d, e), left * V + right (sorted, unique);
        # tokens in a longer run of masks than MAX_GAP are left to the unigram table
        short = d + e - 1 <= MAX_GAP
        want_left = {int(k): np.unique(left[short & (d == k)]) for k in np.unique(d[short])}
        want_both = {(int(k), int(m)): np.unique(left[(d == k) & (e == m)] * V + right[(d == k) & (e == m)])
                     for k, m in set(zip(d[short].tolist(), e[short].tolist()))}
        unigram = np.zeros(V, dtype=np.int64)
        by_left: dict[int, list] = {k: [] for k in want_left}
        by_both: dict[tuple[int, int], list] = {k: [] for k in want_both}
        for t in tokens:
            t = np.asarray(t, dtype=np.int64)
            is_special = special[t]
            specials_before = np.r_[0, np.cumsum(is_special)]                 # specials in t[:i] is [i]
            centre = np.flatnonzero(~is_special)
            unigram += np.bincount(t[centre], minlength=V)

            def clean(lo, hi):  # no special strictly between lo and hi
                return specials_before[hi] - specials_before[lo + 1] == 0

            for k, wanted in want_left.items():
                c = centre[centre >= k]
                c = c[_member(t[c - k], wanted)]
                c = c[clean(c - k, c)]
                by_left[k].append((t[c - k], t[c]))
            for (k, m), wanted in want_both.items():
                c = centre[(centre >= k) & (centre + m < len(t))]
                key = t[c - k] * V + t[c + m]
                hit = _member(key, wanted)
                c, key = c[hit], key[hit]
                ok = clean(c - k, c) & clean(c, c + m)
                by_both[k, m].append((key[ok], t[c[ok]]))
        self.top = int(unigram.argmax())
        self.left = {k: _Table(*_joined(v), V) for k, v in by_left.items()}
        self.both = {k: _Table(*_joined(v), V) for k, v in by_both.items()}

    def predict(self, left: np.ndarray, right: np.ndarray, d: np.ndarray, e: np.ndarray) -> dict[str, np.ndarray]:
        """Each table's answer [M] for masked tokens with these nearest unmasked neighbours and distances [M]."""
        uni = np.full(len(left), self.top, dtype=np.int64)
        by_left = uni.copy()
        for k, table in self.left.items():
            at = d == k
            by_left[at] = table.lookup(left[at], uni[at])
        by_both = by_left.copy()
        for (k, m), table in self.both.items():
            at = (d == k) & (e == m)
            by_both[at] = table.lookup(left[at] * self.V + right[at], by_left[at])
        return {"unigram": uni, "left": by_left, "neighbours": by_both}


def _member(x: np.ndarray, sorted_unique: np.ndarray) -> np.ndarray:
    """x in sorted_unique, elementwise. The wanted keys are few (thousands) and x long (millions): a
    bitmap of the keys modulo a prime passes almost only the members, and a binary search settles those."""
    if not len(sorted_unique):
        return np.zeros(len(x), dtype=bool)
    bitmap = np.zeros(_PRIME, dtype=bool)
    bitmap[sorted_unique % _PRIME] = True
    maybe = np.flatnonzero(bitmap[x % _PRIME])
    at = np.minimum(np.searchsorted(sorted_unique, x[maybe]), len(sorted_unique) - 1)
    out = np.zeros(len(x), dtype=bool)
    out[maybe[sorted_unique[at] == x[maybe]]] = True
    return out


_PRIME = 4_194_301  # the largest prime below 2^22: a 4 MB bitmap, nearly empty for thousands of keys


def _joined(chunks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not chunks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([c for c, _ in chunks]), np.concatenate([a for _, a in chunks])


def queries(batches: Iterable) -> dict[str, np.ndarray]:
    """The masked tokens of these batches (torchbert.data.shards.Batch): their labels, nearest unmasked
    neighbours (the tokens as the model reads them) and distances, each [M] over all batches."""
    out: dict[str, list] = {k: [] for k in ("labels", "left", "right", "d", "e")}
    for b in batches:
        found = neighbours(b.input_ids.numpy(), b.cu_seqlens.numpy().astype(np.int64), b.mlm_positions.numpy())
        for k, v in zip(("left", "right", "d", "e"), found):
            out[k].append(v)
        out["labels"].append(b.mlm_labels.numpy())
    return {k: np.concatenate(v).astype(np.int64) if v else np.zeros(0, np.int64) for k, v in out.items()}


def score(tables: CountTables, q: dict[str, np.ndarray]) -> dict[str, float | int]:
    """Each table's accuracy on the queries, and how many there were (`masked`)."""
    n = len(q["labels"])
    if not n:
        raise ValueError("no masked tokens to score the count yardsticks on")
    guesses = tables.predict(q["left"], q["right"], q["d"], q["e"])
    return {**{name: float((guesses[name] == q["labels"]).mean()) for name in NAMES}, "masked": n}


def yardsticks(train_data, eval_batches: Iterable, max_tokens: int = MAX_COUNTED) -> dict[str, float | int]:
    """The three count yardsticks of `train_data` (PretrainingData) on `eval_batches`' masks, counted
    over its first `max_tokens` training tokens (`counted` says how many)."""
    q = queries(eval_batches)
    arrays = list(train_data.token_arrays(max_tokens))
    tables = CountTables(arrays, train_data.vocab_size, train_data.manifest["special_ids"]["all"],
                         q["left"], q["right"], q["d"], q["e"])
    return {**score(tables, q), "counted": sum(len(a) for a in arrays)}
