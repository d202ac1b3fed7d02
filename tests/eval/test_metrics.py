"""Fine-tuning metrics against hand-computed values, conlleval's chunking rules and real WNUT-16 tags."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import realdata

from torchbert.eval import metrics
from torchbert.eval.metrics import (accuracy, classification_scores, entity_scores, normalize_answer, regression_scores,
                                    squad_best_thresholds, squad_scores)


@pytest.fixture(autouse=True)
def no_warnings():
    """Degenerate inputs must give clean numbers, not leak sklearn / scipy / seqeval warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_accuracy():
    assert accuracy([1, 0, 2, 2], np.array([1, 1, 2, 0])) == 0.5
    assert isinstance(accuracy([1], [1]), float)


def test_binary_scores_by_hand():
    # labels 1 1 1 1 0 0 0 0 0 0 / preds 1 1 1 0 1 0 0 0 0 0: TP 3, FN 1, FP 1, TN 5
    # precision = recall = 3/4 -> F1 0.75; MCC = (3*5 - 1*1) / sqrt(4 * 4 * 6 * 6) = 14 / 24
    labels = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    preds = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]
    s = classification_scores(preds, labels, num_labels=2)
    # class 0: TP 5, FP 1, FN 1 -> F1 5/6; macro_f1, scikit-learn's macro average, is (3/4 + 5/6) / 2
    assert s == pytest.approx({"accuracy": 0.8, "f1": 0.75, "mcc": 14 / 24, "macro_f1": (3 / 4 + 5 / 6) / 2})
    assert all(type(v) is float for v in s.values())
    # F1 is that of class 1: swapping the classes' roles changes it (TP 5, FP 1, FN 1 -> 5/6)
    assert classification_scores([1 - p for p in preds], [1 - y for y in labels], 2)["f1"] == pytest.approx(5 / 6)


def test_multiclass_scores_by_hand():
    # labels 0 0 1 1 2 2 / preds 0 1 1 1 2 0
    # class 0: TP 1 FP 1 FN 1 -> F1 1/2; class 1: TP 2 FP 1 FN 0 -> P 2/3 R 1 F1 4/5; class 2: TP 1 FP 0 FN 1 -> 2/3
    # macro F1 = (1/2 + 4/5 + 2/3) / 3. MCC (Gorodkin): c = 4 correct of s = 6, predicted counts (2, 3, 1),
    # true counts (2, 2, 2): (c*s - sum p*t) / sqrt((s^2 - sum p^2)(s^2 - sum t^2)) = (24 - 12) / sqrt(22 * 24)
    s = classification_scores(np.array([0, 1, 1, 1, 2, 0]), np.array([0, 0, 1, 1, 2, 2]), num_labels=3)
    assert s == pytest.approx({"accuracy": 4 / 6, "f1": (1 / 2 + 4 / 5 + 2 / 3) / 3, "mcc": 12 / math.sqrt(22 * 24)})


def test_binary_scores_match_the_formulas_on_random_labels():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    preds = np.where(rng.random(500) < 0.7, labels, 1 - labels)
    tp = float(np.sum((preds == 1) & (labels == 1)))
    tn = float(np.sum((preds == 0) & (labels == 0)))
    fp = float(np.sum((preds == 1) & (labels == 0)))
    fn = float(np.sum((preds == 0) & (labels == 1)))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    s = classification_scores(preds, labels, 2)
    f1_of_0 = 2 * tn / (2 * tn + fn + fp)  # macro_f1: both labels' F1, averaged (scikit-learn's average="macro")
    assert s == pytest.approx({"accuracy": (tp + tn) / 500, "f1": 2 * tp / (2 * tp + fp + fn), "mcc": mcc,
                               "macro_f1": (2 * tp / (2 * tp + fp + fn) + f1_of_0) / 2})


def test_single_class_gives_zero_f1_and_mcc():
    assert classification_scores([0, 0, 0], [0, 0, 0], 2) == {"accuracy": 1.0, "f1": 0.0, "mcc": 0.0, "macro_f1": 1.0}
    assert classification_scores([1, 1], [1, 1], 2) == {"accuracy": 1.0, "f1": 1.0, "mcc": 0.0, "macro_f1": 1.0}
    # one class in the labels, two in the preds: MCC's denominator is 0 too
    assert classification_scores([0, 1, 1], [1, 1, 1], 2)["mcc"] == 0.0


