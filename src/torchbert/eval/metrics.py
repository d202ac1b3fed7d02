"""Scores of fine-tuned models, as plain floats (fractions in [0, 1]; correlations in [-1, 1]).

* Classification (GLUE): accuracy, F1 (of label 1 for binary tasks, macro otherwise) and Matthews
  correlation, from scikit-learn.
* Regression (STS-B): Pearson and Spearman correlation (scipy) and mean squared error.
* Tagging (CoNLL, WNUT): entity-level precision / recall / F1 with conlleval's chunking rules, from
  seqeval's default mode, plus accuracy over all tags.
* SQuAD v1.1 / v2.0: exact match and token F1, written out here to follow the official evaluation
  scripts (normalization, max over gold answers, "" as the gold of an unanswerable question). A
  question whose gold answer is Chinese is scored as CMRC 2018's script scores it (see cmrc_scores).

The official scripts report percentages; here every score is a fraction, so SQuAD EM 81.2 is 0.812.
"""

from __future__ import annotations

import collections
import re
import string
import warnings
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats
from seqeval.metrics import sequence_labeling as _seqeval
from sklearn import metrics as _sk

# Tag prefixes each scheme may use besides "O". IOB1 and IOB2 (= BIO) differ only in where B- is
# required, and conlleval's chunking reads both (and IOBES) the same way, so the scheme only checks tags.
_SCHEME_PREFIXES = {"IOB1": "BI", "IOB2": "BI", "BIO": "BI", "IOBES": "BIES"}
_TAG = re.compile(r"[BIES](-.+)?")
# Token tasks whose tags are not entity chunks (part of speech: nn, vbd, NR, ...) score per word.
TAG_METRICS = ("accuracy", "macro_f1")


def token_scoring(labels: Iterable[str]) -> str:
    """How a tag set is scored: "entities" (precision/recall/F1 over spans, seqeval) when every tag
    is O or B-/I-/E-/S- followed by a type, "tags" (word accuracy and macro F1) otherwise."""
    return "entities" if all(t == "O" or _TAG.fullmatch(t) for t in labels) else "tags"


def tag_scores(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """{"accuracy", "macro_f1"} of tag sequences, per word: the share of words tagged right, and F1
    averaged over the gold tags with every tag weighing the same (a tag never predicted scores 0)."""
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} true sentences but {len(pred_tags)} predicted")
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {i}: {len(t)} true tags but {len(p)} predicted")
    true = [tag for t in true_tags for tag in t]
    pred = [tag for p in pred_tags for tag in p]
    if not true:
        raise ValueError("no predictions to score")
    macro = _sk.f1_score(true, pred, labels=sorted(set(true)), average="macro", zero_division=0)
    return {"accuracy": accuracy(pred, true), "macro_f1": float(macro)}


def _pair(preds, labels) -> tuple[np.ndarray, np.ndarray]:
    """Both as 1-D arrays of one length, or a ValueError saying why not."""
    p, y = np.asarray(preds), np.asarray(labels)
    if p.ndim != 1 or y.ndim != 1:
        raise ValueError(f"preds and labels must be 1-D, got shapes {p.shape} and {y.shape}")
    if len(p) != len(y):
        raise ValueError(f"{len(p)} predictions but {len(y)} labels")
    if len(p) == 0:
        raise ValueError("no predictions to score")
    return p, y


def accuracy(preds, labels) -> float:
    """Share of predictions equal to their label."""
    p, y = _pair(preds, labels)
    return float(_sk.accuracy_score(y, p))


def classification_scores(preds, labels, num_labels: int) -> dict[str, float]:
    """{"accuracy", "f1", "mcc"} of predicted class ids, and "macro_f1" when num_labels == 2.

    f1 is the F1 of class 1 when num_labels == 2 (GLUE's MRPC / QQP convention; macro_f1 beside it is
    scikit-learn's average="macro"), else the macro average over the classes that occur in labels or
    preds. Undefined scores are 0.0: F1 with no true or predicted positives, and MCC when labels or
    preds hold a single class (its denominator is 0).
    """
    if num_labels < 2:
        raise ValueError(f"classification needs num_labels >= 2, got {num_labels}")
    p, y = _pair(preds, labels)
    for name, a in (("preds", p), ("labels", y)):
        if a.min() < 0 or a.max() >= num_labels:
            raise ValueError(f"{name} must be class ids in [0, {num_labels}), found {a.min()}..{a.max()}")
    macro = {}
    if num_labels == 2:
        f1 = _sk.f1_score(y, p, average="binary", pos_label=1, zero_division=0)
        macro = {"macro_f1": float(_sk.f1_score(y, p, average="macro", zero_division=0))}
    else:
        f1 = _sk.f1_score(y, p, average="macro", zero_division=0)
    # sklearn warns about a 1x1 confusion matrix before returning 0.0; the answer is the same without it.
    mcc = 0.0 if len(np.union1d(p, y)) < 2 else _sk.matthews_corrcoef(y, p)
    return {"accuracy": float(_sk.accuracy_score(y, p)), "f1": float(f1), "mcc": float(mcc), **macro}


