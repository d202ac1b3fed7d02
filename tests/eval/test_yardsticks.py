"""The count yardsticks (eval/yardsticks.py): tables of token counts scored on the held-out masks."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

from torchbert.cli import main
from torchbert.data.shards import Batch, PretrainingData
from torchbert.eval import yardsticks as ys
from torchbert.eval.yardsticks import MAX_GAP, CountTables, neighbours, queries, score, yardsticks

CLS, SEP, MASK = 1, 2, 3
SPECIAL = (0, CLS, SEP, MASK)


def packed(instances, masked):
    """A Batch of instances (lists of ids) with the flat positions `masked` replaced by [MASK]."""
    tokens = np.concatenate([np.array(x) for x in instances])
    cu = np.r_[0, np.cumsum([len(x) for x in instances])]
    positions = np.array(sorted(masked))
    inputs = tokens.copy()
    inputs[positions] = MASK
    return Batch(torch.from_numpy(inputs), torch.zeros(len(tokens), dtype=torch.long),
                 torch.from_numpy(cu.astype(np.int32)), int(np.diff(cu).max()), torch.from_numpy(positions),
                 torch.from_numpy(tokens[positions]), torch.zeros(len(instances), dtype=torch.long))


def tables_for(train, queries, vocab_size=20):
    """CountTables of `train` for queries given as (left, right, d, e) tuples."""
    left, right, d, e = (np.array(x) for x in zip(*queries))
    return CountTables(train, vocab_size, SPECIAL, left, right, d, e), (left, right, d, e)


def test_the_tables_answer_from_counts_and_back_off():
    # after 5 come 10 twice and 11 once; between 5 and 6 stands 11 (twice), never 10; 12 is the most frequent
    train = [np.array([CLS, 5, 10, 7, SEP, 12, 12, 12, SEP]), np.array([CLS, 5, 10, 8, SEP, 12, SEP]),
             np.array([CLS, 5, 11, 6, SEP, 5, 11, 6, SEP, 12, SEP])]
    # (5, 6) -> 11; (5, 7) -> 10; 9 never seen: unigram; (CLS, 10) -> 5
    tables, q = tables_for(train, [(5, 6, 1, 1), (5, 7, 1, 1), (9, 6, 1, 1), (CLS, 10, 1, 1)])
    assert tables.top == 12  # specials are never an answer, though [SEP] is the most frequent id
    got = tables.predict(*q)
    assert got["unigram"].tolist() == [12, 12, 12, 12]
    assert got["left"].tolist() == [10, 10, 12, 5]
    assert got["neighbours"].tolist() == [11, 10, 12, 5]


def test_distances_count_tokens_further_away_and_never_across_a_special():
    # a masked word of two before 6: its second token is 2 after 5 (8, 8, 11: 8), but 2 after 5 and 1
    # before 6 is 11 ([5 10 11 6]); 3 after 5 is 6 alone ([SEP] is no answer); 5 and 9 stand around a
    # token only across instances, and [SEP] [CLS] between never count: those back off to the left table
    train = [np.array([CLS, 5, 10, 8, SEP, CLS, 5, 10, 8, SEP, CLS, 5, 10, 11, 6, SEP, CLS, 4, 11, 6, SEP]),
             np.array([CLS, 5, SEP, CLS, 7, 9, SEP, CLS, 5, SEP, CLS, 7, 9, SEP])]
    tables, q = tables_for(train, [(5, 6, 2, 1), (5, 9, 3, 2), (5, 9, 1, 1)])
    got = tables.predict(*q)
    assert got["left"].tolist() == [8, 6, 10]
    assert got["neighbours"].tolist() == [11, 6, 10]


def test_the_right_neighbour_is_counted_up_to_the_last_token_and_never_across_a_special():
    # 11 follows 5 most often; but between 5 and the final [SEP] of the array stands 10 only
    train = [np.array([CLS, 5, 11, 7, SEP, CLS, 5, 11, 8, SEP, CLS, 5, 10, SEP])]
    tables, q = tables_for(train, [(5, SEP, 1, 1)])
    assert tables.predict(*q)["neighbours"].tolist() == [10]
    # 5 ? . 6 with a [SEP] in the gap on the right is no context for (5, 6, 1, 2): left table's 9
    train = [np.array([CLS, 5, 9, 7, SEP, CLS, 5, 10, SEP, 6, SEP])]
    tables, q = tables_for(train, [(5, 6, 1, 2)])
    assert tables.predict(*q)["neighbours"].tolist() == [9]


def test_longer_runs_of_masks_are_left_to_the_unigram_table():
    # a run of MAX_GAP + 1 masks: 5 . . [x] . . 6 with x = 10 in training, yet 12 is the most frequent token
    run = [CLS, 5, 7, 7, 10, 7, 7, 6, SEP]
    assert len(run) - 4 == MAX_GAP + 1
    train = [np.array(run), np.array([CLS, 12, 12, 12, 12, 12, 12, 12, 12, 12, SEP])]
    tables, q = tables_for(train, [(5, 6, 3, 3)])
    got = tables.predict(*q)
    assert got["left"].tolist() == got["neighbours"].tolist() == [12]
    with pytest.raises(ValueError, match="distances to a neighbour are at least 1"):
        tables_for(train, [(5, 6, 0, 1)])


def test_membership_survives_collisions_of_the_bitmap():
    wanted = np.array([5, 9])
    x = np.array([5, 5 + ys._PRIME, 9 + 2 * ys._PRIME, 9, 6])
    assert ys._member(x, wanted).tolist() == [True, False, False, True, False]
    assert ys._member(x, np.zeros(0, np.int64)).tolist() == [False] * 5


def test_ties_go_to_the_smallest_id():
    tables, q = tables_for([np.array([CLS, 4, 9, SEP, CLS, 4, 8, SEP])], [(4, SEP, 1, 1)], vocab_size=10)
    assert tables.predict(*q)["left"].tolist() == [8]


def test_neighbours_skip_masked_tokens_and_stay_in_their_instance():
    # [CLS] a b c [SEP] | [CLS] d e [SEP]; b and c masked (a whole word), then d
    batch = packed([[CLS, 21, 22, 23, SEP], [CLS, 24, 25, SEP]], masked=[2, 3, 6])
    left, right, d, e = neighbours(batch.input_ids.numpy(), batch.cu_seqlens.numpy().astype(np.int64),
                                   batch.mlm_positions.numpy())
    assert left.tolist() == [21, 21, CLS] and right.tolist() == [SEP, SEP, 25]
    assert d.tolist() == [1, 2, 1] and e.tolist() == [2, 1, 1]
    # the final [SEP] of an instance masked: its right neighbour would be the next instance's [CLS]
    for masked in ([4], [5 + 3], [0]):
        batch = packed([[CLS, 21, 22, 23, SEP], [CLS, 24, 25, SEP]], masked=masked)
        with pytest.raises(ValueError, match="without an unmasked token on each side in its instance"):
            neighbours(batch.input_ids.numpy(), batch.cu_seqlens.numpy().astype(np.int64), batch.mlm_positions.numpy())


def test_score_counts_each_table_right_on_the_masks():
    train = [np.array([CLS, 5, 10, 7, SEP, CLS, 5, 10, 7, SEP, CLS, 8, 9, 10, SEP])]
    # masked: 10 (the most frequent) between 5 and 7, which every table gets right; 8 after [CLS] and
    # before 9, which only the table of both neighbours knows ([CLS] is followed by 5 more often)
    batch = packed([[CLS, 5, 10, 7, SEP], [CLS, 8, 9, SEP]], masked=[2, 6])
    q = queries([batch])
    tables = CountTables(train, 20, SPECIAL, q["left"], q["right"], q["d"], q["e"])
    assert score(tables, q) == {"unigram": 0.5, "left": 0.5, "neighbours": 1.0, "masked": 2}
    q = queries([packed([[CLS, 5, 7, 7, SEP]], masked=[2])])
    tables = CountTables(train, 20, SPECIAL, q["left"], q["right"], q["d"], q["e"])
    assert score(tables, q) == {"unigram": 0.0, "left": 0.0, "neighbours": 0.0, "masked": 1}
    with pytest.raises(ValueError, match="no masked tokens to score"):
        score(tables, queries([]))


def brute_force(data: PretrainingData, batches) -> dict[str, float]:
    """The same tables with Counters over each instance, the neighbours found by walking."""
    specials = set(data.manifest["special_ids"]["all"])
    uni, left, both = Counter(), {}, {}
    for i in range(len(data)):
        t = data.instance(i)["tokens"].tolist()
        for j, c in enumerate(t):
            if c in specials:
                continue
            uni[c] += 1
            for d in range(1, MAX_GAP + 1):
                if j - d < 0 or t[j - d + 1] in specials and d > 1:
                    break
                left.setdefault((t[j - d], d), Counter())[c] += 1
                for e in range(1, MAX_GAP + 2 - d):
                    if j + e >= len(t) or t[j + e - 1] in specials and e > 1:
                        break
                    both.setdefault((t[j - d], t[j + e], d, e), Counter())[c] += 1

    def best(counter):  # the most frequent, the smallest id among ties
        return min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    top = best(uni)
    right_answers = Counter()
    n = 0
    for b in batches:
        ids = b.input_ids.tolist()
        masked = set(b.mlm_positions.tolist())
        for p, label in zip(b.mlm_positions.tolist(), b.mlm_labels.tolist()):
            lo, hi = p - 1, p + 1
            while lo in masked:
                lo -= 1
            while hi in masked:
                hi += 1
            d, e = p - lo, hi - p
            short = d + e - 1 <= MAX_GAP
            lk, bk = (ids[lo], d), (ids[lo], ids[hi], d, e)
            guess_left = best(left[lk]) if short and lk in left else top
            guess_both = best(both[bk]) if short and bk in both else guess_left
            right_answers["unigram"] += top == label
            right_answers["left"] += guess_left == label
            right_answers["neighbours"] += guess_both == label
            n += 1
    return {k: right_answers[k] / n for k in ("unigram", "left", "neighbours")} | {"masked": n}


def test_yardsticks_on_real_text_equal_a_brute_force_count(prepared):
    data = PretrainingData(prepared / "data")
    batches = list(PretrainingData(prepared / "eval", shuffle=False).batches(16))
    got = yardsticks(data, batches)
    assert got.pop("counted") == sum(len(data.instance(i)["tokens"]) for i in range(len(data)))
    assert got == pytest.approx(brute_force(data, batches))
    # on People's Daily, each table knows more than the one before it
    assert got["masked"] > 300 and 0 < got["unigram"] < got["left"] < got["neighbours"] < 1


def test_pretrain_reports_the_yardsticks_beside_the_model(prepared, tmp_path):
    out = tmp_path / "run"
    assert main([str(a) for a in ("pretrain", "--data", prepared / "data", "--eval-data", prepared / "eval",
                                  "--out", out, "--config", "tiny", "--steps", 4, "--batch-size", 8,
                                  "--eval-every", 2, "--log-every", 1, "--eval-batches", 3, "--quiet")]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    batches = list(PretrainingData(prepared / "eval", shuffle=False).batches(8))[:3]
    assert summary["yardsticks"] == yardsticks(PretrainingData(prepared / "data"), batches)
    assert summary["yardsticks"]["masked"] == sum(b.mlm_labels.numel() for b in batches)
    assert (out / "learning.png").is_file() and (out / "accuracy.png").is_file()