def test_classification_errors():
    with pytest.raises(ValueError, match="no predictions to score"):
        classification_scores([], [], 2)
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        classification_scores([0, 1, 1], [0, 1], 2)
    with pytest.raises(ValueError, match=r"preds must be class ids in \[0, 2\)"):
        classification_scores([0, 2], [0, 1], 2)
    with pytest.raises(ValueError, match="1-D"):
        classification_scores([[0.1, 0.9]], [1], 2)
    with pytest.raises(ValueError, match=r"labels must be class ids in \[0, 2\), found -1\.\.1"):
        classification_scores([0, 1], [-1, 1], 2)
    with pytest.raises(ValueError, match="num_labels >= 2, got 1"):
        classification_scores([0, 0], [0, 0], 1)
    with pytest.raises(ValueError, match="no predictions to score"):
        accuracy([], [])


def test_regression_by_hand():
    # preds 1 2 3 4 (deviations -1.5 -.5 .5 1.5, sum of squares 5); labels 1 3 2 10 (mean 4, deviations
    # -3 -1 -2 6, sum of squares 50); covariance sum 4.5 + .5 - 1 + 9 = 13 -> Pearson 13 / sqrt(5 * 50).
    # Ranks of the labels 1 3 2 4 against 1 2 3 4: Spearman = 1 - 6 * (0 + 1 + 1 + 0) / (4 * 15) = 0.8.
    # MSE = (0 + 1 + 1 + 36) / 4.
    s = regression_scores([1.0, 2.0, 3.0, 4.0], np.array([1, 3, 2, 10]))
    assert s == pytest.approx({"pearson": 13 / math.sqrt(250), "spearman": 0.8, "mse": 9.5})
    assert all(type(v) is float for v in s.values())
    assert regression_scores([3, 2, 1], [1, 2, 3]) == pytest.approx({"pearson": -1.0, "spearman": -1.0, "mse": 8 / 3})


def test_constant_predictions_have_zero_correlation():
    s = regression_scores([2.0, 2.0, 2.0], [1.0, 2.0, 4.0])
    assert s == pytest.approx({"pearson": 0.0, "spearman": 0.0, "mse": (1 + 0 + 4) / 3})
    assert regression_scores([1.0], [3.0]) == {"pearson": 0.0, "spearman": 0.0, "mse": 4.0}
    # constant labels are as undefined as constant predictions
    assert regression_scores([1.0, 2.0, 4.0], [2.0, 2.0, 2.0]) == pytest.approx(
        {"pearson": 0.0, "spearman": 0.0, "mse": (1 + 0 + 4) / 3})
    with pytest.raises(ValueError, match="2 predictions but 3 labels"):
        regression_scores([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="no predictions to score"):
        regression_scores(np.array([]), np.array([]))


def test_wrong_type_is_a_false_positive_and_a_false_negative():
    true = [["B-PER", "I-PER", "O", "B-LOC"]]
    pred = [["B-ORG", "I-ORG", "O", "B-LOC"]]
    # gold PER(0-1), LOC(3); predicted ORG(0-1), LOC(3): 1 of 2 right each way
    assert entity_scores(true, pred) == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "token_accuracy": 0.5}


def test_wrong_boundary_counts_as_wrong():
    # gold PER(0-2); predicted PER(0-1) and the tag at 2 is O: no entity right
    s = entity_scores([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "O"]])
    assert s == pytest.approx({"precision": 0.0, "recall": 0.0, "f1": 0.0, "token_accuracy": 2 / 3})


def test_i_tag_after_o_starts_an_entity():
    """IOB1 (conlleval): I-X after O or another type opens an entity; B-X only splits two adjacent X."""
    iob1 = [["O", "I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]]
    iob2 = [["O", "B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG"]]
    assert entity_scores(iob1, iob2, scheme="IOB1") == pytest.approx(
        {"precision": 1.0, "recall": 1.0, "f1": 1.0, "token_accuracy": 4 / 7})
    # all I-PER is one entity PER(1-3), not the gold's PER(1-2) + PER(3)
    merged = [["O", "I-PER", "I-PER", "I-PER", "O", "I-LOC", "I-ORG"]]
    # predicted PER(1-3), LOC(5), ORG(6): 2 of 3 right; gold PER(1-2), PER(3), LOC(5), ORG(6): 2 of 4 found
    s = entity_scores(iob2, merged)
    assert s == pytest.approx({"precision": 2 / 3, "recall": 2 / 4, "f1": 2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2),
                               "token_accuracy": 3 / 7})


def test_iobes():
    true = [["S-LOC", "O", "B-PER", "I-PER", "E-PER"], ["B-ORG", "E-ORG"]]
    pred = [["S-LOC", "O", "B-PER", "E-PER", "S-PER"], ["B-ORG", "E-ORG"]]
    # gold LOC(0), PER(2-4), ORG; predicted LOC(0), PER(2-3), PER(4), ORG: 2 right of 4 predicted, of 3 gold
    p, r = 2 / 4, 2 / 3
    s = entity_scores(true, pred, scheme="IOBES")
    assert s == pytest.approx({"precision": p, "recall": r, "f1": 2 * p * r / (p + r), "token_accuracy": 5 / 7})
    assert entity_scores(true, true) == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "token_accuracy": 1.0}