def regression_scores(preds, labels) -> dict[str, float]:
    """{"pearson", "spearman", "mse"} of predicted scores.

    A correlation with a constant vector (a model that predicts one value for everything, or fewer than
    two examples) is undefined; it is reported as 0.0, not nan, so it can still be compared and logged.
    """
    p, y = _pair(preds, labels)
    p, y = p.astype(np.float64), y.astype(np.float64)
    if np.ptp(p) == 0 or np.ptp(y) == 0:
        pearson = spearman = 0.0
    else:
        pearson, spearman = stats.pearsonr(p, y)[0], stats.spearmanr(p, y)[0]
    return {"pearson": float(pearson), "spearman": float(spearman), "mse": float(np.mean((p - y) ** 2))}


def _check_tags(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]], scheme: str) -> None:
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} true sentences but {len(pred_tags)} predicted")
    if scheme != "auto" and scheme not in _SCHEME_PREFIXES:
        raise ValueError(f"unknown tag scheme {scheme!r}; choose auto, {', '.join(_SCHEME_PREFIXES)}")
    found = set()
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {i}: {len(t)} true tags but {len(p)} predicted")
        for tag in (*t, *p):
            if tag != "O":
                if not isinstance(tag, str) or not _TAG.fullmatch(tag):
                    raise ValueError(f"sentence {i}: tag {tag!r} is not O or B-/I-/E-/S- followed by a type")
                found.add(tag[0])
    if scheme != "auto" and not found <= set(_SCHEME_PREFIXES[scheme]):
        odd = ", ".join(sorted(found - set(_SCHEME_PREFIXES[scheme])))
        raise ValueError(f"tags with prefix {odd} do not belong to scheme {scheme}")


def entity_scores(true_tags: list[list[str]], pred_tags: list[list[str]], scheme: str = "auto") -> dict[str, float]:
    """{"precision", "recall", "f1", "token_accuracy"} of tag sequences, one list of tags per sentence.

    An entity counts only when its type and both ends match (micro-averaged over all entities). Chunks
    are read as conlleval does (seqeval's default mode): an I-X after O or after another type starts an
    entity, so IOB1, IOB2 (BIO) and IOBES tags all score right. `scheme` ("auto", "IOB1", "IOB2", "BIO",
    "IOBES") only restricts which prefixes may appear; "auto" accepts any of B-, I-, E-, S-.
    No entities in the gold or in the predictions makes recall or precision 0.0 (seqeval's zero_division=0).
    """
    _check_tags(true_tags, pred_tags, scheme)
    if sum(len(t) for t in true_tags) == 0:
        raise ValueError("no predictions to score")
    true_tags, pred_tags = [list(t) for t in true_tags], [list(p) for p in pred_tags]
    prf = _seqeval.precision_recall_fscore_support(true_tags, pred_tags, average="micro", zero_division=0)
    precision, recall, f1, _ = prf
    return {"precision": float(precision), "recall": float(recall), "f1": float(f1),
            "token_accuracy": float(_seqeval.accuracy_score(true_tags, pred_tags))}


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lowercase, drop ASCII punctuation, drop a/an/the, collapse whitespace.

    The steps run in the official script's order; punctuation goes first, so "the-cat" keeps no article.
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(gold: str, pred: str) -> float:
    """F1 of the bags of normalized tokens; two empty answers agree (1.0), one empty one scores 0.0."""
    g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
    if not g or not p:
        return float(g == p)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


# CMRC 2018's evaluation (Cui et al. 2019): a Chinese character is a token of its own, its marks below
# are dropped before scoring, F1 is over the longest common run of tokens, EM compares the strings
# without those marks. Runs of other characters are split into words and punctuation (the official
# script gives them to NLTK's word tokenizer, which agrees on plain words and numbers).
_CJK = re.compile(r"[\u4e00-\u9fa5]")
_CMRC_MARKS = frozenset("-:_*^/\\~`+=，。：？！“”；’《》…·、「」（）－～『』")
_WORDS = re.compile(r"\w+|[^\w\s]")


def _cmrc_tokens(text: str) -> list[str]:
    out, run = [], []
    for ch in text.lower().strip():
        if ch in _CMRC_MARKS:
            continue
        if _CJK.match(ch):
            out += _WORDS.findall("".join(run))
            run = []
            out.append(ch)
        else:
            run.append(ch)
    return out + _WORDS.findall("".join(run))


