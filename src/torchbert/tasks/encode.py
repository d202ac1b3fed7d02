"""Fine-tuning examples -> model input rows: token ids, segment ids and labels, unpadded.

One encoder per task family, each tokenizing the whole list of examples in batched Rust calls and
returning an `Encoded`: one row per model input sequence (an example may give several rows).

- texts (classification, pairs, regression): `[CLS] a [SEP] (b [SEP])`, cut "longest_first".
- tokens (NER and other tagging): words -> WordPiece; the first sub-token of a word carries its tag.
  A sentence too long for one sequence is split into overlapping windows rather than cut, and each
  word is predicted by exactly one window: the one where it sits farthest from a cut edge (the
  "max context" rule of BERT's run_squad.py, applied to words).  `words_from_tokens` undoes this.
- qa (SQuAD v1.1 / v2.0): `[CLS] question [SEP] context window [SEP]`, windows every `doc_stride`
  context tokens as in BERT's run_squad.py; `postprocess_qa` turns start/end logits into answers.
- choices (SWAG-style multiple choice): one `(context, question + choice)` pair per choice.

Rows are plain lists of ints; padding and tensors are the collator's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..losses import IGNORE
from .examples import ChoiceExample, QAExample, TextExample, TokenExample


@dataclass
class Encoded:
    """Model inputs, one row per sequence; the optional fields belong to one task family each."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    example_index: list[int]  # the example each row comes from
    # text: class id (int) or float (regression), per row; token: per-token label ids with IGNORE;
    # qa: (start, end) token positions per row; mc: the label index per example.
    labels: list | None = None
    # token classification: per token, the word of its example it predicts, or -1 (special tokens,
    # non-first sub-tokens, and words another window owns).
    word_index: list[list[int]] | None = None
    # extractive QA: per token, its (start, end) character span in the original context; None for
    # [CLS], the question, and the [SEP]s.
    offsets: list[list[tuple[int, int] | None]] | None = None
    # multiple choice: choices per example; the rows of example e are consecutive.
    num_choices: list[int] | None = None


def _where(example: Any, index: int) -> str:
    return example.where or f"example {index} (id {example.id!r})"


def _label_id(label: Any, label2id: dict[str, int], where: str) -> int:
    if label not in label2id:
        known = ", ".join(map(repr, list(label2id)[:20]))
        raise ValueError(f"{where}: unknown label {label!r} (known labels: {known})")
    return label2id[label]


# ----------------------------------------------------------------------------------------------
# sequence classification and regression


def check_room(max_length: int, pairs: bool) -> None:
    """Room for at least one token of each text beside [CLS] and [SEP]: below it a model would learn
    from the special tokens alone."""
    need = 5 if pairs else 3
    if max_length < need:
        raise ValueError(f"--max-length {max_length} leaves no room for the text: "
                         + ("[CLS] A [SEP] B [SEP] needs at least 5" if pairs else "[CLS] text [SEP] needs at least 3"))


def encode_texts(
    tokenizer, examples: list[TextExample], max_length: int, label2id: dict[str, int] | None, regression: bool = False
) -> Encoded:
    """Single texts and pairs, cut "longest_first" to max_length; labels None for unlabelled examples."""
    singles = [i for i, ex in enumerate(examples) if ex.text_b is None]
    pairs = [i for i, ex in enumerate(examples) if ex.text_b is not None]
    check_room(max_length, pairs=bool(pairs))
    rows: list[Any] = [None] * len(examples)
    # One batched call per kind (the tokenizer takes all-single or all-pair batches).
    for indices, is_pair in ((singles, False), (pairs, True)):
        if not indices:
            continue
        a = [examples[i].text_a for i in indices]
        b = [examples[i].text_b for i in indices] if is_pair else None
        enc = tokenizer(a, b, truncation="longest_first", max_length=max_length)
        for i, ids, types in zip(indices, enc["input_ids"], enc["token_type_ids"]):
            rows[i] = (ids, types)

    labelled = [ex.label is not None for ex in examples]
    labels: list | None = None
    if any(labelled):
        if not all(labelled):
            i = labelled.index(False)
            raise ValueError(f"{_where(examples[i], i)}: no label, but other examples have labels")
        if regression:
            labels = []
            for i, ex in enumerate(examples):
                try:
                    labels.append(float(ex.label))
                except ValueError:
                    raise ValueError(f"{_where(ex, i)}: regression label {ex.label!r} is not a number") from None
        elif label2id is None:
            raise ValueError(f"{_where(examples[0], 0)}: examples have labels but no label map was given")
        else:
            labels = [_label_id(ex.label, label2id, _where(ex, i)) for i, ex in enumerate(examples)]
    return Encoded(
        input_ids=[r[0] for r in rows],
        token_type_ids=[r[1] for r in rows],
        example_index=list(range(len(examples))),
        labels=labels,
    )