def test_no_entities_anywhere():
    s = entity_scores([["O", "O"], ["O"]], [["O", "O"], ["O"]])
    assert s == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "token_accuracy": 1.0}
    # entities only in the gold: nothing predicted -> precision 0 (not nan), recall 0
    assert entity_scores([["B-X", "O"]], [["O", "O"]])["precision"] == 0.0


def test_entity_errors():
    with pytest.raises(ValueError, match="sentence 1: 2 true tags but 1 predicted"):
        entity_scores([["O"], ["B-PER", "I-PER"]], [["O"], ["B-PER"]])
    with pytest.raises(ValueError, match="2 true sentences but 1 predicted"):
        entity_scores([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="no predictions to score"):
        entity_scores([], [])
    with pytest.raises(ValueError, match="no predictions to score"):
        entity_scores([[]], [[]])
    with pytest.raises(ValueError, match="prefix E, S do not belong to scheme BIO"):
        entity_scores([["S-PER", "O"]], [["B-PER", "E-PER"]], scheme="BIO")
    with pytest.raises(ValueError, match="unknown tag scheme 'BILOU'"):
        entity_scores([["O"]], [["O"]], scheme="BILOU")
    with pytest.raises(ValueError, match="sentence 0: tag 'PER'"):
        entity_scores([["O"]], [["PER"]])
    # the prefix is a whole tag or is followed by "-": "BPER" and "Bogus" are neither
    for odd in ("BPER", "Bogus"):
        with pytest.raises(ValueError, match=f"sentence 0: tag '{odd}'"):
            entity_scores([["O"]], [[odd]])
    # IOB1 has no E- (nor S-)
    with pytest.raises(ValueError, match="prefix E do not belong to scheme IOB1"):
        entity_scores([["B-PER", "E-PER"]], [["B-PER", "I-PER"]], scheme="IOB1")


def test_wnut_real_tags():
    sents = realdata.wnut_sentences()
    true = [list(tags) for _, tags in sents]
    assert entity_scores(true, true) == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "token_accuracy": 1.0}

    # WNUT is IOB2 (every entity opens with B-), so counting B- tags counts entities.
    n_tags = sum(len(t) for t in true)
    n_entities = sum(tag.startswith("B-") for t in true for tag in t)
    n_person = sum(tag == "B-person" for t in true for tag in t)
    n_person_tags = sum(tag.endswith("-person") for t in true for tag in t)
    assert n_entities > 1000 and n_person > 100
    # Drop every person entity: what remains is all right (precision 1); recall loses exactly the persons' share.
    dropped = [["O" if tag.endswith("-person") else tag for tag in t] for t in true]
    s = entity_scores(true, dropped)
    recall = 1 - n_person / n_entities
    assert s == pytest.approx({"precision": 1.0, "recall": recall, "f1": 2 * recall / (1 + recall),
                               "token_accuracy": 1 - n_person_tags / n_tags}, abs=1e-12)

    # The same entities written in IOB1 (B- only between two adjacent entities of one type) score 1.0.
    iob1 = []
    for t in true:
        out, prev = [], "O"
        for tag in t:
            adjacent_same = tag.startswith("B-") and prev != "O" and prev[2:] == tag[2:]
            out.append(tag if tag == "O" or adjacent_same else "I-" + tag[2:])
            prev = tag
        iob1.append(out)
    assert iob1 != true
    assert entity_scores(true, iob1)["f1"] == 1.0


