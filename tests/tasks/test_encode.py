"""Fine-tuning encoders on real text, checked against transformers and hand-computed cases."""

from __future__ import annotations

import re

import numpy as np
import pytest
import realdata
from transformers import BertTokenizerFast

from torchbert.losses import IGNORE
from torchbert.tasks.choice import ChoiceExample, encode_choices
from torchbert.tasks.encode import cut_note
from torchbert.tasks.qa import Answer, QAExample, encode_qa, postprocess_qa
from torchbert.tasks.tagging import TokenExample, encode_tokens, words_from_tokens
from torchbert.tasks.text import TextExample, encode_texts
from torchbert.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def tok() -> BertTokenizer:
    return BertTokenizer.from_pretrained(realdata.minilm_dir())


@pytest.fixture(scope="module")
def hf() -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(realdata.minilm_dir())


@pytest.fixture(scope="module")
def tagged() -> list[TokenExample]:
    sents = realdata.wnut_sentences()[:400]
    return [TokenExample(str(i), list(w), list(t), where=f"ner.txt: sentence {i}") for i, (w, t) in enumerate(sents)]


@pytest.fixture(scope="module")
def label2id(tagged) -> dict[str, int]:
    return {t: i for i, t in enumerate(sorted({t for ex in tagged for t in ex.tags}))}


WORDS = ["the", "cat", "sat", "on", "the", "mat", "and", "the", "dog", "ran"]  # one piece each


def texts() -> list[str]:
    return list(realdata.english_texts()[:150]) + list(realdata.EDGE_CASES)


# ----------------------------------------------------------------------------------------------
# encode_texts


def test_encode_texts_matches_transformers(tok, hf):
    lines = texts()
    examples = [
        TextExample(str(i), a, lines[(i * 7 + 3) % len(lines)] if i % 2 else None, ["neg", "pos"][i % 3 == 0])
        for i, a in enumerate(lines)
    ]
    enc = encode_texts(tok, examples, max_length=24, label2id={"neg": 0, "pos": 1})
    assert enc.example_index == list(range(len(examples)))
    assert enc.labels == [1 if i % 3 == 0 else 0 for i in range(len(examples))]
    for i, ex in enumerate(examples):
        want = hf(ex.text_a, ex.text_b, truncation=True, max_length=24)
        assert enc.input_ids[i] == want["input_ids"], ex.text_a
        assert enc.token_type_ids[i] == want["token_type_ids"]
    assert max(map(len, enc.input_ids)) == 24 and any(len(r) < 24 for r in enc.input_ids)
    assert any(1 in types for types in enc.token_type_ids)


def test_encode_texts_labels_and_errors(tok):
    reg = [TextExample("a", "one", "two", 0.5), TextExample("b", "three", None, "4.25")]
    assert encode_texts(tok, reg, 16, None, regression=True).labels == [0.5, 4.25]
    unlabelled = [TextExample("a", "one", None, None), TextExample("b", "two", None, None)]
    assert encode_texts(tok, unlabelled, 16, {"x": 0}).labels is None
    with pytest.raises(ValueError, match=r"dev.tsv:3: unknown label 'maybe'"):
        encode_texts(tok, [TextExample("a", "x", None, "maybe", where="dev.tsv:3")], 16, {"yes": 0, "no": 1})
    with pytest.raises(ValueError, match=r"t.tsv:2: no label"):
        encode_texts(tok, [TextExample("a", "x", None, "yes"), TextExample("b", "y", None, None, "t.tsv:2")], 16,
                     {"yes": 0})
    with pytest.raises(ValueError, match=r"r.tsv:9: regression label 'high' is not a number"):
        encode_texts(tok, [TextExample("a", "x", None, "high", "r.tsv:9")], 16, None, regression=True)


def test_cut_note_counts_the_sequences_that_reach_max_length(tok):
    texts = ["short", "a much longer sentence that runs well past eight tokens of wordpiece", "也是一个很长的中文句子而且更长"]
    train = encode_texts(tok, [TextExample(str(i), t, None, None) for i, t in enumerate(texts)], 8, None)
    dev = encode_texts(tok, [TextExample("d", "short too", None, None)], 8, None)
    assert [len(r) for r in train.input_ids] == [3, 8, 8]
    assert cut_note(8, 512, train, dev) == (
        "--max-length 8 cuts what lies beyond it: 2 of 3 training sequences (67%) and 0 of 1 dev sequences (0%) "
        "reach it (up to 512 keeps more of each text, at more cost per step)")
    assert cut_note(8, 8, train).endswith("2 of 3 training sequences (67%) reach it")  # the model holds no more
    assert cut_note(8, 512, dev) == ""  # nothing cut, nothing said
    whole = encode_texts(tok, [TextExample(str(i), t, None, None) for i, t in enumerate(texts)], 64, None)
    assert cut_note(64, 512, whole, dev) == ""