# ----------------------------------------------------------------------------------------------
# token classification


def _word_pieces(tokenizer, examples: list[TokenExample]) -> list[list[list[int]]]:
    """Per example, per word: its WordPiece ids ([UNK] for a word that tokenizes to nothing)."""
    encodings = tokenizer.backend.encode_batch(
        [list(ex.words) for ex in examples], is_pretokenized=True, add_special_tokens=False
    )
    unk = tokenizer.unk_token_id
    out = []
    for ex, enc in zip(examples, encodings):
        pieces: list[list[int]] = [[] for _ in ex.words]
        for token_id, word in zip(enc.ids, enc.word_ids):
            pieces[word].append(token_id)
        out.append([p or [unk] for p in pieces])
    return out


def _windows(starts: list[int], n: int, room: int, stride: int) -> list[tuple[int, int]]:
    """[begin, end) token windows of at most `room` tokens over n tokens whose words begin at `starts`.

    Windows begin and end at word boundaries.  Each next window begins at the last word boundary at
    most `stride` tokens on (and never past the current window's end, so nothing is skipped); only
    when the first word of a window is itself longer than `stride` does it advance further, to the
    end of that word, so that no word is cut.  The last window begins at the first boundary from
    which the rest fits, so it is as full as the stride allows.  Every word must fit in `room` (the
    caller cuts longer ones).
    """
    bounds = starts + [n]  # sorted, unique: word starts are strictly increasing
    windows = []
    begin, k = 0, 0  # k: index in bounds of `begin`
    while True:
        if n - begin <= room:
            windows.append((begin, n))
            return windows
        # The last boundary within room of begin; the word at begin fits, so there is one past begin.
        j = k + 1
        while bounds[j + 1] - begin <= room:
            j += 1
        end = bounds[j]
        windows.append((begin, end))
        nxt = k + 1
        while nxt + 1 <= j and bounds[nxt + 1] - begin <= stride:
            nxt += 1
        if n - bounds[nxt] <= room:  # the last window: start it as early as allowed, so it is full
            while n - bounds[nxt - 1] <= room and nxt - 1 > k:
                nxt -= 1
        begin, k = bounds[nxt], nxt


def encode_tokens(
    tokenizer,
    examples: list[TokenExample],
    max_length: int,
    stride: int,
    label2id: dict[str, int] | None,
    label_all_subtokens: bool = False,
) -> Encoded:
    """Tagged words -> `[CLS] pieces [SEP]` rows; long sentences become overlapping windows (see `_windows`).

    The tag of a word labels its first sub-token; the other sub-tokens get IGNORE, or the same label
    with label_all_subtokens (word_index still marks only first sub-tokens).  A word longer than
    max_length - 2 pieces keeps its first pieces.
    """
    room = max_length - 2
    if room < 1:
        raise ValueError(f"max_length={max_length} leaves no room for a token between [CLS] and [SEP]")
    if stride < 1:
        raise ValueError(f"stride must be at least 1 token, got {stride}")
    tagged = [ex.tags is not None for ex in examples]
    with_labels = label2id is not None and any(tagged)
    if with_labels and not all(tagged):
        i = tagged.index(False)
        raise ValueError(f"{_where(examples[i], i)}: no tags, but other sentences have tags")

    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    out = Encoded(input_ids=[], token_type_ids=[], example_index=[], labels=[] if with_labels else None,
                  word_index=[])
    for e, (ex, words) in enumerate(zip(examples, _word_pieces(tokenizer, examples))):
        tag_ids: list[int] = []
        if with_labels:
            if len(ex.tags) != len(ex.words):
                raise ValueError(f"{_where(ex, e)}: {len(ex.words)} words but {len(ex.tags)} tags")
            tag_ids = [label2id.get(tag, -1) for tag in ex.tags]
            if -1 in tag_ids:
                _label_id(ex.tags[tag_ids.index(-1)], label2id, _where(ex, e))  # raises, naming the tag
        # The sentence as one flat run of pieces (T): each token's word, and the word of each word's
        # first token (-1 for the others).
        ids: list[int] = []
        token_word: list[int] = []
        first_word: list[int] = []
        starts: list[int] = []
        for w, pieces in enumerate(words):
            pieces = pieces[:room]
            starts.append(len(ids))
            ids += pieces
            token_word += [w] * len(pieces)
            first_word += [w] + [-1] * (len(pieces) - 1)
        n = len(ids)
        windows = _windows(starts, n, room, stride)

        # Ownership: the window where the word's nearest cut edge is farthest (a sentence end is no cut).
        owner = [0] * len(words)
        if len(windows) > 1:
            best = [-1] * len(words)
            for k, (begin, end) in enumerate(windows):
                for w in range(token_word[begin], token_word[end - 1] + 1):  # whole words: windows end at bounds
                    left = starts[w] - begin if begin > 0 else n
                    right = end - starts[w] - len(words[w][:room]) if end < n else n
                    if min(left, right) > best[w]:  # ties go to the earlier window
                        best[w], owner[w] = min(left, right), k

        for k, (begin, end) in enumerate(windows):
            mine = [w if w >= 0 and owner[w] == k else -1 for w in first_word[begin:end]]
            out.input_ids.append([cls] + ids[begin:end] + [sep])
            out.token_type_ids.append([0] * (end - begin + 2))
            out.example_index.append(e)
            out.word_index.append([-1] + mine + [-1])
            if with_labels:
                if label_all_subtokens:
                    labels = [tag_ids[w] if owner[w] == k else IGNORE for w in token_word[begin:end]]
                else:
                    labels = [tag_ids[w] if w >= 0 else IGNORE for w in mine]
                out.labels.append([IGNORE] + labels + [IGNORE])
    return out


