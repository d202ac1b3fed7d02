"""The tagging family: a tag per word (NER, part of speech), predicted at the word's first
sub-token (the BERT paper's Figure 4d, section 5.3).

Files: CoNLL, a token first and its tag last on each line, a blank line between sentences (any
extension but .jsonl: CoNLL-2003's are .txt); for predict, also JSON Lines, each line's "tokens" (a
list of words) or "text" (cut into words as BERT's tokenizer cuts it). A
sentence too long for one sequence is split into overlapping windows rather than cut, and each word
is predicted by exactly one window: the one where it sits farthest from a cut edge (the "max
context" rule of BERT's run_squad.py, applied to words); `words_from_tokens` undoes this. Tags
shaped like entity chunks (O, B-/I-/E-/S-) score by entity F1 (seqeval), any other tag set per word.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..baselines.elmo import ELMoForTokenClassification
from ..baselines.gpt import OpenAIGPTForTokenClassification
from ..eval import metrics
from ..heads import BertForTokenClassification
from ..io.texts import json_records, lines
from ..losses import IGNORE
from .encode import Encoded, label_id, where_of
from ..settings import setting
from .families import TaskFamily, TaskSettings, register_family
from .formats import MISSING, PathLike, existing, no_examples, shown


@dataclass
class TokenExample:
    """A sentence as words, with one tag per word (CoNLL)."""

    id: str
    words: list[str]
    tags: list[str] | None  # None in unlabelled inputs
    where: str = ""

    def label_names(self) -> list[str]:
        if self.tags is None:
            raise ValueError(f"{self.where}: no tags; a label map is built from labelled examples")
        return list(self.tags)

    def label_places(self) -> list[tuple[str, str]]:
        return [(tag, word_where(self.where, i)) for i, tag in enumerate(self.tags or ())]


def word_where(where: str, i: int) -> str:
    """FILE:LINE of word i of a CoNLL example (see read_conll: word i is on the example's line + i)."""
    file, _, line = where.rpartition(":")
    return f"{file}:{int(line) + i}" if line.isdigit() else where


def read_conll(path: PathLike, labelled: bool = True) -> list[TokenExample]:
    """Sentences of a CoNLL file: a token per line, token first and its tag in the last column (tab or
    space separated, any columns between are ignored), a blank line between sentences.

    A line of only whitespace ends a sentence too (the WNUT-16 files hold a lone tab); -DOCSTART- lines
    are skipped.  An example's id and `where` are the line of its first token; token i is on that line + i.
    With labelled=False a file may hold bare tokens (tags None); then every line must be bare."""
    path = existing(path)
    examples: list[TokenExample] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    tagged: bool | None = True if labelled else None  # unlabelled: the first token line decides
    decided_at = 0

    def end_sentence() -> None:
        if words:
            examples.append(TokenExample(str(start), words.copy(), tags.copy() if tagged else None,
                                         f"{path}:{start}"))
            words.clear()
            tags.clear()

    for n, line in lines(path):
        if not line.strip() or line.startswith("-DOCSTART-"):
            end_sentence()
            continue
        fields = [f.strip() for f in (line.split("\t") if "\t" in line else line.split(" ")) if f.strip()]
        if len(fields) == 1 and labelled:
            raise ValueError(f"{path}:{n}: one column {fields[0]!r}; expected TOKEN ... TAG (the token first, "
                             "its tag in the last column, separated by tabs or spaces)")
        if tagged is None:
            tagged, decided_at = len(fields) > 1, n
        elif tagged != (len(fields) > 1) and not labelled:
            raise ValueError(f"{path}:{n}: {len(fields)} columns, but line {decided_at} has "
                             f"{'a tag' if tagged else 'no tag'}; expected every line TOKEN ... TAG or every "
                             "line a bare TOKEN")
        if not words:
            start = n
        words.append(fields[0])
        tags.append(fields[-1])
    end_sentence()
    if not examples:
        raise no_examples(path, "CoNLL lines TOKEN ... TAG with a blank line between sentences")
    return examples


def read_token_records(path: PathLike, labelled: bool = False) -> list[TokenExample]:
    """A predict input in JSON Lines: each line a sentence, as "tokens" (its words) or "text" (see
    token_example_from_record), its id the line's "id" or the line number."""
    path = existing(path)
    if labelled:
        raise ValueError(f"{path}: tagging reads tags from CoNLL (a token and its tag a line, a blank line between "
                         "sentences); JSON Lines are predict inputs, each line's \"tokens\" or \"text\"")
    examples = [token_example_from_record(record, f"{path}:{n}", str(n)) for n, record in json_records(path)]
    if not examples:
        raise no_examples(path, 'one JSON object per line, with "tokens" or "text"')
    return examples


def token_example_from_record(record: dict, where: str, default_id: str) -> TokenExample:
    """An unlabelled sentence from one JSON object: "tokens", a list of words, or "text", cut into the
    words BERT's tokenizer makes of it before WordPiece, cased as written (at whitespace and around
    each punctuation mark and each Chinese character: a Chinese sentence is tagged character by
    character, as People's Daily NER is)."""
    if "tokens" not in record and isinstance(record.get("text"), str):
        words = split_words(record["text"])
        if not words:
            raise ValueError(f"{where}: \"text\" holds no words")
    else:
        words = record.get("tokens", MISSING)
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
            raise ValueError(f"{where}: \"tokens\" {shown(words, 60)}; expected a non-empty list of "
                             "words (strings), as the lines of a CoNLL file, or \"text\", a sentence")
    ident = record.get("id")
    return TokenExample(default_id if ident is None or ident == "" else str(ident), words, None, where)


def split_words(text: str) -> list[str]:
    """BERT's words of a text (BertPreTokenizer's split, then each Chinese character apart), unchanged."""
    from tokenizers.pre_tokenizers import BertPreTokenizer

    from ..tokenizer import _is_cjk

    words = []
    for piece, _ in BertPreTokenizer().pre_tokenize_str(text):
        run = ""
        for ch in piece:
            if _is_cjk(ch):
                words += [run, ch] if run else [ch]
                run = ""
            else:
                run += ch
        words += [run] if run else []
    return words


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
        raise ValueError(f"{where_of(examples[i], i)}: no tags, but other sentences have tags")

    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    out = Encoded(input_ids=[], token_type_ids=[], example_index=[], labels=[] if with_labels else None,
                  word_index=[])
    for e, (ex, words) in enumerate(zip(examples, _word_pieces(tokenizer, examples))):
        tag_ids: list[int] = []
        if with_labels:
            if len(ex.tags) != len(ex.words):
                raise ValueError(f"{where_of(ex, e)}: {len(ex.words)} words but {len(ex.tags)} tags")
            tag_ids = [label2id.get(tag, -1) for tag in ex.tags]
            if -1 in tag_ids:
                label_id(ex.tags[tag_ids.index(-1)], label2id, where_of(ex, e))  # raises, naming the tag
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


@dataclass
class TokenSettings(TaskSettings):
    label_all_subtokens: bool = setting(False, "train on every sub-token of a word, not only the first")


class TokenTask(TaskFamily):
    """A tag per word, predicted at the word's first sub-token; long sentences in overlapping windows.
    Tags shaped like entity chunks (O, B-/I-/E-/S-) score by entity F1, any other tag set per word."""

    heads = {"bert": BertForTokenClassification, "gpt": OpenAIGPTForTokenClassification,
             "elmo": ELMoForTokenClassification}
    about = "a tag per word          CoNLL: token first, tag last, blank line between sentences"
    export_per_token = ("logits",)
    gold = "tags"
    label_set = True
    per_word = True
    windows = True
    example_file = ("ner.conll", "John B-PER\nlives O\nin O\nNew B-LOC\nYork I-LOC\n. O\n\n"
                                 "江 B-PER\n泽 I-PER\n民 I-PER\n在 O\n北 B-LOC\n京 I-LOC\n\n"
                                 "Mary B-PER\nleft O\nParis B-LOC\n\nIt O\nrains O\n\n")
    file_format = "conll"
    layouts = ("auto", "conll")
    Settings = TokenSettings
    metrics = ("f1", "precision", "recall", "token_accuracy")

    def texts(self, example):
        return [" ".join(example.words)] if example.words else []

    def _read(self, path, layout, labelled, warn):
        if layout == "auto" and Path(path).suffix.lower() in (".jsonl", ".json"):
            return read_token_records(path, labelled)
        examples = read_conll(path, labelled)
        if not labelled and len(examples) == 1 and len(examples[0].words) > 1:  # each line a sentence, likely
            warn(f"{path}: read as CoNLL, one sentence of {len(examples[0].words):,} lines (a token a line, no blank "
                 "line between sentences); if each line is a sentence, give JSON Lines, {\"text\": SENTENCE} a line")
        return examples

    def from_record(self, record, where, default_id):
        return token_example_from_record(record, where, default_id)

    def _encode(self, tokenizer, examples, ts, label2id, training):
        return encode_tokens(tokenizer, examples, ts.max_length, ts.doc_stride, label2id,
                                 label_all_subtokens=ts.label_all_subtokens)

    def batch_targets(self, encoded, rows, units):
        labels = torch.tensor([t for r in rows for t in encoded.labels[r]], dtype=torch.long)
        return {"labels": labels, "label_positions": (labels != IGNORE).nonzero().squeeze(1)}  # on the host

    def targets(self, batch):  # logits [M, C] of the labelled tokens
        return {"labels": batch.labels, "labelled_only": True, "label_positions": batch.label_positions}

    def count(self, batch):
        return int((batch.labels != IGNORE).sum())

    def total(self, data):
        return sum(sum(t != IGNORE for t in labels) for labels in data.encoded.labels)

    def correct(self, out, batch):
        positions = batch.label_positions
        if positions is None:  # a batch made elsewhere
            positions = (batch.labels != IGNORE).nonzero().squeeze(1)
        return (out.logits.argmax(-1) == batch.labels.index_select(0, positions)).sum()

    def predict_inputs(self, batch, encoded):
        # only the token that owns a word is read: the last layer runs for those alone
        owned = torch.tensor([w >= 0 for r in batch.rows for w in encoded.word_index[r]])
        return {"labels": torch.where(owned, 0, IGNORE), "labelled_only": True}

    def outputs(self, out, batch, inputs):
        owned = inputs["labels"] != IGNORE
        tags = torch.full(owned.shape, -1, dtype=torch.long)  # -1 where no word is read
        tags[owned.cpu()] = out.logits.argmax(-1).cpu()
        return list(zip(batch.units.tolist(), (x.tolist() for x in tags.split(batch.cu_seqlens.diff().tolist()))))

    def records(self, examples, encoded, outputs, ts, id2label):
        words = words_from_tokens(encoded, outputs, len(examples), [len(x.words) for x in examples])
        return [{"id": ex.id, "words": ex.words, "tags": [id2label[i] for i in ids]}
                for ex, ids in zip(examples, words)]

    def score(self, records, examples, label_map):
        true, pred = [list(x.tags) for x in examples], [r["tags"] for r in records]
        if self.scoring(label_map) == "tags":
            return metrics.tag_scores(true, pred)
        return metrics.entity_scores(true, pred)

    def scoring(self, label_map):
        return metrics.token_scoring(label_map.labels)

    def best_metric(self, label_map, preset, dev=None):
        return metrics.TAG_METRICS[0] if self.scoring(label_map) == "tags" else super().best_metric(label_map, preset)


register_family(TokenTask("token"))