# ----------------------------------------------------------------------------------------------
# encode_tokens


def _hf_labels(hf, ex, label2id, label_all: bool) -> tuple[list[int], list[int]]:
    """The transformers run_ner recipe: is_split_into_words + word_ids()."""
    enc = hf(ex.words, is_split_into_words=True)
    labels, previous = [], None
    for w in enc.word_ids():
        if w is None:
            labels.append(IGNORE)
        elif w != previous or label_all:
            labels.append(label2id[ex.tags[w]])
        else:
            labels.append(IGNORE)
        previous = w
    return enc["input_ids"], labels


@pytest.mark.parametrize("label_all", [False, True])
def test_encode_tokens_matches_hf_recipe(tok, hf, tagged, label2id, label_all):
    enc = encode_tokens(tok, tagged, max_length=512, stride=128, label2id=label2id, label_all_subtokens=label_all)
    assert enc.example_index == list(range(len(tagged)))  # everything fits: one row per sentence
    compared = 0
    for i, ex in enumerate(tagged):
        ids, labels = _hf_labels(hf, ex, label2id, label_all)
        if len({w for w in hf(ex.words, is_split_into_words=True).word_ids() if w is not None}) < len(ex.words):
            continue  # a word with no tokens: HF drops it, we give it [UNK] (tested below)
        compared += 1
        assert enc.input_ids[i] == ids
        assert enc.labels[i] == labels
        assert enc.token_type_ids[i] == [0] * len(ids)
        # word_index marks exactly the first sub-tokens, in word order, and carries the word's tag.
        firsts = [t for t, w in enumerate(enc.word_index[i]) if w >= 0]
        assert [enc.word_index[i][t] for t in firsts] == list(range(len(ex.words)))
        assert [enc.labels[i][t] for t in firsts] == [label2id[tag] for tag in ex.tags]
    assert compared > 300


def test_encode_tokens_empty_word_gets_unk(tok, label2id):
    ex = TokenExample("x", ["Hello", "\u200b", "", "world"], ["O", "B-person", "O", "O"])
    enc = encode_tokens(tok, [ex], 16, 8, label2id)
    assert enc.input_ids == [[tok.cls_token_id, *tok.convert_tokens_to_ids(["hello", "[UNK]", "[UNK]", "world"]),
                              tok.sep_token_id]]
    assert enc.word_index == [[-1, 0, 1, 2, 3, -1]]
    assert enc.labels == [[IGNORE, label2id["O"], label2id["B-person"], label2id["O"], label2id["O"], IGNORE]]
    # an empty sentence still gets its row, so rows and examples stay aligned
    enc = encode_tokens(tok, [TokenExample("e", [], []), ex], 16, 8, label2id)
    assert enc.example_index == [0, 1] and enc.input_ids[0] == [tok.cls_token_id, tok.sep_token_id]
    assert words_from_tokens(enc, enc.labels, 2, [0, 4]) == [[], [label2id[t] for t in ex.tags]]
    with pytest.raises(ValueError, match=r"ner.txt:7: unknown label 'B-thing'"):
        encode_tokens(tok, [TokenExample("b", ["x"], ["B-thing"], where="ner.txt:7")], 16, 8, label2id)