def words_from_tokens(
    encoded: Encoded, token_predictions: list[list[int]], num_examples: int, num_words: list[int]
) -> list[list[int]]:
    """Per example, per word: the prediction at the token that owns the word (undoes the windows)."""
    if encoded.word_index is None:
        raise ValueError("words_from_tokens needs an Encoded from encode_tokens (it has no word_index)")
    if len(token_predictions) != len(encoded.word_index):
        raise ValueError(f"{len(token_predictions)} rows of predictions for {len(encoded.word_index)} encoded rows")
    out: list[list[int | None]] = [[None] * num_words[e] for e in range(num_examples)]
    for row, (e, word_index) in enumerate(zip(encoded.example_index, encoded.word_index)):
        predictions = token_predictions[row]
        if hasattr(predictions, "tolist"):  # a tensor or array row
            predictions = predictions.tolist()
        for t, w in enumerate(word_index):
            if w >= 0:
                out[e][w] = int(predictions[t])
    for e, words in enumerate(out):
        if None in words:
            raise ValueError(f"example {e}: word {words.index(None)} has no owning token in the encoded rows")
    return out  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# extractive question answering


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
    inside; in v1 such windows are dropped (run_squad.py's out_of_span rule).
    """
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be at least 1 token, got {doc_stride}")
    questions = tokenizer([ex.question for ex in examples], add_special_tokens=False)["input_ids"]
    contexts = tokenizer([ex.context for ex in examples], add_special_tokens=False, return_offsets_mapping=True)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    out = Encoded(input_ids=[], token_type_ids=[], example_index=[], labels=[] if training else None, offsets=[])
    for e, ex in enumerate(examples):
        where = _where(ex, e)
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
        if training and not (ex.is_impossible or not ex.answers):
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
        where = _where(ex, e)
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


# ----------------------------------------------------------------------------------------------
# multiple choice


def encode_choices(tokenizer, examples: list[ChoiceExample], max_length: int) -> Encoded:
    """One `(context, question + " " + choice)` pair per choice, cut "longest_first"; rows grouped by example."""
    check_room(max_length, pairs=True)
    firsts, seconds, example_index, num_choices = [], [], [], []
    for e, ex in enumerate(examples):
        if not ex.choices:
            raise ValueError(f"{_where(ex, e)}: no choices")
        for k, choice in enumerate(ex.choices):
            if not choice.strip():
                raise ValueError(f"{_where(ex, e)}: choice {k} is empty; every choice needs its text (a row with "
                                 "an empty ending would train the model on the context alone)")
            firsts.append(ex.context)
            seconds.append(f"{ex.question} {choice}" if ex.question else choice)
            example_index.append(e)
        num_choices.append(len(ex.choices))

    labelled = [ex.label is not None for ex in examples]
    labels: list | None = None
    if any(labelled):
        labels = []
        for e, ex in enumerate(examples):
            if ex.label is None:
                raise ValueError(f"{_where(ex, e)}: no label, but other examples have labels")
            if not 0 <= ex.label < len(ex.choices):
                raise ValueError(f"{_where(ex, e)}: label {ex.label} is not a choice index (0..{len(ex.choices) - 1})")
            labels.append(ex.label)

    enc = tokenizer(firsts, seconds, truncation="longest_first", max_length=max_length) if firsts else None
    return Encoded(
        input_ids=enc["input_ids"] if enc else [],
        token_type_ids=enc["token_type_ids"] if enc else [],
        example_index=example_index,
        labels=labels,
        num_choices=num_choices,
    )
