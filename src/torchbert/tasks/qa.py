"""The extractive QA family (SQuAD v1.1 and v2.0): start and end logits over each context window
(the BERT paper's Figure 4c, sections 4.2-4.3); v2 may answer nothing.

Files: SQuAD JSON. Model rows: `[CLS] question [SEP] context window [SEP]`, windows every
`doc_stride` context tokens as in BERT's run_squad.py; `postprocess_qa` turns the logits into
answers (n-best spans, the null score for v2). Scores: SQuAD's exact match and F1 (v2: also per
answerable/unanswerable and at the best null threshold).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..baselines.gpt import OpenAIGPTForQuestionAnswering
from ..eval import metrics
from ..heads import BertForQuestionAnswering
from ..io.texts import json_loads, read_utf8
from ..packing import pad
from .encode import Encoded, where_of
from ..settings import setting
from .families import TaskFamily, TaskSettings, register_family
from .formats import MISSING, PathLike, Warn, existing, no_examples, note, shown


@dataclass
class Answer:
    text: str
    start: int  # character offset into the context


@dataclass
class QAExample:
    """A SQuAD question on a context; no answers and is_impossible for v2's unanswerable ones; answers
    None for a question without labels (one a distilled student learns the teacher's answer of)."""

    id: str
    question: str
    context: str
    answers: list[Answer] | None = field(default_factory=list)
    is_impossible: bool = False
    where: str = ""


_SHOWN_ANSWERS = 10  # answers not at their answer_start warned one by one; the rest are only counted


def read_squad(path: PathLike, v2: bool, labelled: bool = True, warn: Warn = note) -> list[QAExample]:
    """The questions of a SQuAD v1.1 (v2=False) or v2.0 JSON file, one example per question.

    An answer whose text is not at its answer_start in the context would train the model on the wrong
    span: it is dropped with a warning, and a labelled question left with no answer is skipped (counted),
    so it does not turn into an unanswerable one.  With labelled=False questions may have no answers."""
    path = existing(path)
    text = read_utf8(path, expected="a UTF-8 JSON file")
    layout = 'expected a SQuAD file {"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}'
    try:
        doc = json_loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); {layout}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError(f"{path}: not a SQuAD file: no top-level \"data\" list; {layout}")

    examples: list[QAExample] = []
    seen: dict[str, str] = {}  # question id -> where it first was
    misplaced = skipped = 0
    for i, article in enumerate(doc["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise ValueError(f"{path}: data[{i}]: expected an object with a \"paragraphs\" list; {layout}")
        for j, para in enumerate(article["paragraphs"]):
            at = f"data[{i}].paragraphs[{j}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) \
                    or not isinstance(para.get("qas"), list):
                raise ValueError(f"{path}: {at}: expected an object with a \"context\" string and a \"qas\" list")
            context = para["context"]
            for k, qa in enumerate(para["qas"]):
                if not isinstance(qa, dict) or isinstance(qa.get("id"), bool) \
                        or not isinstance(qa.get("id"), (str, int)):
                    raise ValueError(f"{path}: {at}.qas[{k}]: expected a question object with an \"id\"")
                qid = str(qa["id"])
                where = f"{path}: question {qid}"
                if qid in seen:
                    raise ValueError(f"{where}: duplicate question id (first in {seen[qid]}); ids must be unique")
                seen[qid] = at
                question = qa.get("question")
                if not isinstance(question, str):
                    raise ValueError(f"{where}: \"question\" is {json.dumps(question)[:40]}; expected a string")
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise ValueError(f"{where}: is_impossible is {impossible!r}; expected true or false")
                if impossible and not v2:
                    raise ValueError(f"{where}: is_impossible is true, which only SQuAD v2.0 files have; "
                                     "use the qa-v2 task for this file")
                given = qa.get("answers", [])
                if not isinstance(given, list):
                    raise ValueError(f"{where}: \"answers\" is {type(given).__name__}; expected a list")
                if impossible and given:
                    raise ValueError(f"{where}: is_impossible is true but the question has {len(given)} answers; "
                                     "expected an empty answers list")
                answers = []
                for a in given:
                    ok = isinstance(a, dict) and isinstance(a.get("text"), str) \
                        and isinstance(a.get("answer_start"), int) and not isinstance(a["answer_start"], bool)
                    if not ok:
                        raise ValueError(f"{where}: answer {json.dumps(a)[:60]}; expected "
                                         '{"text": string, "answer_start": integer}')
                    answer, begin = a["text"], a["answer_start"]
                    if answer and 0 <= begin and context[begin:begin + len(answer)] == answer:
                        answers.append(Answer(answer, begin))
                        continue
                    misplaced += 1
                    if misplaced <= _SHOWN_ANSWERS and not answer.strip():
                        warn(f"{where}: an answer's text is empty; an answer is a span of the context (SQuAD "
                             "v2.0 marks a question without one is_impossible: true); the answer is dropped")
                    elif misplaced <= _SHOWN_ANSWERS:
                        found = context[max(begin, 0):max(begin, 0) + len(answer)]
                        warn(f"{where}: answer {answer!r} is not at answer_start {begin} of the context "
                             f"(which has {found!r} there); the answer is dropped")
                if not impossible and not answers:
                    if given and labelled:
                        skipped += 1
                        continue
                    if labelled:
                        raise ValueError(f"{where}: no answers; a labelled SQuAD "
                                         + ("v2.0 question has answers or is_impossible: true" if v2
                                            else "v1.1 question has at least one answer"))
                examples.append(QAExample(qid, question, context, answers, impossible, where))
    if misplaced:
        more = f" (the first {_SHOWN_ANSWERS} shown)" if misplaced > _SHOWN_ANSWERS else ""
        warn(f"{path}: dropped {misplaced} answers not found at their answer_start{more}; skipped {skipped} "
             "questions left with no answer")
    if not examples:
        raise no_examples(path, "questions in data[].paragraphs[].qas[]")
    return examples


def _answer_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The first and last context tokens overlapping the characters [start, end), or None."""
    first = next((i for i, (_, b) in enumerate(offsets) if b > start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


def encode_qa(
    tokenizer,
    examples: list[QAExample],
    max_length: int,
    doc_stride: int,
    max_query_length: int = 64,
    training: bool = False,
    v2: bool = False,
) -> Encoded:
    """`[CLS] question [SEP] context window [SEP]` rows; windows start every doc_stride context tokens.

    With training, labels hold the (start, end) token positions of the first answer in each row:
    (0, 0) ([CLS]) for unanswerable questions and, in v2, for windows the answer is not wholly
    inside; in v1 such windows are dropped (run_squad.py's out_of_span rule). A question whose answers
    are None has no labels at all (distillation's examples without labels): every window is kept, its
    label a placeholder (0, 0).
    """
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be at least 1 token, got {doc_stride}")
    questions = tokenizer([ex.question for ex in examples], add_special_tokens=False)["input_ids"]
    contexts = tokenizer([ex.context for ex in examples], add_special_tokens=False, return_offsets_mapping=True)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    out = Encoded(input_ids=[], token_type_ids=[], example_index=[], labels=[] if training else None, offsets=[])
    for e, ex in enumerate(examples):
        where = where_of(ex, e)
        question = questions[e][:max_query_length]
        context, offsets = contexts["input_ids"][e], contexts["offset_mapping"][e]
        room = max_length - len(question) - 3  # [CLS] question [SEP] ... [SEP]
        if room < 1:
            raise ValueError(
                f"{where}: max_length={max_length} leaves no room for context after a question of "
                f"{len(question)} tokens (raise max_length or lower max_query_length)"
            )
        if len(context) > room and doc_stride >= room:
            raise ValueError(
                f"{where}: doc_stride={doc_stride} must be below the {room} context tokens that fit in a "
                f"window (windows would not overlap); use a smaller doc_stride, e.g. {room // 2}"
            )

        answer: tuple[int, int] | None = None  # context token span of the first answer
        if ex.answers is None:  # no labels: a placeholder in every window
            pass
        elif training and not (ex.is_impossible or not ex.answers):
            a = ex.answers[0]
            if ex.context[a.start:a.start + len(a.text)] != a.text:
                found = ex.context[a.start:a.start + len(a.text)]
                raise ValueError(f"{where}: answer {a.text!r} is not at character {a.start} of the context "
                                 f"(found {found!r})")
            answer = _answer_tokens(offsets, a.start, a.start + len(a.text))
            if answer is None:
                raise ValueError(f"{where}: answer {a.text!r} at character {a.start} covers no context token")
        elif training and not v2:
            raise ValueError(f"{where}: no answer (SQuAD v1 training needs one; unanswerable questions need v2)")

        begin = 0
        head = [cls] + question + [sep]
        while True:
            end = min(begin + room, len(context))
            label = (0, 0)
            if answer is not None:
                if begin <= answer[0] and answer[1] < end:
                    shift = len(head) - begin
                    label = (answer[0] + shift, answer[1] + shift)
                elif not v2:
                    label = None  # v1: a window without the answer teaches nothing
            if not training or label is not None:
                out.input_ids.append(head + context[begin:end] + [sep])
                out.token_type_ids.append([0] * len(head) + [1] * (end - begin + 1))
                out.offsets.append([None] * len(head) + offsets[begin:end] + [None])
                out.example_index.append(e)
                if training:
                    out.labels.append(label)
            if end >= len(context):
                break
            begin += doc_stride
    return out


def _as_array(row: Any) -> np.ndarray:
    if hasattr(row, "detach"):  # a torch tensor
        row = row.detach().float().cpu().numpy()
    return np.asarray(row, dtype=np.float64)


def postprocess_qa(
    examples: list[QAExample],
    encoded: Encoded,
    start_logits: list,
    end_logits: list,
    n_best: int = 20,
    max_answer_length: int = 30,
    v2: bool = False,
    null_threshold: float = 0.0,
) -> dict[str, dict]:
    """Per example id: {"text", "score", "null_score", "start"}: the best span over all its windows.

    In each window the candidates are the n_best start and n_best end positions among the context
    tokens (run_squad.py ranks all positions and then drops those outside the context; ranking only
    the context never loses a valid span to a question token); a span needs end >= start and at most
    max_answer_length tokens.  `null_score` is the lowest [CLS] score (start + end logit at 0) over
    the windows; with v2 the answer is "" when null_score - best span score > null_threshold, and
    `score` is then the null score.  `start` is the answer's character offset, -1 for "".  `span` and
    `span_score` are the best span and its score even when "" wins ("" and -inf when no span is valid),
    for choosing the threshold afterwards (metrics.squad_best_thresholds).
    """
    if encoded.offsets is None:
        raise ValueError("postprocess_qa needs an Encoded from encode_qa (it has no offsets)")
    rows_of: list[list[int]] = [[] for _ in examples]
    for row, e in enumerate(encoded.example_index):
        rows_of[e].append(row)

    results: dict[str, dict] = {}
    for e, ex in enumerate(examples):
        where = where_of(ex, e)
        if ex.id in results:
            raise ValueError(f"{where}: duplicate example id {ex.id!r}")
        if not rows_of[e]:
            raise ValueError(f"{where}: no encoded rows for this example (encode with training=False to predict)")
        best_score, best_span = -np.inf, None  # span: (start char, end char)
        null_score = np.inf
        for row in rows_of[e]:
            offsets = encoded.offsets[row]
            starts, ends = _as_array(start_logits[row]), _as_array(end_logits[row])
            null_score = min(null_score, float(starts[0] + ends[0]))
            context = [t for t, o in enumerate(offsets) if o is not None]
            if not context:
                continue
            lo, hi = context[0], context[-1] + 1  # the context tokens are one run [lo, hi)
            k = min(n_best, hi - lo)
            top_s = lo + np.argsort(-starts[lo:hi], kind="stable")[:k]  # [k]
            top_e = lo + np.argsort(-ends[lo:hi], kind="stable")[:k]  # [k]
            length = top_e[None, :] - top_s[:, None] + 1  # [k, k]
            scores = np.where((length >= 1) & (length <= max_answer_length),
                              starts[top_s][:, None] + ends[top_e][None, :], -np.inf)  # [k, k]
            i, j = np.unravel_index(np.argmax(scores), scores.shape)
            if scores[i, j] > best_score:
                best_score = float(scores[i, j])
                best_span = (offsets[top_s[i]][0], offsets[top_e[j]][1])
        span = "" if best_span is None else ex.context[best_span[0]:best_span[1]]
        if best_span is None or (v2 and null_score - best_score > null_threshold):
            results[ex.id] = {"text": "", "score": null_score, "null_score": null_score, "start": -1}
        else:
            results[ex.id] = {"text": span, "score": best_score, "null_score": null_score, "start": best_span[0]}
        results[ex.id].update(span=span, span_score=best_score)
    return results


@dataclass
class QASettings(TaskSettings):
    max_query_length: int = setting(64, "question tokens kept", low=1)
    n_best: int = setting(20, "start and end candidates per window", low=1)
    max_answer_length: int = setting(30, "longest answer in tokens", low=1)
    null_threshold: float = setting(0.0, "qa-v2: answer nothing when the null score beats the best span by more; "
                                         "dev scoring reports best_f1_threshold, the value that scored best on dev")


class SpanTask(TaskFamily):
    """Extractive QA (SQuAD): start and end logits over each context window; v2 may answer nothing."""

    heads = {"bert": BertForQuestionAnswering, "gpt": OpenAIGPTForQuestionAnswering}
    export_outputs = ("start_logits", "end_logits")
    export_per_token = ("start_logits", "end_logits")
    export_sample = "pair"
    soft_targets = 'spans'
    gold = None  # answers are read with the examples; prediction needs none
    layouts = ("auto", "squad")
    Settings = QASettings
    windows = True

    def __init__(self, task_type: str, v2: bool):
        super().__init__(task_type)
        self.v2 = v2
        self.file_format = "squad-v2" if v2 else "squad"
        self.about = "extractive QA           SQuAD v1.1 / v2.0 JSON (v2: unanswerable questions)"
        qas = [{"id": "q1", "question": "Who wrote the letter?",
                "answers": [{"text": "Mary", "answer_start": 0}], "is_impossible": False},
               {"id": "q2", "question": "Where did she send it?",
                "answers": [{"text": "Paris", "answer_start": 37}], "is_impossible": False},
               {"id": "q3", "question": "What did she eat?", "answers": [], "is_impossible": True}]
        squad = {"version": "v2.0" if v2 else "1.1", "data": [{"title": "t", "paragraphs": [
            {"context": "Mary wrote the letter and sent it to Paris in May.", "qas": qas if v2 else qas[:2]},
            {"context": "北京是中国的首都。", "qas": [{"id": "q4", "question": "中国的首都是哪里？",
                                                     "answers": [{"text": "北京", "answer_start": 0}],
                                                     "is_impossible": False}]}]}]}
        self.example_file = ("squad.json", json.dumps(squad, ensure_ascii=False))
        self.metrics = ("f1", "exact_match") + (
            ("HasAns_f1", "HasAns_exact_match", "NoAns_f1", "NoAns_exact_match", "best_f1", "best_f1_threshold",
             "best_exact_match", "best_exact_match_threshold") if v2 else ())

    def texts(self, example):
        return [example.context, example.question]

    def _read(self, path, layout, labelled, warn):
        return read_squad(path, self.v2, labelled, warn)

    def from_record(self, record, where, default_id):
        for key in ("question", "context"):
            if not isinstance(record.get(key), str):
                raise ValueError(f"{where}: \"{key}\" {shown(record.get(key, MISSING))}; expected a string")
        ident = record.get("id")
        return QAExample(default_id if ident is None or ident == "" else str(ident), record["question"],
                         record["context"], [], False, where)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return encode_qa(tokenizer, examples, ts.max_length, ts.doc_stride, ts.max_query_length,
                             training=training, v2=self.v2)

    def batch_targets(self, encoded, rows, units):
        return {"start_positions": torch.tensor([encoded.labels[r][0] for r in rows], dtype=torch.long),
                "end_positions": torch.tensor([encoded.labels[r][1] for r in rows], dtype=torch.long)}

    def targets(self, batch):
        return {"start_positions": batch.start_positions, "end_positions": batch.end_positions}

    def correct(self, out, batch):
        """Sequences whose argmax start and end (over their own tokens) are both the gold ones."""
        starts = pad(out.start_logits, batch.cu_seqlens, batch.max_seqlen, float("-inf")).argmax(-1)
        ends = pad(out.end_logits, batch.cu_seqlens, batch.max_seqlen, float("-inf")).argmax(-1)
        return ((starts == batch.start_positions) & (ends == batch.end_positions)).sum()

    def outputs(self, out, batch, inputs):
        lengths = batch.cu_seqlens.diff().tolist()
        return [(u, (s.numpy(), t.numpy())) for u, s, t in zip(batch.units.tolist(),
                                                               out.start_logits.float().cpu().split(lengths),
                                                               out.end_logits.float().cpu().split(lengths))]

    def records(self, examples, encoded, outputs, ts, id2label):
        answers = postprocess_qa(examples, encoded, [o[0] for o in outputs], [o[1] for o in outputs],
                                     n_best=ts.n_best, max_answer_length=ts.max_answer_length, v2=self.v2,
                                     null_threshold=ts.null_threshold)
        records = []
        for ex in examples:
            a = answers[ex.id]
            rec = {"id": ex.id, "answer": a["text"], "score": round(float(a["score"]), 6), "start": a["start"]}
            if self.v2:  # the best span even when "" wins, to choose --null-threshold on dev
                rec.update(null_score=round(float(a["null_score"]), 6), span=a["span"],
                           span_score=round(float(a["span_score"]), 6) if a["span"] else None)
            records.append(rec)
        return records

    def score(self, records, examples, label_map):
        gold = {x.id: [a.text for a in x.answers] for x in examples}
        scores = metrics.squad_scores(gold, {r["id"]: r["answer"] for r in records})
        if self.v2:
            with_span = [r for r in records if r.get("span")]
            spans = {r["id"]: r["span"] for r in with_span}
            margins = {r["id"]: r["null_score"] - r["span_score"] for r in with_span}
            scores.update(metrics.squad_best_thresholds(gold, spans, margins))
        return scores


register_family(SpanTask("qa", v2=False))
register_family(SpanTask("qa-v2", v2=True))