def test_normalize_answer():
    assert normalize_answer("The  Cat's!") == "cats"
    assert normalize_answer("  A man, an apple and THE end.  ") == "man apple and end"
    # articles only as whole words; punctuation goes first, so "the-end" loses its article too
    assert normalize_answer("Theatre anna thereby") == "theatre anna thereby"
    assert normalize_answer("the-end") == "theend"
    assert normalize_answer("(a)") == ""
    assert normalize_answer("Tab\tand\nnewline") == "tab and newline"


def test_squad_v1_by_hand():
    gold = {"q1": ["the big red dog"], "q2": ["Paris", "in Paris"], "q3": ["x y y"]}
    preds = {"q1": "big dog", "q2": "paris!", "q3": "y y y z", "extra": "ignored"}
    # q1: gold tokens big red dog, predicted big dog: P 1, R 2/3 -> F1 0.8, EM 0
    # q2: "paris" matches the first gold exactly -> EM 1, F1 1
    # q3: common tokens y, y (2): P 2/4, R 2/3 -> F1 4/7
    s = squad_scores(gold, preds)
    assert s == pytest.approx({"exact_match": 1 / 3, "f1": (0.8 + 1 + 4 / 7) / 3, "total": 3.0})
    assert set(s) == {"exact_match", "f1", "total"}


def test_squad_max_over_gold_answers():
    s = squad_scores({"q": ["dog", "big red dog"]}, {"q": "big red dog"})
    assert s["exact_match"] == 1.0 and s["f1"] == 1.0
    # best F1 and best EM each over all golds: "red dog" vs "dog" (P 1/2 R 1 -> 2/3) and vs "big red dog" (0.8)
    assert squad_scores({"q": ["dog", "big red dog"]}, {"q": "red dog"})["f1"] == pytest.approx(0.8)


def test_squad_v2_split():
    gold = {"q1": ["Paris"], "q2": [], "q3": [], "q4": ["the big red dog"]}
    preds = {"q1": "paris.", "q2": "", "q3": "London", "q4": "big dog"}
    # EM: q1 1, q2 1 (no answer, none given), q3 0 (answered an unanswerable), q4 0; F1: 1, 1, 0, 0.8
    s = squad_scores(gold, preds)
    assert s == pytest.approx({
        "exact_match": 2 / 4, "f1": 2.8 / 4, "total": 4.0,
        "HasAns_exact_match": 1 / 2, "HasAns_f1": 1.8 / 2, "HasAns_total": 2.0,
        "NoAns_exact_match": 1 / 2, "NoAns_f1": 1 / 2, "NoAns_total": 2.0,
    })
    # an empty prediction for an answerable question scores 0; a gold of only "the" counts as no answer
    assert squad_scores({"q": ["Paris"]}, {"q": ""}) == {"exact_match": 0.0, "f1": 0.0, "total": 1.0}
    assert squad_scores({"q": ["The"]}, {"q": ""}) == {"exact_match": 1.0, "f1": 1.0, "total": 1.0}
    # golds that normalize to "" are dropped when others remain (v2.0 script), so "" is no match for "Paris"
    assert squad_scores({"q": ["The", "Paris"]}, {"q": ""}) == {"exact_match": 0.0, "f1": 0.0, "total": 1.0}
    only_no_ans = squad_scores({"q": []}, {"q": "a"})  # "a" normalizes to "": it is no answer
    assert only_no_ans == {"exact_match": 1.0, "f1": 1.0, "total": 1.0,
                           "NoAns_exact_match": 1.0, "NoAns_f1": 1.0, "NoAns_total": 1.0}


def test_squad_v2_best_thresholds_by_hand():
    gold = {"q1": ["Paris"], "q2": [], "q3": ["the big red dog"], "q4": [], "q5": ["cat"]}
    spans = {"q1": "Paris", "q2": "London", "q3": "red dog", "q5": "cat"}  # q4 has no valid span
    margins = {"q1": -1.0, "q2": 0.5, "q3": 2.0, "q5": 3.0}  # null score minus span score
    # all "": EM = F1 = 2 (q2, q4). Switched by margin: q1 +1 (3), q2 -1 (2), q3 +0 EM / +0.8 F1, q5 +1
    # EM peaks at 3 after q1 (first reached: halfway between -1.0 and 0.5); F1 at 3.8 after q5 (3.0 + 1)
    best = squad_best_thresholds(gold, spans, margins)
    assert best == pytest.approx({"best_exact_match": 3 / 5, "best_exact_match_threshold": -0.25,
                                  "best_f1": 3.8 / 5, "best_f1_threshold": 4.0})
    # each threshold, used as postprocess_qa's rule (span when margin <= t), scores what was reported
    for name in ("exact_match", "f1"):
        t = best[f"best_{name}_threshold"]
        preds = {q: spans[q] if q in spans and margins[q] <= t else "" for q in gold}
        assert squad_scores(gold, preds)[name] == pytest.approx(best[f"best_{name}"])
    # when answering nothing is best, the threshold sits below every margin
    assert squad_best_thresholds({"q": []}, {"q": "x"}, {"q": 1.5}) == {
        "best_exact_match": 1.0, "best_exact_match_threshold": 0.5, "best_f1": 1.0, "best_f1_threshold": 0.5}
    with pytest.raises(ValueError, match="no predictions to score"):
        squad_best_thresholds({}, {}, {})