def _longest_common_run(a: list[str], b: list[str]) -> int:
    best, row = 0, [0] * (len(b) + 1)
    for x in a:
        prev, row = row, [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                row[j] = prev[j - 1] + 1
                best = max(best, row[j])
    return best


def cmrc_scores(answers: Sequence[str], pred: str) -> tuple[float, float]:
    """(exact match, F1) of one prediction against its best gold, by CMRC 2018's rules."""
    def bare(text: str) -> str:
        return "".join(ch for ch in text.lower().strip() if ch not in _CMRC_MARKS)

    exact, f1 = 0.0, 0.0
    p = _cmrc_tokens(pred)
    for a in answers:
        exact = max(exact, float(bare(a) == bare(pred)))
        g = _cmrc_tokens(a)
        same = _longest_common_run(g, p)
        if same:
            precision, recall = same / len(p), same / len(g)
            f1 = max(f1, 2 * precision * recall / (precision + recall))
    return exact, f1


def _question_scores(answers: Sequence[str], pred: str) -> tuple[float, float]:
    """(exact match, F1) of one prediction against its best gold; golds that normalize to "" are
    dropped, and a question left with none has the single gold "" (the v2.0 script's rule). A
    question with a Chinese gold answer is scored by CMRC 2018's rules (cmrc_scores)."""
    if any(_CJK.search(a) for a in answers):
        return cmrc_scores(answers, pred)
    golds = [a for a in answers if normalize_answer(a)] or [""]
    return (max(float(normalize_answer(a) == normalize_answer(pred)) for a in golds),
            max(_token_f1(a, pred) for a in golds))


def squad_scores(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float]:
    """{"exact_match", "f1", "total"} over the questions of `gold`, and the HasAns / NoAns split for v2.0.

    gold: question id -> gold answer texts ([] when unanswerable); predictions: id -> answer ("" = none).
    Each question scores its best gold answer, as the v2.0 script: golds that normalize to "" are dropped,
    and a question left with none has the single gold "", so only an empty prediction is right.
    A question without a prediction scores 0 (with a warning, as the official script prints
    "Missing prediction"); predictions for ids not in `gold` are ignored. HasAns_* / NoAns_* appear when
    some gold is unanswerable, each group only when it has questions (as the official script).
    """
    if not gold:
        raise ValueError("no predictions to score")
    exact, f1, missing = {}, {}, []
    for qid, answers in gold.items():
        if isinstance(answers, str):
            raise TypeError(f"question {qid}: gold answers must be a list of texts, got the string {answers!r}")
        if qid not in predictions:
            missing.append(qid)
            exact[qid] = f1[qid] = 0.0
            continue
        exact[qid], f1[qid] = _question_scores(answers, predictions[qid])
    if missing:
        warnings.warn(f"Missing prediction for {len(missing)} of {len(gold)} questions "
                      f"(e.g. {', '.join(missing[:3])}); they count as wrong", stacklevel=2)

    def mean(ids: list[str], prefix: str = "") -> dict[str, float]:
        return {f"{prefix}exact_match": sum(exact[q] for q in ids) / len(ids),
                f"{prefix}f1": sum(f1[q] for q in ids) / len(ids), f"{prefix}total": float(len(ids))}

    scores = mean(list(gold))
    has_ans = [q for q, answers in gold.items() if answers]
    no_ans = [q for q, answers in gold.items() if not answers]
    if no_ans:
        if has_ans:
            scores.update(mean(has_ans, "HasAns_"))
        scores.update(mean(no_ans, "NoAns_"))
    return scores


def squad_best_thresholds(gold: Mapping[str, Sequence[str]], spans: Mapping[str, str],
                          margins: Mapping[str, float]) -> dict[str, float]:
    """SQuAD v2.0: the best exact match and F1 over null thresholds, and a threshold reaching each.

    spans: question id -> its best non-null answer ("" when it has none); margins: id -> null score
    minus that answer's score. At threshold t a question gets its span when its margin is at most t,
    else "" (postprocess_qa's rule). As in the official v2.0 script's search, every question starts
    at "" and they switch to their spans in order of margin; the score is kept at its best. The
    threshold returned lies halfway between the last margin switched and the next (1.0 outside them),
    so `--null-threshold` can take it. Questions without a span or margin stay at "".
    """
    if not gold:
        raise ValueError("no predictions to score")
    order = sorted((q for q in gold if q in spans and q in margins), key=lambda q: margins[q])
    m = [float(margins[q]) for q in order]
    empty = {q: _question_scores(answers, "") for q, answers in gold.items()}  # q -> (exact, f1)
    gain = [np.subtract(_question_scores(gold[q], spans[q]), empty[q]) for q in order]  # switching q to its span

    out: dict[str, float] = {}
    for k, name in enumerate(("exact_match", "f1")):
        current = sum(e[k] for e in empty.values())
        best, switched = current, 0  # the best score, reached with the first `switched` questions answered
        for i, g in enumerate(gain):
            current += g[k]
            if current > best:
                best, switched = current, i + 1
        if not m:
            threshold = 0.0
        elif switched == 0:
            threshold = m[0] - 1.0
        elif switched == len(m):
            threshold = m[-1] + 1.0
        else:
            threshold = (m[switched - 1] + m[switched]) / 2
        out[f"best_{name}"] = float(best) / len(gold)
        out[f"best_{name}_threshold"] = float(threshold)
    return out