def test_encode_tokens_window_ownership_by_hand(tok):
    # Ten one-piece words, room 4, stride 2: windows [0,4) [2,6) [4,8) [6,10).  A word belongs to the
    # window where min(left, right) context is largest (a sentence end counts as unlimited context).
    words = WORDS
    ex = TokenExample("x", words, [str(i) for i in range(10)])
    enc = encode_tokens(tok, [ex], max_length=6, stride=2, label2id={str(i): i for i in range(10)})
    pieces = tok.convert_tokens_to_ids(words)
    assert [row[1:-1] for row in enc.input_ids] == [pieces[0:4], pieces[2:6], pieces[4:8], pieces[6:10]]
    assert enc.word_index == [[-1, 0, 1, 2, -1, -1], [-1, -1, 3, 4, -1, -1], [-1, -1, 5, 6, -1, -1],
                              [-1, -1, 7, 8, 9, -1]]
    assert enc.labels == [[IGNORE if w < 0 else w for w in row] for row in enc.word_index]
    assert enc.example_index == [0, 0, 0, 0]
    # every sub-token labelled: one-piece words, so the same labels; a word in two windows is
    # labelled in the one that owns it only (trained once)
    every = encode_tokens(tok, [ex], max_length=6, stride=2, label2id={str(i): i for i in range(10)},
                          label_all_subtokens=True)
    assert every.labels == enc.labels
    # nine words, stride 3: [0,4) [3,7), and the last window starts as early as it can and still hold
    # the rest: [5,9), not [6,9)
    ex = TokenExample("y", words[:9], None)
    enc = encode_tokens(tok, [ex], max_length=6, stride=3, label2id=None)
    assert [row[1:-1] for row in enc.input_ids] == [pieces[0:4], pieces[3:7], pieces[5:9]]
    # word 3 ties (0 context on one side in both windows): the earlier window takes it
    assert enc.word_index == [[-1, 0, 1, 2, 3, -1], [-1, -1, 4, 5, -1, -1], [-1, -1, 6, 7, 8, -1]]


def test_encode_tokens_long_words(tok):
    # The long word has more pieces than the stride (1): no window starts or ends inside it, even if
    # that means advancing by more than the stride.  It also has more than the room (4): it keeps its
    # first pieces and its label.
    long_word = "Supercalifragilisticexpialidocious"
    n_long = len(tok.tokenize(long_word))
    assert n_long > 6
    ex = TokenExample("x", ["a", long_word, "b", "c"], ["0", "1", "2", "3"])
    enc = encode_tokens(tok, [ex], max_length=6, stride=1, label2id={str(i): i for i in range(4)},
                        label_all_subtokens=True)
    first_pieces = tok.convert_tokens_to_ids(tok.tokenize(long_word))[:4]
    rows = [row[1:-1] for row in enc.input_ids]
    a, b, c = tok.convert_tokens_to_ids(["a", "b", "c"])
    assert rows == [[a], first_pieces, [b, c]]
    assert enc.labels[1] == [IGNORE, 1, 1, 1, 1, IGNORE]  # label_all_subtokens
    assert enc.word_index[1] == [-1, 1, -1, -1, -1, -1]
    assert words_from_tokens(enc, enc.labels, 1, [4]) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("stride", [3, 7, 14])
def test_encode_tokens_windows_on_tweets(tok, hf, tagged, label2id, stride):
    max_length = 16
    enc = encode_tokens(tok, tagged, max_length=max_length, stride=stride, label2id=label2id)
    whole = encode_tokens(tok, tagged, max_length=512, stride=128, label2id=label2id)
    assert max(map(len, enc.input_ids)) <= max_length
    rows_of: dict[int, list[int]] = {}
    for row, e in enumerate(enc.example_index):
        rows_of.setdefault(e, []).append(row)
    assert sorted(rows_of) == list(range(len(tagged)))
    assert list(enc.example_index) == sorted(enc.example_index)  # rows of an example are consecutive
    windowed = 0
    for e, ex in enumerate(tagged):
        # the whole sentence with each word cut to the room of a window (14 pieces), and the word
        # boundaries in it: where a window may start and end
        ids, firsts = whole.input_ids[e][1:-1], [t for t, w in enumerate(whole.word_index[e][1:-1]) if w >= 0]
        full, bounds = [], set()
        for a, b in zip(firsts, firsts[1:] + [len(ids)]):
            bounds.add(len(full))
            full += ids[a:b][:max_length - 2]
        bounds.add(len(full))
        owned = []
        begin = end = -1
        for k, row in enumerate(rows_of[e]):
            body = enc.input_ids[row][1:-1]
            # each window is a slice of the full sentence that starts and ends at word boundaries,
            # overlaps the previous one, and advances by at most `stride` (unless one word is longer)
            previous = begin
            # (the last match that overlaps the previous window: a short window may repeat earlier tokens)
            begin = max(b for b in bounds if previous < b <= max(end, 0) and full[b:b + len(body)] == body)
            assert begin + len(body) in bounds
            if k:
                assert begin - previous <= stride or begin == min(b for b in bounds if b > previous)
            end = begin + len(body)
            for t, w in enumerate(enc.word_index[row]):
                if w >= 0:
                    owned.append(w)
                    assert enc.labels[row][t] == label2id[ex.tags[w]]
                else:
                    assert enc.labels[row][t] == IGNORE
        assert end == len(full)  # the last window reaches the end
        assert sorted(owned) == list(range(len(ex.words)))  # every word owned exactly once
        windowed += len(rows_of[e]) > 1
    assert windowed > 100
    gold = words_from_tokens(enc, enc.labels, len(tagged), [len(ex.words) for ex in tagged])
    assert gold == [[label2id[t] for t in ex.tags] for ex in tagged]