def test_squad_missing_prediction_counts_as_wrong():
    with pytest.warns(UserWarning, match="Missing prediction for 2 of 3 questions"):
        s = squad_scores({"q1": ["cat"], "q2": ["dog"], "q3": []}, {"q1": "cat"})
    assert s["exact_match"] == pytest.approx(1 / 3) and s["total"] == 3.0
    assert s["NoAns_exact_match"] == 0.0  # a missing answer is not an empty answer
    with pytest.raises(ValueError, match="no predictions to score"):
        squad_scores({}, {})
    with pytest.raises(TypeError, match="question q: gold answers must be a list"):
        squad_scores({"q": "cat"}, {"q": "cat"})


def test_token_scoring_follows_the_tag_shapes():
    assert metrics.token_scoring(["O", "B-PER", "I-PER", "E-LOC", "S-LOC"]) == "entities"
    assert metrics.token_scoring(["O"]) == "entities"
    # part of speech: Penn (lower-cased, as in Brown), People's Daily; "IN" and "Bg" are no chunk tags
    for tags in (["nn", "vbd", "''", ",", "--"], ["n", "v", "nr", "Vg", "Bg"], ["O", "IN", "B-NP"]):
        assert metrics.token_scoring(tags) == "tags", tags


def test_tag_scores_per_word():
    true = [["n", "v", "n"], ["a", "n"]]
    pred = [["n", "n", "n"], ["a", "v"]]
    got = metrics.tag_scores(true, pred)
    assert got["accuracy"] == pytest.approx(3 / 5)
    # per gold tag: n P=2/3 R=2/3 F=2/3; v P=0 R=0 F=0; a P=1 R=1 F=1 -> macro (2/3 + 0 + 1) / 3
    assert got["macro_f1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    # a tag predicted but never gold ("d") costs the gold tags' recall, and is not a class of its own:
    # n P=2/2 R=2/3 F=0.8, v F=0, a F=1 -> (0.8 + 0 + 1) / 3, not (0.8 + 0 + 1 + 0) / 4
    got = metrics.tag_scores(true, [["n", "d", "n"], ["a", "d"]])
    assert got["macro_f1"] == pytest.approx((0.8 + 0 + 1) / 3)
    with pytest.raises(ValueError, match="sentence 1: 2 true tags but 1 predicted"):
        metrics.tag_scores(true, [["n", "n", "n"], ["a"]])
    with pytest.raises(ValueError, match="no predictions to score"):
        metrics.tag_scores([[]], [[]])


def test_cmrc_longest_common_run_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = list(rng.choice(list("abc"), rng.integers(0, 8)))
        b = list(rng.choice(list("abc"), rng.integers(0, 8)))
        brute = max([k for i in range(len(a)) for j in range(len(b)) for k in range(1, min(len(a) - i, len(b) - j) + 1)
                     if a[i:i + k] == b[j:j + k]], default=0)
        assert metrics._longest_common_run(a, b) == brute, (a, b)


def test_cmrc_rules_in_detail():
    # Latin letters are lower-cased inside a Chinese answer, for F1 as for EM
    assert metrics.cmrc_scores(["北京ABC"], "北京abc") == (1.0, 1.0)
    # the best gold counts, not the last: "北京" alone would give P 2/4, R 1
    assert metrics.cmrc_scores(["北京大学", "北京"], "北京大学") == (1.0, 1.0)
    # one Chinese gold puts the whole question under CMRC's rules: "。" is dropped there, kept by SQuAD's
    assert squad_scores({"q": ["北京", "Beijing"]}, {"q": "北京。"})["exact_match"] == 1.0
