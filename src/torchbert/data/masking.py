"""Masking pretraining instances (BERT paper, section 3.1): 15% of the tokens, 80/10/10.

Shared by `prepare` (static masks, written into the shards) and the data loader (dynamic masks, drawn
afresh each epoch). The random numbers are a hash of (seed, epoch, instance, position): nothing about
a mask needs remembering, and any process draws the same mask for the same instance and epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that scrambles every bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, instance: np.ndarray, position: np.ndarray, stream: int) -> np.ndarray:
    """Uniform [0, 1) floats that are a pure function of (seed, epoch, instance, position, stream).

    Counter-based randomness: masks depend on nothing else (not the batch, rank or resume point)."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([(seed * 1_000_003 + epoch) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
        key = _mix(key ^ np.uint64(stream + 1) * _GOLDEN)
        x = _mix(key + instance.astype(np.uint64) * _GOLDEN)
        x = _mix(x + position.astype(np.uint64) + _GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def document_uniforms(seed: int, tokens: np.ndarray, doc_starts: np.ndarray) -> np.ndarray:
    """[D] uniform [0, 1) floats, each a pure function of the seed and one document's tokens
    (tokens[doc_starts[d]:doc_starts[d + 1]]): where prepare deals the document, the same wherever
    it lies in the corpus and however the files were cut (issue 58)."""
    if len(doc_starts) < 2:
        return np.zeros(0)
    lengths = np.diff(doc_starts)
    with np.errstate(over="ignore"):
        position = np.arange(len(tokens), dtype=np.uint64) - np.repeat(doc_starts[:-1], lengths).astype(np.uint64)
        x = _mix(tokens.astype(np.uint64) * _GOLDEN + position)  # each token at its place in its document
        h = np.add.reduceat(x, doc_starts[:-1].astype(np.int64)) if len(tokens) else np.zeros(len(lengths), np.uint64)
        h = _mix(_mix(h ^ lengths.astype(np.uint64) * _GOLDEN) + np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _greedy_fit(s_len: np.ndarray, s_inst: np.ndarray, budget: np.ndarray, n: int) -> np.ndarray:
    """[W] which words to take: in their (shuffled) order, each instance takes every word that still
    fits its budget and skips one that does not (Google's rule).  Each numpy round drops the words
    too long for what is left and takes the longest prefix that fits; a few rounds settle all."""
    budget = budget.copy()
    chosen = np.zeros(len(s_len), dtype=bool)
    open_ = np.ones(len(s_len), dtype=bool)
    while True:
        open_ &= s_len <= budget[s_inst]                             # can never fit: skipped for good
        if not open_.any():
            return chosen
        o = np.flatnonzero(open_)
        csum = np.cumsum(s_len[o])
        inst_o = s_inst[o]
        first_of_inst = np.r_[True, inst_o[1:] != inst_o[:-1]]
        base = np.maximum.accumulate(np.where(first_of_inst, csum - s_len[o], 0))
        take = (csum - base) <= budget[inst_o]                       # the prefix that fits, per instance
        chosen[o[take]] = True
        open_[o[take]] = False
        budget -= np.bincount(inst_o[take], weights=s_len[o][take], minlength=n).astype(np.int64)
        # the next open word of an instance no longer fits: the length rule drops it next round


@dataclass
class Masked:
    """The MLM side of n instances: positions are within each instance, sorted."""

    offsets: np.ndarray    # [n+1] int64 into positions
    positions: np.ndarray  # [M] int64
    input_ids: np.ndarray  # [M] int32: what the model sees there ([MASK], a random token, or the original)
    labels: np.ndarray     # [M] int32: the original tokens


def mask_instances(
    tokens: np.ndarray,
    word_starts: np.ndarray,
    offsets: np.ndarray,
    instance_ids: np.ndarray,
    *,
    special_ids: Sequence[int],
    never_mask: Sequence[int],
    mask_id: int,
    vocab_size: int,
    seed: int,
    epoch: int,
    masked_lm_prob: float = 0.15,
    max_predictions: int = 20,
    whole_word: bool = False,
    replace: tuple[float, float] = (0.8, 0.1),
) -> Masked:
    """Choose and replace the masked tokens of packed instances, all at once.

    Per instance: num = min(max_predictions, max(1, round(candidates * masked_lm_prob))) tokens, taken
    word by word in random order, skipping a word that would overflow num (Google's rule), so a
    word is masked whole or not at all.  Without whole_word every token is its own word.
    `never_mask` ([CLS], [SEP], [PAD]) are never chosen; random replacements avoid all `special_ids`.
    `replace`: the shares of chosen tokens that become [MASK] and a random token (the paper's 0.8 and
    0.1); the rest stay unchanged."""
    n = len(offsets) - 1
    N = len(tokens)
    lengths = np.diff(offsets)
    inst = np.repeat(np.arange(n), lengths)                          # [N] instance of each token
    pos = np.arange(N) - np.repeat(offsets[:-1], lengths)            # [N] position within the instance
    gid = np.asarray(instance_ids, dtype=np.int64)[inst]             # [N] global instance id
    special = np.isin(tokens, np.asarray(never_mask))
    cand = ~special
    n_cand = np.bincount(inst[cand], minlength=n)
    num = np.minimum(max_predictions, np.maximum(1, np.rint(n_cand * masked_lm_prob).astype(np.int64)))

    # Words among the candidates: a candidate starts a new word if flagged, or if the token before
    # it is special (a word never crosses [SEP]).  Without whole_word every candidate is a word.
    c_idx = np.flatnonzero(cand)                                     # [C]
    if whole_word:
        prev_special = np.r_[True, special[:-1]][c_idx]
        starts = word_starts[c_idx] | prev_special | (pos[c_idx] == 0)
    else:
        starts = np.ones(len(c_idx), dtype=bool)
    word_of = np.cumsum(starts) - 1                                  # [C] word index of each candidate
    w_first = c_idx[starts]                                          # [W] first token of each word
    w_len = np.bincount(word_of, minlength=len(w_first))             # [W]
    w_inst = inst[w_first]                                           # [W]
    key = uniforms(seed, epoch, gid[w_first], pos[w_first], stream=0)

    # Shuffle words within their instance (key < 1 never crosses into the next instance, and words
    # are in instance order), then take words greedily while they fit the budget.
    order = np.argsort(w_inst + key)                                 # [W] instance-major, random within
    s_len, s_inst = w_len[order], w_inst[order]
    if whole_word:
        chosen = _greedy_fit(s_len, s_inst, num, n)
    else:  # every word is one token: the first `num` of each instance
        first = np.repeat(np.cumsum(n_cand) - n_cand, n_cand)        # [W] where each instance begins
        chosen = (np.arange(len(order)) - first) < num[s_inst]

    picked_words = np.zeros(len(w_first), dtype=bool)
    picked_words[order[chosen]] = True
    masked = np.zeros(N, dtype=bool)
    masked[c_idx[picked_words[word_of]]] = True
    m_idx = np.flatnonzero(masked)                                   # [M], sorted by instance then position

    # 80% [MASK], 10% a random non-special token, 10% unchanged (the paper's `replace`); decided per token.
    u = uniforms(seed, epoch, gid[m_idx], pos[m_idx], stream=1)
    r = uniforms(seed, epoch, gid[m_idx], pos[m_idx], stream=2)
    normal = np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids))
    to_mask, to_random = replace
    replaced = np.where(u < to_mask, mask_id,
                        np.where(u < to_mask + to_random, normal[(r * len(normal)).astype(np.int64)], tokens[m_idx]))
    m_count = np.bincount(inst[m_idx], minlength=n)
    return Masked(
        offsets=np.r_[0, np.cumsum(m_count)].astype(np.int64),
        positions=pos[m_idx].astype(np.int64),
        input_ids=replaced.astype(np.int32),
        labels=tokens[m_idx].astype(np.int32),
    )


# ----------------------------------------------------------------------------------------------
# the whole job