def test_words_from_tokens_uses_the_owning_window(tok):
    ex = TokenExample("x", WORDS, None)
    enc = encode_tokens(tok, [ex], max_length=6, stride=2, label2id=None)
    assert enc.labels is None
    # predict the row number at every position: each word must report the row that owns it
    predictions = [[row] * len(ids) for row, ids in enumerate(enc.input_ids)]
    assert words_from_tokens(enc, predictions, 1, [10]) == [[0, 0, 0, 1, 1, 2, 2, 3, 3, 3]]
    with pytest.raises(ValueError, match="word 10 has no owning token"):
        words_from_tokens(enc, predictions, 1, [11])


# ----------------------------------------------------------------------------------------------
# encode_qa / postprocess_qa


def _squad_examples(n: int = 6) -> list[QAExample]:
    """Contexts of six joined tweets; the answer is two plain words near the middle."""
    tweets = [" ".join(w) for w, _ in realdata.wnut_sentences()]
    out = []
    for i in range(n):
        context = " ".join(tweets[i * 6:(i + 1) * 6])
        matches = [m for m in re.finditer(r"(?<= )[A-Za-z]{3,} [A-Za-z]{3,}(?= )", context)]
        m = min(matches, key=lambda m: abs(m.start() - len(context) // 2))
        out.append(QAExample(f"q{i}", f"what comes after {tweets[i * 6].split()[0]} ?", context,
                             [Answer(m.group(), m.start())], where=f"dev.json: question q{i}"))
    return out


def test_encode_qa_windows_match_transformers(tok, hf):
    examples = _squad_examples()
    question = "where is it ?"
    for ex in examples:
        ex.question = question
    max_length, doc_stride = 40, 10
    enc = encode_qa(tok, examples, max_length, doc_stride)
    assert enc.labels is None
    room = max_length - len(tok.tokenize(question)) - 3
    # transformers' stride is the overlap, so windows start every room - overlap tokens
    want = hf([ex.question for ex in examples], [ex.context for ex in examples], truncation="only_second",
              max_length=max_length, stride=room - doc_stride, return_overflowing_tokens=True,
              return_offsets_mapping=True)
    assert enc.input_ids == want["input_ids"]
    assert enc.token_type_ids == want["token_type_ids"]
    assert enc.example_index == list(want["overflow_to_sample_mapping"])
    for row, e in enumerate(enc.example_index):
        offsets, hf_offsets, types = enc.offsets[row], want["offset_mapping"][row], enc.token_type_ids[row]
        for t in range(len(offsets)):
            is_context = types[t] == 1 and t < len(offsets) - 1
            assert (offsets[t] is not None) == is_context
            if is_context:
                assert offsets[t] == tuple(hf_offsets[t])


def test_encode_qa_training_labels(tok):
    examples = _squad_examples()
    kwargs = {"max_length": 48, "doc_stride": 12}
    plain = encode_qa(tok, examples, **kwargs)
    v2 = encode_qa(tok, examples, **kwargs, training=True, v2=True)
    v1 = encode_qa(tok, examples, **kwargs, training=True)
    assert v2.input_ids == plain.input_ids  # v2 keeps every window
    kept = []
    for row, (s, e) in enumerate(v2.labels):
        ex = examples[v2.example_index[row]]
        answer = ex.answers[0]
        if (s, e) == (0, 0):
            continue
        kept.append(row)
        offsets = v2.offsets[row]
        assert ex.context[offsets[s][0]:offsets[e][1]] == answer.text
        assert offsets[s][0] == answer.start
    # v1 has exactly the windows that hold the whole answer, with the same labels
    assert v1.input_ids == [v2.input_ids[r] for r in kept]
    assert v1.labels == [v2.labels[r] for r in kept]
    per_example = [v1.example_index.count(e) for e in range(len(examples))]
    assert min(per_example) >= 2, per_example  # a small stride puts the answer in several windows
    assert len(plain.input_ids) > len(kept)  # and some windows miss it
    # a window that holds only part of the answer counts as missing it
    for row in range(len(v2.input_ids)):
        ex = examples[v2.example_index[row]]
        spans = [o for o in v2.offsets[row] if o is not None]
        inside = spans[0][0] <= ex.answers[0].start and ex.answers[0].start + len(ex.answers[0].text) <= spans[-1][1]
        assert (v2.labels[row] != (0, 0)) == inside


def test_encode_qa_unanswerable_and_errors(tok):
    ex = _squad_examples(1)[0]
    impossible = QAExample("u", ex.question, ex.context, [], is_impossible=True, where="dev.json: question u")
    enc = encode_qa(tok, [impossible], 48, 12, training=True, v2=True)
    assert enc.labels == [(0, 0)] * len(enc.input_ids) and len(enc.input_ids) > 1
    with pytest.raises(ValueError, match=r"dev.json: question u: no answer \(SQuAD v1"):
        encode_qa(tok, [impossible], 48, 12, training=True)
    with pytest.raises(ValueError, match=r"dev.json: question q0: max_length=8 leaves no room"):
        encode_qa(tok, [ex], 8, 2)
    with pytest.raises(ValueError, match=r"dev.json: question q0: doc_stride=40 .*smaller doc_stride"):
        encode_qa(tok, [ex], 48, 40)
    moved = QAExample("m", ex.question, ex.context, [Answer(ex.answers[0].text, ex.answers[0].start + 1)], where="w:1")
    with pytest.raises(ValueError, match=r"w:1: answer .* is not at character"):
        encode_qa(tok, [moved], 48, 12, training=True)
    # the question is cut to max_query_length tokens
    long_q = QAExample("l", " ".join(["why"] * 30), "short context .", [])
    enc = encode_qa(tok, [long_q], 64, 16, max_query_length=5)
    assert enc.input_ids[0][:7] == [tok.cls_token_id] + tok.convert_tokens_to_ids(["why"] * 5) + [tok.sep_token_id]


def _peaked_logits(enc, examples, rng, spans=None):
    """Small noise everywhere; 8.0 at each window's gold start and end tokens when it holds the answer."""
    starts, ends = [], []
    for row, e in enumerate(enc.example_index):
        n = len(enc.input_ids[row]) + 3  # padded rows are fine
        s, t = rng.normal(0, 0.1, n), rng.normal(0, 0.1, n)
        answer = examples[e].answers[0]
        for i, o in enumerate(enc.offsets[row]):
            if o is not None and o[0] == answer.start:
                s[i] = 8.0
            if o is not None and o[1] == answer.start + len(answer.text):
                t[i] = 8.0
        starts.append(s)
        ends.append(t)
    return starts, ends


def test_postprocess_qa_finds_the_gold_span(tok):
    examples = _squad_examples()
    enc = encode_qa(tok, examples, 48, 12)
    starts, ends = _peaked_logits(enc, examples, np.random.default_rng(0))
    out = postprocess_qa(examples, enc, starts, ends)
    for ex in examples:
        assert out[ex.id]["text"] == ex.answers[0].text
        assert out[ex.id]["start"] == ex.answers[0].start
        assert out[ex.id]["score"] > 15.0


def test_postprocess_qa_null_threshold_and_limits(tok):
    context = "the quick brown fox jumps over the lazy dog"
    ex = QAExample("a", "who jumps ?", context)
    enc = encode_qa(tok, [ex], 64, 16)
    assert len(enc.input_ids) == 1
    head = enc.offsets[0].index(next(o for o in enc.offsets[0] if o is not None))  # first context token
    s, e = np.full(len(enc.input_ids[0]), -1.0), np.full(len(enc.input_ids[0]), -1.0)
    s[0], e[0] = 3.0, 3.0  # null score 6
    s[head + 2], e[head + 3] = 2.0, 2.0  # "brown fox": 4
    out = postprocess_qa([ex], enc, [s], [e], v2=True)["a"]
    # "" wins, and the best span comes along for choosing a threshold later
    assert out == {"text": "", "score": 6.0, "null_score": 6.0, "start": -1, "span": "brown fox", "span_score": 4.0}
    out = postprocess_qa([ex], enc, [s], [e], v2=True, null_threshold=2.5)["a"]
    assert out == {"text": "brown fox", "score": 4.0, "null_score": 6.0, "start": 10, "span": "brown fox",
                   "span_score": 4.0}
    assert postprocess_qa([ex], enc, [s], [e])["a"]["text"] == "brown fox"  # v1 never answers ""
    # max_answer_length: the best end is too far; the next best within 2 tokens wins
    e[head + 3], e[head + 5], e[head + 2] = -1.0, 3.5, 1.0
    assert postprocess_qa([ex], enc, [s], [e])["a"]["text"] == "brown fox jumps over"  # 5.5
    assert postprocess_qa([ex], enc, [s], [e], max_answer_length=2)["a"]["text"] == "brown"  # 3 > 2.5
    # question tokens (and [CLS]/[SEP]) are never chosen, however high their logits
    s[1:head], e[1:head] = 50.0, 50.0
    s[-1], e[-1] = 60.0, 60.0
    out = postprocess_qa([ex], enc, [s], [e])["a"]
    assert out["text"] == "brown fox jumps over" and out["score"] == 5.5


def test_postprocess_qa_at_its_bounds(tok):
    """A span of exactly max_answer_length tokens is allowed; an end before its start never is; a
    null score that beats the best span by exactly the threshold still gives the span (the v2.0
    script answers "" only when the difference is above it)."""
    context = "the quick brown fox jumps over the lazy dog"
    ex = QAExample("a", "who jumps ?", context)
    enc = encode_qa(tok, [ex], 64, 16)
    head = enc.offsets[0].index(next(o for o in enc.offsets[0] if o is not None))
    s, e = np.full(len(enc.input_ids[0]), -1.0), np.full(len(enc.input_ids[0]), -1.0)
    s[0], e[0] = 3.0, 3.0  # null score 6
    s[head + 2], e[head + 3] = 2.0, 2.0  # "brown fox": 4, two tokens
    assert postprocess_qa([ex], enc, [s], [e], max_answer_length=2)["a"]["text"] == "brown fox"
    assert postprocess_qa([ex], enc, [s], [e], max_answer_length=1)["a"]["text"] != "brown fox"
    out = postprocess_qa([ex], enc, [s], [e], v2=True, null_threshold=2.0)["a"]
    assert out["text"] == "brown fox" and out["score"] == 4.0
    s[head + 1], e[head + 1] = 0.5, 9.0  # "quick": the best end, before the best start ("brown": 2.0)
    out = postprocess_qa([ex], enc, [s], [e])["a"]
    assert out["text"] == "quick" and out["score"] == 9.5  # not "brown" .. "quick" (11.0), which runs backwards


def test_postprocess_qa_null_score_is_min_over_windows(tok):
    ex = _squad_examples(1)[0]
    enc = encode_qa(tok, [ex], 48, 12)
    n = len(enc.input_ids)
    starts = [np.full(len(r), -1.0) for r in enc.input_ids]
    ends = [np.full(len(r), -1.0) for r in enc.input_ids]
    for row in range(n):
        starts[row][0] = ends[row][0] = float(row + 1)  # null scores 2, 4, 6, ...
    out = postprocess_qa([ex], enc, starts, ends, v2=True)[ex.id]
    assert out["null_score"] == 2.0
    assert out["text"] == "" and out["score"] == 2.0  # the best span scores -2


# ----------------------------------------------------------------------------------------------
# encode_choices


def test_encode_choices(tok, hf):
    lines = texts()
    examples = []
    for i in range(12):
        k = 2 if i % 3 else 4
        question = "" if i % 4 == 1 else lines[i + 40][:40]
        choices = [lines[(i * 5 + j) % 80 + 60] for j in range(k)]
        examples.append(ChoiceExample(str(i), lines[i], question, choices, label=i % k))
    enc = encode_choices(tok, examples, max_length=32)
    assert enc.num_choices == [4 if i % 3 == 0 else 2 for i in range(12)]
    assert enc.example_index == [e for e, k in enumerate(enc.num_choices) for _ in range(k)]
    assert enc.labels == [ex.label for ex in examples]
    row = 0
    for ex in examples:
        for choice in ex.choices:
            second = f"{ex.question} {choice}" if ex.question else choice
            want = hf(ex.context, second, truncation=True, max_length=32)
            assert enc.input_ids[row] == want["input_ids"]
            assert enc.token_type_ids[row] == want["token_type_ids"]
            assert enc.input_ids[row] == tok(ex.context, second, truncation=True, max_length=32)["input_ids"]
            row += 1
    assert row == len(enc.input_ids)
    assert encode_choices(tok, [ChoiceExample("x", "c", "q", ["a", "b"], None)], 16).labels is None
    with pytest.raises(ValueError, match=r"swag.csv:4: label 2 is not a choice index \(0..1\)"):
        encode_choices(tok, [ChoiceExample("x", "c", "q", ["a", "b"], 2, where="swag.csv:4")], 16)
